// Kernel benchmarks against their peers in the same run (plain main; prints
// the markdown of docs/performance.md's "## Kernels" section):
//  - f32 GEMM vs cblas_sgemm at the same core count (1024^3 and MoE shapes),
//    and on one core with cold operands at the training step's shapes;
//  - grouped GEMM (f32 and fp8 operands) vs a loop of cblas_sgemm calls;
//  - flash attention fwd+bwd vs the naive reference (small shape) and timings
//    for the PyTorch comparison shape (bench/ops_attention_torch.py);
//  - RMSNorm, SwiGLU, optimizer (AdamW over an arena, grad_sq_sum), fp8
//    quantization and transpose bandwidth as a share of measured memcpy
//    bandwidth.
// Usage: bench_ops_kernels [--quick] [--only gemm,cold,grouped,attention,bandwidth]
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "coremesh/ops/attention.hpp"
#include "coremesh/ops/activation.hpp"
#include "coremesh/ops/gemm.hpp"
#include "coremesh/ops/grouped_gemm.hpp"
#include "coremesh/ops/norm.hpp"
#include "coremesh/ops/optimizer.hpp"
#include "coremesh/ops/quant.hpp"
#include "coremesh/ops/transpose.hpp"
#include "coremesh/runtime/stream.hpp"

using namespace coremesh;
using Clock = std::chrono::steady_clock;

namespace {

bool quick = false;
constexpr double kPeakPerCore = 90.0;  // GFLOP/s, DESIGN.md section 10

// Median seconds of fn() over repetitions (at least 5, about 0.4 s in total).
double time_it(const std::function<void()>& fn) {
  fn();
  fn();
  std::vector<double> t;
  const double budget = quick ? 0.1 : 0.4;
  double total = 0;
  while (t.size() < 5 || (total < budget && t.size() < 200)) {
    auto a = Clock::now();
    fn();
    const double s = std::chrono::duration<double>(Clock::now() - a).count();
    t.push_back(s);
    total += s;
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

Tensor randn(const Shape& shape, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  Tensor x = Tensor::empty(shape);
  for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = d(rng);
  return x;
}

// Runs `op` on the default device's default stream under a cube/vector limit
// of `cores` and waits for it.
double time_ours(int cores, const std::function<void()>& op) {
  runtime::Stream stream = runtime::Device::default_device().default_stream();
  runtime::StreamLimitGuard guard(stream, cores, cores);
  openblas_set_num_threads(1);
  return time_it([&] {
    op();
    stream.synchronize();
  });
}


// Median seconds of coremesh `ours` and OpenBLAS `peer`, measured alternately
// (ours, peer, ours, ...) so that load changes on a shared machine hit both.
std::pair<double, double> compare(int cores, const std::function<void()>& ours,
                                  const std::function<void()>& peer) {
  runtime::Stream stream = runtime::Device::default_device().default_stream();
  runtime::StreamLimitGuard guard(stream, cores, cores);
  auto run_ours = [&] {
    openblas_set_num_threads(1);
    auto a = Clock::now();
    ours();
    stream.synchronize();
    return std::chrono::duration<double>(Clock::now() - a).count();
  };
  auto run_peer = [&] {
    openblas_set_num_threads(cores);
    auto a = Clock::now();
    peer();
    return std::chrono::duration<double>(Clock::now() - a).count();
  };
  for (int i = 0; i < 2; ++i) run_ours(), run_peer();
  std::vector<double> a, b;
  const double budget = quick ? 0.2 : 0.8;
  double total = 0;
  while (a.size() < 7 || (total < budget && a.size() < 300)) {
    a.push_back(run_ours());
    b.push_back(run_peer());
    total += a.back() + b.back();
  }
  openblas_set_num_threads(1);
  std::sort(a.begin(), a.end());
  std::sort(b.begin(), b.end());
  return {a[a.size() / 2], b[b.size() / 2]};
}

void gemm_section(int max_cores) {
  std::printf("### f32 GEMM vs OpenBLAS cblas_sgemm (same core count)\n\n");
  std::printf("| M | K | N | cores | coremesh GFLOP/s | sgemm GFLOP/s | ratio | share of peak |\n");
  std::printf("|---|---|---|---|---|---|---|---|\n");
  struct S {
    int64_t m, k, n;
  };
  std::vector<S> shapes{{1024, 1024, 1024}};
  for (int64_t m : {64, 256, 1024})
    for (auto kn : {std::pair<int64_t, int64_t>{256, 1024}, {1024, 256}, {512, 512}, {1024, 1024}})
      if (!(m == 1024 && kn.first == 1024 && kn.second == 1024)) shapes.push_back({m, kn.first, kn.second});
  if (quick) shapes.resize(3);
  for (const S& s : shapes) {
    Tensor a = randn({s.m, s.k}, 1), b = randn({s.k, s.n}, 2), c = Tensor::empty({s.m, s.n});
    std::vector<float> cref(static_cast<size_t>(s.m * s.n));
    const double flops = 2.0 * s.m * s.n * s.k;
    for (int cores = 1; cores <= max_cores; ++cores) {
      auto [ours, peer] = compare(cores, [&] { ops::matmul_out(a, b, c); }, [&] {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, s.m, s.n, s.k, 1.0f, a.data<float>(), s.k,
                    b.data<float>(), s.n, 0.0f, cref.data(), s.n);
      });
      std::printf("| %ld | %ld | %ld | %d | %.1f | %.1f | %.3f | %.0f%% |\n", s.m, s.k, s.n, cores,
                  flops / ours * 1e-9, flops / peer * 1e-9, peer / ours,
                  100.0 * flops / ours * 1e-9 / (kPeakPerCore * cores));
    }
  }
  std::printf("\n");
}

// The GEMMs of one training step of the demo model find their operands
// evicted by the kernels before them; this section flushes the caches
// (64 MiB written) before every call, ours and OpenBLAS's alternately.
void cold_gemm_section() {
  std::printf("### f32 GEMM with cold operands (the demo model's training shapes), 1 core\n\n");
  std::printf("| M | K | N | op | beta | coremesh GFLOP/s | sgemm GFLOP/s | ratio |\n");
  std::printf("|---|---|---|---|---|---|---|---|\n");
  struct S {
    int64_t m, k, n;
    bool ta, tb;
    float beta;
  };
  std::vector<S> shapes{{1024, 256, 768, false, true, 0},  {1024, 256, 256, false, true, 0},
                        {250, 256, 768, false, true, 0},   {250, 384, 256, false, true, 0},
                        {1024, 768, 256, false, false, 0}, {256, 768, 256, false, false, 0},
                        {768, 1024, 256, true, false, 0},  {512, 1024, 256, true, false, 1}};
  if (quick) shapes.resize(2);
  std::vector<char> junk(64 << 20);
  runtime::Stream stream = runtime::Device::default_device().default_stream();
  runtime::StreamLimitGuard guard(stream, 1, 1);
  openblas_set_num_threads(1);
  for (const S& s : shapes) {
    Tensor a = s.ta ? randn({s.k, s.m}, 1) : randn({s.m, s.k}, 1);
    Tensor b = s.tb ? randn({s.n, s.k}, 2) : randn({s.k, s.n}, 2);
    Tensor c = Tensor::zeros({s.m, s.n});
    std::vector<float> cref(static_cast<size_t>(s.m * s.n));
    auto timed_cold = [&](const std::function<void()>& fn) {
      for (size_t i = 0; i < junk.size(); i += 64) junk[i] = static_cast<char>(junk[i] + 1);
      auto t0 = Clock::now();
      fn();
      return std::chrono::duration<double>(Clock::now() - t0).count();
    };
    auto ours = [&] {
      ops::matmul_out(a, b, c, s.ta, s.tb, s.beta);
      stream.synchronize();
    };
    auto peer = [&] {
      cblas_sgemm(CblasRowMajor, s.ta ? CblasTrans : CblasNoTrans, s.tb ? CblasTrans : CblasNoTrans, s.m,
                  s.n, s.k, 1.0f, a.data<float>(), s.ta ? s.m : s.k, b.data<float>(), s.tb ? s.k : s.n,
                  s.beta, cref.data(), s.n);
    };
    std::vector<double> to, tp;
    for (int i = 0; i < (quick ? 5 : 31); ++i) to.push_back(timed_cold(ours)), tp.push_back(timed_cold(peer));
    std::sort(to.begin(), to.end());
    std::sort(tp.begin(), tp.end());
    const double flops = 2.0 * s.m * s.n * s.k, o = to[to.size() / 2], p = tp[tp.size() / 2];
    const char* op = s.ta ? "x^T dy (wgrad)" : s.tb ? "x W^T (fwd)" : "dy W (dgrad)";
    std::printf("| %ld | %ld | %ld | %s | %.0f | %.1f | %.1f | %.3f |\n", s.m, s.k, s.n, op, s.beta,
                flops / o * 1e-9, flops / p * 1e-9, p / o);
  }
  std::printf("\n");
}

void grouped_section(int cores) {
  std::printf("### Grouped GEMM (layout B, y = x w^T) vs a loop of cblas_sgemm, %d cores\n\n", cores);
  std::printf("| experts | tokens per expert | K | N | coremesh GFLOP/s | sgemm loop GFLOP/s | ratio |\n");
  std::printf("|---|---|---|---|---|---|---|\n");
  struct S {
    std::vector<int64_t> rows;
    int64_t k, n;
  };
  std::vector<S> cases{{{128, 128, 128, 128, 128, 128, 128, 128}, 512, 1024},
                       {{300, 0, 17, 200, 90, 400, 1, 0}, 512, 1024},
                       {{64, 64, 64, 64, 64, 64, 64, 64, 64, 64, 64, 64, 64, 64, 64, 64}, 1024, 512}};
  for (const S& s : cases) {
    const int64_t G = static_cast<int64_t>(s.rows.size());
    std::vector<int64_t> off{0};
    for (int64_t r : s.rows) off.push_back(off.back() + r);
    const int64_t M = off.back();
    Tensor x = randn({M, s.k}, 3), w = randn({G, s.n, s.k}, 4), y = Tensor::empty({M, s.n});
    Tensor offsets = Tensor::from_vector<int64_t>(off, {G + 1});
    std::vector<float> yref(static_cast<size_t>(M * s.n));
    const double flops = 2.0 * M * s.n * s.k;
    auto [ours, peer] = compare(cores, [&] { ops::grouped_matmul_out(x, w, offsets, y); }, [&] {
      for (int64_t g = 0; g < G; ++g)
        if (s.rows[g] > 0)
          cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, s.rows[g], s.n, s.k, 1.0f,
                      x.data<float>() + off[g] * s.k, s.k, w.data<float>() + g * s.n * s.k, s.k, 0.0f,
                      yref.data() + off[g] * s.n, s.n);
    });
    std::string rows;
    bool uniform = std::all_of(s.rows.begin(), s.rows.end(), [&](int64_t r) { return r == s.rows[0]; });
    if (uniform) rows = std::to_string(s.rows[0]);
    else for (int64_t r : s.rows) rows += (rows.empty() ? "" : ",") + std::to_string(r);
    std::printf("| %ld | %s | %ld | %ld | %.1f | %.1f | %.3f |\n", G, rows.c_str(), s.k, s.n,
                flops / ours * 1e-9, flops / peer * 1e-9, peer / ours);
    // The same product on fp8 operands (dequantized per tile to f32, then sgemm).
    const ops::QuantizedTensor x8 = ops::quantize_fp8_act(x), w8 = ops::quantize_fp8_weight(w);
    auto [ours8, peer8] = compare(cores, [&] { ops::grouped_matmul_fp8(x8, w8, offsets); }, [&] {
      for (int64_t g = 0; g < G; ++g)
        if (s.rows[g] > 0)
          cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, s.rows[g], s.n, s.k, 1.0f,
                      x.data<float>() + off[g] * s.k, s.k, w.data<float>() + g * s.n * s.k, s.k, 0.0f,
                      yref.data() + off[g] * s.n, s.n);
    });
    std::printf("| %ld (fp8) | %s | %ld | %ld | %.1f | %.1f | %.3f |\n", G, rows.c_str(), s.k, s.n,
                flops / ours8 * 1e-9, flops / peer8 * 1e-9, peer8 / ours8);
  }
  std::printf("\n");
}

void attention_section(int cores) {
  std::printf("### Causal flash attention, forward + backward, %d cores\n\n", cores);
  std::printf("| B | T | H | Hkv | D | coremesh fwd ms | coremesh fwd+bwd ms | reference fwd+bwd ms | speedup vs reference |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|\n");
  struct S {
    int64_t B, T, H, Hkv, D;
    bool with_reference;
  };
  std::vector<S> cases{{1, 128, 2, 2, 64, true}, {8, 128, 8, 4, 32, false},  // the second: the demo model's
                       {1, 1024, 8, 8, 64, false}, {1, 1024, 8, 2, 64, false}, {2, 2048, 8, 8, 64, false}};
  if (quick) cases.resize(2);
  for (const S& s : cases) {
    Tensor q = randn({s.B, s.T, s.H, s.D}, 5), k = randn({s.B, s.T, s.Hkv, s.D}, 6);
    Tensor v = randn({s.B, s.T, s.Hkv, s.D}, 7), dout = randn({s.B, s.T, s.H, s.D}, 8);
    ops::AttentionOut o;
    const double fwd = time_ours(cores, [&] { o = ops::flash_attention(q, k, v); });
    const double both = time_ours(cores, [&] {
      ops::AttentionOut f = ops::flash_attention(q, k, v);
      ops::flash_attention_backward(dout, q, k, v, f.out, f.lse);
    });
    if (s.with_reference) {
      auto a = Clock::now();
      ops::reference::attention(q, k, v);
      ops::reference::attention_backward(dout, q, k, v);
      const double ref = std::chrono::duration<double>(Clock::now() - a).count();
      std::printf("| %ld | %ld | %ld | %ld | %ld | %.2f | %.2f | %.0f | %.0fx |\n", s.B, s.T, s.H, s.Hkv, s.D,
                  fwd * 1e3, both * 1e3, ref * 1e3, ref / both);
    } else {
      std::printf("| %ld | %ld | %ld | %ld | %ld | %.2f | %.2f | - | - |\n", s.B, s.T, s.H, s.Hkv, s.D, fwd * 1e3,
                  both * 1e3);
    }
  }
  std::printf("\n");
}

// memcpy bandwidth with `threads` threads each copying its half (read + write bytes / s).
double memcpy_bandwidth(int threads, size_t bytes) {
  std::vector<char> src(bytes, 1), dst(bytes, 0);
  return 2.0 * bytes / time_it([&] {
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t)
      pool.emplace_back([&, t] {
        const size_t b = bytes * t / threads, e = bytes * (t + 1) / threads;
        std::memcpy(dst.data() + b, src.data() + b, e - b);
      });
    for (auto& th : pool) th.join();
  });
}

void bandwidth_section(int max_cores) {
  std::printf("### RMSNorm, SwiGLU, optimizer, fp8 quantization and transpose bandwidth vs memcpy (read + write bytes)\n\n");
  std::printf("| op | shape | cores | GB/s | memcpy GB/s | share |\n|---|---|---|---|---|---|\n");
  const int64_t R = 4096, C = 4096;  // 64 MiB in, 64 MiB out: beyond the caches
  Tensor x = randn({R, C}, 9), w = randn({C}, 10), y = Tensor::empty({R, C}), rstd = Tensor::empty({R});
  Tensor gu = randn({R, 2 * 2048}, 11), out = Tensor::empty({R, 2048});
  // AdamW over a 10M-element arena in one launch: 10 segments of 1M, every
  // other one with weight decay (read p, g, m, v; write p, m, v).
  const int64_t N = 10 * (int64_t(1) << 20);
  std::vector<ops::ParamSegment> segments;
  for (int64_t s = 0; s < 10; ++s) segments.push_back({s * (N / 10), N / 10, s % 2 == 0});
  Tensor p = randn({N}, 12), g = randn({N}, 13), m = Tensor::zeros({N}), v = Tensor::zeros({N});
  const ops::QuantizedTensor q8 = ops::quantize_fp8_act(x);  // fp8 output, input of the byte transpose
  const ops::AdamWConfig adam{1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f};
  int64_t adam_step = 0;
  for (int cores = 1; cores <= max_cores; ++cores) {
    const double mem = memcpy_bandwidth(cores, static_cast<size_t>(R * C) * 4);
    const double rms = time_ours(cores, [&] { ops::rmsnorm_out(x, w, 1e-6f, y, rstd); });
    const double rms_bytes = 2.0 * R * C * 4;  // read x, write y
    const double sw = time_ours(cores, [&] { ops::swiglu_out(gu, out); });
    const double sw_bytes = (2.0 * 2048 + 2048) * R * 4;  // read gate+up, write out
    std::printf("| rmsnorm | %ldx%ld | %d | %.1f | %.1f | %.0f%% |\n", R, C, cores, rms_bytes / rms * 1e-9,
                mem * 1e-9, 100.0 * rms_bytes / rms / mem);
    std::printf("| swiglu | %ldx%d -> %ldx%d | %d | %.1f | %.1f | %.0f%% |\n", R, 4096, R, 2048, cores,
                sw_bytes / sw * 1e-9, mem * 1e-9, 100.0 * sw_bytes / sw / mem);
    const double adamw = time_ours(cores, [&] { ops::adamw_step(p, g, m, v, segments, adam, ++adam_step); });
    const double adamw_bytes = 7.0 * N * 4;  // read p, g, m, v; write p, m, v
    const double sq = time_ours(cores, [&] { ops::grad_sq_sum(g, segments); });
    const double sq_bytes = 1.0 * N * 4;  // read g
    std::printf("| adamw (one launch, 10 segments) | %ld | %d | %.1f | %.1f | %.0f%% |\n", N, cores,
                adamw_bytes / adamw * 1e-9, mem * 1e-9, 100.0 * adamw_bytes / adamw / mem);
    std::printf("| grad_sq_sum (one launch, 10 segments) | %ld | %d | %.1f | %.1f | %.0f%% |\n", N, cores,
                sq_bytes / sq * 1e-9, mem * 1e-9, 100.0 * sq_bytes / sq / mem);
    // fp8 quantization: read f32, write 1 byte per element plus the f32 scales.
    const double qa = time_ours(cores, [&] { ops::quantize_fp8_act_out(x, q8.data, q8.scale); });
    const double qa_bytes = (4.0 + 1.0) * R * C + 4.0 * R * (C / ops::kQuantBlock);
    std::printf("| quantize_fp8_act (1x128 tiles) | %ldx%ld | %d | %.1f | %.1f | %.0f%% |\n", R, C, cores,
                qa_bytes / qa * 1e-9, mem * 1e-9, 100.0 * qa_bytes / qa / mem);
    const double qw = time_ours(cores, [&] { ops::quantize_fp8_weight(x); });
    const double qw_bytes = (4.0 + 1.0) * R * C + 4.0 * (R / ops::kQuantBlock) * (C / ops::kQuantBlock);
    std::printf("| quantize_fp8_weight (128x128 blocks) | %ldx%ld | %d | %.1f | %.1f | %.0f%% |\n", R, C,
                cores, qw_bytes / qw * 1e-9, mem * 1e-9, 100.0 * qw_bytes / qw / mem);
    for (DType dtype : {DType::f32, DType::f8e4m3}) {
      const Tensor src = dtype == DType::f32 ? x : q8.data, dst = Tensor::empty({C, R}, dtype);
      const double tr = time_ours(cores, [&] { ops::transpose_out(src, dst); });
      const double tr_bytes = 2.0 * src.nbytes();  // read x, write x^T
      std::printf("| transpose %s | %ldx%ld | %d | %.1f | %.1f | %.0f%% |\n", dtype_name(dtype).data(), R, C,
                  cores, tr_bytes / tr * 1e-9, mem * 1e-9, 100.0 * tr_bytes / tr / mem);
    }
  }
  std::printf("\n");
}

}  // namespace

int main(int argc, char** argv) {
  std::string only;  // comma-separated section names; empty: all
  for (int i = 1; i < argc; ++i) {
    quick |= std::strcmp(argv[i], "--quick") == 0;
    if (std::strcmp(argv[i], "--only") == 0 && i + 1 < argc) only = "," + std::string(argv[++i]) + ",";
  }
  auto wanted = [&](const char* name) { return only.empty() || only.find("," + std::string(name) + ",") != std::string::npos; };
  const int cores = runtime::Device::default_device().num_cores();
  std::printf("Device: %d cores; peak assumed %.0f GFLOP/s per core.\n\n", cores, kPeakPerCore);
  if (wanted("gemm")) gemm_section(cores);
  if (wanted("cold")) cold_gemm_section();
  if (wanted("grouped")) grouped_section(cores);
  if (wanted("attention")) attention_section(cores);
  if (wanted("bandwidth")) bandwidth_section(cores);
  return 0;
}
