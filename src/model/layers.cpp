#include "layers.hpp"

#include "coremesh/ops/activation.hpp"
#include "coremesh/ops/gemm.hpp"
#include "coremesh/ops/quant.hpp"

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

namespace {

const Tensor& operand(const GemmWeight& w) { return w.precision == Precision::bf16 ? w.bf16 : w.master; }

}  // namespace

Tensor enter_linear(parallel::TensorParallel& tp, const Tensor& x, const GemmWeight& w, GemmInput& entered) {
  if (!tp.fuses()) {
    entered = gemm_input(tp.enter(x), w.precision);
    return linear(entered, w);
  }
  if (w.precision == Precision::fp8) {  // this rank's rows quantized, then gathered
    const parallel::TensorParallel::EnteredFp8 e =
        tp.enter_matmul(ops::quantize_fp8_act(x), ops::quantize_fp8_weight(w.master));
    entered = GemmInput{w.precision, {}, e.x};
    return e.y;
  }
  const parallel::TensorParallel::Entered e = tp.enter_matmul(gemm_input(x, w.precision).x, operand(w));
  entered = GemmInput{w.precision, e.x, {}};
  return e.y;
}

Tensor linear_exit(parallel::TensorParallel& tp, const GemmInput& x, const GemmWeight& w) {
  if (!tp.fuses()) return tp.exit(linear(x, w));
  if (w.precision == Precision::fp8) return tp.matmul_exit(x.fp8, ops::quantize_fp8_weight(w.master));
  return tp.matmul_exit(x.x, operand(w));
}

namespace {

// The MLP past its first GEMM: g = silu(a1) * a3 (N,F), then exit(g W2^T) (N,C).
Tensor mlp_rest(parallel::TensorParallel& tp, Precision precision, MlpActs& a) {
  a.g = gemm_input(ops::swiglu(a.gu), precision);
  return linear_exit(tp, a.g, a.w2);
}

}  // namespace

Tensor mlp_forward(const GemmInput& x, const Tensor& w13, const Tensor& w2, MlpActs& a) {
  a.w13 = gemm_weight(w13, x.precision);
  a.w2 = gemm_weight(w2, x.precision);
  a.gu = linear(x, a.w13);  // [a1 | a3] (N,2F)
  return mlp_rest(parallel::TensorParallel::local(), x.precision, a);
}

Tensor mlp_forward(parallel::TensorParallel& tp, const Tensor& x, Precision precision, const Tensor& w13,
                   const Tensor& w2, MlpActs& a, GemmInput& entered) {
  a.w13 = gemm_weight(w13, precision);
  a.w2 = gemm_weight(w2, precision);
  a.gu = enter_linear(tp, x, a.w13, entered);
  return mlp_rest(tp, precision, a);
}

Tensor mlp_backward(const Tensor& dy, const GemmInput& x, const MlpActs& a, const GradRef& dw13,
                    const GradRef& dw2, WgradSink& sink) {
  const Tensor dg = linear_backward(dy, a.g, a.w2, dw2, sink);      // y = g W2^T
  const Tensor dgu = ops::swiglu_backward(dg, a.gu);               // g = silu(a1) * a3
  return linear_backward(dgu, x, a.w13, dw13, sink);               // gu = x W13^T
}

}  // namespace coremesh::model::detail
