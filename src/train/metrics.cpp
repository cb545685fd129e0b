#include "coremesh/train/metrics.hpp"

#include "coremesh/runtime/op_cache.hpp"

#include <cblas.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fmt/format.h>
#include <functional>
#include <mutex>
#include <vector>

#include "coremesh/core/tensor.hpp"
#include "coremesh/ops/gemm.hpp"
#include "coremesh/runtime/op_cache.hpp"
#include "coremesh/runtime/stream.hpp"

namespace coremesh::train {

double now_seconds() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

double expert_balance(const std::vector<double>& counts) {
  if (counts.empty()) return 0;
  double sum = 0, mx = 0;
  for (double c : counts) {
    sum += c;
    mx = std::max(mx, c);
  }
  return sum > 0 ? mx / (sum / double(counts.size())) : 0;
}

namespace {

// Best FLOP/s of `gemm` (`flops` per call) over at least 0.3 s and 20 calls:
// a shared core has slow spells of a few hundred milliseconds.
double best_rate(const std::function<void()>& gemm, double flops) {
  double best = 1e30;
  const double start = now_seconds();
  for (int rep = 0; rep < 20 || now_seconds() - start < 0.3; ++rep) {
    const double t0 = now_seconds();
    gemm();
    best = std::min(best, now_seconds() - t0);
  }
  return flops / best;
}

// One core's fp32 GEMM rate at 512^3: the faster of OpenBLAS and coremesh's
// own kernel (ops::matmul on one core), so MFU is never flattered by a slow
// reference.
double measure_core_gemm() {
  const int n = 512;
  const double flops = 2.0 * n * n * n;
  std::vector<float> a(size_t(n) * n, 0.5f), b(size_t(n) * n, 0.25f), c(size_t(n) * n);
  const int saved = openblas_get_num_threads();
  openblas_set_num_threads(1);
  const double blas = best_rate([&] {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a.data(), n, b.data(), n,
                0.0f, c.data(), n);
  }, flops);
  openblas_set_num_threads(saved);
  runtime::Stream stream;
  runtime::StreamLimitGuard one_core(stream, 1, 1);
  const runtime::OpCache::HeuristicOnly as_shipped;
  const Tensor ta = Tensor::full({n, n}, 0.5f), tb = Tensor::full({n, n}, 0.25f);
  Tensor tc = Tensor::empty({n, n});
  const double ours = best_rate([&] {
    ops::matmul_out(ta, tb, tc);
    stream.synchronize();
  }, flops);
  return std::max(blas, ours);
}

std::mutex peak_mutex;
double peak_per_core = 0;  // guarded by peak_mutex

}  // namespace

double measured_peak_flops(int threads) {
  std::lock_guard lock(peak_mutex);
  if (peak_per_core == 0) peak_per_core = measure_core_gemm();
  return peak_per_core * std::max(1, threads);
}

double remeasure_peak_flops(int threads) {
  const double again = measure_core_gemm();
  std::lock_guard lock(peak_mutex);
  peak_per_core = std::max(peak_per_core, again);
  return peak_per_core * std::max(1, threads);
}

std::string format_count(double n) {
  const char* units[] = {"", "K", "M", "G", "T"};
  int u = 0;
  while (std::fabs(n) >= 1000 && u < 4) {
    n /= 1000;
    ++u;
  }
  return u == 0 ? fmt::format("{:.0f}", n) : fmt::format("{:.2f}{}", n, units[u]);
}

std::string format_bytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (bytes >= 1024 && u < 4) {
    bytes /= 1024;
    ++u;
  }
  return fmt::format("{:.1f} {}", bytes, units[u]);
}

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "--:--:--";
  int64_t s = int64_t(seconds + 0.5);
  return fmt::format("{:02d}:{:02d}:{:02d}", s / 3600, (s / 60) % 60, s % 60);
}

Progress::Progress(int64_t total_steps, int64_t first_step, int log_every, std::FILE* out,
                   int force_tty)
    : total_(total_steps),
      first_(first_step),
      log_every_(std::max(1, log_every)),
      out_(out),
      tty_(force_tty >= 0 ? force_tty == 1 : ::isatty(::fileno(out)) == 1),
      start_s_(now_seconds()) {}

std::string Progress::line_for(const StepRecord& r, double val_loss) const {
  std::string s = fmt::format("step {}/{} loss {:.4f}", r.step + 1, total_, r.loss);
  if (val_loss >= 0) s += fmt::format(" val {:.4f}", val_loss);
  s += fmt::format(" lr {:.2e} gnorm {:.3f} {} tok/s MFU {:.1f}%", r.lr, r.grad_norm,
                   format_count(r.tokens_per_s), 100 * r.mfu);
  if (r.expert_balance > 0) s += fmt::format(" balance {:.2f}", r.expert_balance);
  return s;
}

void Progress::update(const StepRecord& r, double val_loss) {
  if (val_loss >= 0) last_val_ = val_loss;
  const int64_t done = r.step + 1 - first_;
  const double elapsed = now_seconds() - start_s_;
  const double eta = done > 0 ? elapsed / double(done) * double(total_ - r.step - 1) : -1;
  if (tty_) {
    const int width = 24;
    const double frac = double(r.step + 1) / double(std::max<int64_t>(1, total_));
    const int fill = int(frac * width);
    std::string bar(size_t(fill), '#');
    bar.append(size_t(width - fill), ' ');
    fmt::print(out_, "\r\x1b[2K[{}] {:3.0f}% {} ETA {}", bar, 100 * frac, line_for(r, last_val_),
               format_duration(eta));
    std::fflush(out_);
    bar_drawn_ = true;
    return;
  }
  if ((r.step + 1) % log_every_ == 0 || r.step + 1 == total_ || val_loss >= 0)
    fmt::print(out_, "{} elapsed {} eta {}\n", line_for(r, val_loss), format_duration(elapsed),
               format_duration(eta));
}

void Progress::message(const std::string& line) {
  if (tty_ && bar_drawn_) fmt::print(out_, "\r\x1b[2K");
  fmt::print(out_, "{}\n", line);
  std::fflush(out_);
}

void Progress::finish() {
  if (tty_ && bar_drawn_) fmt::print(out_, "\n");
  bar_drawn_ = false;
  std::fflush(out_);
}

}  // namespace coremesh::train
