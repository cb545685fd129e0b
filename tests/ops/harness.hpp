// One harness for every op test (ggml's test-backend-ops is the model):
//  - deterministic random inputs;
//  - comparison with the reference by normalized error
//      nmse(a, ref) = sum (a - ref)^2 / sum ref^2;
//  - outputs written into guarded buffers whose sentinels catch overruns;
//  - a sweep over core limits (1, 2, 3 and 4 cube/vector cores on a device
//    with 2 workers and a 4+4 core spec) that also checks, through the
//    profiler, that every kernel's block_dim obeyed the limit in force and
//    that it carried its op descriptor;
//  - finite-difference gradient checks on small shapes.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "coremesh/core/tensor.hpp"
#include "coremesh/runtime/device.hpp"
#include "coremesh/runtime/profiler.hpp"
#include "coremesh/runtime/stream.hpp"

namespace coremesh::ops::testing {

// The device and stream all op tests run on: 2 workers, 4 cube + 4 vector cores.
inline runtime::Device& test_device() {
  static runtime::Device device(runtime::DeviceOptions{.cores = 2, .cube_cores = 4, .vector_cores = 4});
  return device;
}
inline runtime::Stream& test_stream() {
  static runtime::Stream stream(test_device());
  return stream;
}

inline Tensor randn(const Shape& shape, uint64_t seed, float scale = 1.0f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  Tensor t = Tensor::empty(shape);
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = dist(rng);
  return t;
}

inline Tensor uniform(const Shape& shape, uint64_t seed, float lo, float hi) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  Tensor t = Tensor::empty(shape);
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = dist(rng);
  return t;
}

inline Tensor randint(const Shape& shape, uint64_t seed, int64_t lo, int64_t hi, DType dtype = DType::i64) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int64_t> dist(lo, hi - 1);
  Tensor t = Tensor::empty(shape, dtype);
  for (int64_t i = 0; i < t.numel(); ++i) {
    if (dtype == DType::i64) t.data<int64_t>()[i] = dist(rng);
    else t.data<int32_t>()[i] = static_cast<int32_t>(dist(rng));
  }
  return t;
}

// Normalized mean squared error (ggml): 0 when both are zero.
inline double nmse(const Tensor& a, const Tensor& ref) {
  EXPECT_EQ(a.shape(), ref.shape()) << "shapes differ";
  if (a.shape() != ref.shape()) return INFINITY;
  auto x = a.to_float_vector(), y = ref.to_float_vector();
  double num = 0, den = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    if (std::isnan(x[i]) != std::isnan(y[i])) return INFINITY;
    if (std::isnan(x[i])) continue;
    num += (double(x[i]) - y[i]) * (double(x[i]) - y[i]);
    den += double(y[i]) * y[i];
  }
  if (den == 0) return num;
  return num / den;
}

#define EXPECT_NMSE(a, ref, tol)                                    \
  do {                                                              \
    const double nmse_value_ = ::coremesh::ops::testing::nmse((a), (ref)); \
    EXPECT_LE(nmse_value_, (tol)) << "nmse of " #a " vs " #ref;     \
  } while (0)

inline bool bitwise_equal(const Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape() || a.dtype() != b.dtype()) return false;
  Tensor ca = a.contiguous(), cb = b.contiguous();
  return std::memcmp(ca.raw_data(), cb.raw_data(), ca.nbytes()) == 0;
}

// A tensor inside a larger buffer with 256 sentinel bytes on each side.
struct Guarded {
  static constexpr size_t kPad = 256;
  static constexpr uint8_t kSentinel = 0xA5;
  std::shared_ptr<std::vector<uint8_t>> buffer;
  Tensor tensor;

  Guarded(const Shape& shape, DType dtype = DType::f32) {
    const size_t bytes = static_cast<size_t>(shape_numel(shape)) * dtype_size(dtype);
    buffer = std::make_shared<std::vector<uint8_t>>(bytes + 2 * kPad + 64, kSentinel);
    uint8_t* base = buffer->data();
    base += (64 - reinterpret_cast<uintptr_t>(base) % 64) % 64;  // 64-byte aligned data
    tensor = Tensor::wrap(base + kPad, shape, dtype, buffer);
    std::memset(base + kPad, 0x7F, bytes);  // garbage the kernel must overwrite
  }
  // True when every sentinel byte is intact.
  bool intact() const {
    const uint8_t* data = static_cast<const uint8_t*>(tensor.raw_data());
    for (size_t i = 1; i <= kPad; ++i)
      if (data[-static_cast<ptrdiff_t>(i)] != kSentinel) return false;
    const uint8_t* end = data + tensor.nbytes();
    for (size_t i = 0; i < kPad; ++i)
      if (end[i] != kSentinel) return false;
    return true;
  }
};

struct LimitCase {
  int cube, vector;
};
inline const std::vector<LimitCase>& limit_cases() {
  static const std::vector<LimitCase> cases{{1, 1}, {2, 2}, {3, 3}, {4, 1}, {1, 4}};
  return cases;
}

// Runs `body` under each core limit on the test stream, synchronizes, and
// checks that every kernel launched inside obeyed the limit.
inline void for_each_limit(const std::function<void(const LimitCase&)>& body) {
  runtime::Stream& stream = test_stream();
  for (const LimitCase& lc : limit_cases()) {
    SCOPED_TRACE(::testing::Message() << "limits cube=" << lc.cube << " vector=" << lc.vector);
    runtime::profiler_start();
    runtime::profiler_clear();
    {
      runtime::StreamLimitGuard guard(stream, lc.cube, lc.vector);
      body(lc);
      stream.synchronize();
    }
    const runtime::CoreLimits want{lc.cube, lc.vector};
    int kernels = 0;
    for (const runtime::KernelRecord& r : runtime::profiler_records()) {
      if (r.stream != stream.id() || r.device != stream.device().id()) continue;
      ++kernels;
      EXPECT_EQ(r.limits, want) << r.name;
      EXPECT_GE(r.block_dim, 1) << r.name;
      EXPECT_LE(r.block_dim, runtime::max_blocks(want, r.kind)) << r.name;
      EXPECT_NE(r.cache_id, 0u) << r.name << " did not go through the op cache";
      EXPECT_EQ(r.op.rfind(r.name + "(", 0), 0u) << r.name << " launched without its op descriptor: " << r.op;
    }
    EXPECT_GT(kernels, 0) << "no kernel ran on the test stream";
    runtime::profiler_stop();
  }
}

// Runs `body` on the test stream (default limits) and synchronizes.
inline void run_on_stream(const std::function<void()>& body) {
  runtime::StreamGuard guard(test_stream());
  body();
  test_stream().synchronize();
}

// sum(out * weight) in double: the scalar whose gradient a backward computes
// when given `weight` as the output gradient.
inline double dot(const Tensor& out, const Tensor& weight) {
  auto a = out.to_float_vector(), b = weight.to_float_vector();
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += double(a[i]) * b[i];
  return s;
}

// Finite-difference check of `grad` = d loss / d input, where loss() runs the
// forward on the current value of `input` (which this function perturbs in
// place). Checks up to `samples` coordinates; returns the worst relative error
// max |fd - g| / max(|g|_inf, 1e-3 scale).
inline double grad_check(Tensor input, const Tensor& grad, const std::function<double()>& loss,
                         float eps = 1e-2f, int samples = 24) {
  EXPECT_EQ(input.shape(), grad.shape());
  float* x = input.data<float>();
  auto g = grad.to_float_vector();
  double scale = 1e-3;
  for (float v : g) scale = std::max(scale, double(std::fabs(v)));
  const int64_t n = input.numel();
  std::mt19937_64 rng(1234);
  double worst = 0;
  for (int s = 0; s < std::min<int64_t>(samples, n); ++s) {
    const int64_t i = n <= samples ? s : static_cast<int64_t>(rng() % static_cast<uint64_t>(n));
    const float saved = x[i];
    x[i] = saved + eps;
    const double up = loss();
    x[i] = saved - eps;
    const double down = loss();
    x[i] = saved;
    const double fd = (up - down) / (2.0 * eps);
    worst = std::max(worst, std::fabs(fd - g[static_cast<size_t>(i)]) / scale);
  }
  return worst;
}

}  // namespace coremesh::ops::testing
