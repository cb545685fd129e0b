#include "coremesh/train/optimizer.hpp"

#include <cmath>

namespace coremesh::train {

AdamW::AdamW(model::Model& model, const AdamWConfig& config)
    : model_(model),
      cfg_(config),
      m_(Tensor::zeros({model.num_params()})),
      v_(Tensor::zeros({model.num_params()})) {}

double AdamW::clip_gradients() {
  float* g = model_.grad_data();
  double ss = 0;
  for (const auto& p : model_.params())
    for (int64_t i = 0; i < p.numel; ++i) ss += double(g[p.offset + i]) * g[p.offset + i];
  const double norm = std::sqrt(ss);
  if (cfg_.grad_clip > 0) {
    const double coef = cfg_.grad_clip / (norm + 1e-6);
    if (coef < 1.0) {
      const float cf = float(coef);
      for (const auto& p : model_.params())
        for (int64_t i = 0; i < p.numel; ++i) g[p.offset + i] *= cf;
    }
  }
  return norm;
}

void AdamW::step(double lr) {
  ++t_;
  const float b1 = float(cfg_.beta1), b2 = float(cfg_.beta2), eps = float(cfg_.eps);
  const double bc1 = 1.0 - std::pow(cfg_.beta1, double(t_));
  const double bc2 = 1.0 - std::pow(cfg_.beta2, double(t_));
  const float step_size = float(lr / bc1), bc2_sqrt = float(std::sqrt(bc2));
  float* w = model_.param_data();
  const float* g = model_.grad_data();
  float* m = m_.data<float>();
  float* v = v_.data<float>();
  for (const auto& p : model_.params()) {
    const float decay = p.weight_decay ? float(1.0 - lr * cfg_.weight_decay) : 1.0f;
    for (int64_t i = p.offset; i < p.offset + p.numel; ++i) {
      w[i] *= decay;
      m[i] = b1 * m[i] + (1.0f - b1) * g[i];
      v[i] = b2 * v[i] + (1.0f - b2) * g[i] * g[i];
      w[i] -= step_size * m[i] / (std::sqrt(v[i]) / bc2_sqrt + eps);
    }
  }
}

}  // namespace coremesh::train
