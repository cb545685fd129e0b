// Removes nodes whose work nobody can see: every output is internal to the
// graph and no other node reads or writes its storage. Repeats until none is
// left (a removal can make the node that fed it dead). A comm kernel stays:
// its effect is on another PE.
#include "../rewrite.hpp"
#include "coremesh/graph/passes.hpp"

namespace coremesh::graph {

PassResult remove_dead_nodes(Graph& g) {
  PassResult result{"dead_nodes"};
  for (;;) {
    const rewrite::Uses uses(g);
    std::vector<int> dead;
    for (const Node& n : g.nodes()) {
      if (n.kind == runtime::KernelKind::comm || n.op->outputs.empty()) continue;
      bool unread = true;
      for (const Tensor& t : n.op->outputs) unread = unread && g.internal(t) && !uses.touched_elsewhere(t, {n.id});
      if (unread) dead.push_back(n.id);
    }
    if (dead.empty()) return result;
    for (int id : dead) g.remove(id);  // removing one leaves the others dead
    result.matches += static_cast<int>(dead.size());
    result.removed += static_cast<int>(dead.size());
  }
}

std::vector<PassResult> run_passes(Graph& g) {
  return {fuse_matmul_add(g), fuse_matmul_bias(g), fuse_elementwise_chains(g), remove_dead_nodes(g)};
}

}  // namespace coremesh::graph
