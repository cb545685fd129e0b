// Profiler: one record per kernel and per block, exported as
// kernel_details.csv (the RFC reads block_dim there) and as a Chrome/Perfetto
// trace JSON with one track per stream and one per core, and spans: named
// intervals that a caller knows the meaning of (a pipeline stage's F3, B3,
// RECV_F3), one track per span track name.
//
// Switched on by profiler_start() or by COREMESH_PROFILE=<dir>, in which case
// the files are written to <dir> when the process exits (as
// kernel_details[_pe<k>].csv and trace[_pe<k>].json when a PE id is set).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "coremesh/runtime/device.hpp"

namespace coremesh::runtime {

struct BlockRecord {
  int block_idx;
  int core_id;
  int64_t start_ns;
  int64_t end_ns;
};

struct KernelRecord {
  int pe;
  int device;
  int stream;
  std::string name;
  KernelKind kind;
  int64_t start_ns;  // first block start, since the profiler's epoch
  int64_t end_ns;    // last block end
  int block_dim;
  CoreLimits limits;
  uint64_t cache_id;
  std::vector<BlockRecord> blocks;
  std::string op;  // the op descriptor as text (OpDesc::describe), empty if none
};

struct SpanRecord {
  int pe = -1;
  std::string track;  // e.g. "pipeline stage 1"
  std::string name;   // e.g. "0F3"
  std::string cat;    // e.g. "F", "p2p"
  int64_t start_ns = 0, end_ns = 0;
};

void profiler_start();
void profiler_stop();
bool profiler_enabled();
void profiler_clear();
// This process's PE id in multi-process runs (set by shmem init); -1: none.
void profiler_set_pe(int pe);
std::vector<KernelRecord> profiler_records();
// Nanoseconds since the profiler's epoch (process start).
int64_t profiler_now_ns();

// Write the files; throw InvalidArgument when the path cannot be written.
void write_kernel_details_csv(const std::string& path);
void write_chrome_trace(const std::string& path);
// Writes both into `dir` (created if missing) and returns their paths.
std::vector<std::string> profiler_export(const std::string& dir);
// Creates `dir` if missing; throws InvalidArgument (what to change) if it
// cannot be written. Called before the work to profile, not after it.
void prepare_profile_dir(const std::string& dir);

// Names stream `stream` of device `device` in the trace ("dev0 stream 5:
// moe slice 0"); a later name replaces an earlier one.
void profiler_name_stream(int device, int stream, std::string name);

// Called by the runtime for each finished kernel.
void profiler_add(KernelRecord record);
// A finished span (pe filled in); spans by start time.
void profiler_add_span(SpanRecord span);
std::vector<SpanRecord> profiler_spans();

}  // namespace coremesh::runtime
