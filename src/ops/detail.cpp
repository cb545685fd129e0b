#include "detail.hpp"

#include <fmt/format.h>

#include <array>
#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define CM_OPS_AVX2 1
#endif
#include <cstring>
#include <mutex>

namespace coremesh::ops::detail {

Plan plan(std::string op, KernelKind kind, std::vector<Shape> shapes, std::vector<DType> dtypes,
          std::string attrs, const std::function<Tiling(int max_blocks)>& make) {
  const runtime::CoreLimits limits = runtime::current_stream().effective_limits();
  const int max_blocks = std::max(1, runtime::max_blocks(limits, kind));
  runtime::OpKey key{std::move(op), std::move(shapes), std::move(dtypes), limits, std::move(attrs)};
  auto [id, tiling] = runtime::OpCache::global().get<Tiling>(key, [&] {
    Tiling t = make(max_blocks);
    t.block_dim = std::clamp(t.block_dim, 1, max_blocks);
    t.align = std::max<int64_t>(t.align, 1);
    return t;
  });
  return Plan{id, *tiling};
}

Plan plan_rows(std::string op, KernelKind kind, std::vector<Shape> shapes,
               std::vector<DType> dtypes, std::string attrs, int64_t items, int64_t unit_cost) {
  return plan(std::move(op), kind, std::move(shapes), std::move(dtypes), std::move(attrs),
              [&](int max_blocks) {
                Tiling t;
                const int64_t cost = std::max<int64_t>(unit_cost, 1);
                t.align = std::max<int64_t>(1, kMinBlockWork / cost);
                t.block_dim = static_cast<int>(
                    std::min<int64_t>(max_blocks, ceil_div(items, t.align)));
                return t;
              });
}

void launch(std::string name, KernelKind kind, const Plan& plan, runtime::KernelBody body) {
  runtime::current_stream().launch(
      runtime::LaunchInfo{std::move(name), kind, plan.tiling.block_dim, plan.cache_id},
      std::move(body));
}

void blas_single_thread() {
  static std::once_flag once;
  std::call_once(once, [] { openblas_set_num_threads(1); });
}

const float* f8e4m3_table() {
  static const std::array<float, 256> table = [] {
    std::array<float, 256> t{};
    for (int c = 0; c < 256; ++c) t[c] = to_float(f8e4m3{static_cast<uint8_t>(c)});
    return t;
  }();
  return table.data();
}

void load_float(const void* src, DType dtype, int64_t n, float* dst) {
  switch (dtype) {
    case DType::f32: std::memcpy(dst, src, static_cast<size_t>(n) * 4); return;
    case DType::bf16: {
      const uint16_t* s = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_float(s[i]);
      return;
    }
    case DType::f8e4m3: {
      const uint8_t* s = static_cast<const uint8_t*>(src);
      const float* table = f8e4m3_table();
      for (int64_t i = 0; i < n; ++i) dst[i] = table[s[i]];
      return;
    }
    case DType::f8e5m2: {
      const f8e5m2* s = static_cast<const f8e5m2*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = to_float(s[i]);
      return;
    }
    default:
      CM_CHECK(false, "pass a floating-point tensor", "cannot load {} as float", dtype_name(dtype));
  }
}

void store_float(const float* src, int64_t n, DType dtype, void* dst) {
  switch (dtype) {
    case DType::f32: std::memcpy(dst, src, static_cast<size_t>(n) * 4); return;
    case DType::bf16: {
      bf16* d = static_cast<bf16*>(dst);
      for (int64_t i = 0; i < n; ++i) d[i] = to_bf16(src[i]);
      return;
    }
    case DType::f8e4m3: {
      f8e4m3* d = static_cast<f8e4m3*>(dst);
      for (int64_t i = 0; i < n; ++i) d[i] = to_f8e4m3(src[i]);
      return;
    }
    case DType::f8e5m2: {
      f8e5m2* d = static_cast<f8e5m2*>(dst);
      for (int64_t i = 0; i < n; ++i) d[i] = to_f8e5m2(src[i]);
      return;
    }
    default:
      CM_CHECK(false, "pass a floating-point dtype", "cannot store float as {}", dtype_name(dtype));
  }
}

#ifdef CM_OPS_AVX2
namespace {
// Eight lanes of fast_exp (same polynomial and reduction).
inline __m256 exp8(__m256 x) {
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.0f)), _mm256_set1_ps(88.7f));
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
  return _mm256_mul_ps(y, _mm256_castsi256_ps(bits));
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

void check_contiguous(const Tensor& t, const char* what) {
  CM_CHECK(t.defined(), "pass a defined tensor", "{} is undefined", what);
  CM_CHECK(t.is_contiguous(), "call .contiguous() first", "{} must be contiguous, got {}", what,
           t.describe());
}

void check_dtype(const Tensor& t, DType dtype, const char* what) {
  CM_CHECK(t.dtype() == dtype, "convert it with .to(dtype)", "{} must be {}, got {}", what,
           dtype_name(dtype), dtype_name(t.dtype()));
}

void check_shape(const Tensor& t, const Shape& shape, const char* what) {
  CM_CHECK(t.shape() == shape, "pass a tensor of the expected shape", "{} must have shape {}, got {}",
           what, shape_str(shape), shape_str(t.shape()));
}

std::string key_attrs(std::initializer_list<std::pair<const char*, double>> attrs) {
  std::string s;
  for (auto& [name, value] : attrs) s += fmt::format("{}={};", name, value);
  return s;
}

}  // namespace coremesh::ops::detail
