#include "coremesh/train/optimizer.hpp"

#include <cmath>
#include <vector>

#include "coremesh/ops/optimizer.hpp"
#include "coremesh/runtime/stream.hpp"

namespace coremesh::train {

AdamW::AdamW(model::Model& model, const AdamWConfig& config)
    : model_(model),
      cfg_(config),
      m_(Tensor::zeros({model.num_params()})),
      v_(Tensor::zeros({model.num_params()})) {}

namespace {
// Views of one parameter's slot in an arena-shaped tensor.
Tensor slot(const Tensor& arena, const model::ParamInfo& p) {
  return arena.slice(0, p.offset, p.offset + p.numel);
}
}  // namespace

double AdamW::clip_gradients() {
  // sum of squares on the stream (ops::grad_sq_sum), the host reads the norm
  std::vector<Tensor> grads;
  const Tensor g = model_.grad_arena();
  for (const auto& p : model_.params()) grads.push_back(slot(g, p));
  const Tensor sq = ops::grad_sq_sum(grads);
  // min(1, clip / (norm + 1e-6)), applied to the gradients inside step()
  clip_scale_ = cfg_.grad_clip > 0 ? ops::clip_coefficient(sq, float(cfg_.grad_clip)) : Tensor();
  runtime::current_stream().synchronize();
  return std::sqrt(double(sq.data<float>()[0]));
}

void AdamW::step(double lr) {
  ++t_;
  // Two fused ops::adamw_step launches: matrices decay, norms do not.
  const Tensor w = model_.param_arena(), g = model_.grad_arena();
  for (const bool decay : {true, false}) {
    std::vector<Tensor> ps, gs, ms, vs;
    for (const auto& p : model_.params()) {
      if (p.weight_decay != decay) continue;
      ps.push_back(slot(w, p)), gs.push_back(slot(g, p)), ms.push_back(slot(m_, p)),
          vs.push_back(slot(v_, p));
    }
    if (ps.empty()) continue;
    ops::AdamWConfig c;
    c.lr = float(lr), c.beta1 = float(cfg_.beta1), c.beta2 = float(cfg_.beta2), c.eps = float(cfg_.eps);
    c.weight_decay = decay ? float(cfg_.weight_decay) : 0.0f;
    ops::adamw_step(ps, gs, ms, vs, c, t_, clip_scale_);
  }
  clip_scale_ = Tensor();
  runtime::current_stream().synchronize();  // weights are host-visible for the next forward
}

}  // namespace coremesh::train
