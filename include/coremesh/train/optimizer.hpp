// AdamW over the model's parameter arena (PyTorch semantics, fp32 state):
//   p <- p * (1 - lr * wd)                      (matrices only)
//   m <- b1 m + (1 - b1) g;  v <- b2 v + (1 - b2) g^2
//   p <- p - lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
// plus global-norm gradient clipping (torch.nn.utils.clip_grad_norm_).
// Runs on the kernel library (ops::grad_sq_sum, clip_coefficient, adamw_step)
// on the current stream, one launch each over the whole arena (a segment per
// parameter); the clip coefficient is folded into the update.
#pragma once

#include <cstdint>
#include <vector>

#include "coremesh/core/tensor.hpp"
#include "coremesh/model/model.hpp"
#include "coremesh/ops/optimizer.hpp"

namespace coremesh::train {

struct AdamWConfig {
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.1;
  double grad_clip = 1.0;  // <= 0: no clipping
};

class AdamW {
 public:
  AdamW(model::Model& model, const AdamWConfig& config);

  // Computes the global gradient norm (returned, before clipping) and the
  // clip coefficient that the next step() applies to the gradients.
  double clip_gradients();
  // One update with learning rate `lr` (increments the step count).
  void step(double lr);

  int64_t steps() const { return t_; }
  void set_steps(int64_t t) { t_ = t; }
  Tensor& m() { return m_; }
  Tensor& v() { return v_; }

 private:
  model::Model& model_;
  AdamWConfig cfg_;
  Tensor m_, v_;
  std::vector<ops::ParamSegment> segments_;  // one per parameter slot of the arena
  Tensor clip_scale_;  // (1) from clip_gradients(), consumed by step()
  int64_t t_ = 0;
};

}  // namespace coremesh::train
