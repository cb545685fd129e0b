#include "layers.hpp"

#include "coremesh/ops/activation.hpp"
#include "coremesh/ops/gemm.hpp"

namespace coremesh::model::detail {

Tensor linear(const Tensor& x, const Tensor& w) { return ops::matmul(x, w, false, true); }

Tensor linear_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const GradRef& dw,
                       WgradSink& sink, const Tensor* dx_acc) {
  // y = x W^T  =>  dW = dy^T x (+ beta dW),  dx = dy W
  sink.add(dw, [dy, x](const Tensor& g, float beta) {
    Tensor out = g;
    ops::matmul_out(dy, x, out, /*trans_a=*/true, /*trans_b=*/false, beta);
  });
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

Tensor mlp_backward(const Tensor& dy, const GemmInput& x, const MlpActs& a, const GradRef& dw13,
                    const GradRef& dw2, WgradSink& sink) {
  const Tensor dg = linear_backward(dy, a.g, a.w2, dw2, sink);      // y = g W2^T
  const Tensor dgu = ops::swiglu_backward(dg, a.gu);               // g = silu(a1) * a3
  return linear_backward(dgu, x, a.w13, dw13, sink);               // gu = x W13^T
}

}  // namespace coremesh::model::detail
