// Dense matrix multiplication on the current stream.
//
// Notation: Bt batch, M rows of c, N columns of c, K reduction.
// op(a) is (M,K): a is (M,K), or (K,M) with trans_a; op(b) is (K,N): b is
// (K,N), or (N,K) with trans_b (nn.Linear's weight). Batched: a (Bt,.,.) and
// b (Bt,.,.) or a 2-D b shared by every batch; c (Bt,M,N).
// Inputs may be f32 or bf16 (exactly converted, f32 accumulation); c is f32.
//
// A cube kernel: the Bt x grid_m x grid_n output tiles are spread over
// block_dim <= the effective cube limit blocks, each tile one single-threaded
// OpenBLAS sgemm. Asynchronous: results are valid once the stream reaches them.
#pragma once

#include "coremesh/core/tensor.hpp"
#include "coremesh/ops/quant.hpp"

namespace coremesh::ops {

// c = op(a) @ op(b).
Tensor matmul(const Tensor& a, const Tensor& b, bool trans_a = false, bool trans_b = false);
// c = op(a) @ op(b) + beta * c (beta 0: c is overwritten; 1: accumulate).
void matmul_out(const Tensor& a, const Tensor& b, Tensor& c, bool trans_a = false,
                bool trans_b = false, float beta = 0.0f);

// Backward of c = op(a) @ op(b) (f32): da has a's shape, db has b's shape
// (summed over the batch when b is a shared 2-D matrix).
struct MatmulGrads {
  Tensor da, db;
};
MatmulGrads matmul_backward(const Tensor& dc, const Tensor& a, const Tensor& b,
                            bool trans_a = false, bool trans_b = false);

// DeepSeek-V3 FP8 GEMM: x data (M,K) + scale (M,ceil(K/128)), w data (N,K) +
// scale (ceil(N/128),ceil(K/128)) -> y (M,N) = dequant(x) dequant(w)^T, f32.
Tensor matmul_fp8(const QuantizedTensor& x, const QuantizedTensor& w);

// DeepSeek-V3 FP8 wgrad: out (N,K) = dy^T x (+ beta out), dy (M,N) and x (M,K)
// f32 (the values of an fp8 forward input, dequantized), each rounded to fp8
// in 1x128 tiles along the M tokens (fp8_round_transposed). There is no GEMM
// with 1x128 scales on both operands, so the rounded values multiply in f32:
// the sums an fp8 kernel accumulating in f32 makes.
void matmul_fp8_wgrad_out(const Tensor& dy, const Tensor& x, Tensor& out, float beta = 0.0f);
Tensor matmul_fp8_wgrad(const Tensor& dy, const Tensor& x);

namespace reference {
Tensor matmul(const Tensor& a, const Tensor& b, bool trans_a = false, bool trans_b = false);
Tensor matmul_fp8_wgrad(const Tensor& dy, const Tensor& x);
MatmulGrads matmul_backward(const Tensor& dc, const Tensor& a, const Tensor& b,
                            bool trans_a = false, bool trans_b = false);
}  // namespace reference

}  // namespace coremesh::ops
