#include "coremesh/runtime/op_cache.hpp"

#include "coremesh/core/log.hpp"

namespace coremesh::runtime {

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

std::pair<uint64_t, std::shared_ptr<const void>> OpCache::lookup(
    const OpKey& key, const std::function<std::shared_ptr<const void>()>& make) {
  std::string text = key.text();
  {
    std::lock_guard lock(mutex_);
    auto it = entries_.find(text);
    if (it != entries_.end()) {
      hits_.fetch_add(1);
      CM_LOG_DEBUG("op cache hit id={:016x} key={}", it->second.first, text);
      return it->second;
    }
  }
  // Build the tiling outside the lock; a concurrent miss on the same key
  // computes the same deterministic tiling and the first insert wins.
  auto payload = make();
  const uint64_t id = hash_key(text);
  std::lock_guard lock(mutex_);
  auto [it, inserted] = entries_.emplace(text, std::make_pair(id, std::move(payload)));
  (inserted ? misses_ : hits_).fetch_add(1);
  CM_LOG_DEBUG("op cache {} id={:016x} key={}", inserted ? "miss" : "hit", id, text);
  return it->second;
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
