// Helpers the C++ benchmarks share: a monotonic clock in seconds and the
// median of a sample.
#pragma once

#include <algorithm>
#include <chrono>
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

}  // namespace coremesh::bench
