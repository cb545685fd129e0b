// matmul + add into one matmul_add (the RFC's MatmulAssignaddFusion when the
// add writes its other operand: C += A B):
//
//   n0 = matmul(A, B) -> T {beta=0}          n2 = matmul_add(A, B, X) -> Y
//   n1 = add(X, T) -> Y            ==>
//
// T is no longer written, so it must be internal and read by nobody else,
// unless Y is T itself. Y is written tile by tile while A and B are read, so
// it may not share their storage, and it is X exactly or apart from it.
#include "../rewrite.hpp"
#include "coremesh/graph/passes.hpp"

namespace coremesh::graph {

PassResult fuse_matmul_add(Graph& g) {
  using namespace rewrite;
  PassResult result{"matmul_add"};
  Rewrites rewrites;
  do {
    const auto successors = g.successors();
    const Uses uses(g);
    for (const Node& add : g.nodes()) {
      const Node* feeder = add.op->key.op == "add" ? feeding_matmul(g, successors, add, rewrites) : nullptr;
      if (!feeder) continue;
      const Node& mm = *feeder;
      const Tensor &a = mm.op->inputs[0], &b = mm.op->inputs[1], &t = mm.op->outputs[0];
      const int at = same_view(add.op->inputs[0], t) ? 0 : same_view(add.op->inputs[1], t) ? 1 : -1;
      if (at < 0) continue;
      const Tensor &x = add.op->inputs[1 - at], &y = add.op->outputs[0];
      const bool t_is_output = same_view(y, t);
      if (!t_is_output && (!g.internal(t) || uses.touched_elsewhere(t, {mm.id, add.id}))) continue;
      if (shares_storage(y, a) || shares_storage(y, b) || (shares_storage(y, x) && !same_view(y, x))) continue;
      if (!plain_f32(x) || !plain_f32(t) || !plain_f32(y) || shares_storage(x, t)) continue;
      runtime::OpKey key{"matmul_add",
                         {a.shape(), b.shape(), x.shape()},
                         {a.dtype(), b.dtype(), x.dtype()},
                         {},
                         fmt::format("{};tile_first={}", transposes(mm), at == 0)};
      rewrites.add({mm.id, add.id}, fused(g, {&mm, &add}, std::move(key), {a, b, x}, {y}));
    }
  } while (rewrites.apply(g, result));
  return result;
}

}  // namespace coremesh::graph
