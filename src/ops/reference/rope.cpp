// Naive RoPE reference: complex multiplication per pair, double precision.
#include <cmath>
#include <complex>

#include "coremesh/ops/rope.hpp"

namespace coremesh::ops::reference {

Tensor rope(const Tensor& x, const Tensor& positions, const RopeConfig& cfg) {
  const int64_t B = x.size(0), T = x.size(1), H = x.size(2), D = x.size(3);
  Tensor y = Tensor::empty(x.shape());
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t p = 0; p < D / 2; ++p) {
          const int64_t i = cfg.interleaved ? 2 * p : p, j = cfg.interleaved ? 2 * p + 1 : p + D / 2;
          const double angle = double(positions.item({t})) * std::pow(double(cfg.base), -2.0 * p / D);
          std::complex<double> z(x.item({b, t, h, i}), x.item({b, t, h, j}));
          z *= std::polar(1.0, angle);
          y.data<float>()[((b * T + t) * H + h) * D + i] = static_cast<float>(z.real());
          y.data<float>()[((b * T + t) * H + h) * D + j] = static_cast<float>(z.imag());
        }
  return y;
}

}  // namespace coremesh::ops::reference
