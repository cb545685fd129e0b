// `coremesh demo`: the RFC's concurrency experiment. A matmul stream and a mul
// stream run under split core limits, then the same work runs serially on one
// stream; the trace of the concurrent run is written for a look in Perfetto.
#include <fmt/format.h>

#include <chrono>
#include <filesystem>

#include "commands.hpp"
#include "coremesh/ops/elementwise.hpp"
#include "coremesh/ops/gemm.hpp"
#include "coremesh/runtime/profiler.hpp"
#include "coremesh/runtime/stream.hpp"

namespace coremesh::cli {
namespace {

struct DemoOptions {
  int64_t size = 768;
  int64_t elements = 1 << 24;
  int rounds = 4;
  std::string out = "out/demo";
};

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void run_demo(const DemoOptions& opt) {
  using namespace runtime;
  Device& device = Device::default_device();
  const int cores = device.num_cores();
  const int cube_share = std::max(1, cores / 2);
  const int vector_share = std::max(1, cores - cube_share);
  Tensor a = Tensor::full({opt.size, opt.size}, 0.5f);
  Tensor b = Tensor::full({opt.size, opt.size}, 0.25f);
  Tensor x = Tensor::full({opt.elements}, 1.5f);
  Tensor y = Tensor::full({opt.elements}, 2.0f);
  Stream matmul_stream(device), mul_stream(device);

  auto run_concurrent = [&] {
    for (int i = 0; i < opt.rounds; ++i) {
      {
        StreamLimitGuard g(matmul_stream, cube_share, -1);
        ops::matmul(a, b);
      }
      {
        StreamLimitGuard g(mul_stream, -1, vector_share);
        ops::mul(x, y);
      }
    }
    matmul_stream.synchronize();
    mul_stream.synchronize();
  };
  auto run_serial = [&] {
    StreamGuard g(matmul_stream);
    for (int i = 0; i < opt.rounds; ++i) {
      ops::matmul(a, b);
      ops::mul(x, y);
    }
    matmul_stream.synchronize();
  };
  run_serial();  // warm up caches and the op cache
  auto t0 = std::chrono::steady_clock::now();
  run_serial();
  const double serial = seconds_since(t0);
  // Under COREMESH_PROFILE the whole process is already profiled; otherwise
  // profile just the concurrent run.
  const bool whole_process = profiler_enabled();
  if (!whole_process) profiler_start();
  t0 = std::chrono::steady_clock::now();
  run_concurrent();
  const double concurrent = seconds_since(t0);
  if (!whole_process) profiler_stop();
  const auto files = profiler_export(opt.out);
  fmt::print("{} cores: matmul {}x{} on stream {} (cube {}) || mul of {} floats on stream {} "
             "(vector {}), {} rounds\n",
             cores, opt.size, opt.size, matmul_stream.id(), cube_share, opt.elements,
             mul_stream.id(), vector_share, opt.rounds);
  fmt::print("serial on one stream: {:.1f} ms   concurrent on two streams: {:.1f} ms   gain {:+.1f}%\n",
             serial * 1e3, concurrent * 1e3, (serial / concurrent - 1) * 100);
  for (const auto& f : files) fmt::print("wrote {}\n", f);
  fmt::print("open the trace in https://ui.perfetto.dev or chrome://tracing\n");
}

}  // namespace

void register_demo_command(CLI::App& app) {
  static DemoOptions opt;
  auto* cmd = app.add_subcommand("demo", "Run the RFC's multi-stream core-limit demo and write a trace");
  cmd->add_option("--size", opt.size, "matmul size N (N x N x N)")
      ->capture_default_str()
      ->check(CLI::Range(16, 8192));
  cmd->add_option("--elements", opt.elements, "elements of the mul")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 28));
  cmd->add_option("--rounds", opt.rounds, "matmul+mul pairs")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000));
  cmd->add_option("--out", opt.out, "directory for kernel_details.csv and trace.json")
      ->capture_default_str();
  cmd->callback([] { run_demo(opt); });
}

}  // namespace coremesh::cli
