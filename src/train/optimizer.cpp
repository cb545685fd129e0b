#include "coremesh/train/optimizer.hpp"

#include "coremesh/ops/optimizer.hpp"

namespace coremesh::train {

AdamW::AdamW(model::Model& model, const AdamWConfig& config)
    : model_(model),
      cfg_(config),
      m_(Tensor::zeros({model.num_params()})),
      v_(Tensor::zeros({model.num_params()})) {
  for (const auto& p : model.params()) segments_.push_back({p.offset, p.numel, p.weight_decay});
}

Tensor AdamW::clip_gradients() {
  // sum of squares on the stream: one ops::grad_sq_sum launch over the arena
  const Tensor sq = ops::grad_sq_sum(model_.grad_arena(), segments_);
  // min(1, clip / (norm + 1e-6)), applied to the gradients inside step()
  clip_scale_ = cfg_.grad_clip > 0 ? ops::clip_coefficient(sq, float(cfg_.grad_clip)) : Tensor();
  return sq;
}

void AdamW::step(double lr) {
  ++t_;
  // One fused ops::adamw_step launch over the arena: matrices decay, norms do not.
  ops::AdamWConfig c;
  c.lr = float(lr), c.beta1 = float(cfg_.beta1), c.beta2 = float(cfg_.beta2), c.eps = float(cfg_.eps);
  c.weight_decay = float(cfg_.weight_decay);
  ops::adamw_step(model_.param_arena(), model_.grad_arena(), m_, v_, segments_, c, t_, clip_scale_);
  clip_scale_ = Tensor();
}

}  // namespace coremesh::train
