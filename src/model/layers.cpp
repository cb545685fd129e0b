#include "layers.hpp"

#include "coremesh/ops/activation.hpp"
#include "coremesh/ops/elementwise.hpp"
#include "coremesh/ops/gemm.hpp"

namespace coremesh::model::detail {

Tensor linear(const Tensor& x, const Tensor& w) { return ops::matmul(x, w, false, true); }

Tensor linear_backward(const Tensor& dy, const Tensor& x, const Tensor& w, Tensor dw,
                       float dw_beta, const Tensor* dx_acc) {
  // y = x W^T  =>  dW = dy^T x + dw_beta dW,  dx = dy W
  ops::matmul_out(dy, x, dw, /*trans_a=*/true, /*trans_b=*/false, dw_beta);
  if (!dx_acc) return ops::matmul(dy, w);
  Tensor dx = *dx_acc;
  ops::matmul_out(dy, w, dx, false, false, 1.0f);
  return dx;
}

Tensor mlp_forward(const GemmInput& x, const Tensor& w13, const Tensor& w2, MlpActs& a) {
  a.w13 = gemm_weight(w13, x.precision);
  a.w2 = gemm_weight(w2, x.precision);
  a.gu = linear(x, a.w13);                                // [a1 | a3] (N,2F)
  a.g = gemm_input(ops::swiglu(a.gu), x.precision);       // silu(a1) * a3 (N,F)
  return linear(a.g, a.w2);                               // (N,C)
}

Tensor mlp_backward(const Tensor& dy, const GemmInput& x, const MlpActs& a, Tensor dw13,
                    Tensor dw2, float dw_beta) {
  const Tensor dg = linear_backward(dy, a.g, a.w2, dw2, dw_beta);  // y = g W2^T
  const Tensor dgu = ops::swiglu_backward(dg, a.gu);               // g = silu(a1) * a3
  return linear_backward(dgu, x, a.w13, dw13, dw_beta);            // gu = x W13^T
}

}  // namespace coremesh::model::detail
