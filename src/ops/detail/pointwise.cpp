#include "pointwise.hpp"

#include <cmath>

#include "coremesh/runtime/op_registry.hpp"
#include "vec_math.hpp"

namespace coremesh::ops::detail {
namespace {

constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kGeluCoef = 0.044715f;

inline float sigmoid(float x) { return 1.0f / (1.0f + fast_exp(-x)); }

}  // namespace

void add_row(const float* a, const float* b, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = a[i] + b[i];
}

void mul_row(const float* a, const float* b, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = a[i] * b[i];
}

// y = x * s, s = sigmoid(x)
void silu_row(const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float v = x[i];
    y[i] = v * sigmoid(v);
  }
}

// y = 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3)
void gelu_tanh_row(const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float v = x[i];
    y[i] = 0.5f * v * (1.0f + std::tanh(kSqrt2OverPi * (v + kGeluCoef * v * v * v)));
  }
}

// y = 0.5 x (1 + erf(x / sqrt 2))
void gelu_erf_row(const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float v = x[i];
    y[i] = 0.5f * v * (1.0f + std::erf(v * 0.70710678118654752f));
  }
}

PointwiseFn pointwise_fn(const std::string& op, const std::string& attrs) {
  if (op == "add") return {2, nullptr, add_row};
  if (op == "mul") return {2, nullptr, mul_row};
  if (op == "silu") return {1, silu_row, nullptr};
  if (op == "gelu") return {1, attrs == "tanh" ? gelu_tanh_row : gelu_erf_row, nullptr};
  return {};
}

}  // namespace coremesh::ops::detail

// What graph passes may chain, and the chain's kernel (elementwise.cpp).
// Registered here: every element-wise op links this file.
namespace coremesh::ops::detail {
runtime::Kernel build_elementwise_chain(const runtime::OpDesc& desc);
namespace {
[[maybe_unused]] const bool registered = runtime::register_op("add", {2, nullptr}) && runtime::register_op("mul", {2, nullptr}) &&
                        runtime::register_op("silu", {1, nullptr}) && runtime::register_op("gelu", {1, nullptr}) &&
                        runtime::register_op("elementwise_chain", {0, build_elementwise_chain});
}  // namespace
}  // namespace coremesh::ops::detail
