// Fast runs of f32/bf16 -> e4m3 and e4m3 -> f32 for the quantization kernels
// (quant.cpp) and the fp8 GEMMs' dequantization (grouped_gemm.cpp). Every
// result is bit-identical to core/dtype.hpp's to_f8e4m3 / to_float, which stay
// the oracle (tests/ops/test_quant.cpp sweeps every boundary between codes).
//
// Encode, on a = |v| (the sign bit is OR'ed back as bit 7, NaN included):
//   NaN                   -> 0x7F            (S.1111.111)
//   a > 448, also inf     -> 0x7E            (saturate to +-448)
//   a < 2^-6 (subnormal)  -> round(a * 2^9): the f32 sum a + 2^14 has an ulp
//                            of 2^-9, so the addition itself rounds a to
//                            nearest even and the sum's low bits are the code
//                            (0..8; 8 is the smallest normal, 2^-6)
//   otherwise (normal)    -> a's f32 bits rounded to 3 mantissa bits, nearest
//                            even (add 0x7FFFF + the kept lsb; a carry bumps
//                            the exponent), exponent rebiased 127 -> 7:
//                            code = (bits >> 20) - (120 << 3)
// Decode, on the magnitude m = c & 0x7F:
//   m == 0x7F             -> the table's NaN (to_float gives +NaN for both signs)
//   m >= 8 (normal)       -> f32 bits (m << 20) + (120 << 23): the rebias back
//   m < 8 (subnormal)     -> m * 2^-9 (exact)
// then the sign, then one multiply by the tile's scale, as table[c] * scale.
//
// The AVX2 paths run 32 (encode) or 8 (decode) elements at a time; the scalar
// forms handle the tails and non-AVX2 builds.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "coremesh/core/dtype.hpp"
#include "convert.hpp"

#if defined(__AVX2__)
#include <immintrin.h>
#define CM_FP8_AVX2 1
#endif

namespace coremesh::ops::fp8 {

inline constexpr uint32_t kSubnormalMagic = 0x46800000u;  // bits of 2^14
inline constexpr float kMinNormal = 0x1p-6f;

// e4m3 code of v (to_f8e4m3(v)).
inline uint8_t encode(float v) {
  const uint32_t u = std::bit_cast<uint32_t>(v);
  const uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80);
  const uint32_t ua = u & 0x7FFFFFFFu;
  const float a = std::bit_cast<float>(ua);
  if (a != a) return sign | 0x7F;
  if (a > kF8E4M3Max) return sign | 0x7E;
  if (a < kMinNormal) return sign | static_cast<uint8_t>(std::bit_cast<uint32_t>(a + 0x1p14f) - kSubnormalMagic);
  return sign | static_cast<uint8_t>(((ua + 0x7FFFFu + ((ua >> 20) & 1u)) >> 20) - (120u << 3));
}

// Source element loads: f32 as is, bf16 (given as its bits) widened exactly.
inline float load(const float* p) { return *p; }
inline float load(const uint16_t* p) { return detail::bf16_to_float(*p); }

#ifdef CM_FP8_AVX2
inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const uint16_t* p) {
  const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}

// Eight codes (one per 32-bit lane, 0..255) of v.
inline __m256i encode8(__m256 v) {
  const __m256i u = _mm256_castps_si256(v);
  const __m256i sign = _mm256_and_si256(_mm256_srli_epi32(u, 24), _mm256_set1_epi32(0x80));
  const __m256i ua = _mm256_and_si256(u, _mm256_set1_epi32(0x7FFFFFFF));
  const __m256 a = _mm256_castsi256_ps(ua);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(ua, 20), _mm256_set1_epi32(1));
  const __m256i rounded = _mm256_add_epi32(ua, _mm256_add_epi32(_mm256_set1_epi32(0x7FFFF), lsb));
  const __m256i normal = _mm256_sub_epi32(_mm256_srli_epi32(rounded, 20), _mm256_set1_epi32(120 << 3));
  const __m256i subnormal = _mm256_sub_epi32(
      _mm256_castps_si256(_mm256_add_ps(a, _mm256_set1_ps(0x1p14f))), _mm256_set1_epi32(kSubnormalMagic));
  __m256i code = _mm256_blendv_epi8(
      normal, subnormal, _mm256_castps_si256(_mm256_cmp_ps(a, _mm256_set1_ps(kMinNormal), _CMP_LT_OQ)));
  code = _mm256_blendv_epi8(code, _mm256_set1_epi32(0x7E),
                            _mm256_castps_si256(_mm256_cmp_ps(a, _mm256_set1_ps(kF8E4M3Max), _CMP_GT_OQ)));
  code = _mm256_blendv_epi8(code, _mm256_set1_epi32(0x7F), _mm256_castps_si256(_mm256_cmp_ps(a, a, _CMP_UNORD_Q)));
  return _mm256_or_si256(code, sign);
}

// Packs the 32 codes of c0..c3 (in that order) into 32 bytes at dst.
inline void store32(__m256i c0, __m256i c1, __m256i c2, __m256i c3, uint8_t* dst) {
  // packus works within 128-bit lanes: lane 0 gets c0[0..3] c1[0..3] c2[0..3]
  // c3[0..3], lane 1 the upper halves; the permute restores element order.
  const __m256i bytes = _mm256_packus_epi16(_mm256_packus_epi32(c0, c1), _mm256_packus_epi32(c2, c3));
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst), _mm256_permutevar8x32_epi32(bytes, order));
}
#endif

// max_i |x[i]| over n elements, NaNs skipped; 0 for n = 0.
template <typename Src>
inline float amax(const Src* x, int64_t n) {
  int64_t i = 0;
  float m = 0.0f;
#ifdef CM_FP8_AVX2
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  __m256 m0 = _mm256_setzero_ps(), m1 = m0;
  // max_ps returns its second operand when either is NaN: the accumulator.
  for (; i + 16 <= n; i += 16) {
    m0 = _mm256_max_ps(_mm256_and_ps(load8(x + i), abs_mask), m0);
    m1 = _mm256_max_ps(_mm256_and_ps(load8(x + i + 8), abs_mask), m1);
  }
  for (; i + 8 <= n; i += 8) m0 = _mm256_max_ps(_mm256_and_ps(load8(x + i), abs_mask), m0);
  m0 = _mm256_max_ps(m0, m1);
  __m128 h = _mm_max_ps(_mm256_castps256_ps128(m0), _mm256_extractf128_ps(m0, 1));
  h = _mm_max_ps(h, _mm_movehl_ps(h, h));
  h = _mm_max_ss(h, _mm_shuffle_ps(h, h, 1));
  m = _mm_cvtss_f32(h);
#endif
  // A comparison skips NaNs of every kind; std::fmax may return NaN for a
  // signalling one (glibc), which would drop the maximum seen so far.
  for (; i < n; ++i) {
    const float a = std::fabs(load(x + i));
    if (a > m) m = a;
  }
  return m;
}

// dst[i] = e4m3(x[i] / scale) for n elements (a true division, as the reference).
template <typename Src>
inline void encode_scaled(const Src* x, int64_t n, float scale, uint8_t* dst) {
  int64_t i = 0;
#ifdef CM_FP8_AVX2
  const __m256 s = _mm256_set1_ps(scale);
  for (; i + 32 <= n; i += 32)
    store32(encode8(_mm256_div_ps(load8(x + i), s)), encode8(_mm256_div_ps(load8(x + i + 8), s)),
            encode8(_mm256_div_ps(load8(x + i + 16), s)), encode8(_mm256_div_ps(load8(x + i + 24), s)),
            dst + i);
#endif
  for (; i < n; ++i) dst[i] = encode(load(x + i) / scale);
}

// out[i] = to_float(e4m3 code[i]) * scale for n elements.
inline void decode_scaled(const uint8_t* code, int64_t n, float scale, float* out) {
  const float* table = detail::f8e4m3_table();
  int64_t i = 0;
#ifdef CM_FP8_AVX2
  const __m256 s = _mm256_set1_ps(scale), nan = _mm256_set1_ps(table[0x7F]);
  const __m256i mag_mask = _mm256_set1_epi32(0x7F), rebias = _mm256_set1_epi32(120 << 23);
  for (; i + 8 <= n; i += 8) {
    int64_t eight;
    std::memcpy(&eight, code + i, 8);
    const __m256i c = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(eight));
    const __m256i m = _mm256_and_si256(c, mag_mask);
    const __m256 normal = _mm256_castsi256_ps(_mm256_add_epi32(_mm256_slli_epi32(m, 20), rebias));
    const __m256 subnormal = _mm256_mul_ps(_mm256_cvtepi32_ps(m), _mm256_set1_ps(0x1p-9f));
    __m256 v = _mm256_blendv_ps(normal, subnormal,
                                _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(8), m)));
    const __m256i sign = _mm256_slli_epi32(_mm256_andnot_si256(mag_mask, c), 24);
    v = _mm256_or_ps(v, _mm256_castsi256_ps(sign));
    v = _mm256_blendv_ps(v, nan, _mm256_castsi256_ps(_mm256_cmpeq_epi32(m, mag_mask)));
    _mm256_storeu_ps(out + i, _mm256_mul_ps(v, s));
  }
#endif
  for (; i < n; ++i) out[i] = table[code[i]] * scale;
}

}  // namespace coremesh::ops::fp8
