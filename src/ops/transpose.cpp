// Transpose of the last two dimensions, cache-blocked.
// Notation: x (G, R, C) (leading dimensions flattened into G), y (G, C, R);
// S the tile side (kSide: 64 for 1-2 byte elements, 32 for 4-8 byte ones).
// A work unit is one S x S tile; block b of n takes the units
// split_range(G * ceil(R/S) * ceil(C/S), b, n). A tile copies its S runs of x
// into an L1 buffer, transposes it there by AVX2 micro-kernels (8x8, or 4x4
// for 8-byte elements; element by element at the ragged edges) and copies S
// runs out to y, while the next tile's runs of x are prefetched. Elements move
// as bits whatever the dtype.
#include "coremesh/ops/transpose.hpp"

#include <cstring>

#include "detail/checks.hpp"
#include "detail/launch.hpp"

#if defined(__AVX2__)
#include <immintrin.h>
#define CM_TRANSPOSE_AVX2 1
#endif

namespace coremesh::ops {
namespace {

using detail::ceil_div;

// Tile side by element size: 4 KiB (1-2 byte) to 8 KiB (8 byte) per tile.
template <typename T>
constexpr int64_t kSide = sizeof(T) <= 2 ? 64 : 32;
// Tile rows per band: units go column by column through a band of kBand tile
// rows, so kBand * S rows of x and S rows of y are in use at a time (pages
// within the TLB's reach even when every row is a page of its own).
constexpr int64_t kBand = 8;

// y[c * ldy + r] = x[r * ldx + c] for r < rows, c < cols, element by element.
template <typename T>
void transpose_scalar(const T* x, int64_t ldx, T* y, int64_t ldy, int64_t rows, int64_t cols) {
  for (int64_t c = 0; c < cols; ++c)
    for (int64_t r = 0; r < rows; ++r) y[c * ldy + r] = x[r * ldx + c];
}

#ifdef CM_TRANSPOSE_AVX2
// Micro-kernels: a full n x n block, x rows of stride ldx -> y rows of stride
// ldy. Unpacks and shuffles move bits, so NaN payloads survive.
template <typename T>
struct Micro;

// 8x8 bytes: pairs of rows interleaved byte-wise, then 16-bit, then 32-bit.
template <>
struct Micro<uint8_t> {
  static constexpr int64_t n = 8;
  static void run(const uint8_t* x, int64_t ldx, uint8_t* y, int64_t ldy) {
    __m128i r[8];
    for (int i = 0; i < 8; ++i) r[i] = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(x + i * ldx));
    const __m128i a0 = _mm_unpacklo_epi8(r[0], r[1]), a1 = _mm_unpacklo_epi8(r[2], r[3]);  // (row pair, column)
    const __m128i a2 = _mm_unpacklo_epi8(r[4], r[5]), a3 = _mm_unpacklo_epi8(r[6], r[7]);
    const __m128i b0 = _mm_unpacklo_epi16(a0, a1), b1 = _mm_unpackhi_epi16(a0, a1);  // rows 0-3: cols 0-3 | 4-7
    const __m128i b2 = _mm_unpacklo_epi16(a2, a3), b3 = _mm_unpackhi_epi16(a2, a3);  // rows 4-7
    const __m128i c[4] = {_mm_unpacklo_epi32(b0, b2), _mm_unpackhi_epi32(b0, b2),  // cols 0,1 | 2,3
                          _mm_unpacklo_epi32(b1, b3), _mm_unpackhi_epi32(b1, b3)};  // cols 4,5 | 6,7
    for (int i = 0; i < 4; ++i) {
      _mm_storel_epi64(reinterpret_cast<__m128i*>(y + 2 * i * ldy), c[i]);
      _mm_storel_epi64(reinterpret_cast<__m128i*>(y + (2 * i + 1) * ldy), _mm_unpackhi_epi64(c[i], c[i]));
    }
  }
};

// 8x8 of 16 bits: 16-bit, 32-bit, then 64-bit interleaves.
template <>
struct Micro<uint16_t> {
  static constexpr int64_t n = 8;
  static void run(const uint16_t* x, int64_t ldx, uint16_t* y, int64_t ldy) {
    __m128i r[8], a[8], b[8];
    for (int i = 0; i < 8; ++i) r[i] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x + i * ldx));
    for (int i = 0; i < 8; i += 2) {
      a[i] = _mm_unpacklo_epi16(r[i], r[i + 1]);      // rows i, i+1: cols 0-3
      a[i + 1] = _mm_unpackhi_epi16(r[i], r[i + 1]);  // cols 4-7
    }
    for (int h = 0; h < 8; h += 4) {  // rows h..h+3
      b[h] = _mm_unpacklo_epi32(a[h], a[h + 2]);          // cols 0,1
      b[h + 1] = _mm_unpackhi_epi32(a[h], a[h + 2]);      // cols 2,3
      b[h + 2] = _mm_unpacklo_epi32(a[h + 1], a[h + 3]);  // cols 4,5
      b[h + 3] = _mm_unpackhi_epi32(a[h + 1], a[h + 3]);  // cols 6,7
    }
    for (int i = 0; i < 4; ++i) {
      _mm_storeu_si128(reinterpret_cast<__m128i*>(y + 2 * i * ldy), _mm_unpacklo_epi64(b[i], b[i + 4]));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(y + (2 * i + 1) * ldy), _mm_unpackhi_epi64(b[i], b[i + 4]));
    }
  }
};

// 8x8 of 32 bits: pairs interleaved, 2x2 shuffles, then 128-bit halves.
template <>
struct Micro<uint32_t> {
  static constexpr int64_t n = 8;
  static void run(const uint32_t* x, int64_t ldx, uint32_t* y, int64_t ldy) {
    __m256 r[8], t[8];
    for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(reinterpret_cast<const float*>(x + i * ldx));
    for (int i = 0; i < 8; i += 2) {
      t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);      // rows i, i+1 interleaved, elements 0 1 | 4 5
      t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);  // elements 2 3 | 6 7
    }
    for (int i = 0; i < 8; i += 4) {
      r[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);          // column 0 | 4 of rows i..i+3
      r[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xEE);      // column 1 | 5
      r[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);  // column 2 | 6
      r[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xEE);  // column 3 | 7
    }
    for (int i = 0; i < 4; ++i) {
      _mm256_storeu_ps(reinterpret_cast<float*>(y + i * ldy), _mm256_permute2f128_ps(r[i], r[i + 4], 0x20));
      _mm256_storeu_ps(reinterpret_cast<float*>(y + (i + 4) * ldy), _mm256_permute2f128_ps(r[i], r[i + 4], 0x31));
    }
  }
};

// 4x4 of 64 bits: pairs interleaved, then 128-bit halves.
template <>
struct Micro<uint64_t> {
  static constexpr int64_t n = 4;
  static void run(const uint64_t* x, int64_t ldx, uint64_t* y, int64_t ldy) {
    __m256d r[4];
    for (int i = 0; i < 4; ++i) r[i] = _mm256_loadu_pd(reinterpret_cast<const double*>(x + i * ldx));
    const __m256d t0 = _mm256_unpacklo_pd(r[0], r[1]), t1 = _mm256_unpackhi_pd(r[0], r[1]);  // cols 0 2 | 1 3
    const __m256d t2 = _mm256_unpacklo_pd(r[2], r[3]), t3 = _mm256_unpackhi_pd(r[2], r[3]);
    double* out = reinterpret_cast<double*>(y);
    _mm256_storeu_pd(out, _mm256_permute2f128_pd(t0, t2, 0x20));
    _mm256_storeu_pd(out + ldy, _mm256_permute2f128_pd(t1, t3, 0x20));
    _mm256_storeu_pd(out + 2 * ldy, _mm256_permute2f128_pd(t0, t2, 0x31));
    _mm256_storeu_pd(out + 3 * ldy, _mm256_permute2f128_pd(t1, t3, 0x31));
  }
};
#endif

// As transpose_scalar, by full micro-kernel blocks where AVX2 is compiled in.
template <typename T>
void transpose_block(const T* x, int64_t ldx, T* y, int64_t ldy, int64_t rows, int64_t cols) {
#ifdef CM_TRANSPOSE_AVX2
  constexpr int64_t n = Micro<T>::n;
  const int64_t rn = rows / n * n, cn = cols / n * n;
  for (int64_t r = 0; r < rn; r += n)
    for (int64_t c = 0; c < cn; c += n) Micro<T>::run(x + r * ldx + c, ldx, y + c * ldy + r, ldy);
  transpose_scalar(x + cn, ldx, y + cn * ldy, ldy, rows, cols - cn);  // right edge, all rows
  transpose_scalar(x + rn * ldx, ldx, y + rn, ldy, rows - rn, cn);    // bottom edge
#else
  transpose_scalar(x, ldx, y, ldy, rows, cols);
#endif
}

// The tile rows [r0, r1) x columns [c0, c1) of one (R, C) matrix, staged
// through two contiguous L1 buffers: rows of x and of y move as whole runs,
// so the large strides (R and C elements, often a multiple of 4 KiB that maps
// every row to one cache set) are never walked element by element.
template <typename T>
void transpose_tile(const T* x, T* y, int64_t R, int64_t C, int64_t r0, int64_t r1, int64_t c0,
                    int64_t c1) {
  constexpr int64_t S = kSide<T>;
  alignas(64) T in[S * S];
  alignas(64) T out[S * S];
  const int64_t rows = r1 - r0, cols = c1 - c0;
  if (rows == S && cols == S) {  // full tile: runs of a constant size, copied inline
    for (int64_t r = 0; r < S; ++r) std::memcpy(in + r * S, x + (r0 + r) * C + c0, S * sizeof(T));
    transpose_block(in, S, out, S, S, S);
    for (int64_t c = 0; c < S; ++c) std::memcpy(y + (c0 + c) * R + r0, out + c * S, S * sizeof(T));
    return;
  }
  for (int64_t r = 0; r < rows; ++r)
    std::memcpy(in + r * S, x + (r0 + r) * C + c0, static_cast<size_t>(cols) * sizeof(T));
  transpose_block(in, S, out, S, rows, cols);
  for (int64_t c = 0; c < cols; ++c)
    std::memcpy(y + (c0 + c) * R + r0, out + c * S, static_cast<size_t>(rows) * sizeof(T));
}

template <typename T>
void run(const Tensor& x, const Tensor& y, int64_t G, int64_t R, int64_t C) {
  const int64_t side = kSide<T>, tr = ceil_div(R, side), tc = ceil_div(C, side);
  detail::launch_rows(
      "transpose", detail::KernelKind::vector, {x.shape()}, {x.dtype()}, "", {{x}, {y}}, G * tr * tc,
      side * side, [x, y, R, C, side, tr, tc](int64_t u0, int64_t u1) {
        const T* src = static_cast<const T*>(x.raw_data());
        T* dst = static_cast<T*>(y.raw_data());
        // unit -> first element of its tile in x: (g, band, tile column, tile row inside the band)
        auto origin = [&](int64_t u, int64_t& g, int64_t& r0, int64_t& c0) {
          g = u / (tr * tc);
          const int64_t v = u % (tr * tc), band = v / (kBand * tc);
          const int64_t in_band = std::min(kBand, tr - band * kBand), w = v - band * kBand * tc;
          r0 = (band * kBand + w % in_band) * side;
          c0 = w / in_band * side;
        };
        for (int64_t u = u0; u < u1; ++u) {
          int64_t g, r0, c0;
          origin(u, g, r0, c0);
          if (u + 1 < u1) {  // the next tile's runs of x, while this one is transposed
            int64_t gn, rn, cn;
            origin(u + 1, gn, rn, cn);
            const int64_t pitch = C * static_cast<int64_t>(sizeof(T));
            const int64_t bytes = std::min(side, C - cn) * static_cast<int64_t>(sizeof(T));
            const char* next = reinterpret_cast<const char*>(src + gn * R * C + rn * C + cn);
            for (int64_t r = 0; r < std::min(side, R - rn); ++r)
              for (int64_t b = 0; b < bytes; b += 64) __builtin_prefetch(next + r * pitch + b);
          }
          transpose_tile<T>(src + g * R * C, dst + g * R * C, R, C, r0, std::min(R, r0 + side), c0,
                            std::min(C, c0 + side));
        }
      });
}

}  // namespace

void transpose_out(const Tensor& x, const Tensor& y) {
  detail::check_contiguous(x, "x");
  detail::check_contiguous(y, "y");
  CM_CHECK(x.dim() >= 2, "pass a tensor (..., R, C) of at least 2 dimensions",
           "cannot transpose the last two dimensions of {}", x.describe());
  Shape want = x.shape();
  std::swap(want[want.size() - 2], want[want.size() - 1]);
  detail::check_shape(y, want, "y");
  detail::check_dtype(y, x.dtype(), "y");
  detail::check_disjoint(y, "y", x, "x");
  const int64_t R = x.size(-2), C = x.size(-1), G = R * C == 0 ? 0 : x.numel() / (R * C);
  switch (dtype_size(x.dtype())) {
    case 1: return run<uint8_t>(x, y, G, R, C);
    case 2: return run<uint16_t>(x, y, G, R, C);
    case 4: return run<uint32_t>(x, y, G, R, C);
    case 8: return run<uint64_t>(x, y, G, R, C);
  }
  CM_CHECK(false, "transpose a 1, 2, 4 or 8 byte dtype", "no transpose for {}", dtype_name(x.dtype()));
}

Tensor transpose(const Tensor& x) {
  CM_CHECK(x.dim() >= 2, "pass a tensor (..., R, C) of at least 2 dimensions",
           "cannot transpose the last two dimensions of {}", x.describe());
  Shape shape = x.shape();
  std::swap(shape[shape.size() - 2], shape[shape.size() - 1]);
  Tensor y = Tensor::empty(shape, x.dtype());
  transpose_out(x, y);
  return y;
}

}  // namespace coremesh::ops
