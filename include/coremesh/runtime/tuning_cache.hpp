// The tuning cache: tilings measured by the tuner (runtime/tuner.hpp), saved
// as JSON and loaded into OpCache at start (`--tune-cache PATH`).
//
//   {"format": "coremesh-tuning-cache", "version": 1,
//    "coremesh_version": "0.1.0", "machine": "<fingerprint>",
//    "entries": [{"key": "<OpKey::text()>", "op": "matmul",
//                 "tiling": {"block_dim": 2, "align": 1, "tile_m": 64, "tile_n": 128},
//                 "heuristic": {...}, "seconds": 1.2e-4, "heuristic_seconds": 1.3e-4,
//                 "candidates": 12, "evaluations": 30, "rejected": 0}]}
//
// A key is the RFC's (op, shapes, dtypes, cube_num, vector_num) plus attrs. A
// cache made by another coremesh version or on another machine (fingerprint:
// CPU model, CPUs this process may use, BLAS) is stale: it is ignored with a
// warning that says why, never trusted.
#pragma once

#include <string>
#include <vector>

#include "coremesh/runtime/op_cache.hpp"

namespace coremesh::runtime {

struct TunedEntry {
  std::string key;  // OpKey::text()
  std::string op;
  Tiling tiling, heuristic;
  double seconds = 0, heuristic_seconds = 0;  // median per launch
  int candidates = 0, evaluations = 0, rejected = 0;
};

struct TuningCacheFile {
  std::string coremesh_version;
  std::string machine;
  std::vector<TunedEntry> entries;
};

std::string coremesh_version();
// "Intel(R) Xeon(R) ... | 2 cpus": the CPU model and the host's online CPUs.
std::string machine_fingerprint();

// Writes `file` to `path` atomically (a temporary renamed over it); throws
// InvalidArgument when it cannot be written.
void write_tuning_cache(const std::string& path, const TuningCacheFile& file);
// Reads `path`; throws InvalidArgument (saying what to fix) when it is missing
// or malformed.
TuningCacheFile read_tuning_cache(const std::string& path);
// Entries of `updated` replace those of `base` with the same key when they
// were searched at least as thoroughly (as many evaluations: a rerun under a
// short time limit keeps an earlier, longer search's pick); the rest stay.
// Both must come from one machine and coremesh (stale_reason is empty).
TuningCacheFile merge(TuningCacheFile base, const TuningCacheFile& updated);
// Why `file` does not hold tilings for this machine and coremesh ("" if it does).
std::string stale_reason(const TuningCacheFile& file);

// Reads `path` and loads its tilings into OpCache::global() (its entries
// made so far are dropped: the next lookups take the tuned tilings). A stale
// cache (other version or machine) loads nothing and warns; returns the
// number of tilings loaded.
size_t load_tuning_cache(const std::string& path);

}  // namespace coremesh::runtime
