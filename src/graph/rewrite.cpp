#include "rewrite.hpp"

#include <fmt/format.h>

#include <algorithm>

namespace coremesh::graph::rewrite {

// Addresses, not Storage objects: two wraps of one buffer are one memory.
bool same_view(const Tensor& a, const Tensor& b) {
  return a.raw_data() == b.raw_data() && a.shape() == b.shape() && a.strides() == b.strides() &&
         a.dtype() == b.dtype();
}

bool shares_storage(const Tensor& a, const Tensor& b) { return a.storage()->meets(*b.storage()); }

bool same_placement(const Node& a, const Node& b) {
  return a.stream_id == b.stream_id && a.limits == b.limits && a.stream_limit == b.stream_limit;
}

Uses::Uses(const Graph& g) {
  for (const Node& n : g.nodes())
    for (const auto* list : {&n.op->inputs, &n.op->outputs})
      for (const Tensor& t : *list) {
        std::vector<int>& ids = nodes_[t.storage().get()];
        if (ids.empty()) wraps_ += t.storage()->wraps();
        if (ids.empty() || ids.back() != n.id) ids.push_back(n.id);
      }
}

bool Uses::touched_elsewhere(const Tensor& t, std::initializer_list<int> except) const {
  auto other = [&](const std::vector<int>& ids) {
    return std::any_of(ids.begin(), ids.end(),
                       [&](int id) { return std::find(except.begin(), except.end(), id) == except.end(); });
  };
  const Storage& mine = *t.storage();
  if (auto it = nodes_.find(&mine); it != nodes_.end() && other(it->second)) return true;
  if (wraps_ == 0) return false;  // allocated storages never meet each other
  for (const auto& [storage, ids] : nodes_)  // another wrap of the same memory counts
    if (storage != &mine && (storage->wraps() || mine.wraps()) && storage->meets(mine) && other(ids)) return true;
  return false;
}

bool follows_directly(const Graph& g, const std::vector<std::vector<int>>& successors, const Node& first,
                      const Node& next) {
  (void)g;
  return next.deps.size() == 1 && next.deps[0] == first.id && successors[size_t(first.id)].size() == 1;
}

bool Rewrites::free(std::initializer_list<int> ids) const {
  for (int id : ids)
    if (std::find(taken.begin(), taken.end(), id) != taken.end()) return false;
  return true;
}

void Rewrites::add(std::vector<int> ids, Node node) {
  taken.insert(taken.end(), ids.begin(), ids.end());
  list.emplace_back(std::move(ids), std::move(node));
}

bool Rewrites::apply(Graph& g, PassResult& result) {
  for (auto& [ids, node] : list) {
    g.replace(ids, std::move(node));
    ++result.matches;
    result.removed += static_cast<int>(ids.size()) - 1;
  }
  const bool any = !list.empty();
  list.clear();
  taken.clear();
  return any;
}

const Node* feeding_matmul(const Graph& g, const std::vector<std::vector<int>>& successors, const Node& op,
                           const Rewrites& rewrites) {
  if (op.op->inputs.size() != 2 || op.op->outputs.size() != 1 || op.deps.size() != 1) return nullptr;
  const Node* mm = g.find(op.deps[0]);
  if (mm->op->key.op != "matmul" || mm->op->key.attr("beta") != "0" || !follows_directly(g, successors, *mm, op) ||
      !same_placement(*mm, op) || !rewrites.free({mm->id, op.id}))
    return nullptr;
  return mm;
}

std::string transposes(const Node& matmul) {
  return fmt::format("ta={};tb={}", matmul.op->key.attr("ta").value_or("false"),
                     matmul.op->key.attr("tb").value_or("false"));
}

bool plain_f32(const Tensor& t) { return t.dtype() == DType::f32 && t.is_contiguous(); }

Node fused(Graph& g, const std::vector<const Node*>& from, runtime::OpKey key, std::vector<Tensor> in,
           std::vector<Tensor> out) {
  const Node& like = *from.front();
  Node n;
  n.id = g.new_id();
  n.kind = like.kind;
  n.stream_id = like.stream_id;
  n.priority = like.priority;
  n.limits = like.limits;
  n.stream_limit = like.stream_limit;
  key.limits = like.limits;
  n.op = std::make_shared<const runtime::OpDesc>(runtime::OpDesc{std::move(key), std::move(in), std::move(out)});
  for (const Node* f : from) {
    if (f->fused_from.empty()) n.fused_from.push_back(f->id);
    else n.fused_from.insert(n.fused_from.end(), f->fused_from.begin(), f->fused_from.end());
  }
  return n;
}

}  // namespace coremesh::graph::rewrite
