#include "coremesh/graph/graph.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <map>

namespace coremesh::graph {

Graph::Graph(runtime::Device* device, int origin_stream, std::vector<Node> nodes,
             std::unordered_set<const Storage*> external)
    : device_(device), origin_stream_(origin_stream), nodes_(std::move(nodes)), external_(std::move(external)) {
  for (const Node& n : nodes_) {
    CM_CHECK(n.op != nullptr, "give every node an op descriptor", "graph node n{} has no op", n.id);
    next_id_ = std::max(next_id_, n.id + 1);
  }
}

Node* Graph::find(int id) {
  for (Node& n : nodes_)
    if (n.id == id) return &n;
  return nullptr;
}

const Node* Graph::find(int id) const { return const_cast<Graph*>(this)->find(id); }

std::vector<std::vector<int>> Graph::successors() const {
  std::vector<std::vector<int>> out(static_cast<size_t>(next_id_));
  for (const Node& n : nodes_)
    for (int d : n.deps) out[size_t(d)].push_back(n.id);
  return out;
}

void Graph::replace(const std::vector<int>& ids, Node node) {
  auto gone = [&](int id) { return std::find(ids.begin(), ids.end(), id) != ids.end(); };
  size_t at = 0;
  std::vector<int> deps;
  for (size_t i = 0; i < nodes_.size(); ++i) {
    if (!gone(nodes_[i].id)) continue;
    at = i;
    for (int d : nodes_[i].deps)
      if (!gone(d) && std::find(deps.begin(), deps.end(), d) == deps.end()) deps.push_back(d);
  }
  node.deps = std::move(deps);
  next_id_ = std::max(next_id_, node.id + 1);
  const int id = node.id;
  nodes_[at] = std::move(node);
  std::erase_if(nodes_, [&](const Node& n) { return n.id != id && gone(n.id); });
  for (Node& n : nodes_) {
    if (n.id == id) continue;
    bool waits = false;
    std::erase_if(n.deps, [&](int d) { return gone(d) ? (waits = true) : false; });
    if (waits && std::find(n.deps.begin(), n.deps.end(), id) == n.deps.end()) n.deps.push_back(id);
  }
}

void Graph::remove(int id) {
  const Node* victim = find(id);
  CM_CHECK(victim != nullptr, "remove a node of this graph", "no node n{}", id);
  const std::vector<int> inherited = victim->deps;
  std::erase_if(nodes_, [&](const Node& n) { return n.id == id; });
  for (Node& n : nodes_) {
    auto it = std::find(n.deps.begin(), n.deps.end(), id);
    if (it == n.deps.end()) continue;
    n.deps.erase(it);
    for (int d : inherited)
      if (std::find(n.deps.begin(), n.deps.end(), d) == n.deps.end()) n.deps.push_back(d);
  }
}

std::string Graph::dump() const {
  std::map<const Storage*, int> names;
  std::vector<const Storage*> order;
  auto name_of = [&](const Tensor& t) {
    auto [it, added] = names.emplace(t.storage().get(), static_cast<int>(names.size()));
    if (added) order.push_back(t.storage().get());
    return t.offset() ? fmt::format("t{}+{}", it->second, t.offset()) : fmt::format("t{}", it->second);
  };
  auto limit = [](int v) { return v ? std::to_string(v) : std::string("-"); };
  std::string s = fmt::format("graph: {} nodes, origin stream s{}\n", nodes_.size(), origin_stream_);
  for (const Node& n : nodes_) {
    s += fmt::format("  n{} = {}  @s{} cores=cube:{},vector:{} limit=", n.id, n.op->describe(name_of), n.stream_id,
                     n.limits.cube, n.limits.vector);
    s += n.stream_limit.cube || n.stream_limit.vector
             ? fmt::format("cube:{},vector:{}", limit(n.stream_limit.cube), limit(n.stream_limit.vector))
             : "-";
    for (size_t i = 0; i < n.deps.size(); ++i) s += fmt::format("{}n{}", i ? "," : " after ", n.deps[i]);
    for (size_t i = 0; i < n.fused_from.size(); ++i) s += fmt::format("{}n{}", i ? "," : " fused from ", n.fused_from[i]);
    s += "\n";
  }
  std::string internal;
  for (const Storage* st : order)
    if (!external_.contains(st)) internal += fmt::format(" t{}", names[st]);
  if (!internal.empty()) s += "  internal:" + internal + "\n";
  return s;
}

}  // namespace coremesh::graph
