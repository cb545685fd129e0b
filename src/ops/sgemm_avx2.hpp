// Single-threaded f32 GEMM for x86-64 AVX2+FMA, tuned for the training step's
// shapes (M ~ 150..1024, K and N 256..1536) with operands that are cold in
// cache. See sgemm_avx2.cpp for the blocking scheme.
#pragma once

#include <cstdint>

namespace coremesh::ops::detail {

#if defined(__AVX2__) && defined(__FMA__)
#define COREMESH_HAS_SGEMM_AVX2 1

// Row-major C (m,n) = op(A) op(B) + beta * C, like cblas_sgemm(CblasRowMajor)
// with alpha = 1. op(A) is (m,k): A stored (m,k), or (k,m) with trans_a.
// op(B) is (k,n): B stored (k,n), or (n,k) with trans_b. With beta == 0, C is
// never read (NaNs in it do not propagate).
void sgemm_avx2(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const float* a,
                int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc);

#endif

}  // namespace coremesh::ops::detail
