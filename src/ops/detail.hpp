// Internals shared by the kernels of src/ops: tiling lookup through the op
// cache, launch on the current stream, balanced block ranges, element
// conversion and single-threaded BLAS tiles.
//
// Every kernel follows the same three steps:
//   1. plan():   look up its tiling in OpCache under the current stream's
//                effective limits (the key holds op, shapes, dtypes, limits,
//                attrs), computing it on a miss from max_blocks(limits, kind);
//   2. launch(): enqueue the body on the current stream with that block_dim;
//   3. the body: block b of n works on split_range(items, b, n, align).
// Bodies capture Tensor handles by value so storage outlives the kernel.
#pragma once

#include <cblas.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "coremesh/core/dtype.hpp"
#include "coremesh/core/error.hpp"
#include "coremesh/core/tensor.hpp"
#include "coremesh/runtime/device.hpp"
#include "coremesh/runtime/op_cache.hpp"
#include "coremesh/runtime/stream.hpp"
#include "sgemm_avx2.hpp"

namespace coremesh::ops::detail {

using runtime::BlockContext;
using runtime::KernelKind;

// Block `part` of `parts` over [0, n): balanced, boundaries multiple of `align`.
inline std::pair<int64_t, int64_t> split_range(int64_t n, int part, int parts, int64_t align = 1) {
  const int64_t units = (n + align - 1) / align;
  const int64_t b = units * part / parts, e = units * (part + 1) / parts;
  return {std::min(n, b * align), std::min(n, e * align)};
}

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Rows [r0, r1) of unit `unit`.
struct UnitRows {
  int64_t unit, r0, r1;
};

// Block `part` of `parts` over units of unequal cost whose cost is spread
// evenly over their rows (rows[u] rows each), given the prefix sums of the
// costs (prefix[0] = 0, prefix[u+1] = cost of units 0..u). Each boundary is
// the point of an equal share of the total cost, inside a unit, rounded to
// `align` rows: shares differ by at most `align` rows of one unit, not up to
// half a unit. Neighbouring blocks compute the same boundary, so the pieces of
// all blocks cover every row of every unit (zero-cost ones too) exactly once.
inline std::vector<UnitRows> split_rows_by_cost(const std::vector<int64_t>& prefix,
                                                const std::vector<int64_t>& rows, int part,
                                                int parts, int64_t align) {
  const int64_t units = static_cast<int64_t>(rows.size());
  auto boundary = [&](int p) -> std::pair<int64_t, int64_t> {  // (unit, row)
    if (p <= 0) return {0, 0};
    if (p >= parts) return {units, 0};
    const int64_t target = static_cast<int64_t>(static_cast<double>(prefix.back()) * p / parts);
    const int64_t u = std::upper_bound(prefix.begin(), prefix.end(), target) - prefix.begin() - 1;
    if (u >= units) return {units, 0};
    const int64_t cost = prefix[u + 1] - prefix[u];
    const double at = static_cast<double>(target - prefix[u]) * rows[u] / cost;
    return {u, std::min(rows[u], static_cast<int64_t>(at / align + 0.5) * align)};
  };
  const auto [ua, ra] = boundary(part);
  const auto [ub, rb] = boundary(part + 1);
  std::vector<UnitRows> pieces;
  for (int64_t u = ua; u <= std::min(ub, units - 1); ++u) {
    const int64_t r0 = u == ua ? ra : 0, r1 = u == ub ? rb : rows[u];
    if (r0 < r1) pieces.push_back({u, r0, r1});
  }
  return pieces;
}

// Tiling of a kernel whose work is `items` independent units (rows, tiles,
// heads): block_dim blocks, each gets a range aligned to `align` units.
struct Tiling {
  int block_dim = 1;
  int64_t align = 1;
  int64_t tile_m = 0, tile_n = 0;  // GEMM-like kernels: tile sizes (0 = unused)
};

struct Plan {
  uint64_t cache_id = 0;
  Tiling tiling;
};

// Looks up (or makes) the tiling of `op` under the current stream's limits.
// make(max_blocks) returns the tiling; block_dim is clamped to [1, max_blocks].
Plan plan(std::string op, KernelKind kind, std::vector<Shape> shapes, std::vector<DType> dtypes,
          std::string attrs, const std::function<Tiling(int max_blocks)>& make);

// The common case: `items` work units of `unit_cost` elements each. Blocks
// get at least ~kMinBlockWork elements so tiny ops do not fan out.
Plan plan_rows(std::string op, KernelKind kind, std::vector<Shape> shapes,
               std::vector<DType> dtypes, std::string attrs, int64_t items, int64_t unit_cost);

inline constexpr int64_t kMinBlockWork = 2048;

// Enqueues body on the current stream.
void launch(std::string name, KernelKind kind, const Plan& plan, runtime::KernelBody body);

// plan_rows + launch; body(begin, end) gets the block's item range.
template <typename Body>
void launch_rows(const std::string& op, KernelKind kind, std::vector<Shape> shapes,
                 std::vector<DType> dtypes, std::string attrs, int64_t items, int64_t unit_cost,
                 Body body) {
  if (items <= 0) return;
  Plan p = plan_rows(op, kind, std::move(shapes), std::move(dtypes), std::move(attrs), items,
                     unit_cost);
  const int64_t align = p.tiling.align;
  launch(op, kind, p, [items, align, body](const BlockContext& ctx) {
    auto [begin, end] = split_range(items, ctx.block_idx, ctx.block_dim, align);
    if (begin < end) body(begin, end);
  });
}

// openblas_set_num_threads(1) once per process: tiles run single-threaded,
// parallelism comes from the runtime's blocks.
void blas_single_thread();

// C(m,n) = alpha * op(A) op(B) + beta * C, row-major, single-threaded: our
// AVX2 kernel (sgemm_avx2.hpp, ~10% faster than OpenBLAS on the training
// shapes) where compiled for it, else OpenBLAS.
inline void sgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                  const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
                  int64_t ldc) {
  if (m == 0 || n == 0) return;
#ifdef COREMESH_HAS_SGEMM_AVX2
  if (alpha == 1.0f) return sgemm_avx2(trans_a, trans_b, m, n, k, a, lda, b, ldb, beta, c, ldc);
#endif
  if (k == 0) {
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) c[i * ldc + j] = beta == 0.0f ? 0.0f : beta * c[i * ldc + j];
    return;
  }
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
              static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), alpha, a,
              static_cast<int>(lda), b, static_cast<int>(ldb), beta, c, static_cast<int>(ldc));
}

// Block `part`'s GEMM pieces, balanced with the other blocks' through
// `share` (row_share.hpp); each block runs its own without a share (or
// without the AVX2 kernel).
inline void sgemm_pieces([[maybe_unused]] RowShare* share, [[maybe_unused]] int part, const GemmShape& shape,
                         std::vector<GemmPiece> pieces) {
#ifdef COREMESH_HAS_SGEMM_AVX2
  if (share) return sgemm_avx2_shared(*share, part, shape, std::move(pieces));
#endif
  for (const GemmPiece& p : pieces)
    sgemm(shape.trans_a, shape.trans_b, p.m, shape.n, p.k, 1.0f, p.a, shape.lda, p.b, shape.ldb, shape.beta, p.c,
          shape.ldc);
}

// Exact decode table of all 256 f8e4m3 codes.
const float* f8e4m3_table();

// Converts n elements of `dtype` at src to float (exact for bf16 and fp8).
void load_float(const void* src, DType dtype, int64_t n, float* dst);

// Converts n floats to `dtype` at dst (rounding of core/dtype.hpp).
void store_float(const float* src, int64_t n, DType dtype, void* dst);

inline float bf16_to_float(uint16_t bits) {
  uint32_t u = static_cast<uint32_t>(bits) << 16;
  float f;
  __builtin_memcpy(&f, &u, 4);
  return f;
}

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

// exp(x) with ~2 ulp error (Cephes polynomial, Cody-Waite reduction);
// inputs are clamped to [-87, 88.7] (x < -87 gives ~1.6e-38, not 0).
inline float fast_exp(float x) {
  x = x < -87.0f ? -87.0f : (x > 88.7f ? 88.7f : x);
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

// Rows of a (..., C) tensor: numel / C (C = last dimension).
inline int64_t rows_of(const Tensor& t) { return t.dim() == 0 || t.size(-1) == 0 ? 0 : t.numel() / t.size(-1); }

// Checks used at API boundaries.
void check_contiguous(const Tensor& t, const char* what);
void check_dtype(const Tensor& t, DType dtype, const char* what);
void check_shape(const Tensor& t, const Shape& shape, const char* what);
std::string key_attrs(std::initializer_list<std::pair<const char*, double>> attrs);

}  // namespace coremesh::ops::detail
