// Passes over a captured graph, each a small unit with its own test (a dump
// before and after). instantiate() runs them in this order.
//
// A fusion applies only when every node of the pattern has the same stream,
// the same core limits in force and the same stream-limit attribute (the
// RFC's rule: never merge ops of different streams or core limits); the
// fused node carries them on. Patterns are matched on op descriptors; the
// fused op's kernel comes from the ops library through the op registry and
// computes the same bits as the nodes it replaces. A pattern's nodes follow
// each other directly (the first has no other dependent, the second waits
// for nothing else), and a tensor that the fusion stops writing must be
// internal to the graph and read by no other node.
#pragma once

#include <string>
#include <vector>

#include "coremesh/graph/graph.hpp"

namespace coremesh::graph {

struct PassResult {
  std::string name;
  int matches = 0;  // patterns rewritten
  int removed = 0;  // nodes fewer than before
};

// matmul (beta 0) into T, then add(X, T) or add(T, X) into Y -> one
// matmul_add: Y = X + A B; with Y = X it is the RFC's MatmulAssignaddFusion
// (C += A B).
PassResult fuse_matmul_add(Graph& graph);
// matmul (beta 0) into T, then add_bias(T, bias) into Y -> one matmul_bias.
PassResult fuse_matmul_bias(Graph& graph);
// Chains of element-wise ops (add, mul, silu, gelu: ops that register an
// element-wise arity), each reading the one before, -> one elementwise_chain.
PassResult fuse_elementwise_chains(Graph& graph);
// Nodes none of whose outputs anyone can read (internal, and no other node
// touches them); comm kernels stay (their effect is elsewhere).
PassResult remove_dead_nodes(Graph& graph);

// All of the above, in that order.
std::vector<PassResult> run_passes(Graph& graph);

}  // namespace coremesh::graph
