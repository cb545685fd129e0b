// matmul + bias add into one matmul_bias:
//
//   n0 = matmul(A, B) -> T {beta=0}          n2 = matmul_bias(A, B, bias) -> Y
//   n1 = add_bias(T, bias) -> Y     ==>
//
// T is no longer written, so it must be internal and read by nobody else,
// unless Y is T itself (the bias added in place). Y may not share A's or
// B's storage (it is written tile by tile while they are read).
#include "../rewrite.hpp"
#include "coremesh/graph/passes.hpp"

namespace coremesh::graph {

PassResult fuse_matmul_bias(Graph& g) {
  using namespace rewrite;
  PassResult result{"matmul_bias"};
  Rewrites rewrites;
  do {
    const auto successors = g.successors();
    const Uses uses(g);
    for (const Node& add : g.nodes()) {
      const Node* feeder = add.op->key.op == "add_bias" ? feeding_matmul(g, successors, add, rewrites) : nullptr;
      if (!feeder) continue;
      const Node& mm = *feeder;
      const Tensor &a = mm.op->inputs[0], &b = mm.op->inputs[1], &t = mm.op->outputs[0];
      const Tensor &bias = add.op->inputs[1], &y = add.op->outputs[0];
      if (!same_view(add.op->inputs[0], t) || t.dim() != 2) continue;
      if (!same_view(y, t) && (!g.internal(t) || uses.touched_elsewhere(t, {mm.id, add.id}))) continue;
      if (shares_storage(y, a) || shares_storage(y, b) || shares_storage(y, bias)) continue;
      if (!plain_f32(t) || !plain_f32(y) || !plain_f32(bias)) continue;
      runtime::OpKey key{"matmul_bias",
                         {a.shape(), b.shape(), bias.shape()},
                         {a.dtype(), b.dtype(), bias.dtype()},
                         {},
                         transposes(mm)};
      rewrites.add({mm.id, add.id}, fused(g, {&mm, &add}, std::move(key), {a, b, bias}, {y}));
    }
  } while (rewrites.apply(g, result));
  return result;
}

}  // namespace coremesh::graph
