// AdamW with decoupled weight decay and bias correction, and gradient
// clipping by global norm from partial sums of squares.
//
// Clipping is split so that it can span PEs: grad_sq_sum() gives this PE's
// sum of squares (a (1) f32 tensor), the caller may all-reduce it, and
// clip_coefficient() turns the total into min(1, max_norm / (norm + 1e-6)),
// which adamw_step() multiplies into the gradients on the fly. Everything runs
// on the current stream without host synchronization.
#pragma once

#include <vector>

#include "coremesh/core/tensor.hpp"

namespace coremesh::ops {

struct AdamWConfig {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;
};

// sum_i sum_j grads[i][j]^2 as a (1) f32 tensor (deterministic: fixed chunks).
Tensor grad_sq_sum(const std::vector<Tensor>& grads);
// (1) tensor min(1, max_norm / (sqrt(sq_sum) + 1e-6)).
Tensor clip_coefficient(const Tensor& sq_sum, float max_norm);

// One fused AdamW update (step >= 1), in place on param, m, v:
//   g = grad * grad_scale[0] (if given)
//   m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2
//   param = param (1 - lr wd) - lr (m / (1-b1^step)) / (sqrt(v / (1-b2^step)) + eps)
void adamw_step(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v,
                const AdamWConfig& config, int64_t step, const Tensor& grad_scale = {});
void adamw_step(const std::vector<Tensor>& params, const std::vector<Tensor>& grads,
                const std::vector<Tensor>& m, const std::vector<Tensor>& v,
                const AdamWConfig& config, int64_t step, const Tensor& grad_scale = {});

namespace reference {
void adamw_step(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v,
                const AdamWConfig& config, int64_t step, float grad_scale = 1.0f);
}  // namespace reference

}  // namespace coremesh::ops
