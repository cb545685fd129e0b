#include "coremesh/runtime/tuning_cache.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "coremesh/core/error.hpp"
#include "coremesh/core/file.hpp"
#include "coremesh/core/log.hpp"

#ifndef COREMESH_VERSION
#define COREMESH_VERSION "unknown"
#endif

namespace coremesh::runtime {
namespace {

constexpr const char* kFormat = "coremesh-tuning-cache";
constexpr int kVersion = 1;

nlohmann::json to_json(const Tiling& t) {
  return {{"block_dim", t.block_dim}, {"align", t.align}, {"tile_m", t.tile_m}, {"tile_n", t.tile_n}};
}

Tiling tiling_from(const nlohmann::json& j) {
  Tiling t;
  t.block_dim = j.at("block_dim").get<int>();
  t.align = j.at("align").get<int64_t>();
  t.tile_m = j.value("tile_m", int64_t{0});
  t.tile_n = j.value("tile_n", int64_t{0});
  CM_CHECK(t.block_dim >= 1 && t.align >= 1 && t.tile_m >= 0 && t.tile_n >= 0,
           "block_dim and align are >= 1, tiles >= 0", "invalid tiling {}", j.dump());
  return t;
}

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("model name", 0) == 0)
      if (auto colon = line.find(':'); colon != std::string::npos) return line.substr(line.find_first_not_of(' ', colon + 1));
  return "unknown cpu";
}

}  // namespace

std::string coremesh_version() { return COREMESH_VERSION; }

// The host's CPUs, not this process's affinity: the PEs of a job narrow
// theirs to their core share (unevenly: 3 PEs on 8 CPUs), mpirun binds ranks,
// and all must agree on the cache; the core counts are in every key anyway.
std::string machine_fingerprint() {
  return fmt::format("{} | {} cpus", cpu_model(), sysconf(_SC_NPROCESSORS_ONLN));
}

void write_tuning_cache(const std::string& path, const TuningCacheFile& file) {
  nlohmann::json entries = nlohmann::json::array();
  for (const TunedEntry& e : file.entries)
    entries.push_back({{"key", e.key},
                       {"op", e.op},
                       {"tiling", to_json(e.tiling)},
                       {"heuristic", to_json(e.heuristic)},
                       {"seconds", e.seconds},
                       {"heuristic_seconds", e.heuristic_seconds},
                       {"candidates", e.candidates},
                       {"evaluations", e.evaluations},
                       {"rejected", e.rejected}});
  const nlohmann::json j{{"format", kFormat},
                         {"version", kVersion},
                         {"coremesh_version", file.coremesh_version},
                         {"machine", file.machine},
                         {"entries", std::move(entries)}};
  write_file_atomic(path, j.dump(1) + "\n");
}

TuningCacheFile read_tuning_cache(const std::string& path) {
  std::error_code ec;
  CM_CHECK(!std::filesystem::is_directory(path, ec), "pass the cache file, not a directory",
           "the tuning cache '{}' is a directory", path);
  std::ifstream in(path);
  CM_CHECK(in.good(), "run `coremesh tune` to make one, or fix the path", "cannot read the tuning cache '{}'", path);
  std::stringstream text;
  text << in.rdbuf();
  try {
    const nlohmann::json j = nlohmann::json::parse(text.str());
    CM_CHECK(j.value("format", "") == kFormat, "pass a file written by `coremesh tune`",
             "'{}' is not a coremesh tuning cache (format '{}')", path, j.value("format", ""));
    CM_CHECK(j.value("version", 0) == kVersion, "delete it and run `coremesh tune` to make a new one",
             "the tuning cache '{}' has format version {}; this coremesh reads version {}", path, j.value("version", 0),
             kVersion);
    TuningCacheFile f;
    f.coremesh_version = j.at("coremesh_version").get<std::string>();
    f.machine = j.at("machine").get<std::string>();
    for (const auto& e : j.at("entries")) {
      TunedEntry t;
      t.key = e.at("key").get<std::string>();
      t.op = e.value("op", "");
      t.tiling = tiling_from(e.at("tiling"));
      if (e.contains("heuristic")) t.heuristic = tiling_from(e.at("heuristic"));
      t.seconds = e.value("seconds", 0.0);
      t.heuristic_seconds = e.value("heuristic_seconds", 0.0);
      t.candidates = e.value("candidates", 0);
      t.evaluations = e.value("evaluations", 0);
      t.rejected = e.value("rejected", 0);
      f.entries.push_back(std::move(t));
    }
    return f;
  } catch (const nlohmann::json::exception& e) {
    CM_THROW(InvalidArgument, "delete it and run `coremesh tune` to make a new one",
             "the tuning cache '{}' is malformed: {}", path,
             e.what());
  }
}

TuningCacheFile merge(TuningCacheFile base, const TuningCacheFile& updated) {
  CM_CHECK(base.coremesh_version == updated.coremesh_version && base.machine == updated.machine,
           "write the new tilings into another tuning cache", "cannot merge tilings of '{}' (coremesh {}) into a "
           "cache of '{}' (coremesh {})", updated.machine, updated.coremesh_version, base.machine,
           base.coremesh_version);
  std::map<std::string, TunedEntry> by_key;
  for (TunedEntry& e : base.entries) by_key[e.key] = std::move(e);
  for (const TunedEntry& e : updated.entries) {
    auto [it, fresh] = by_key.try_emplace(e.key, e);
    if (!fresh && e.evaluations >= it->second.evaluations) it->second = e;
  }
  TuningCacheFile out{updated.coremesh_version, updated.machine, {}};
  for (auto& [key, e] : by_key) out.entries.push_back(std::move(e));
  return out;
}

std::string stale_reason(const TuningCacheFile& f) {
  if (f.coremesh_version != coremesh_version())
    return fmt::format("it was made by coremesh {}, this is {}", f.coremesh_version, coremesh_version());
  if (f.machine != machine_fingerprint())
    return fmt::format("it was made on '{}', this is '{}'", f.machine, machine_fingerprint());
  return "";
}

size_t load_tuning_cache(const std::string& path) {
  const TuningCacheFile f = read_tuning_cache(path);
  if (const std::string stale = stale_reason(f); !stale.empty()) {
    CM_LOG_WARN("ignoring the stale tuning cache '{}' ({}): heuristic tilings are used; run `coremesh tune` here",
                path, stale);
    return 0;
  }
  std::map<std::string, Tiling> tuned;
  for (const TunedEntry& e : f.entries) tuned[e.key] = e.tiling;
  OpCache::global().set_tuned(std::move(tuned));
  OpCache::global().clear();  // the tilings chosen so far give way to the tuned ones
  CM_LOG_INFO("tuning cache '{}': {} tuned tilings", path, f.entries.size());
  return f.entries.size();
}

}  // namespace coremesh::runtime
