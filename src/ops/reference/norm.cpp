// Naive RMSNorm reference in double.
#include <cmath>

#include "coremesh/ops/norm.hpp"

namespace coremesh::ops::reference {

RMSNormOut rmsnorm(const Tensor& x, const Tensor& w, float eps) {
  const int64_t C = x.size(-1), R = x.numel() / C;
  RMSNormOut out{Tensor::empty(x.shape()), Tensor::empty({R})};
  const float* xp = x.data<float>();
  for (int64_t r = 0; r < R; ++r) {
    double ss = 0;
    for (int64_t c = 0; c < C; ++c) ss += double(xp[r * C + c]) * xp[r * C + c];
    const double rstd = 1.0 / std::sqrt(ss / C + eps);
    out.rstd.data<float>()[r] = static_cast<float>(rstd);
    for (int64_t c = 0; c < C; ++c)
      out.y.data<float>()[r * C + c] = static_cast<float>(xp[r * C + c] * rstd * w.data<float>()[c]);
  }
  return out;
}

RMSNormGrads rmsnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& rstd) {
  const int64_t C = x.size(-1), R = x.numel() / C;
  RMSNormGrads g{Tensor::empty(x.shape()), Tensor::zeros({C})};
  std::vector<double> dw(static_cast<size_t>(C), 0.0);
  for (int64_t r = 0; r < R; ++r) {
    const float* xr = x.data<float>() + r * C;
    const float* dyr = dy.data<float>() + r * C;
    const double s = rstd.data<float>()[r];
    double dot = 0;
    for (int64_t c = 0; c < C; ++c) dot += double(dyr[c]) * w.data<float>()[c] * xr[c];
    for (int64_t c = 0; c < C; ++c) {
      g.dx.data<float>()[r * C + c] =
          static_cast<float>(s * dyr[c] * w.data<float>()[c] - xr[c] * s * s * s * dot / C);
      dw[static_cast<size_t>(c)] += double(dyr[c]) * xr[c] * s;
    }
  }
  for (int64_t c = 0; c < C; ++c) g.dw.data<float>()[c] = static_cast<float>(dw[static_cast<size_t>(c)]);
  return g;
}

}  // namespace coremesh::ops::reference
