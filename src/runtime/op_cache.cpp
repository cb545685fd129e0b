#include "coremesh/runtime/op_cache.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "coremesh/core/log.hpp"

namespace coremesh::runtime {

std::string describe(const Tiling& t) {
  std::string s = fmt::format("block_dim={} align={}", t.block_dim, t.align);
  if (t.tile_m > 0 || t.tile_n > 0) s += fmt::format(" tile={}x{}", t.tile_m, t.tile_n);
  return s;
}

OpCache& OpCache::global() {
  static OpCache cache;
  return cache;
}

uint64_t OpCache::hash_key(const std::string& text) {
  uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a 64: stable across runs and processes
  for (unsigned char c : text) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

namespace {

// A tuned tiling (read from a file) replaces the heuristic only where it fits
// the op: an op that tiles by M and N needs tiles of at least 1.
bool fits(const Tiling& heuristic, const Tiling& tuned) {
  return (heuristic.tile_m <= 0 || tuned.tile_m > 0) && (heuristic.tile_n <= 0 || tuned.tile_n > 0);
}

Tiling clamped(Tiling t, int max_blocks) {
  t.block_dim = std::clamp(t.block_dim, 1, max_blocks);
  t.align = std::max<int64_t>(t.align, 1);
  return t;
}

thread_local int heuristic_only = 0;

}  // namespace

OpCache::HeuristicOnly::HeuristicOnly() { ++heuristic_only; }
OpCache::HeuristicOnly::~HeuristicOnly() { --heuristic_only; }

std::pair<uint64_t, Tiling> OpCache::get(const OpKey& key, KernelKind kind,
                                         const std::function<Tiling(int max_blocks)>& make) {
  std::string text = key.text();
  {
    std::lock_guard lock(mutex_);
    auto it = entries_.find(text);
    if (it != entries_.end()) {
      hits_.fetch_add(1);
      if (!forced_.empty())
        if (auto f = forced_.find(text); f != forced_.end()) it->second.tiling = clamped(f->second, it->second.max_blocks);
      CM_LOG_DEBUG("op cache hit id={:016x} key={}", it->second.id, text);
      return {it->second.id, it->second.tiling};
    }
  }
  // The heuristic runs outside the lock; a concurrent miss on the same key
  // computes the same deterministic tiling and the first insert wins.
  Entry e{hash_key(text), key, kind, std::max(1, max_blocks(key.limits, kind)), {}, {}};
  e.heuristic = clamped(make(e.max_blocks), e.max_blocks);
  std::lock_guard lock(mutex_);
  e.tiling = e.heuristic;
  if (auto f = forced_.find(text); f != forced_.end()) {
    e.tiling = clamped(f->second, e.max_blocks);
  } else if (heuristic_only > 0) {
  } else if (auto t = tuned_.find(text); t != tuned_.end()) {
    if (fits(e.heuristic, t->second))
      e.tiling = clamped(t->second, e.max_blocks);
    else
      CM_LOG_WARN("the tuning cache's tiling for {} ({}) has a tile of 0 where the op tiles by rows and columns: "
                  "the heuristic tiling is used; run `coremesh tune` again", text, describe(t->second));
  } else if (!tuned_.empty()) {
    if (!warned_untuned_)
      CM_LOG_WARN("the tuning cache has no tiling for {} (nor maybe for others; COREMESH_LOG_LEVEL=debug lists "
                  "them): the heuristic tiling is used; `coremesh tune` on this config tunes a training step's "
                  "ops (not the shapes only sampling, validation or generate use)",
                  text);
    else
      CM_LOG_DEBUG("untuned: {}", text);
    warned_untuned_ = true;
  }
  auto [it, inserted] = entries_.emplace(text, std::move(e));
  (inserted ? misses_ : hits_).fetch_add(1);
  CM_LOG_DEBUG("op cache {} id={:016x} key={}", inserted ? "miss" : "hit", it->second.id, text);
  return {it->second.id, it->second.tiling};
}

Tiling OpCache::peek(const OpKey& key, KernelKind kind, const Tiling& heuristic) const {
  const std::string text = key.text();
  const int most = std::max(1, max_blocks(key.limits, kind));
  std::lock_guard lock(mutex_);
  if (auto f = forced_.find(text); f != forced_.end()) return clamped(f->second, most);
  if (auto it = entries_.find(text); it != entries_.end()) return it->second.tiling;
  if (auto t = tuned_.find(text); t != tuned_.end() && heuristic_only == 0 && fits(heuristic, t->second))
    return clamped(t->second, most);
  return clamped(heuristic, most);
}

std::vector<OpCache::Entry> OpCache::entries() const {
  std::lock_guard lock(mutex_);
  std::vector<Entry> out;
  out.reserve(entries_.size());
  for (const auto& [text, e] : entries_) out.push_back(e);
  std::sort(out.begin(), out.end(), [](const Entry& a, const Entry& b) { return a.key.text() < b.key.text(); });
  return out;
}

void OpCache::set_tuned(std::map<std::string, Tiling> tuned) {
  std::lock_guard lock(mutex_);
  tuned_ = std::move(tuned);
  warned_untuned_ = false;
}

size_t OpCache::tuned_count() const {
  std::lock_guard lock(mutex_);
  return tuned_.size();
}

void OpCache::force(const std::string& key_text, const Tiling& tiling) {
  std::lock_guard lock(mutex_);
  forced_[key_text] = tiling;
}

void OpCache::unforce_all() {
  std::lock_guard lock(mutex_);
  forced_.clear();
  for (auto& [text, e] : entries_) {
    auto t = tuned_.find(text);
    e.tiling = t == tuned_.end() || !fits(e.heuristic, t->second) ? e.heuristic : clamped(t->second, e.max_blocks);
  }
}

size_t OpCache::size() const {
  std::lock_guard lock(mutex_);
  return entries_.size();
}

void OpCache::clear() {
  std::lock_guard lock(mutex_);
  entries_.clear();
  hits_ = 0;
  misses_ = 0;
}

}  // namespace coremesh::runtime
