// Shared helpers for the runtime tests.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "coremesh/runtime/profiler.hpp"
#include "coremesh/runtime/stream.hpp"

namespace coremesh::runtime::testing {

// Busy work for `ms` milliseconds of wall time per block, so kernel
// durations do not depend on how fast the machine is.
inline KernelBody busy_body(double ms) {
  return [ms](const BlockContext&) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::microseconds(int64_t(ms * 1000));
    while (std::chrono::steady_clock::now() < end) {
    }
  };
}

inline void launch_busy(Stream& s, const std::string& name, double ms, int block_dim = 1,
                        KernelKind kind = KernelKind::vector) {
  s.launch({name, kind, block_dim, 0}, busy_body(ms));
}

// Profiler records of kernels that ran on `stream`, by start time.
inline std::vector<KernelRecord> records_of(const Stream& stream) {
  std::vector<KernelRecord> out;
  for (auto& r : profiler_records())
    if (r.stream == stream.id() && r.device == stream.device().id()) out.push_back(r);
  return out;
}

inline bool overlap(const KernelRecord& a, const KernelRecord& b) {
  return a.start_ns < b.end_ns && b.start_ns < a.end_ns;
}

inline bool any_overlap(const std::vector<KernelRecord>& a, const std::vector<KernelRecord>& b) {
  for (auto& x : a)
    for (auto& y : b)
      if (overlap(x, y)) return true;
  return false;
}

// Start and end of all kernels of a stream.
inline std::pair<int64_t, int64_t> span_of(const std::vector<KernelRecord>& records) {
  int64_t start = INT64_MAX, end = 0;
  for (auto& r : records) {
    start = std::min(start, r.start_ns);
    end = std::max(end, r.end_ns);
  }
  return {start, end};
}

// Profiling on for one test, records cleared before and after.
struct ProfilerScope {
  ProfilerScope() {
    profiler_clear();
    profiler_start();
  }
  ~ProfilerScope() {
    profiler_stop();
    profiler_clear();
  }
};

// Rows of kernel_details.csv as column -> value maps.
inline std::vector<std::map<std::string, std::string>> read_csv(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::vector<std::string> header;
  std::vector<std::map<std::string, std::string>> rows;
  auto split = [](const std::string& s) {
    std::vector<std::string> cells;
    std::stringstream ss(s);
    std::string cell;
    while (std::getline(ss, cell, ',')) cells.push_back(cell);
    return cells;
  };
  if (!std::getline(in, line)) return rows;
  header = split(line);
  while (std::getline(in, line)) {
    auto cells = split(line);
    std::map<std::string, std::string> row;
    for (size_t i = 0; i < header.size() && i < cells.size(); ++i) row[header[i]] = cells[i];
    rows.push_back(row);
  }
  return rows;
}

// The RFC test plan's device: four worker threads (time-shared on small
// machines) with a spec of 8 cube and 8 vector cores, so limits below and
// above the worker count both occur; and the operands of its cases.
inline DeviceOptions rfc_device() { return {.cores = 4, .cube_cores = 8, .vector_cores = 8}; }

struct RfcOperands {
  Tensor a = Tensor::full({384, 384}, 0.01f);
  Tensor b = Tensor::full({384, 384}, 0.02f);
  Tensor x = Tensor::full({1 << 20}, 1.0f);
  Tensor y = Tensor::full({1 << 20}, 2.0f);
};

inline std::string temp_dir(const std::string& name) {
  auto dir = std::filesystem::temp_directory_path() /
             ("coremesh_test_" + name + "_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  return dir.string();
}

}  // namespace coremesh::runtime::testing
