// Chains of element-wise ops into one elementwise_chain kernel:
//
//   n0 = silu(X) -> T0                       n3 = elementwise_chain(X, Y, Z) -> W
//   n1 = mul(T0, Y) -> T1          ==>            {chain=silu(i0) mul(t,i1) add(t,i2)}
//   n2 = add(T1, Z) -> W
//
// Each link: the next op reads the previous one's output, follows it
// directly and is placed like it; that output is internal, equal in shape,
// and read by no other node. Every other operand is an input of the fused
// op ("iK"); one that shares the output's storage must be the output itself
// (the kernel works chunk by chunk, element i is read before it is written).
#include "../rewrite.hpp"
#include "coremesh/graph/passes.hpp"
#include "coremesh/runtime/op_registry.hpp"

namespace coremesh::graph {
namespace {

bool elementwise(const Node& n) {
  const int arity = runtime::op_traits(n.op->key.op).elementwise_arity;
  if (arity == 0 || static_cast<int>(n.op->inputs.size()) != arity || n.op->outputs.size() != 1) return false;
  for (const auto* list : {&n.op->inputs, &n.op->outputs})
    for (const Tensor& t : *list)
      if (!rewrite::plain_f32(t) || t.shape() != n.op->outputs[0].shape()) return false;
  return true;
}

// The node that continues the chain after `n`, or null.
const Node* next_link(const Graph& g, const std::vector<std::vector<int>>& successors, const rewrite::Uses& uses,
                      const Node& n) {
  using namespace rewrite;
  if (successors[size_t(n.id)].size() != 1) return nullptr;
  const Node* next = g.find(successors[size_t(n.id)][0]);
  if (!elementwise(*next) || !follows_directly(g, successors, n, *next) || !same_placement(n, *next)) return nullptr;
  const Tensor& t = n.op->outputs[0];
  bool reads = false;
  for (const Tensor& in : next->op->inputs) reads |= same_view(in, t);
  if (!reads || !g.internal(t) || uses.touched_elsewhere(t, {n.id, next->id})) return nullptr;
  for (const Tensor& in : next->op->inputs)
    if (!same_view(in, t) && shares_storage(in, t)) return nullptr;
  return next;
}

}  // namespace

PassResult fuse_elementwise_chains(Graph& g) {
  using namespace rewrite;
  PassResult result{"elementwise_chain"};
  Rewrites rewrites;
  do {
    const auto successors = g.successors();
    const Uses uses(g);
    for (const Node& head : g.nodes()) {
      if (!elementwise(head)) continue;
      if (head.deps.size() == 1) {  // start at the chain's first link
        const Node* prev = g.find(head.deps[0]);
        if (elementwise(*prev) && next_link(g, successors, uses, *prev) == &head) continue;
      }
      std::vector<const Node*> chain{&head};
      while (const Node* next = next_link(g, successors, uses, *chain.back())) chain.push_back(next);
      if (chain.size() < 2) continue;
      const Tensor& out = chain.back()->op->outputs[0];
      std::vector<Tensor> inputs;
      std::string program;
      bool ok = true;
      for (size_t i = 0; i < chain.size(); ++i) {
        const Node& n = *chain[i];
        const std::string& attrs = n.op->key.attrs;
        program += (i ? " " : "") + n.op->key.op + (attrs.empty() ? "" : "." + attrs) + "(";
        for (size_t j = 0; j < n.op->inputs.size(); ++j) {
          const Tensor& in = n.op->inputs[j];
          std::string operand;
          if (i > 0 && same_view(in, chain[i - 1]->op->outputs[0])) {
            operand = "t";
          } else {
            if (shares_storage(in, out) && !same_view(in, out)) ok = false;
            size_t k = 0;
            while (k < inputs.size() && !same_view(inputs[k], in)) ++k;
            if (k == inputs.size()) inputs.push_back(in);
            operand = "i" + std::to_string(k);
          }
          program += (j ? "," : "") + operand;
        }
        program += ")";
      }
      if (!ok || program.find(';') != std::string::npos) continue;  // ';' would end the attrs
      runtime::OpKey key{"elementwise_chain", {out.shape()}, {DType::f32}, {}, "chain=" + program};
      std::vector<int> ids;
      for (const Node* c : chain) ids.push_back(c->id);
      rewrites.add(std::move(ids), fused(g, chain, std::move(key), std::move(inputs), {out}));
    }
  } while (rewrites.apply(g, result));
  return result;
}

}  // namespace coremesh::graph
