// RMSNorm: plain, fused with the residual add, fused with FP8 output quantization.
//
// Notation: R rows (all leading dimensions flattened), C channels.
//   rstd[r] = 1 / sqrt(mean_c x[r,c]^2 + eps),   y[r,c] = x[r,c] * rstd[r] * w[c]
// rstd is kept for the backward. All tensors f32 and contiguous.
#pragma once

#include "coremesh/core/tensor.hpp"
#include "coremesh/ops/quant.hpp"

namespace coremesh::ops {

struct RMSNormOut {
  Tensor y;     // (..., C)
  Tensor rstd;  // (R)
};
// x (..., C), w (C).
RMSNormOut rmsnorm(const Tensor& x, const Tensor& w, float eps = 1e-6f);
void rmsnorm_out(const Tensor& x, const Tensor& w, float eps, const Tensor& y, const Tensor& rstd);

// h = x + residual (the new residual stream), y = rmsnorm(h).
struct RMSNormResidualOut {
  Tensor h, y, rstd;
};
RMSNormResidualOut rmsnorm_residual(const Tensor& x, const Tensor& residual, const Tensor& w,
                                    float eps = 1e-6f);
// The same into given tensors (contiguous, e.g. views of one buffer).
void rmsnorm_residual_out(const Tensor& x, const Tensor& residual, const Tensor& w, float eps,
                          const RMSNormResidualOut& out);

// y = rmsnorm(x) quantized to FP8 with 1x128 tiles (scale (R, ceil(C/128))).
struct RMSNormFP8Out {
  QuantizedTensor y;
  Tensor rstd;
};
RMSNormFP8Out rmsnorm_fp8(const Tensor& x, const Tensor& w, float eps = 1e-6f);

// dy (..., C), x, w, rstd from the forward -> dx (..., C), dw (C). For the
// residual form, the gradient of h is dx plus the gradient flowing into h:
// pass that as `dx_plus` (x's shape) and dx includes it. With `dw_into` (C,
// e.g. a gradient-arena view) it becomes dw + dw_beta * dw_into (dw_beta 0:
// only written) and is returned as g.dw.
struct RMSNormGrads {
  Tensor dx, dw;
};
RMSNormGrads rmsnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& rstd,
                              const Tensor& dx_plus = {}, const Tensor& dw_into = {},
                              float dw_beta = 1.0f);

namespace reference {
RMSNormOut rmsnorm(const Tensor& x, const Tensor& w, float eps = 1e-6f);
RMSNormGrads rmsnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& rstd);
}  // namespace reference

}  // namespace coremesh::ops
