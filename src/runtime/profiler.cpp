#include "coremesh/runtime/profiler.hpp"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <nlohmann/json.hpp>

#include "coremesh/core/env.hpp"
#include "coremesh/core/error.hpp"
#include "coremesh/core/log.hpp"

namespace coremesh::runtime {
namespace {

struct ProfilerState {
  std::atomic<bool> enabled{false};
  std::atomic<int> pe{-1};
  std::mutex mutex;
  std::vector<KernelRecord> records;
  std::vector<SpanRecord> spans;
  std::map<std::pair<int, int>, std::string> stream_names;  // (device, stream)
  const std::chrono::steady_clock::time_point epoch = std::chrono::steady_clock::now();
};

ProfilerState& state() {
  static ProfilerState s;
  return s;
}

// COREMESH_PROFILE=<dir>: profile the whole process and export at exit.
struct EnvProfiler {
  std::optional<std::string> dir = env::get("COREMESH_PROFILE");
  EnvProfiler() {
    state();  // construct the state first so it outlives this object
    if (!dir) return;
    try {  // said now, not after the run
      prepare_profile_dir(*dir);
    } catch (const Error& e) {
      CM_LOG_ERROR("COREMESH_PROFILE: {}; no profile will be written (HINT: {})", e.message(), e.hint());
      dir.reset();
      return;
    }
    profiler_start();
  }
  ~EnvProfiler() {
    if (!dir) return;
    try {
      for (const auto& path : profiler_export(*dir)) CM_LOG_INFO("profile written to {}", path);
    } catch (const std::exception& e) {
      CM_LOG_ERROR("could not write the profile to {}: {}", *dir, e.what());
    }
  }
} g_env_profiler;

std::ofstream open_for_write(const std::string& path) {
  std::ofstream out(path, std::ios::trunc);
  CM_CHECK(out.good(), "check that the directory exists and is writable",
           "cannot open '{}' for writing", path);
  return out;
}

std::string pe_suffix() {
  const int pe = state().pe.load();
  return pe >= 0 ? fmt::format("_pe{}", pe) : "";
}

}  // namespace

void profiler_start() { state().enabled = true; }
void profiler_stop() { state().enabled = false; }
bool profiler_enabled() { return state().enabled.load(std::memory_order_relaxed); }
void profiler_set_pe(int pe) { state().pe = pe; }

void profiler_clear() {
  std::lock_guard lock(state().mutex);
  state().records.clear();
  state().spans.clear();
}

int64_t profiler_now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() -
                                                              state().epoch)
      .count();
}

void profiler_add(KernelRecord record) {
  record.pe = state().pe.load();
  std::lock_guard lock(state().mutex);
  state().records.push_back(std::move(record));
}

void profiler_name_stream(int device, int stream, std::string name) {
  std::lock_guard lock(state().mutex);
  state().stream_names[{device, stream}] = std::move(name);
}

void profiler_add_span(SpanRecord span) {
  span.pe = state().pe.load();
  std::lock_guard lock(state().mutex);
  state().spans.push_back(std::move(span));
}

std::vector<SpanRecord> profiler_spans() {
  std::lock_guard lock(state().mutex);
  auto spans = state().spans;
  std::sort(spans.begin(), spans.end(), [](const auto& a, const auto& b) { return a.start_ns < b.start_ns; });
  return spans;
}

std::vector<KernelRecord> profiler_records() {
  std::lock_guard lock(state().mutex);
  auto records = state().records;
  std::sort(records.begin(), records.end(),
            [](const auto& a, const auto& b) { return a.start_ns < b.start_ns; });
  return records;
}

void write_kernel_details_csv(const std::string& path) {
  auto out = open_for_write(path);
  out << "pe,device,stream,name,kind,start_us,end_us,duration_us,block_dim,cube_num,vector_num,"
         "cache_id\n";
  for (const auto& r : profiler_records()) {
    out << fmt::format("{},{},{},{},{},{:.3f},{:.3f},{:.3f},{},{},{},{:016x}\n", r.pe, r.device,
                       r.stream, r.name, kernel_kind_name(r.kind), r.start_ns / 1e3,
                       r.end_ns / 1e3, (r.end_ns - r.start_ns) / 1e3, r.block_dim, r.limits.cube,
                       r.limits.vector, r.cache_id);
  }
}

// Chrome trace format: complete ("X") events, one track (tid) per stream and
// one per core, named through thread_name metadata events.
void write_chrome_trace(const std::string& path) {
  using nlohmann::json;
  const auto records = profiler_records();
  const int pid = std::max(0, state().pe.load());
  json events = json::array();
  std::set<std::pair<int, int>> stream_tracks, core_tracks;
  for (const auto& r : records) {
    const int stream_tid = r.device * 10000 + r.stream;
    stream_tracks.insert({r.device, r.stream});
    json args = {{"block_dim", r.block_dim},     {"cube_num", r.limits.cube},
                 {"vector_num", r.limits.vector}, {"kind", kernel_kind_name(r.kind)},
                 {"cache_id", fmt::format("{:016x}", r.cache_id)}};
    if (!r.op.empty()) args["op"] = r.op;
    // A parked wait (block_dim 0) holds no core: it shows on its stream's track only.
    events.push_back({{"name", r.name}, {"cat", r.block_dim == 0 ? "wait" : "kernel"}, {"ph", "X"}, {"pid", pid},
                      {"tid", stream_tid}, {"ts", r.start_ns / 1e3},
                      {"dur", (r.end_ns - r.start_ns) / 1e3}, {"args", args}});
    for (const auto& b : r.blocks) {
      core_tracks.insert({r.device, b.core_id});
      events.push_back({{"name", r.name}, {"cat", "block"}, {"ph", "X"}, {"pid", pid},
                        {"tid", 1000000 + r.device * 10000 + b.core_id}, {"ts", b.start_ns / 1e3},
                        {"dur", (b.end_ns - b.start_ns) / 1e3},
                        {"args", {{"block", b.block_idx}, {"stream", r.stream}}}});
    }
  }
  auto name_track = [&](int tid, const std::string& name, int order) {
    events.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", pid}, {"tid", tid},
                      {"args", {{"name", name}}}});
    events.push_back({{"name", "thread_sort_index"}, {"ph", "M"}, {"pid", pid}, {"tid", tid},
                      {"args", {{"sort_index", order}}}});
  };
  std::map<std::string, int> span_tracks;  // by name, numbered in order of appearance
  for (const SpanRecord& s : profiler_spans()) {
    const int tid = 2000000 + int(span_tracks.emplace(s.track, int(span_tracks.size())).first->second);
    events.push_back({{"name", s.name}, {"cat", s.cat}, {"ph", "X"}, {"pid", pid}, {"tid", tid},
                      {"ts", s.start_ns / 1e3}, {"dur", (s.end_ns - s.start_ns) / 1e3}});
  }
  int order = -1000;  // above the streams, by name
  for (const auto& [track, i] : span_tracks) name_track(2000000 + i, track, order++);
  std::map<std::pair<int, int>, std::string> stream_names;
  {
    std::lock_guard lock(state().mutex);
    stream_names = state().stream_names;
  }
  for (auto [device, stream] : stream_tracks) {
    const auto named = stream_names.find({device, stream});
    name_track(device * 10000 + stream,
               fmt::format("dev{} stream {}{}", device, stream, named == stream_names.end() ? "" : ": " + named->second),
               device * 10000 + stream);
  }
  for (auto [device, core] : core_tracks)
    name_track(1000000 + device * 10000 + core, fmt::format("dev{} core {}", device, core),
               1000000 + device * 10000 + core);
  events.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", pid},
                    {"args", {{"name", fmt::format("coremesh pe {}", pid)}}}});
  auto out = open_for_write(path);
  out << json{{"traceEvents", events}, {"displayTimeUnit", "ms"}}.dump() << "\n";
}

void prepare_profile_dir(const std::string& dir) {
  CM_CHECK(!dir.empty(), "name the profile directory", "the profile directory is empty");
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  CM_CHECK(!ec, "choose a directory you can write", "cannot create profile directory '{}': {}",
           dir, ec.message());
  CM_CHECK(::access(dir.c_str(), W_OK) == 0, "choose a directory you can write",
           "the profile directory '{}' is not writable", dir);
}

std::vector<std::string> profiler_export(const std::string& dir) {
  prepare_profile_dir(dir);
  const std::string csv = (std::filesystem::path(dir) / ("kernel_details" + pe_suffix() + ".csv")).string();
  const std::string trace = (std::filesystem::path(dir) / ("trace" + pe_suffix() + ".json")).string();
  write_kernel_details_csv(csv);
  write_chrome_trace(trace);
  return {csv, trace};
}

}  // namespace coremesh::runtime
