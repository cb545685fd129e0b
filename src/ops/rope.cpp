// RoPE forward and backward (the same rotation with the angle negated).
// Notation: x (B,T,H,D), P = D/2 pairs; blocks own ranges of (b,t) rows.
#include "coremesh/ops/rope.hpp"

#include <cmath>

#include "detail.hpp"

namespace coremesh::ops {
namespace {

Tensor rotate(const char* name, const Tensor& x, const Tensor& positions, const RopeConfig& cfg,
              float sign) {
  detail::check_contiguous(x, "x");
  detail::check_dtype(x, DType::f32, "x");
  CM_CHECK(x.dim() == 4 && x.size(3) % 2 == 0, "pass x (B,T,H,D) with an even head size",
           "rope input {} is not (B,T,H,D) with even D", x.describe());
  detail::check_contiguous(positions, "positions");
  detail::check_dtype(positions, DType::i64, "positions");
  const int64_t B = x.size(0), T = x.size(1), H = x.size(2), D = x.size(3), P = D / 2;
  detail::check_shape(positions, {T}, "positions");
  Tensor y = Tensor::empty(x.shape());
  detail::launch_rows(
      name, detail::KernelKind::vector, {x.shape()}, {DType::f32},
      detail::key_attrs({{"base", cfg.base}, {"interleaved", cfg.interleaved}}), B * T, H * D,
      [x, y, positions, cfg, sign, T, H, D, P](int64_t r0, int64_t r1) {
        std::vector<float> cs(static_cast<size_t>(P)), sn(static_cast<size_t>(P));
        for (int64_t r = r0; r < r1; ++r) {  // r = b*T + t
          const double pos = static_cast<double>(positions.data<int64_t>()[r % T]);
          for (int64_t p = 0; p < P; ++p) {
            const double a = pos * std::pow(double(cfg.base), -2.0 * double(p) / double(D));
            cs[p] = static_cast<float>(std::cos(a));
            sn[p] = sign * static_cast<float>(std::sin(a));
          }
          for (int64_t h = 0; h < H; ++h) {
            const float* in = x.data<float>() + (r * H + h) * D;
            float* out = y.data<float>() + (r * H + h) * D;
            const int64_t step = cfg.interleaved ? 2 : 1, second = cfg.interleaved ? 1 : P;
            for (int64_t p = 0; p < P; ++p) {
              const int64_t i = p * step, j = i + second;
              const float x1 = in[i], x2 = in[j];
              out[i] = x1 * cs[p] - x2 * sn[p];
              out[j] = x1 * sn[p] + x2 * cs[p];
            }
          }
        }
      });
  return y;
}

}  // namespace

Tensor rope(const Tensor& x, const Tensor& positions, const RopeConfig& config) {
  return rotate("rope", x, positions, config, 1.0f);
}

// y = R(a) x with R orthogonal, so dx = R(a)^T dy = R(-a) dy.
Tensor rope_backward(const Tensor& dy, const Tensor& positions, const RopeConfig& config) {
  return rotate("rope_backward", dy, positions, config, -1.0f);
}

Tensor rope_positions(int64_t T, int64_t start) {
  Tensor p = Tensor::empty({T}, DType::i64);
  for (int64_t t = 0; t < T; ++t) p.data<int64_t>()[t] = start + t;
  return p;
}

}  // namespace coremesh::ops
