// Naive activation references in double.
#include <cmath>

#include "coremesh/ops/activation.hpp"

namespace coremesh::ops::reference {
namespace {

template <typename Fn>
Tensor map(const Tensor& x, Fn fn) {
  Tensor y = Tensor::empty(x.shape());
  for (int64_t i = 0; i < x.numel(); ++i) y.data<float>()[i] = static_cast<float>(fn(i));
  return y;
}
double sig(double v) { return 1.0 / (1.0 + std::exp(-v)); }
double gelu_value(double v, GeluApprox a) {
  if (a == GeluApprox::tanh) return 0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v)));
  return 0.5 * v * (1 + std::erf(v / std::sqrt(2.0)));
}

}  // namespace

Tensor silu(const Tensor& x) {
  return map(x, [&](int64_t i) { double v = x.data<float>()[i]; return v * sig(v); });
}
Tensor silu_backward(const Tensor& dy, const Tensor& x) {
  return map(x, [&](int64_t i) {
    double v = x.data<float>()[i], s = sig(v);
    return dy.data<float>()[i] * (s + v * s * (1 - s));
  });
}
Tensor gelu(const Tensor& x, GeluApprox a) {
  return map(x, [&](int64_t i) { return gelu_value(x.data<float>()[i], a); });
}
Tensor gelu_backward(const Tensor& dy, const Tensor& x, GeluApprox a) {
  // Central difference in double of the exact function: independent of the
  // kernel's closed form.
  return map(x, [&](int64_t i) {
    double v = x.data<float>()[i], h = 1e-5;
    return dy.data<float>()[i] * (gelu_value(v + h, a) - gelu_value(v - h, a)) / (2 * h);
  });
}
Tensor swiglu(const Tensor& gu) {
  const int64_t F = gu.size(-1) / 2, R = gu.numel() / (2 * F);
  Shape s = gu.shape();
  s.back() = F;
  Tensor y = Tensor::empty(s);
  for (int64_t r = 0; r < R; ++r)
    for (int64_t f = 0; f < F; ++f) {
      double g = gu.data<float>()[r * 2 * F + f], u = gu.data<float>()[r * 2 * F + F + f];
      y.data<float>()[r * F + f] = static_cast<float>(g * sig(g) * u);
    }
  return y;
}
Tensor swiglu_backward(const Tensor& dy, const Tensor& gu) {
  const int64_t F = gu.size(-1) / 2, R = gu.numel() / (2 * F);
  Tensor d = Tensor::empty(gu.shape());
  for (int64_t r = 0; r < R; ++r)
    for (int64_t f = 0; f < F; ++f) {
      double g = gu.data<float>()[r * 2 * F + f], u = gu.data<float>()[r * 2 * F + F + f];
      double o = dy.data<float>()[r * F + f], s = sig(g);
      d.data<float>()[r * 2 * F + f] = static_cast<float>(o * u * (s + g * s * (1 - s)));
      d.data<float>()[r * 2 * F + F + f] = static_cast<float>(o * g * s);
    }
  return d;
}
Tensor softmax(const Tensor& x) {
  const int64_t C = x.size(-1), R = x.numel() / C;
  Tensor y = Tensor::empty(x.shape());
  for (int64_t r = 0; r < R; ++r) {
    double m = -INFINITY, s = 0;
    for (int64_t c = 0; c < C; ++c) m = std::max(m, double(x.data<float>()[r * C + c]));
    for (int64_t c = 0; c < C; ++c) s += std::exp(x.data<float>()[r * C + c] - m);
    for (int64_t c = 0; c < C; ++c)
      y.data<float>()[r * C + c] = static_cast<float>(std::exp(x.data<float>()[r * C + c] - m) / s);
  }
  return y;
}
Tensor softmax_backward(const Tensor& dy, const Tensor& y) {
  const int64_t C = y.size(-1), R = y.numel() / C;
  Tensor dx = Tensor::empty(y.shape());
  for (int64_t r = 0; r < R; ++r) {
    double dot = 0;
    for (int64_t c = 0; c < C; ++c) dot += double(dy.data<float>()[r * C + c]) * y.data<float>()[r * C + c];
    for (int64_t c = 0; c < C; ++c)
      dx.data<float>()[r * C + c] =
          static_cast<float>(y.data<float>()[r * C + c] * (dy.data<float>()[r * C + c] - dot));
  }
  return dx;
}

}  // namespace coremesh::ops::reference
