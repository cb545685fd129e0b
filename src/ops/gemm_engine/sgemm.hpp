// The GEMM engine's entry points for the kernels of src/ops: one
// single-threaded GEMM per tile (parallelism comes from the runtime's
// blocks), dispatched to our AVX2 kernel (sgemm_avx2.hpp) where the build
// targets AVX2+FMA and to OpenBLAS otherwise, and the blocks of one launch
// balanced through a RowShare (row_share.hpp). Small L1-sized tiles go to
// small_gemm.hpp instead.
#pragma once

#include <cblas.h>

#include <cstdint>
#include <utility>
#include <vector>

#include "row_share.hpp"
#include "sgemm_avx2.hpp"

namespace coremesh::ops::detail {

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

}  // namespace coremesh::ops::detail
