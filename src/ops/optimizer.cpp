// AdamW (fused, in place) and global-norm clipping from partial sums.
#include "coremesh/ops/optimizer.hpp"

#include <cmath>

#include "detail.hpp"

namespace coremesh::ops {
namespace {

constexpr int64_t kChunk = 4096;  // elements per work unit and per partial sum

void check_f32(const Tensor& t, const char* what) {
  detail::check_contiguous(t, what);
  detail::check_dtype(t, DType::f32, what);
}

}  // namespace

// Pass 1 (per gradient): partial[chunk] = sum of squares of one chunk, in double.
// Pass 2 (one block): out = sum of all partials in a fixed order.
Tensor grad_sq_sum(const std::vector<Tensor>& grads) {
  int64_t chunks = 0;
  for (const Tensor& g : grads) {
    check_f32(g, "grad");
    chunks += detail::ceil_div(g.numel(), kChunk);
  }
  Tensor partial = Tensor::empty({std::max<int64_t>(chunks, 1)});
  Tensor out = Tensor::empty({1});
  int64_t first = 0;
  for (const Tensor& g : grads) {
    const int64_t n = g.numel(), nc = detail::ceil_div(n, kChunk);
    detail::launch_rows("grad_sq_sum", detail::KernelKind::vector, {g.shape()}, {DType::f32}, "", nc,
                        kChunk, [g, partial, first, n](int64_t c0, int64_t c1) {
                          const float* x = g.data<float>();
                          for (int64_t c = c0; c < c1; ++c) {
                            const int64_t i0 = c * kChunk, len = std::min(kChunk, n - i0);
                            partial.data<float>()[first + c] = detail::dot(x + i0, x + i0, len);
                          }
                        });
    first += nc;
  }
  detail::Plan plan = detail::plan("grad_sq_sum_total", detail::KernelKind::vector, {{chunks}},
                                   {DType::f32}, "", [](int) { return detail::Tiling{}; });
  detail::launch("grad_sq_sum_total", detail::KernelKind::vector, plan,
                 [partial, out, chunks](const detail::BlockContext&) {
                   double s = 0;
                   for (int64_t c = 0; c < chunks; ++c) s += partial.data<float>()[c];
                   out.data<float>()[0] = static_cast<float>(s);
                 });
  return out;
}

Tensor clip_coefficient(const Tensor& sq_sum, float max_norm) {
  check_f32(sq_sum, "sq_sum");
  detail::check_shape(sq_sum, {1}, "sq_sum");
  CM_CHECK(max_norm > 0.0f, "use a positive max_norm", "max_norm is {}", max_norm);
  Tensor out = Tensor::empty({1});
  detail::Plan plan = detail::plan("clip_coefficient", detail::KernelKind::vector, {{1}}, {DType::f32},
                                   "", [](int) { return detail::Tiling{}; });
  detail::launch("clip_coefficient", detail::KernelKind::vector, plan,
                 [sq_sum, out, max_norm](const detail::BlockContext&) {
                   const float norm = std::sqrt(sq_sum.data<float>()[0]);
                   out.data<float>()[0] = std::fmin(1.0f, max_norm / (norm + 1e-6f));
                 });
  return out;
}

void adamw_step(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v,
                const AdamWConfig& c, int64_t step, const Tensor& grad_scale) {
  for (const Tensor* t : {&param, &grad, &m, &v}) {
    check_f32(*t, "adamw tensor");
    detail::check_shape(*t, param.shape(), "grad/m/v");
  }
  CM_CHECK(step >= 1, "count steps from 1", "adamw step {}", step);
  if (grad_scale.defined()) detail::check_shape(grad_scale, {1}, "grad_scale");
  const float bc1 = 1.0f - static_cast<float>(std::pow(double(c.beta1), double(step)));
  const float bc2 = 1.0f - static_cast<float>(std::pow(double(c.beta2), double(step)));
  const int64_t n = param.numel();
  detail::launch_rows("adamw", detail::KernelKind::vector, {param.shape()}, {DType::f32}, "",
                      detail::ceil_div(n, kChunk), kChunk,
                      [param, grad, m, v, c, bc1, bc2, grad_scale, n](int64_t c0, int64_t c1) {
                        const float gs = grad_scale.defined() ? grad_scale.data<float>()[0] : 1.0f;
                        float* p = param.data<float>();
                        const float* g = grad.data<float>();
                        float* mm = m.data<float>();
                        float* vv = v.data<float>();
                        const float decay = 1.0f - c.lr * c.weight_decay;
                        for (int64_t i = c0 * kChunk, end = std::min(n, c1 * kChunk); i < end; ++i) {
                          const float gi = g[i] * gs;
                          mm[i] = c.beta1 * mm[i] + (1.0f - c.beta1) * gi;
                          vv[i] = c.beta2 * vv[i] + (1.0f - c.beta2) * gi * gi;
                          p[i] = p[i] * decay - c.lr * (mm[i] / bc1) / (std::sqrt(vv[i] / bc2) + c.eps);
                        }
                      });
}

void adamw_step(const std::vector<Tensor>& params, const std::vector<Tensor>& grads,
                const std::vector<Tensor>& m, const std::vector<Tensor>& v, const AdamWConfig& config,
                int64_t step, const Tensor& grad_scale) {
  CM_CHECK(params.size() == grads.size() && params.size() == m.size() && params.size() == v.size(),
           "pass one grad, m and v per parameter", "{} params, {} grads, {} m, {} v", params.size(),
           grads.size(), m.size(), v.size());
  for (size_t i = 0; i < params.size(); ++i) adamw_step(params[i], grads[i], m[i], v[i], config, step, grad_scale);
}

}  // namespace coremesh::ops
