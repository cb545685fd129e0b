// Naive GEMM reference: triple loop, double accumulation, any transposes.
#include "coremesh/ops/gemm.hpp"

namespace coremesh::ops::reference {
namespace {

// Element (i,j) of op(t) for batch `bt` (a 2-D t is shared by every batch).
double at(const Tensor& t, int64_t bt, int64_t i, int64_t j, bool trans) {
  if (trans) std::swap(i, j);
  return t.dim() == 3 ? t.item({bt, i, j}) : t.item({i, j});
}

}  // namespace

Tensor matmul(const Tensor& a, const Tensor& b, bool ta, bool tb) {
  const bool batched = a.dim() == 3 || b.dim() == 3;
  const int64_t batch = a.dim() == 3 ? a.size(0) : (b.dim() == 3 ? b.size(0) : 1);
  const int64_t m = ta ? a.size(-1) : a.size(-2), k = ta ? a.size(-2) : a.size(-1);
  const int64_t n = tb ? b.size(-2) : b.size(-1);
  Tensor c = batched ? Tensor::empty({batch, m, n}) : Tensor::empty({m, n});
  float* out = c.data<float>();
  for (int64_t bt = 0; bt < batch; ++bt)
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double acc = 0;
        for (int64_t p = 0; p < k; ++p) acc += at(a, bt, i, p, ta) * at(b, bt, p, j, tb);
        out[(bt * m + i) * n + j] = static_cast<float>(acc);
      }
  return c;
}

MatmulGrads matmul_backward(const Tensor& dc, const Tensor& a, const Tensor& b, bool ta, bool tb) {
  // Element-wise definition: c[i,j] = sum_p opa[i,p] opb[p,j], so
  // d opa[i,p] = sum_j dc[i,j] opb[p,j] and d opb[p,j] = sum_i dc[i,j] opa[i,p].
  const int64_t batch = dc.dim() == 3 ? dc.size(0) : 1;
  const int64_t m = ta ? a.size(-1) : a.size(-2), k = ta ? a.size(-2) : a.size(-1);
  const int64_t n = tb ? b.size(-2) : b.size(-1);
  MatmulGrads g{Tensor::zeros(a.shape()), Tensor::zeros(b.shape())};
  auto add = [](Tensor& t, int64_t bt, int64_t i, int64_t j, bool trans, double v) {
    if (trans) std::swap(i, j);
    const int64_t rows = t.size(-2), cols = t.size(-1);
    const int64_t idx = (t.dim() == 3 ? bt * rows * cols : 0) + i * cols + j;
    t.data<float>()[idx] += static_cast<float>(v);
  };
  for (int64_t bt = 0; bt < batch; ++bt) {
    auto dcv = [&](int64_t i, int64_t j) { return dc.dim() == 3 ? dc.item({bt, i, j}) : dc.item({i, j}); };
    for (int64_t i = 0; i < m; ++i)
      for (int64_t p = 0; p < k; ++p) {
        double acc = 0;
        for (int64_t j = 0; j < n; ++j) acc += dcv(i, j) * at(b, bt, p, j, tb);
        add(g.da, bt, i, p, ta, acc);
      }
    for (int64_t p = 0; p < k; ++p)
      for (int64_t j = 0; j < n; ++j) {
        double acc = 0;
        for (int64_t i = 0; i < m; ++i) acc += dcv(i, j) * at(a, bt, i, p, ta);
        add(g.db, bt, p, j, tb, acc);
      }
  }
  return g;
}

}  // namespace coremesh::ops::reference
