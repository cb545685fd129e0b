// RMSNorm forward (plain / + residual / -> FP8) and backward.
// Notation: R rows, C channels; blocks own contiguous row ranges.
#include "coremesh/ops/norm.hpp"

#include <utility>

#include <cmath>

#include "detail/checks.hpp"
#include "detail/launch.hpp"
#include "detail/vec_math.hpp"

namespace coremesh::ops {
namespace {

using detail::ceil_div;
constexpr int64_t QB = kQuantBlock;

// One forward kernel for all variants; undefined tensors are skipped.
struct Forward {
  Tensor x, residual, w;          // inputs (residual optional)
  Tensor h, y, rstd, q, q_scale;  // outputs (h, y, q optional)
  float eps;
};

void check_norm_inputs(const Tensor& x, const Tensor& w) {
  detail::check_contiguous(x, "x");
  detail::check_contiguous(w, "w");
  detail::check_dtype(x, DType::f32, "x");
  detail::check_dtype(w, DType::f32, "w");
  CM_CHECK(x.dim() >= 1 && w.dim() == 1 && w.size(0) == x.size(-1), "w must be (C) for x (..., C)",
           "rmsnorm weight {} does not match input {}", w.describe(), x.describe());
  // the mean of no squares is not a number: each row needs a feature
  CM_CHECK(x.size(-1) > 0, "normalize rows of at least one column", "rmsnorm of rows of 0 columns ({})",
           x.describe());
}

// Row by row, each output row may be an input's own row (in place); the
// weights and rstd are read or written across rows.
void check_norm_outputs(const Tensor& x, const Tensor& residual, const Tensor& w, const Tensor& h, const Tensor& y,
                        const Tensor& rstd) {
  for (const auto& [out, out_name] : {std::pair{h, "h"}, std::pair{y, "y"}}) {
    detail::check_disjoint(out, out_name, x, "x", /*in_place=*/true);
    detail::check_disjoint(out, out_name, residual, "residual", /*in_place=*/true);
    detail::check_disjoint(out, out_name, w, "w");
    detail::check_disjoint(rstd, "rstd", out, out_name);
  }
  detail::check_disjoint(y, "y", h, "h", /*in_place=*/true);
  for (const auto& [in, in_name] : {std::pair{x, "x"}, std::pair{residual, "residual"}, std::pair{w, "w"}})
    detail::check_disjoint(rstd, "rstd", in, in_name);
}

void run_forward(const char* name, const Forward& f) {
  CM_CHECK(f.eps >= 0 && std::isfinite(f.eps), "use a finite eps >= 0 (1e-6 in most models)", "{} eps {}", name, f.eps);
  const int64_t R = detail::rows_of(f.x), C = f.x.size(-1);
  detail::launch_rows(name, detail::KernelKind::vector, {f.x.shape()}, {DType::f32},
                      detail::key_attrs({{"eps", f.eps}}),
                      {detail::defined({f.x, f.residual, f.w}), detail::defined({f.h, f.y, f.rstd, f.q, f.q_scale})}, R, C,
                      [f, C](int64_t r0, int64_t r1) {
    const float* w = f.w.data<float>();
    std::vector<float> row(static_cast<size_t>(C));
    for (int64_t r = r0; r < r1; ++r) {
      const float* x = f.x.data<float>() + r * C;
      if (f.residual.defined()) {  // h = x + residual
        const float* res = f.residual.data<float>() + r * C;
        float* h = f.h.data<float>() + r * C;
        for (int64_t c = 0; c < C; ++c) h[c] = x[c] + res[c];
        x = h;
      }
      const float rstd = 1.0f / std::sqrt(detail::dot(x, x, C) / static_cast<float>(C) + f.eps);
      f.rstd.data<float>()[r] = rstd;
      float* y = f.y.defined() ? f.y.data<float>() + r * C : row.data();
      for (int64_t c = 0; c < C; ++c) y[c] = x[c] * rstd * w[c];
      if (f.q.defined()) {  // 1x128 FP8 tiles of the normalized row
        const int64_t Kb = ceil_div(C, QB);
        f8e4m3* q = f.q.data<f8e4m3>() + r * C;
        for (int64_t kb = 0; kb < Kb; ++kb) {
          const int64_t c0 = kb * QB, c1 = std::min(C, c0 + QB);
          float amax = 0.0f;
          for (int64_t c = c0; c < c1; ++c) amax = std::fmax(amax, std::fabs(y[c]));
          const float s = amax > 0.0f && std::isfinite(amax) ? amax / kF8E4M3Max : 1.0f;
          f.q_scale.data<float>()[r * Kb + kb] = s;
          for (int64_t c = c0; c < c1; ++c) q[c] = to_f8e4m3(y[c] / s);
        }
      }
    }
  });
}

}  // namespace

void rmsnorm_out(const Tensor& x, const Tensor& w, float eps, const Tensor& y, const Tensor& rstd) {
  check_norm_inputs(x, w);
  detail::check_shape(y, x.shape(), "y");
  detail::check_contiguous(y, "y");
  detail::check_shape(rstd, {detail::rows_of(x)}, "rstd");
  check_norm_outputs(x, {}, w, {}, y, rstd);
  run_forward("rmsnorm", Forward{x, {}, w, {}, y, rstd, {}, {}, eps});
}

RMSNormOut rmsnorm(const Tensor& x, const Tensor& w, float eps) {
  check_norm_inputs(x, w);
  RMSNormOut out{Tensor::empty(x.shape()), Tensor::empty({detail::rows_of(x)})};
  rmsnorm_out(x, w, eps, out.y, out.rstd);
  return out;
}

void rmsnorm_residual_out(const Tensor& x, const Tensor& residual, const Tensor& w, float eps,
                          const RMSNormResidualOut& out) {
  check_norm_inputs(x, w);
  detail::check_contiguous(residual, "residual");
  detail::check_shape(residual, x.shape(), "residual");
  for (const auto& [t, name] : {std::pair{out.h, "h"}, std::pair{out.y, "y"}}) {
    detail::check_shape(t, x.shape(), name);
    detail::check_contiguous(t, name);
  }
  detail::check_shape(out.rstd, {detail::rows_of(x)}, "rstd");
  check_norm_outputs(x, residual, w, out.h, out.y, out.rstd);
  run_forward("rmsnorm_residual", Forward{x, residual, w, out.h, out.y, out.rstd, {}, {}, eps});
}

RMSNormResidualOut rmsnorm_residual(const Tensor& x, const Tensor& residual, const Tensor& w,
                                    float eps) {
  RMSNormResidualOut out{Tensor::empty(x.shape()), Tensor::empty(x.shape()),
                         Tensor::empty({detail::rows_of(x)})};
  rmsnorm_residual_out(x, residual, w, eps, out);
  return out;
}

RMSNormFP8Out rmsnorm_fp8(const Tensor& x, const Tensor& w, float eps) {
  check_norm_inputs(x, w);
  const int64_t R = detail::rows_of(x), C = x.size(-1);
  RMSNormFP8Out out{{Tensor::empty({R, C}, DType::f8e4m3), Tensor::empty({R, ceil_div(C, QB)})},
                    Tensor::empty({R})};
  run_forward("rmsnorm_fp8", Forward{x, {}, w, {}, {}, out.rstd, out.y.data, out.y.scale, eps});
  return out;
}

// y = x * rstd * w, rstd = (mean x^2 + eps)^-1/2:
//   dx[c] = rstd * dy[c] w[c] - x[c] * rstd^3 / C * sum_j dy[j] w[j] x[j]
//   dw[c] = sum_r dy[r,c] x[r,c] rstd[r]
// dw: each block sums its rows into its row of partial (block_dim, C),
// zeroed by the block itself (a replayed graph runs no host code); a second
// kernel adds the partials (deterministic for a given block_dim).
RMSNormGrads rmsnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& rstd,
                              const Tensor& dx_plus, const Tensor& dw_into, float dw_beta) {
  check_norm_inputs(x, w);
  detail::check_shape(dy, x.shape(), "dy");
  detail::check_contiguous(dy, "dy");
  const int64_t R = detail::rows_of(x), C = x.size(-1);
  detail::check_shape(rstd, {R}, "rstd");
  for (const Tensor* t : {&dx_plus, &dw_into}) {
    if (!t->defined()) continue;
    detail::check_contiguous(*t, "dx_plus/dw_into");
    detail::check_dtype(*t, DType::f32, "dx_plus/dw_into");
  }
  if (dx_plus.defined()) detail::check_shape(dx_plus, x.shape(), "dx_plus");
  if (dw_into.defined()) detail::check_shape(dw_into, {C}, "dw_into");
  RMSNormGrads g{Tensor::empty(x.shape()), dw_into.defined() ? dw_into : Tensor::empty({C})};
  detail::Plan plan = detail::plan_rows("rmsnorm_backward", detail::KernelKind::vector, {x.shape()},
                                        {DType::f32}, "", R, C);
  const int bd = plan.tiling.block_dim;
  const int64_t align = plan.tiling.align;
  Tensor partial = R > 0 ? Tensor::empty({bd, C}) : Tensor::zeros({bd, C});
  Tensor dx = g.dx;
  if (R > 0)
    detail::launch(std::move(plan), {detail::defined({dy, x, w, rstd, dx_plus}), {dx, partial}},
                   [dy, x, w, rstd, dx, dx_plus, partial, R, C, align](const detail::BlockContext& ctx) {
                     auto [r0, r1] = detail::split_range(R, ctx.block_idx, ctx.block_dim, align);
                     const float* wp = w.data<float>();
                     float* dw = partial.data<float>() + ctx.block_idx * C;
                     std::fill(dw, dw + C, 0.0f);
                     for (int64_t r = r0; r < r1; ++r) {
                       const float* xr = x.data<float>() + r * C;
                       const float* dyr = dy.data<float>() + r * C;
                       float* dxr = dx.data<float>() + r * C;
                       const float* plus = dx_plus.defined() ? dx_plus.data<float>() + r * C : nullptr;
                       const float s = rstd.data<float>()[r];
                       float dot = 0.0f;  // sum_j dy[j] w[j] x[j]
                       for (int64_t c = 0; c < C; ++c) dot += dyr[c] * wp[c] * xr[c];
                       const float k = s * s * s * dot / static_cast<float>(C);
                       for (int64_t c = 0; c < C; ++c) {
                         dxr[c] = s * dyr[c] * wp[c] - xr[c] * k + (plus ? plus[c] : 0.0f);
                         dw[c] += dyr[c] * xr[c] * s;
                       }
                     }
                   });
  Tensor dw = g.dw;
  const float beta = dw_into.defined() ? dw_beta : 0.0f;
  detail::launch_rows("rmsnorm_backward_dw", detail::KernelKind::vector, {x.shape()}, {DType::f32},
                      "", {beta == 0.0f ? std::vector<Tensor>{partial} : std::vector<Tensor>{partial, dw}, {dw}}, C, bd,
                      [partial, dw, bd, C, beta](int64_t c0, int64_t c1) {
                        const float* p = partial.data<float>();
                        float* out = dw.data<float>();
                        for (int64_t c = c0; c < c1; ++c) {
                          float s = beta == 0.0f ? 0.0f : beta * out[c];
                          for (int b = 0; b < bd; ++b) s += p[b * C + c];
                          out[c] = s;
                        }
                      });
  return g;
}

}  // namespace coremesh::ops
