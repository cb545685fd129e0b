// Naive grouped GEMM reference: triple loops, double accumulation.
#include "coremesh/ops/grouped_gemm.hpp"

namespace coremesh::ops::reference {
namespace {

// w element (n,k) of group g in either layout.
float w_at(const Tensor& w, int64_t g, int64_t n, int64_t k, WeightLayout layout) {
  return layout == WeightLayout::nk ? w.item({g, n, k}) : w.item({g, k, n});
}

}  // namespace

Tensor grouped_matmul(const Tensor& x, const Tensor& w, const Tensor& offsets, WeightLayout layout) {
  const int64_t G = w.size(0), M = x.size(0), K = x.size(1);
  const int64_t N = layout == WeightLayout::nk ? w.size(1) : w.size(2);
  Tensor y = Tensor::zeros({M, N});
  for (int64_t g = 0; g < G; ++g)
    for (int64_t m = offsets.item({g}); m < offsets.item({g + 1}); ++m)
      for (int64_t n = 0; n < N; ++n) {
        double acc = 0;
        for (int64_t k = 0; k < K; ++k) acc += double(x.item({m, k})) * w_at(w, g, n, k, layout);
        y.data<float>()[m * N + n] = static_cast<float>(acc);
      }
  return y;
}

GroupedMatmulGrads grouped_matmul_backward(const Tensor& dy, const Tensor& x, const Tensor& w,
                                           const Tensor& offsets, WeightLayout layout) {
  const int64_t G = w.size(0), M = x.size(0), K = x.size(1);
  const int64_t N = layout == WeightLayout::nk ? w.size(1) : w.size(2);
  GroupedMatmulGrads grads{Tensor::zeros({M, K}), Tensor::zeros(w.shape())};
  for (int64_t g = 0; g < G; ++g) {
    const int64_t m0 = static_cast<int64_t>(offsets.item({g}));
    const int64_t m1 = static_cast<int64_t>(offsets.item({g + 1}));
    for (int64_t m = m0; m < m1; ++m)  // dx[m,k] = sum_n dy[m,n] w[n,k]
      for (int64_t k = 0; k < K; ++k) {
        double acc = 0;
        for (int64_t n = 0; n < N; ++n) acc += double(dy.item({m, n})) * w_at(w, g, n, k, layout);
        grads.dx.data<float>()[m * K + k] = static_cast<float>(acc);
      }
    for (int64_t n = 0; n < N; ++n)  // dw[n,k] = sum_m dy[m,n] x[m,k]
      for (int64_t k = 0; k < K; ++k) {
        double acc = 0;
        for (int64_t m = m0; m < m1; ++m) acc += double(dy.item({m, n})) * x.item({m, k});
        const int64_t idx = layout == WeightLayout::nk ? (g * N + n) * K + k : (g * K + k) * N + n;
        grads.dw.data<float>()[idx] = static_cast<float>(acc);
      }
  }
  return grads;
}

}  // namespace coremesh::ops::reference
