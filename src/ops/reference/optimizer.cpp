// Naive AdamW reference in double.
#include <cmath>

#include "coremesh/ops/optimizer.hpp"

namespace coremesh::ops::reference {

void adamw_step(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v,
                const AdamWConfig& c, int64_t step, float grad_scale) {
  for (int64_t i = 0; i < param.numel(); ++i) {
    const double g = double(grad.data<float>()[i]) * grad_scale;
    double mi = c.beta1 * double(m.data<float>()[i]) + (1 - double(c.beta1)) * g;
    double vi = c.beta2 * double(v.data<float>()[i]) + (1 - double(c.beta2)) * g * g;
    const double mhat = mi / (1 - std::pow(double(c.beta1), double(step)));
    const double vhat = vi / (1 - std::pow(double(c.beta2), double(step)));
    double p = param.data<float>()[i];
    p = p * (1 - double(c.lr) * c.weight_decay) - c.lr * mhat / (std::sqrt(vhat) + c.eps);
    param.data<float>()[i] = static_cast<float>(p);
    m.data<float>()[i] = static_cast<float>(mi);
    v.data<float>()[i] = static_cast<float>(vi);
  }
}

}  // namespace coremesh::ops::reference
