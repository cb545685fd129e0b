// Blocking scheme (Goto/BLIS loop nest, sized for a Zen core: 32 KiB L1d,
// 512 KiB L2):
//
//   for jc in N step NC          B panel  KC x NC, packed per (jc, pc)  (L3)
//    for pc in K step KC         C updated K/KC times
//     for ic in M step MC        A block  MC x KC                       (L2)
//      for jr in NC step 16      B sliver KC x 16 = 16 KiB              (L1)
//       for ir in MC step 6      6x16 micro-kernel, 12 ymm accumulators
//
// 6x16 uses 12 accumulators + 2 B vectors + 1 broadcast of the 16 ymm
// registers, and needs 8 loads per 12 FMAs (Zen: 2 loads and 2 FMAs/cycle).
//
// Why it beats OpenBLAS 0.3.21 (about 10% on the training shapes, measured
// with operands evicted from cache, as they are inside a training step):
//  - With beta == 0 C is written without being zeroed (OpenBLAS runs a
//    separate beta pass over C first, then reads it back).
//  - Software prefetch (worth ~8% cold in all, a few % each), spread over
//    the micro-kernel calls so requests never pile up: the C tile at the
//    start of its micro-kernel (prefetchw), the next A block during the
//    current one, the next B sliver's source while the first A block runs,
//    and a few rows ahead inside the packing loops (which start cold).
//  - B is packed lazily, sliver by sliver, during the first A block, so no
//    separate packing pass waits on DRAM.
//  - A is used in place when its rows are contiguous (no packing pass); only
//    a transposed A is packed (read in place it strides by lda per k and
//    thrashes L1/L2 sets).
// Tried and dropped: KC 384/512 (B sliver no longer fits L1 with A: slower),
// prefetching the next KC step's first A block and B sliver (slower),
// prefetching the next C tile instead of the current one (no gain).
#include "sgemm_avx2.hpp"

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>

namespace coremesh::ops::detail {
namespace {

constexpr int64_t kMr = 6;     // micro-tile rows: 6 broadcasts of A per k
constexpr int64_t kNr = 16;    // micro-tile columns: 2 ymm of B per k
constexpr int64_t kKc = 256;   // A sliver 6 KiB + B sliver 16 KiB fit L1
constexpr int64_t kMc = 96;    // A block 96 KiB stays in L2 with B slivers
constexpr int64_t kNc = 1536;  // widest N of the training shapes: one panel
constexpr int64_t kLine = 64;

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
int64_t round_up(int64_t a, int64_t b) { return ceil_div(a, b) * b; }

// 64-byte aligned scratch that grows on demand, one per thread.
class Scratch {
 public:
  float* get(int64_t floats) {
    if (floats > size_) {
      buf_.reset(static_cast<float*>(std::aligned_alloc(kLine, round_up(floats * 4, kLine))));
      if (!buf_) throw std::bad_alloc();
      size_ = floats;
    }
    return buf_.get();
  }

 private:
  struct Free {
    void operator()(float* p) const { std::free(p); }
  };
  std::unique_ptr<float, Free> buf_;
  int64_t size_ = 0;
};

// Prefetches a 2-D region (rows of row_bytes, stride_bytes apart) a few
// cache lines per call, so that the whole region is in cache after `calls`
// calls of step() and the requests never pile up in the miss buffers.
class RegionPrefetcher {
 public:
  RegionPrefetcher() = default;
  RegionPrefetcher(const float* base, int64_t rows, int64_t row_bytes, int64_t stride_bytes,
                   int64_t calls)
      : row_(reinterpret_cast<const char*>(base)), rows_(rows), row_bytes_(row_bytes),
        stride_(stride_bytes) {
    const int64_t lines = rows * (ceil_div(row_bytes, kLine) + 1);
    per_call_ = rows > 0 ? ceil_div(lines, std::max<int64_t>(calls, 1)) : 0;
    start_row();
  }

  void step() {
    for (int64_t i = 0; i < per_call_ && rows_ > 0; ++i) {
      _mm_prefetch(cur_, _MM_HINT_T0);
      cur_ += kLine;
      if (cur_ >= end_) {
        row_ += stride_;
        --rows_;
        start_row();
      }
    }
  }

 private:
  void start_row() {
    const auto p = reinterpret_cast<uintptr_t>(row_);
    cur_ = reinterpret_cast<const char*>(p & ~uintptr_t(kLine - 1));
    end_ = row_ + row_bytes_;
  }

  const char* row_ = nullptr;
  const char* cur_ = nullptr;
  const char* end_ = nullptr;
  int64_t rows_ = 0, row_bytes_ = 0, stride_ = 0, per_call_ = 0;
};

// One row of the micro-tile: (lo, hi) += a[0] * (b0, b1).
[[gnu::always_inline]] inline void row_update(const float* a, __m256 b0, __m256 b1, __m256& lo, __m256& hi) {
  const __m256 x = _mm256_broadcast_ss(a);
  lo = _mm256_fmadd_ps(x, b0, lo);
  hi = _mm256_fmadd_ps(x, b1, hi);
}

// c (6x16, row stride ldc) = A B + beta c, beta == 0 never reading c.
// Row i of A is a_i[p * kAStep] for p < kc (kAStep 1: rows of A in place,
// 6: a packed sliver); bp is a packed KC x 16 sliver. Accumulators are named
// variables: GCC spills an array of __m256.
template <int64_t kAStep>
[[gnu::always_inline]] inline void kernel_6x16(int64_t kc, const float* a0, const float* a1,
                                               const float* a2, const float* a3,
                                               const float* a4, const float* a5,
                                               const float* __restrict bp, float* c,
                                               int64_t ldc, float beta) {
  // The C tile is needed only at the end: its RFO/read overlaps the loop.
  for (int64_t i = 0; i < kMr; ++i) {
    __builtin_prefetch(c + i * ldc, 1, 3);
    __builtin_prefetch(c + i * ldc + kNr - 1, 1, 3);
  }
  __m256 c00 = _mm256_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00;
  __m256 c30 = c00, c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00;
#pragma GCC unroll 4
  for (int64_t p = 0; p < kc; ++p) {
    const __m256 b0 = _mm256_load_ps(bp + p * kNr);
    const __m256 b1 = _mm256_load_ps(bp + p * kNr + 8);
    const int64_t o = p * kAStep;
    row_update(a0 + o, b0, b1, c00, c01);
    row_update(a1 + o, b0, b1, c10, c11);
    row_update(a2 + o, b0, b1, c20, c21);
    row_update(a3 + o, b0, b1, c30, c31);
    row_update(a4 + o, b0, b1, c40, c41);
    row_update(a5 + o, b0, b1, c50, c51);
  }
  const __m256 vb = _mm256_set1_ps(beta);
  auto store = [&](float* row, __m256 v0, __m256 v1) {
    if (beta != 0.0f) {
      v0 = _mm256_fmadd_ps(vb, _mm256_loadu_ps(row), v0);
      v1 = _mm256_fmadd_ps(vb, _mm256_loadu_ps(row + 8), v1);
    }
    _mm256_storeu_ps(row, v0);
    _mm256_storeu_ps(row + 8, v1);
  };
  store(c, c00, c01);
  store(c + ldc, c10, c11);
  store(c + 2 * ldc, c20, c21);
  store(c + 3 * ldc, c30, c31);
  store(c + 4 * ldc, c40, c41);
  store(c + 5 * ldc, c50, c51);
}

// One micro-tile of an mr x nr (<= 6 x 16) corner of C: computed into a
// local tile, then merged.
template <int64_t kAStep>
void edge_tile(int64_t mr, int64_t nr, int64_t kc, const float* const* a, const float* bp,
               float* c, int64_t ldc, float beta) {
  alignas(32) float tile[kMr * kNr];
  kernel_6x16<kAStep>(kc, a[0], a[1], a[2], a[3], a[4], a[5], bp, tile, kNr, 0.0f);
  for (int64_t i = 0; i < mr; ++i) {
    float* row = c + i * ldc;
    for (int64_t j = 0; j < nr; ++j) {
      row[j] = beta == 0.0f ? tile[i * kNr + j] : tile[i * kNr + j] + beta * row[j];
    }
  }
}

// Transposes 8 rows of 8 floats (r[i] = row i) into columns.
void transpose8(__m256 r[8]) {
  __m256 t[8];
  for (int i = 0; i < 4; ++i) {
    t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  __m256 u[8];
  for (int i = 0; i < 2; ++i) {
    const int b = 4 * i;
    u[b + 0] = _mm256_shuffle_ps(t[b], t[b + 2], _MM_SHUFFLE(1, 0, 1, 0));
    u[b + 1] = _mm256_shuffle_ps(t[b], t[b + 2], _MM_SHUFFLE(3, 2, 3, 2));
    u[b + 2] = _mm256_shuffle_ps(t[b + 1], t[b + 3], _MM_SHUFFLE(1, 0, 1, 0));
    u[b + 3] = _mm256_shuffle_ps(t[b + 1], t[b + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  for (int i = 0; i < 4; ++i) {
    r[i] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x20);
    r[i + 4] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x31);
  }
}

// How many rows (or lines) ahead the packing loops prefetch a cold source.
constexpr int64_t kPackAhead = 8;

void prefetch_row(const float* row, int64_t floats) {
  for (int64_t i = 0; i < floats; i += kLine / 4) _mm_prefetch(row + i, _MM_HINT_T0);
  _mm_prefetch(row + floats - 1, _MM_HINT_T0);
}

// Packs op(B)[0:kc, 0:nr] (nr <= 16) into a kc x 16 sliver, zero-padded.
// b points at op(B)(0, 0): B stored (k, n), or (n, k) with trans_b.
void pack_b_sliver(int64_t kc, int64_t nr, const float* b, int64_t ldb, bool trans_b,
                   float* dst) {
  if (!trans_b && nr == kNr) {
    for (int64_t p = 0; p < kc; ++p) {
      if (p + kPackAhead < kc) prefetch_row(b + (p + kPackAhead) * ldb, kNr);
      _mm256_store_ps(dst + p * kNr, _mm256_loadu_ps(b + p * ldb));
      _mm256_store_ps(dst + p * kNr + 8, _mm256_loadu_ps(b + p * ldb + 8));
    }
    return;
  }
  int64_t p0 = 0;
  if (trans_b && nr == kNr) {
    // B stored (n, k): 8x8 transposes turn 8 rows of k into 8 sliver rows.
    for (; p0 + 8 <= kc; p0 += 8) {
      if (p0 % 16 == 0 && p0 + 16 * kPackAhead < kc) {
        for (int64_t j = 0; j < kNr; ++j) {
          _mm_prefetch(b + j * ldb + p0 + 16 * kPackAhead, _MM_HINT_T0);
        }
      }
      for (int64_t half = 0; half < 2; ++half) {
        __m256 r[8];
        for (int64_t j = 0; j < 8; ++j) r[j] = _mm256_loadu_ps(b + (half * 8 + j) * ldb + p0);
        transpose8(r);
        for (int64_t p = 0; p < 8; ++p) _mm256_store_ps(dst + (p0 + p) * kNr + half * 8, r[p]);
      }
    }
  }
  const int64_t rsb = trans_b ? 1 : ldb, csb = trans_b ? ldb : 1;
  for (int64_t p = p0; p < kc; ++p) {
    for (int64_t j = 0; j < kNr; ++j) dst[p * kNr + j] = j < nr ? b[p * rsb + j * csb] : 0.0f;
  }
}

// Packs op(A)[0:mc, 0:kc] of a transposed A (A(i, p) = a[p * lda + i]) into
// 6-row slivers [sliver][p][6], zero-padding the last one. Row p of the
// source is read once, front to back.
void pack_a_block_trans(int64_t mc, int64_t kc, const float* a, int64_t lda, float* dst) {
  const int64_t full = mc / kMr, rest = mc % kMr;
  for (int64_t p = 0; p < kc; ++p) {
    const float* src = a + p * lda;
    // Only needed for the first block (later ones were prefetched during
    // the block before): keeps a few strided rows in flight.
    if (p + kPackAhead < kc) prefetch_row(src + kPackAhead * lda, mc);
    float* out = dst + p * kMr;
    for (int64_t s = 0; s < full; ++s) {
      std::memcpy(out + s * kc * kMr, src + s * kMr, kMr * sizeof(float));
    }
    if (rest) {
      float* o = out + full * kc * kMr;
      for (int64_t t = 0; t < kMr; ++t) o[t] = t < rest ? src[full * kMr + t] : 0.0f;
    }
  }
}

struct Gemm {
  bool trans_a, trans_b;
  int64_t m, n, k;
  const float* a;
  int64_t lda;
  const float* b;
  int64_t ldb;
  float beta;
  float* c;
  int64_t ldc;

  // Source region of op(A)[i0:i0+mc, p0:p0+kc] as rows for the prefetcher.
  RegionPrefetcher a_prefetcher(int64_t i0, int64_t mc, int64_t p0, int64_t kc,
                                int64_t calls) const {
    if (mc <= 0) return {};
    if (trans_a) return {a + p0 * lda + i0, kc, mc * 4, lda * 4, calls};
    return {a + i0 * lda + p0, mc, kc * 4, lda * 4, calls};
  }
  // Source region of op(B)[p0:p0+kc, j0:j0+nr].
  RegionPrefetcher b_prefetcher(int64_t p0, int64_t kc, int64_t j0, int64_t nr,
                                int64_t calls) const {
    if (nr <= 0) return {};
    if (trans_b) return {b + j0 * ldb + p0, nr, kc * 4, ldb * 4, calls};
    return {b + p0 * ldb + j0, kc, nr * 4, ldb * 4, calls};
  }
  const float* b_at(int64_t p, int64_t j) const {
    return trans_b ? b + j * ldb + p : b + p * ldb + j;
  }

  // Rows per MC block: equal blocks, a multiple of 6 rows, rather than a
  // thin remainder block.
  int64_t block_rows() const { return m > 0 ? round_up(ceil_div(m, ceil_div(m, kMc)), kMr) : kMr; }
  // The last KC step of the last NC panel, which RowShare splits into items
  // (row block, sliver).
  int64_t last_pc() const { return (k - 1) / kKc * kKc; }
  int64_t last_jc() const { return (n - 1) / kNc * kNc; }
  int64_t last_slivers() const { return ceil_div(n - last_jc(), kNr); }
  int64_t items() const { return m > 0 && n > 0 && k > 0 ? ceil_div(m, block_rows()) * last_slivers() : 0; }

  // All steps, or all but the last one (left to items).
  void run(bool last_step = true) const;
  void block(int64_t ic, int64_t mc, int64_t mc_next, int64_t pc, int64_t kc, int64_t jc,
             int64_t nc, bool pack_b, float* bpack, float* apack) const;
  void micro_tiles(int64_t ic, int64_t mc, int64_t pc, int64_t kc, int64_t jc, int64_t jr, int64_t nr,
                   const float* bp, const float* apack, float beta_now, RegionPrefetcher& next_a,
                   RegionPrefetcher& next_b) const;
  void scale_c() const;
};

// One MC x NC block of C for one KC step; packs B slivers first if pack_b.
void Gemm::block(int64_t ic, int64_t mc, int64_t mc_next, int64_t pc, int64_t kc, int64_t jc,
                 int64_t nc, bool pack_b, float* bpack, float* apack) const {
  const float beta_now = pc == 0 ? beta : 1.0f;
  const int64_t slivers = ceil_div(nc, kNr), tiles = ceil_div(mc, kMr);
  RegionPrefetcher next_a = a_prefetcher(ic + mc, mc_next, pc, kc, slivers * tiles);
  if (trans_a) pack_a_block_trans(mc, kc, a + pc * lda + ic, lda, apack);

  for (int64_t s = 0; s < slivers; ++s) {
    const int64_t jr = s * kNr, nr = std::min(kNr, nc - jr);
    float* bp = bpack + jr * kc;
    RegionPrefetcher next_b;
    if (pack_b) {
      pack_b_sliver(kc, nr, b_at(pc, jc + jr), ldb, trans_b, bp);
      next_b = b_prefetcher(pc, kc, jc + jr + kNr, std::min(kNr, nc - jr - kNr), tiles);
    }
    micro_tiles(ic, mc, pc, kc, jc, jr, nr, bp, apack, beta_now, next_a, next_b);
  }
}

// Rows [ic, ic+mc) x columns [jc+jr, jc+jr+nr) of C for the KC step at pc, from
// a packed B sliver (and A block, if transposed).
void Gemm::micro_tiles(int64_t ic, int64_t mc, int64_t pc, int64_t kc, int64_t jc, int64_t jr, int64_t nr,
                       const float* bp, const float* apack, float beta_now, RegionPrefetcher& next_a,
                       RegionPrefetcher& next_b) const {
  for (int64_t ir = 0; ir < mc; ir += kMr) {
    const int64_t mr = std::min(kMr, mc - ir);
    next_a.step();
    next_b.step();
    float* ct = c + (ic + ir) * ldc + jc + jr;
    const float* r[kMr];
    if (trans_a) {
      const float* sl = apack + ir * kc;
      for (int64_t i = 0; i < kMr; ++i) r[i] = sl + i;
      if (mr == kMr && nr == kNr) {
        kernel_6x16<kMr>(kc, r[0], r[1], r[2], r[3], r[4], r[5], bp, ct, ldc, beta_now);
      } else {
        edge_tile<kMr>(mr, nr, kc, r, bp, ct, ldc, beta_now);
      }
    } else {
      const float* rows = a + (ic + ir) * lda + pc;
      for (int64_t i = 0; i < kMr; ++i) r[i] = rows + std::min(i, mr - 1) * lda;
      if (mr == kMr && nr == kNr) {
        kernel_6x16<1>(kc, r[0], r[1], r[2], r[3], r[4], r[5], bp, ct, ldc, beta_now);
      } else {
        edge_tile<1>(mr, nr, kc, r, bp, ct, ldc, beta_now);
      }
    }
  }
}

void Gemm::scale_c() const {
  for (int64_t i = 0; i < m; ++i) {
    float* row = c + i * ldc;
    for (int64_t j = 0; j < n; ++j) row[j] = beta == 0.0f ? 0.0f : beta * row[j];
  }
}

void Gemm::run(bool last_step) const {
  if (m <= 0 || n <= 0) return;
  if (k <= 0) {
    if (beta != 1.0f) scale_c();
    return;
  }
  const int64_t mc_even = block_rows();
  static thread_local Scratch bscratch, ascratch;
  float* bpack = bscratch.get(kKc * round_up(std::min(n, kNc), kNr));
  float* apack = trans_a ? ascratch.get(kKc * mc_even) : nullptr;

  for (int64_t jc = 0; jc < n; jc += kNc) {
    const int64_t nc = std::min(kNc, n - jc);
    for (int64_t pc = 0; pc < k; pc += kKc) {
      const int64_t kc = std::min(kKc, k - pc);
      if (!last_step && jc == last_jc() && pc == last_pc()) return;
      for (int64_t ic = 0; ic < m; ic += mc_even) {
        const int64_t mc = std::min(mc_even, m - ic);
        const int64_t mc_next = std::min(mc_even, m - ic - mc);
        block(ic, mc, mc_next, pc, kc, jc, nc, ic == 0, bpack, apack);
      }
    }
  }
}

// Runs items of pieces' last steps on this thread, keeping the packed B
// slivers and A block between items of the same piece.
class ItemRunner {
 public:
  ItemRunner(int64_t n, bool trans_a) {
    static thread_local Scratch bscratch, ascratch;  // apart from Gemm::run's
    bpack_ = bscratch.get(kKc * round_up(std::min(n, kNc), kNr));
    apack_ = trans_a ? ascratch.get(kKc * kMc) : nullptr;
  }

  // Item `item` of g; `own`: g's items come in order, so the next A block is
  // worth prefetching.
  void run(const Gemm& g, int64_t item, bool own) {
    const int64_t pc = g.last_pc(), kc = g.k - pc, jc = g.last_jc(), nc = g.n - jc;
    const int64_t slivers = ceil_div(nc, kNr), mc_even = g.block_rows();
    const int64_t blk = item / slivers, s = item % slivers, ic = blk * mc_even, mc = std::min(mc_even, g.m - ic);
    const float* src = g.trans_a ? g.a + pc * g.lda + ic : g.a + ic * g.lda + pc;
    if (src != a_src_ || mc != a_mc_ || kc != a_kc_) {  // a new row block
      a_src_ = src, a_mc_ = mc, a_kc_ = kc;
      if (g.trans_a) pack_a_block_trans(mc, kc, src, g.lda, apack_);
      next_a_ = own ? g.a_prefetcher(ic + mc, std::min(mc_even, g.m - ic - mc), pc, kc,
                                     (slivers - s) * ceil_div(mc, kMr))
                    : RegionPrefetcher{};
    }
    if (g.b != b_ || g.k != b_k_) packed_.fill(false), b_ = g.b, b_k_ = g.k;
    const int64_t jr = s * kNr, nr = std::min(kNr, nc - jr);
    float* bp = bpack_ + jr * kc;
    RegionPrefetcher next_b;
    if (!packed_[static_cast<size_t>(s)]) {
      pack_b_sliver(kc, nr, g.b_at(pc, jc + jr), g.ldb, g.trans_b, bp);
      packed_[static_cast<size_t>(s)] = true;
      if (s + 1 < slivers && !packed_[static_cast<size_t>(s + 1)])
        next_b = g.b_prefetcher(pc, kc, jc + jr + kNr, std::min(kNr, nc - jr - kNr), ceil_div(mc, kMr));
    }
    g.micro_tiles(ic, mc, pc, kc, jc, jr, nr, bp, apack_, pc == 0 ? g.beta : 1.0f, next_a_, next_b);
  }

 private:
  float *bpack_, *apack_;
  std::array<bool, kNc / kNr> packed_{};  // slivers of (b_, b_k_)'s last step in bpack_
  const float* b_ = nullptr;
  int64_t b_k_ = -1;
  const float* a_src_ = nullptr;  // the row block in apack_ (or being prefetched)
  int64_t a_mc_ = -1, a_kc_ = -1;
  RegionPrefetcher next_a_;
};

Gemm gemm_of(const GemmShape& s, const GemmPiece& p) {
  return Gemm{s.trans_a, s.trans_b, p.m, s.n, p.k, p.a, s.lda, p.b, s.ldb, s.beta, p.c, s.ldc};
}

}  // namespace

void sgemm_avx2(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const float* a,
                int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  Gemm{trans_a, trans_b, m, n, k, a, lda, b, ldb, beta, c, ldc}.run();
}

int64_t sgemm_avx2_items(const GemmShape& shape, const GemmPiece& piece) { return gemm_of(shape, piece).items(); }

void sgemm_avx2_shared(RowShare& share, int part, const GemmShape& shape, std::vector<GemmPiece> pieces) {
  if (shape.n <= 0) return;
  ItemRunner runner(shape.n, shape.trans_a);
  bool shareable = !pieces.empty() && static_cast<int64_t>(pieces.size()) <= RowShare::kMaxPieces;
  for (const GemmPiece& p : pieces) shareable = shareable && gemm_of(shape, p).items() <= RowShare::kMaxItems;
  if (!shareable) {  // nothing, or too much to describe: run it alone
    for (const GemmPiece& p : pieces) gemm_of(shape, p).run();
  } else {
    share.publish(part, std::move(pieces));
    for (int64_t i = 0; i >= 0; i = share.advance(part)) {
      const Gemm g = gemm_of(shape, share.piece(part, i));
      g.run(/*last_step=*/false);
      share.open(part, g.items());
      for (int64_t item; (item = share.take_front(part)) >= 0;) runner.run(g, item, true);
    }
  }
  // Then the others' pieces and items, until a pass finds none.
  for (bool took = true; took;) {
    took = false;
    for (int q = 1; q < share.parts(); ++q) {
      const int p = (part + q) % share.parts();
      for (RowShare::Take t; (t = share.take_back(p)).piece >= 0; took = true) {
        const Gemm g = gemm_of(shape, share.piece(p, t.piece));
        if (t.item < 0)
          g.run();
        else
          runner.run(g, t.item, false);
      }
    }
  }
}

}  // namespace coremesh::ops::detail

#endif
