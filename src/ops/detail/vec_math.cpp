#include "vec_math.hpp"

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define CM_OPS_AVX2 1
#endif

namespace coremesh::ops::detail {

#ifdef CM_OPS_AVX2
namespace {
// Eight lanes of fast_exp (same polynomial and reduction).
inline __m256 exp8(__m256 in) {
  const __m256 zero = _mm256_cmp_ps(in, _mm256_set1_ps(kExpZeroBelow), _CMP_LT_OQ);
  const __m256 nan = _mm256_cmp_ps(in, in, _CMP_UNORD_Q);
  const __m256 x = _mm256_min_ps(_mm256_max_ps(in, _mm256_set1_ps(kExpZeroBelow)), _mm256_set1_ps(88.7f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  const __m256 y = _mm256_add_ps(_mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r), _mm256_set1_ps(1.0f));
  const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  const __m256 e = _mm256_andnot_ps(zero, _mm256_mul_ps(y, _mm256_castsi256_ps(bits)));
  return _mm256_blendv_ps(e, in, nan);
}
inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_hadd_ps(s, s);
  s = _mm_hadd_ps(s, s);
  return _mm_cvtss_f32(s);
}
}  // namespace
#endif

float exp_sub_sum(const float* in, float* out, int64_t n, float shift) {
  int64_t i = 0;
  float total = 0.0f;
#ifdef CM_OPS_AVX2
  __m256 acc = _mm256_setzero_ps();
  const __m256 sh = _mm256_set1_ps(shift);
  for (; i + 8 <= n; i += 8) {
    const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(in + i), sh));
    _mm256_storeu_ps(out + i, e);
    acc = _mm256_add_ps(acc, e);
  }
  total = hsum(acc);
#endif
  for (; i < n; ++i) total += (out[i] = fast_exp(in[i] - shift));
  return total;
}

float sum_exp(const float* in, int64_t n, float shift) {
  int64_t i = 0;
  float total = 0.0f;
#ifdef CM_OPS_AVX2
  __m256 acc = _mm256_setzero_ps();
  const __m256 sh = _mm256_set1_ps(shift);
  for (; i + 8 <= n; i += 8) acc = _mm256_add_ps(acc, exp8(_mm256_sub_ps(_mm256_loadu_ps(in + i), sh)));
  total = hsum(acc);
#endif
  for (; i < n; ++i) total += fast_exp(in[i] - shift);
  return total;
}

void sigmoid_row(const float* in, float* out, int64_t n) {
  int64_t i = 0;
#ifdef CM_OPS_AVX2
  const __m256 one = _mm256_set1_ps(1.0f);
  for (; i + 8 <= n; i += 8) {
    const __m256 e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), _mm256_loadu_ps(in + i)));
    _mm256_storeu_ps(out + i, _mm256_div_ps(one, _mm256_add_ps(one, e)));
  }
#endif
  for (; i < n; ++i) out[i] = 1.0f / (1.0f + fast_exp(-in[i]));
}

}  // namespace coremesh::ops::detail
