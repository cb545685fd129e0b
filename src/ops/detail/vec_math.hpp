// Row math shared by the kernels: dot products, sums and maxima with 16
// partial results (they vectorize without -ffast-math), and exp/sigmoid with
// AVX2+FMA paths where the build targets them.
#pragma once

#include <cstdint>

namespace coremesh::ops::detail {

// sum_i a[i] * b[i] with 16 partial sums (vectorizes without -ffast-math).
inline float dot(const float* a, const float* b, int64_t n) {
  float acc[16] = {};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    for (int j = 0; j < 16; ++j) acc[j] += a[i + j] * b[i + j];
  float s = 0.0f;
  for (; i < n; ++i) s += a[i] * b[i];
  for (int j = 0; j < 16; ++j) s += acc[j];
  return s;
}

// Below this exp(x) is under FLT_MIN: fast_exp returns 0 there (exactly 0
// for -inf, the masked entries of a softmax), not a denormal.
inline constexpr float kExpZeroBelow = -87.33654f;

// exp(x) with ~2 ulp error (Cephes polynomial, Cody-Waite reduction);
// inputs above 88.7 are clamped there; NaN stays NaN.
inline float fast_exp(float x) {
  if (x < kExpZeroBelow) return 0.0f;
  if (x != x) return x;
  x = x > 88.7f ? 88.7f : x;
  const float n = __builtin_nearbyintf(x * 1.44269504088896341f);
  float r = x - n * 0.693359375f;
  r -= n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float y = p * r * r + r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  __builtin_memcpy(&scale, &bits, 4);
  return y * scale;
}

// Vectorized (AVX2+FMA where compiled for it) row helpers built on fast_exp:
// out[i] = exp(in[i] - shift), returning sum_i out[i] (out may equal in).
float exp_sub_sum(const float* in, float* out, int64_t n, float shift);
// sum_i exp(in[i] - shift) without storing.
float sum_exp(const float* in, int64_t n, float shift);
// out[i] = 1 / (1 + exp(-in[i])) (out may equal in).
void sigmoid_row(const float* in, float* out, int64_t n);

// sum of n floats with 16 partial sums.
inline float sum(const float* a, int64_t n) {
  float acc[16] = {};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    for (int j = 0; j < 16; ++j) acc[j] += a[i + j];
  float s = 0.0f;
  for (; i < n; ++i) s += a[i];
  for (int j = 0; j < 16; ++j) s += acc[j];
  return s;
}

// max of n floats (-inf for n = 0), 16 partial maxima.
inline float max_of(const float* a, int64_t n) {
  float acc[16];
  for (float& v : acc) v = -__builtin_inff();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    for (int j = 0; j < 16; ++j) acc[j] = a[i + j] > acc[j] ? a[i + j] : acc[j];
  float m = -__builtin_inff();
  for (; i < n; ++i) m = a[i] > m ? a[i] : m;
  for (int j = 0; j < 16; ++j) m = acc[j] > m ? acc[j] : m;
  return m;
}

}  // namespace coremesh::ops::detail
