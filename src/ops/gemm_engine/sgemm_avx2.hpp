// Single-threaded f32 GEMM for x86-64 AVX2+FMA, tuned for the training step's
// shapes (M ~ 150..1024, K and N 256..1536) with operands that are cold in
// cache. See sgemm_avx2.cpp for the blocking scheme.
#pragma once

#include <cstdint>
#include <vector>

#include "row_share.hpp"

namespace coremesh::ops::detail {

// What the pieces of a shared launch (row_share.hpp) have in common.
struct GemmShape {
  bool trans_a = false, trans_b = false;
  int64_t n = 0, lda = 0, ldb = 0, ldc = 0;
  float beta = 0.0f;
};

#if defined(__AVX2__) && defined(__FMA__)
#define COREMESH_HAS_SGEMM_AVX2 1

// Row-major C (m,n) = op(A) op(B) + beta * C, like cblas_sgemm(CblasRowMajor)
// with alpha = 1. op(A) is (m,k): A stored (m,k), or (k,m) with trans_a.
// op(B) is (k,n): B stored (k,n), or (n,k) with trans_b. With beta == 0, C is
// never read (NaNs in it do not propagate).
void sgemm_avx2(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const float* a,
                int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc);

// Runs part `part`'s pieces through `share` (row_share.hpp), then helps the
// other parts until nothing is left to take. Every micro-tile is computed
// exactly as sgemm_avx2 computes it on its piece, so C is bit-identical
// whichever core runs it.
void sgemm_avx2_shared(RowShare& share, int part, const GemmShape& shape, std::vector<GemmPiece> pieces);

// How many items the piece's last K step opens in a RowShare.
int64_t sgemm_avx2_items(const GemmShape& shape, const GemmPiece& piece);

#endif

}  // namespace coremesh::ops::detail
