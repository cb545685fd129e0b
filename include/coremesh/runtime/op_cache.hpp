// Op/tiling cache keyed by (op, shapes, dtypes, cube_num, vector_num), the
// RFC's extended tiling hash key. Entry ids are a stable 64-bit hash of the
// key, so the same op under the same limits gets the same id in every run.
// A debug log line (COREMESH_LOG_LEVEL=debug) shows each lookup and its id.
//
// Where a tiling comes from, on a miss: a tiling the tuner is trying (force),
// else a tuned one (a loaded tuning cache, runtime/tuning_cache.hpp), else the
// op's heuristic; an untuned key while tuned tilings are loaded is reported
// once per process (a warning naming it), the rest at debug level.
//
// Thread safety: all methods are safe to call concurrently.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "coremesh/runtime/op_desc.hpp"

namespace coremesh::runtime {

// How a kernel splits its work: block_dim blocks, each a range of its work
// units aligned to `align`; GEMM-like kernels also tile their output.
struct Tiling {
  int block_dim = 1;
  int64_t align = 1;
  int64_t tile_m = 0, tile_n = 0;  // 0: unused
  bool operator==(const Tiling&) const = default;
};
std::string describe(const Tiling& t);  // "block_dim=2 align=64 tile=128x64"

class OpCache {
 public:
  static OpCache& global();

  // The entry for `key` (a kernel of `kind`): its id and tiling, made on a
  // miss (see above; make(max_blocks) is the heuristic). block_dim is clamped
  // to [1, max_blocks(key.limits, kind)] and align to >= 1.
  std::pair<uint64_t, Tiling> get(const OpKey& key, KernelKind kind, const std::function<Tiling(int max_blocks)>& make);

  struct Entry {
    uint64_t id = 0;
    OpKey key;
    KernelKind kind = KernelKind::vector;
    int max_blocks = 1;
    Tiling heuristic;  // what the op chose by itself
    Tiling tiling;     // in use
  };
  std::vector<Entry> entries() const;  // by key text
  // The tiling a lookup of `key` would give now (forced, an entry's, tuned,
  // else `heuristic`, clamped), making no entry and no report: a check
  // that must not add a key to what the tuner finds.
  Tiling peek(const OpKey& key, KernelKind kind, const Tiling& heuristic) const;

  // Tuned tilings by key text (replaces those loaded before); entries made
  // before keep theirs until clear().
  void set_tuned(std::map<std::string, Tiling> tuned);
  size_t tuned_count() const;
  // The tuner's candidate for one key (by text): used by the next lookup of
  // that key, even one that hits. unforce_all() drops every candidate.
  void force(const std::string& key_text, const Tiling& tiling);
  void unforce_all();

  // While one lives, this thread's misses take the op's heuristic, neither
  // tuned nor reported: instruments (the trainer's GEMM peak) measure the
  // ops as they come.
  class HeuristicOnly {
   public:
    HeuristicOnly();
    ~HeuristicOnly();
    HeuristicOnly(const HeuristicOnly&) = delete;
    HeuristicOnly& operator=(const HeuristicOnly&) = delete;
  };

  uint64_t hits() const { return hits_.load(); }
  uint64_t misses() const { return misses_.load(); }
  size_t size() const;
  void clear();  // the entries and counters (tuned tilings stay)

  static uint64_t hash_key(const std::string& text);

 private:
  mutable std::mutex mutex_;
  std::unordered_map<std::string, Entry> entries_;
  std::map<std::string, Tiling> tuned_, forced_;
  bool warned_untuned_ = false;
  std::atomic<uint64_t> hits_{0};
  std::atomic<uint64_t> misses_{0};
};

}  // namespace coremesh::runtime
