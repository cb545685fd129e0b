// Op/tiling cache keyed by (op, shapes, dtypes, cube_num, vector_num), the
// RFC's extended tiling hash key. Entry ids are a stable 64-bit hash of the
// key, so the same op under the same limits gets the same id in every run.
// A debug log line (COREMESH_LOG_LEVEL=debug) shows each lookup and its id.
//
// Thread safety: all methods are safe to call concurrently.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "coremesh/runtime/op_desc.hpp"

namespace coremesh::runtime {

class OpCache {
 public:
  static OpCache& global();

  // Returns the entry for `key`, creating its tiling with `make` on a miss.
  template <typename Tiling>
  std::pair<uint64_t, std::shared_ptr<const Tiling>> get(const OpKey& key,
                                                         const std::function<Tiling()>& make) {
    auto [id, payload] = lookup(key, [&] { return std::make_shared<const Tiling>(make()); });
    return {id, std::static_pointer_cast<const Tiling>(payload)};
  }

  uint64_t hits() const { return hits_.load(); }
  uint64_t misses() const { return misses_.load(); }
  size_t size() const;
  void clear();

  static uint64_t hash_key(const std::string& text);

 private:
  std::pair<uint64_t, std::shared_ptr<const void>> lookup(
      const OpKey& key, const std::function<std::shared_ptr<const void>()>& make);

  mutable std::mutex mutex_;
  std::unordered_map<std::string, std::pair<uint64_t, std::shared_ptr<const void>>> entries_;
  std::atomic<uint64_t> hits_{0};
  std::atomic<uint64_t> misses_{0};
};

}  // namespace coremesh::runtime
