// The C++ side of bench/python_launch.py: per-kernel launch cost of a small
// op (ops::add of two f32 vectors) from C++, measured exactly as the Python
// script measures coremesh.ops.add, so the difference is Python's overhead.
//   launch         host time per call in a batch of back-to-back launches
//   launch+sync    one launch followed by synchronize(), per op
// usage: bench_launch_overhead ELEMENTS BATCH REPS
// prints: launch_ns=<median> launch_sync_ns=<median>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <vector>

#include "coremesh/ops/elementwise.hpp"
#include "coremesh/runtime/stream.hpp"
#include "bench_util.hpp"

using namespace coremesh;
using Clock = std::chrono::steady_clock;

using coremesh::bench::median;

namespace {

// Median over `reps` batches of the nanoseconds per call of `batch` calls.
template <typename Fn>
double per_call_ns(int batch, int reps, Fn&& fn) {
  std::vector<double> samples;
  for (int r = 0; r < reps + 2; ++r) {  // two warm-up batches
    const auto t0 = Clock::now();
    for (int i = 0; i < batch; ++i) fn();
    const double ns = std::chrono::duration<double, std::nano>(Clock::now() - t0).count() / batch;
    runtime::synchronize();  // drain outside the timed part
    if (r >= 2) samples.push_back(ns);
  }
  return median(samples);
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t elements = argc > 1 ? std::atoll(argv[1]) : 1024;
  const int batch = argc > 2 ? std::atoi(argv[2]) : 1000;
  const int reps = argc > 3 ? std::atoi(argv[3]) : 20;
  const Tensor a = Tensor::full({elements}, 1.0f), b = Tensor::full({elements}, 2.0f);
  const double launch = per_call_ns(batch, reps, [&] { ops::add(a, b); });
  const double launch_sync = per_call_ns(batch / 10, reps, [&] {
    ops::add(a, b);
    runtime::synchronize();
  });
  fmt::print("launch_ns={:.1f} launch_sync_ns={:.1f}\n", launch, launch_sync);
}
