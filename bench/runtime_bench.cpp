// Runtime benchmarks, each beside its peer in the same run (medians):
//   1. launch-to-completion of an empty kernel vs a bare condition-variable
//      handoff to a waiting thread (the floor of any cross-thread launch);
//   2. cross-stream event record + wait latency vs the same handoff;
//   3. f32 matmul 1024^3 on 1 and 2 cores vs cblas_sgemm at 1 and 2 threads;
//   4. the RFC's concurrency experiment: matmul || mul on two streams with
//      split core limits vs the same work serially on one stream.
// Prints a markdown table.
#include <cblas.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "coremesh/ops/elementwise.hpp"
#include "coremesh/ops/gemm.hpp"
#include "coremesh/runtime/stream.hpp"
#include "bench_util.hpp"

using namespace coremesh;
using namespace coremesh::runtime;
using Clock = std::chrono::steady_clock;

using coremesh::bench::median;

namespace {

// Median seconds of `reps` runs of fn after `warmup` runs.
double time_median(int reps, int warmup, const std::function<void()>& fn) {
  for (int i = 0; i < warmup; ++i) fn();
  std::vector<double> samples;
  for (int i = 0; i < reps; ++i) {
    auto t0 = Clock::now();
    fn();
    samples.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return median(samples);
}

// The peer for latency: hand a task to a thread waiting on a condition
// variable (after the same short spin our workers do) and wait for it.
struct HandoffThread {
  std::mutex m;
  std::condition_variable cv;
  std::atomic<int> posted{0};
  std::atomic<int> done{0};
  bool stop = false;
  std::thread t{[this] { loop(); }};
  void loop() {
    int seen = 0;
    for (;;) {
      auto until = Clock::now() + std::chrono::microseconds(50);
      while (posted.load() == seen && Clock::now() < until) {
      }
      std::unique_lock lock(m);
      cv.wait(lock, [&] { return stop || posted.load() != seen; });
      if (stop) return;
      seen = posted.load();
      lock.unlock();
      done.store(seen);
    }
  }
  void round_trip() {
    int target;
    {
      std::lock_guard lock(m);
      target = posted.fetch_add(1) + 1;
    }
    cv.notify_one();
    while (done.load() != target) {
    }
  }
  ~HandoffThread() {
    {
      std::lock_guard lock(m);
      stop = true;
    }
    cv.notify_one();
    t.join();
  }
};

struct Row {
  std::string what, ours, peer, ratio;
};

}  // namespace

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::atoi(argv[1]) : 2000;
  Device& device = Device::default_device();
  Stream s1 = device.default_stream(), s2(device);
  std::vector<Row> rows;

  // 1. Launch to completion of an empty kernel.
  {
    HandoffThread peer;
    const double peer_s = time_median(reps, 100, [&] { peer.round_trip(); });
    const double ours_s = time_median(reps, 100, [&] {
      s1.launch({"empty", KernelKind::vector, 1, 0}, [](const BlockContext&) {});
      s1.synchronize();
    });
    rows.push_back({"empty kernel launch -> synchronize (median)", fmt::format("{:.2f} us", ours_s * 1e6),
                    fmt::format("{:.2f} us (condvar handoff)", peer_s * 1e6),
                    fmt::format("{:.2f}x", ours_s / peer_s)});
  }
  // 2. Cross-stream event: record on s1, wait on s2, empty kernel on s2.
  {
    HandoffThread peer;
    const double peer_s = time_median(reps, 100, [&] { peer.round_trip(); });
    Event e;
    const double ours_s = time_median(reps, 100, [&] {
      e.record(s1);
      e.wait(s2);
      s2.launch({"empty", KernelKind::vector, 1, 0}, [](const BlockContext&) {});
      s2.synchronize();
    });
    rows.push_back({"event record(s1) + wait(s2) + empty kernel on s2", fmt::format("{:.2f} us", ours_s * 1e6),
                    fmt::format("{:.2f} us (condvar handoff)", peer_s * 1e6),
                    fmt::format("{:.2f}x", ours_s / peer_s)});
  }
  // 3. matmul 1024^3 vs cblas_sgemm, at 1 and 2 cores/threads.
  {
    const int n = 1024;
    Tensor a = Tensor::full({n, n}, 0.5f), b = Tensor::full({n, n}, 0.25f);
    Tensor c = Tensor::empty({n, n});
    const double flops = 2.0 * n * n * n;
    for (int cores : {1, 2}) {
      if (cores > device.num_cores()) continue;
      double peer_s = 0, ours_s = 0;
      std::vector<double> peer_samples, our_samples;
      for (int round = 0; round < 7; ++round) {  // interleave to share the noise
        openblas_set_num_threads(cores);
        peer_samples.push_back(time_median(3, 1, [&] {
          cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a.data<float>(), n,
                      b.data<float>(), n, 0.0f, c.data<float>(), n);
        }));
        openblas_set_num_threads(1);
        StreamLimitGuard g(s1, cores, -1);
        our_samples.push_back(time_median(3, 1, [&] {
          ops::matmul_out(a, b, c);
          s1.synchronize();
        }));
      }
      peer_s = median(peer_samples);
      ours_s = median(our_samples);
      rows.push_back({fmt::format("matmul f32 1024^3, {} core(s)", cores),
                      fmt::format("{:.1f} GFLOP/s", flops / ours_s / 1e9),
                      fmt::format("{:.1f} GFLOP/s (cblas_sgemm, {} thread(s))", flops / peer_s / 1e9, cores),
                      fmt::format("{:.3f}x", peer_s / ours_s)});
    }
  }
  // 4. The RFC's concurrency experiment.
  if (device.num_cores() >= 2) {
    const int n = 768;
    const int64_t elements = int64_t{1} << 23;
    Tensor a = Tensor::full({n, n}, 0.5f), b = Tensor::full({n, n}, 0.25f);
    Tensor x = Tensor::full({elements}, 1.5f), y = Tensor::full({elements}, 2.0f);
    const int cube_share = device.num_cores() / 2, vector_share = device.num_cores() - cube_share;
    const int rounds = 4;
    auto serial = [&] {
      StreamGuard g(s1);
      for (int i = 0; i < rounds; ++i) {
        ops::matmul(a, b);
        ops::mul(x, y);
      }
      s1.synchronize();
    };
    auto concurrent = [&] {
      for (int i = 0; i < rounds; ++i) {
        {
          StreamLimitGuard g(s1, cube_share, -1);
          ops::matmul(a, b);
        }
        {
          StreamLimitGuard g(s2, -1, vector_share);
          ops::mul(x, y);
        }
      }
      s1.synchronize();
      s2.synchronize();
    };
    std::vector<double> serial_samples, concurrent_samples;
    for (int round = 0; round < 9; ++round) {
      serial_samples.push_back(time_median(1, round == 0 ? 1 : 0, serial));
      concurrent_samples.push_back(time_median(1, round == 0 ? 1 : 0, concurrent));
    }
    const double ser = median(serial_samples), con = median(concurrent_samples);
    rows.push_back({fmt::format("RFC experiment: {}x matmul {}^3 || mul {}M floats, limits cube {} / vector {}",
                                rounds, n, elements >> 20, cube_share, vector_share),
                    fmt::format("{:.1f} ms (two streams)", con * 1e3),
                    fmt::format("{:.1f} ms (one stream, full cores)", ser * 1e3),
                    fmt::format("gain {:+.1f}%", (ser / con - 1) * 100)});
  }

  fmt::print("| benchmark | coremesh | peer | ratio |\n|---|---|---|---|\n");
  for (auto& r : rows) fmt::print("| {} | {} | {} | {} |\n", r.what, r.ours, r.peer, r.ratio);
  return 0;
}
