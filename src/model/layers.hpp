// The model's thin glue over the kernel library (include/coremesh/ops), llm.c
// style: forward and backward side by side, shapes in comments. Notation:
// N = B*T tokens, C model width, F hidden width. Linear weights are (out, in)
// like nn.Linear (y = x W^T). Every call launches kernels on the current
// stream; nothing here synchronizes with the host.
//
// A backward is split into its input-gradient half (returned at once) and its
// weight-gradient half, handed to a WgradSink as a job: the model runs the
// job at once, or keeps it for a later backward_weight() (zero-bubble
// pipeline schedules run the halves at different times).
#pragma once

#include "coremesh/core/tensor.hpp"
#include "coremesh/parallel/seams.hpp"
#include "precision.hpp"
#include "wgrad.hpp"

namespace coremesh::model::detail {

// y (N,out) = x (N,in) W^T, W (out,in), in f32 (the LM head and the router; the
// block GEMMs take the model's precision through precision.hpp).
Tensor linear(const Tensor& x, const Tensor& w);
// y = x W^T  =>  dx (N,in) = dy W (added into *dx_acc when given, which is
// then returned);  dW (out,in) = dy^T x, a job for the sink.
Tensor linear_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const GradRef& dw,
                       WgradSink& sink, const Tensor* dx_acc = nullptr);

// The GEMMs at a tensor-parallel region's edges, fused with its exchanges
// where the seam fuses() (the same bits as unfused):
//   enter_linear: y = enter(x) W^T; `entered` gets enter(x) as the GEMM read it
//                 (bf16: cast before the gather, half the bytes moved; fp8:
//                 quantized before it, data and scales moved)
//   linear_exit:  exit(x W^T)
Tensor enter_linear(parallel::TensorParallel& tp, const Tensor& x, const GemmWeight& w, GemmInput& entered);
Tensor linear_exit(parallel::TensorParallel& tp, const GemmInput& x, const GemmWeight& w);

// SwiGLU MLP on a fused gate/up weight W13 (2F,C) = [W1; W3] (the model
// keeps w1 and w3 adjacent in the arena, so this is a view), in the
// precision of its input x:
//   gu = x W13^T = [a1 | a3] (N,2F);  g = silu(a1) * a3 (N,F);  y = g W2^T (N,C)
struct MlpActs {
  GemmWeight w13, w2;  // this pass's casts of the masters
  Tensor gu;           // (N,2F) f32 (the swiglu backward reads it)
  GemmInput g;         // (N,F) as the W2 GEMM read it
};
Tensor mlp_forward(const GemmInput& x, const Tensor& w13, const Tensor& w2, MlpActs& a);
// exit(MLP(enter(x))) of a tensor-parallel region; `entered` as in enter_linear.
Tensor mlp_forward(parallel::TensorParallel& tp, const Tensor& x, Precision precision, const Tensor& w13,
                   const Tensor& w2, MlpActs& a, GemmInput& entered);
// dy (N,C) -> dx (N,C); x as in the forward; dW13 and dW2 go to the sink.
Tensor mlp_backward(const Tensor& dy, const GemmInput& x, const MlpActs& a, const GradRef& dw13,
                    const GradRef& dw2, WgradSink& sink);

}  // namespace coremesh::model::detail
