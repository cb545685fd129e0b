// Small row-major GEMMs for tiles that live in L1 (flash attention's 64x128
// tiles with head sizes 32..128). OpenBLAS spends most of such a call packing
// its operands; libxsmm JIT-generates a kernel per shape that reads them in
// place (about 1.7x faster at these sizes on the development machine, see
// docs/performance.md). Shapes libxsmm has no kernel for fall back to sgemm.
#pragma once

#include <cstdint>

namespace coremesh::ops::detail {

// C (m,n) = op(A) B, or C += op(A) B with `accumulate`; op(A) = A (m,k) or,
// with trans_a, A^T for A stored (k,m). B is (k,n), never transposed: keep a
// transposed copy instead (libxsmm's JIT has no row-major B^T kernel).
void small_gemm(bool trans_a, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
                const float* b, int64_t ldb, bool accumulate, float* c, int64_t ldc);

}  // namespace coremesh::ops::detail
