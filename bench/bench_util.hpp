// Helpers the C++ benchmarks share: a monotonic clock in seconds, the
// median of a sample, and pinning a PE to one core.
#pragma once

#include <sched.h>

#include <algorithm>
#include <chrono>
#include <thread>
#include <vector>

namespace coremesh::bench {

inline double seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

inline double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// One core per PE, as `coremesh train` gives them (mpirun binds its ranks alike).
inline void pin_to_one_core(int pe) {
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(pe % int(std::max(1u, std::thread::hardware_concurrency())), &one);
  sched_setaffinity(0, sizeof(one), &one);
}

}  // namespace coremesh::bench
