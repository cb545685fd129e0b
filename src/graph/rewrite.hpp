// What the passes share: the conditions a pattern's nodes must meet and
// how a fused node is made.
#pragma once

#include <initializer_list>
#include <string>
#include <unordered_map>
#include <vector>

#include "coremesh/graph/graph.hpp"
#include "coremesh/graph/passes.hpp"

namespace coremesh::graph::rewrite {

// The same elements: address, shape, strides and dtype.
bool same_view(const Tensor& a, const Tensor& b);
// Whether the storages' memory meets (one storage, or two wraps of one buffer).
bool shares_storage(const Tensor& a, const Tensor& b);
// Same stream and the same core limits (in force, and the stream's own
// limit attribute): nodes that may be fused.
bool same_placement(const Node& a, const Node& b);
// Which nodes read or write each storage; made once per sweep of a pass
// (a rewrite of other nodes in the sweep does not change the answer for a
// node it left alone).
class Uses {
 public:
  explicit Uses(const Graph& g);
  // True if a node not in `except` reads or writes memory of t's storage.
  bool touched_elsewhere(const Tensor& t, std::initializer_list<int> except) const;

 private:
  std::unordered_map<const Storage*, std::vector<int>> nodes_;
  int wraps_ = 0;  // storages that wrap memory (only they may meet another)
};
// `next` follows `first` directly: it waits for `first` only, and nothing
// else waits for `first`.
bool follows_directly(const Graph& g, const std::vector<std::vector<int>>& successors, const Node& first,
                      const Node& next);
// Rewrites found in one sweep of a pass over nodes no other rewrite of the
// sweep uses: each replaces `ids` by `node`.
struct Rewrites {
  std::vector<std::pair<std::vector<int>, Node>> list;
  std::vector<int> taken;  // ids some rewrite uses

  bool free(std::initializer_list<int> ids) const;
  void add(std::vector<int> ids, Node node);
  // Applies them (adding to result's counts); returns false if there were none.
  bool apply(Graph& g, PassResult& result);
};

// The matmul (beta 0) that `op`, a binary op with one output, follows
// directly and is placed like, if no other rewrite of the sweep uses them.
const Node* feeding_matmul(const Graph& g, const std::vector<std::vector<int>>& successors, const Node& op,
                           const Rewrites& rewrites);
// "ta=...;tb=..." of a matmul node, for the fused op's attrs.
std::string transposes(const Node& matmul);

// A contiguous f32 tensor.
bool plain_f32(const Tensor& t);
// The node replacing `from` (at least one): the placement of from[0], a new
// id, op {key, in, out}; key.limits is set to the node's limits.
Node fused(Graph& g, const std::vector<const Node*>& from, runtime::OpKey key, std::vector<Tensor> in,
           std::vector<Tensor> out);

}  // namespace coremesh::graph::rewrite
