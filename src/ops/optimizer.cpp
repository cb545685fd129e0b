// AdamW (fused, in place) and global-norm clipping from partial sums.
//
// Both kernels work on fixed chunks of kOptimizerChunk elements of a flat
// tensor; a per-tensor call is the flat call with one segment covering the
// tensor, so every variant runs the same kernel body.
#include "coremesh/ops/optimizer.hpp"

#include <algorithm>
#include <cmath>

#include "detail/checks.hpp"
#include "detail/launch.hpp"
#include "detail/vec_math.hpp"

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define CM_OPTIMIZER_AVX2 1
#endif

namespace coremesh::ops {
namespace {

constexpr int64_t kChunk = kOptimizerChunk;

void check_f32(const Tensor& t, const char* what) {
  detail::check_contiguous(t, what);
  detail::check_dtype(t, DType::f32, what);
}

// `segments` sorted by offset, empty ones dropped, after checking that each
// lies inside [0, n) and that no two overlap.
std::vector<ParamSegment> checked_segments(const std::vector<ParamSegment>& segments, int64_t n) {
  std::vector<size_t> order;
  for (size_t i = 0; i < segments.size(); ++i) {
    const ParamSegment& s = segments[i];
    CM_CHECK(s.offset >= 0 && s.numel >= 0 && s.offset <= n && s.numel <= n - s.offset,
             "a segment is [offset, offset + numel) inside the flat tensor",
             "segment {} [{}, {}) lies outside the tensor of {} elements", i, s.offset,
             s.offset + s.numel, n);
    if (s.numel > 0) order.push_back(i);
  }
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return segments[a].offset < segments[b].offset; });
  std::vector<ParamSegment> sorted;
  sorted.reserve(order.size());
  for (size_t k = 0; k < order.size(); ++k) {
    const ParamSegment& s = segments[order[k]];
    if (k > 0) {
      const ParamSegment& prev = segments[order[k - 1]];
      CM_CHECK(prev.offset + prev.numel <= s.offset, "give each element to at most one segment",
               "segment {} [{}, {}) overlaps segment {} [{}, {})", order[k - 1], prev.offset,
               prev.offset + prev.numel, order[k], s.offset, s.offset + s.numel);
    }
    sorted.push_back(s);
  }
  return sorted;
}

// Calls fn(begin, end, segment) for the part of each segment inside
// [begin, end), in offset order (`segments` sorted and disjoint).
template <typename Fn>
void for_each_piece(const std::vector<ParamSegment>& segments, int64_t begin, int64_t end, Fn&& fn) {
  auto it = std::upper_bound(segments.begin(), segments.end(), begin,
                             [](int64_t x, const ParamSegment& s) { return x < s.offset + s.numel; });
  for (; it != segments.end() && it->offset < end; ++it)
    fn(std::max(begin, it->offset), std::min(end, it->offset + it->numel), *it);
}

// Launches "grad_sq_sum" over the chunks of `grad` (n elements):
// partial[first + c] = sum of squares of the segment elements of chunk c.
void launch_chunk_sums(const Tensor& grad, std::vector<ParamSegment> segments, const Tensor& partial,
                       int64_t first) {
  const int64_t n = grad.numel();
  detail::launch_rows("grad_sq_sum", detail::KernelKind::vector, {grad.shape()}, {DType::f32}, "",
                      {{grad}, {partial}}, detail::ceil_div(n, kChunk), kChunk,
                      [grad, segments = std::move(segments), partial, first, n](int64_t c0, int64_t c1) {
                        const float* x = grad.data<float>();
                        float* out = partial.data<float>() + first;
                        for (int64_t c = c0; c < c1; ++c) {
                          double s = 0;
                          for_each_piece(segments, c * kChunk, std::min(n, (c + 1) * kChunk),
                                         [&](int64_t b, int64_t e, const ParamSegment&) {
                                           s += detail::dot(x + b, x + b, e - b);
                                         });
                          out[c] = static_cast<float>(s);
                        }
                      });
}

// Launches "grad_sq_sum_total": (1) sum of partial[0, chunks) in index order.
Tensor launch_total(const Tensor& partial, int64_t chunks) {
  Tensor out = Tensor::empty({1});
  detail::Plan plan = detail::plan("grad_sq_sum_total", detail::KernelKind::vector, {{chunks}},
                                   {DType::f32}, "", [](int) { return detail::Tiling{}; });
  detail::launch(std::move(plan), {{partial}, {out}},
                 [partial, out, chunks](const detail::BlockContext&) {
                   double s = 0;
                   for (int64_t c = 0; c < chunks; ++c) s += partial.data<float>()[c];
                   out.data<float>()[0] = static_cast<float>(s);
                 });
  return out;
}

// The per-step constants of the update (see adamw_run).
struct AdamWScalars {
  float grad_scale, beta1, one_minus_beta1, beta2, one_minus_beta2;
  float step_size;     // lr / (1 - b1^step)
  float inv_sqrt_bc2;  // 1 / sqrt(1 - b2^step)
  float eps;
  float decay;  // 1 - lr wd, or 1
};

// The AdamW update of n elements (pointers at the run's first element):
//   g = grad * grad_scale
//   m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2
//   p = p decay - step_size m / (sqrt(v) inv_sqrt_bc2 + eps)
// The AVX2 loop and the scalar loop use the same roundings (every multiply-add
// is an explicit fma, no other product meets an addition), so an element gets
// the same bits whether a vector or the tail handles it.
void adamw_run(float* __restrict p, const float* __restrict g, float* __restrict m,
               float* __restrict v, int64_t n, const AdamWScalars& k) {
  int64_t i = 0;
#if CM_OPTIMIZER_AVX2
  const __m256 gs = _mm256_set1_ps(k.grad_scale), b1 = _mm256_set1_ps(k.beta1),
               c1 = _mm256_set1_ps(k.one_minus_beta1), b2 = _mm256_set1_ps(k.beta2),
               c2 = _mm256_set1_ps(k.one_minus_beta2), ss = _mm256_set1_ps(k.step_size),
               isb = _mm256_set1_ps(k.inv_sqrt_bc2), eps = _mm256_set1_ps(k.eps),
               decay = _mm256_set1_ps(k.decay);
  for (; i + 8 <= n; i += 8) {
    const __m256 gi = _mm256_mul_ps(_mm256_loadu_ps(g + i), gs);
    const __m256 mi = _mm256_fmadd_ps(b1, _mm256_loadu_ps(m + i), _mm256_mul_ps(c1, gi));
    const __m256 vi = _mm256_fmadd_ps(b2, _mm256_loadu_ps(v + i), _mm256_mul_ps(_mm256_mul_ps(c2, gi), gi));
    const __m256 denom = _mm256_fmadd_ps(_mm256_sqrt_ps(vi), isb, eps);
    const __m256 update = _mm256_div_ps(_mm256_mul_ps(ss, mi), denom);
    _mm256_storeu_ps(m + i, mi);
    _mm256_storeu_ps(v + i, vi);
    _mm256_storeu_ps(p + i, _mm256_fmsub_ps(_mm256_loadu_ps(p + i), decay, update));
  }
#endif
  for (; i < n; ++i) {
    const float gi = g[i] * k.grad_scale;
    const float mi = std::fma(k.beta1, m[i], k.one_minus_beta1 * gi);
    const float vi = std::fma(k.beta2, v[i], (k.one_minus_beta2 * gi) * gi);
    const float denom = std::fma(std::sqrt(vi), k.inv_sqrt_bc2, k.eps);
    const float update = (k.step_size * mi) / denom;
    m[i] = mi;
    v[i] = vi;
    p[i] = std::fma(p[i], k.decay, -update);
  }
}

}  // namespace

// Pass 1 (per gradient): partial[chunk] = sum of squares of one chunk.
// Pass 2 (one block): out = sum of all partials in a fixed order.
Tensor grad_sq_sum(const std::vector<Tensor>& grads) {
  int64_t chunks = 0;
  for (const Tensor& g : grads) {
    check_f32(g, "grad");
    chunks += detail::ceil_div(g.numel(), kChunk);
  }
  Tensor partial = Tensor::empty({std::max<int64_t>(chunks, 1)});
  int64_t first = 0;
  for (const Tensor& g : grads) {
    launch_chunk_sums(g, {ParamSegment{0, g.numel(), false}}, partial, first);
    first += detail::ceil_div(g.numel(), kChunk);
  }
  return launch_total(partial, chunks);
}

// The same two passes, pass 1 in one launch over the chunks of the flat grad.
Tensor grad_sq_sum(const Tensor& grad, const std::vector<ParamSegment>& segments) {
  check_f32(grad, "grad");
  const int64_t chunks = detail::ceil_div(grad.numel(), kChunk);
  Tensor partial = Tensor::empty({std::max<int64_t>(chunks, 1)});
  launch_chunk_sums(grad, checked_segments(segments, grad.numel()), partial, 0);
  return launch_total(partial, chunks);
}

Tensor grad_sq_partials(const Tensor& grad, const std::vector<ParamSegment>& segments) {
  check_f32(grad, "grad");
  const int64_t chunks = detail::ceil_div(grad.numel(), kChunk);
  Tensor partial = Tensor::empty({std::max<int64_t>(chunks, 1)});
  if (chunks == 0) partial.fill(0.0f);
  launch_chunk_sums(grad, checked_segments(segments, grad.numel()), partial, 0);
  return partial;
}

Tensor sum_partials(const Tensor& partials) {
  check_f32(partials, "partials");
  return launch_total(partials, partials.numel());
}

Tensor clip_coefficient(const Tensor& sq_sum, float max_norm) {
  check_f32(sq_sum, "sq_sum");
  detail::check_shape(sq_sum, {1}, "sq_sum");
  CM_CHECK(max_norm > 0.0f, "use a positive max_norm", "max_norm is {}", max_norm);
  Tensor out = Tensor::empty({1});
  detail::Plan plan = detail::plan("clip_coefficient", detail::KernelKind::vector, {{1}}, {DType::f32},
                                   "", [](int) { return detail::Tiling{}; });
  detail::launch(std::move(plan), {{sq_sum}, {out}},
                 [sq_sum, out, max_norm](const detail::BlockContext&) {
                   const float norm = std::sqrt(sq_sum.data<float>()[0]);
                   out.data<float>()[0] = std::fmin(1.0f, max_norm / (norm + 1e-6f));
                 });
  return out;
}

namespace {

// The update's constants for learning rate `lr` at step `step` (>= 1).
// One compiled copy (not inlined) so that launch-time and run-time values get
// the same roundings (no contraction that differs between call sites).
[[gnu::noinline]] AdamWScalars adamw_scalars(const AdamWConfig& c, float lr, int64_t step) {
  const double bc1 = 1.0 - std::pow(double(c.beta1), double(step));
  const double bc2 = 1.0 - std::pow(double(c.beta2), double(step));
  AdamWScalars k{};
  k.beta1 = c.beta1, k.one_minus_beta1 = 1.0f - c.beta1;
  k.beta2 = c.beta2, k.one_minus_beta2 = 1.0f - c.beta2;
  k.step_size = static_cast<float>(double(lr) / bc1);
  k.inv_sqrt_bc2 = static_cast<float>(1.0 / std::sqrt(bc2));
  k.eps = c.eps;
  k.decay = 1.0f - lr * c.weight_decay;
  return k;
}

// One launch over the chunks of the flat tensors; block b of the launch
// updates the segment pieces inside its chunk range. The lr and step come
// from `values` when given (read as the kernel runs), else from config.lr
// and `step`.
void launch_adamw(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v,
                  const std::vector<ParamSegment>& segments, const AdamWConfig& c, int64_t step,
                  const AdamWStepValues* values, const Tensor& grad_scale) {
  for (const Tensor* t : {&param, &grad, &m, &v}) {
    check_f32(*t, "adamw tensor");
    detail::check_shape(*t, param.shape(), "grad/m/v");
  }
  // param, m and v are each written: one memory for two of them (or the
  // gradient) would mix the states
  const std::pair<const Tensor*, const char*> written[] = {{&param, "param"}, {&m, "m"}, {&v, "v"}};
  for (size_t i = 0; i < 3; ++i) {
    detail::check_disjoint(*written[i].first, written[i].second, grad, "grad");
    for (size_t k = i + 1; k < 3; ++k)
      detail::check_disjoint(*written[i].first, written[i].second, *written[k].first, written[k].second);
  }
  if (grad_scale.defined()) {
    check_f32(grad_scale, "grad_scale");
    detail::check_shape(grad_scale, {1}, "grad_scale");
  }
  // each would turn every parameter into nan or inf on the first step
  CM_CHECK(c.beta1 >= 0 && c.beta1 < 1 && c.beta2 >= 0 && c.beta2 < 1, "use betas in [0, 1)",
           "adamw beta1 {} / beta2 {}", c.beta1, c.beta2);
  CM_CHECK(c.eps > 0 && std::isfinite(c.eps) && std::isfinite(c.lr) && c.lr >= 0 && std::isfinite(c.weight_decay),
           "use a finite lr >= 0, a finite eps > 0 and a finite weight_decay", "adamw lr {}, eps {}, weight_decay {}",
           c.lr, c.eps, c.weight_decay);
  const bool late = values != nullptr;
  const AdamWStepValues at = late ? *values : AdamWStepValues{};
  if (late) {
    CM_CHECK(at.lr.defined() && at.step.defined(), "pass both the lr and the step tensor",
             "the step values need both tensors (lr {}, step {})", at.lr.defined() ? "given" : "missing",
             at.step.defined() ? "given" : "missing");
    check_f32(at.lr, "lr");
    detail::check_shape(at.lr, {1}, "lr");
    CM_CHECK(at.step.dtype() == DType::i64 && at.step.numel() == 1, "pass the step as a (1) i64 tensor",
             "step is {}", at.step.describe());
  } else {
    CM_CHECK(step >= 1, "count steps from 1", "adamw step {}", step);
  }
  const int64_t n = param.numel();
  std::vector<ParamSegment> pieces = checked_segments(segments, n);
  detail::Args args{{param, grad, m, v}, {param, m, v}};
  if (grad_scale.defined()) args.in.add(grad_scale);
  if (late) args.in.add(at.lr), args.in.add(at.step);
  const AdamWScalars fixed = late ? AdamWScalars{} : adamw_scalars(c, c.lr, step);
  detail::launch_rows("adamw", detail::KernelKind::vector, {param.shape()}, {DType::f32}, "", args,
                      detail::ceil_div(n, kChunk), kChunk,
                      [param, grad, m, v, pieces = std::move(pieces), c, fixed, at, late, grad_scale, n](
                          int64_t c0, int64_t c1) {
                        AdamWScalars ks = fixed;
                        if (late) {
                          const int64_t t = at.step.data<int64_t>()[0];
                          CM_CHECK(t >= 1, "count steps from 1", "adamw step {}", t);
                          ks = adamw_scalars(c, at.lr.data<float>()[0], t);
                        }
                        const float decay = ks.decay;
                        ks.grad_scale = grad_scale.defined() ? grad_scale.data<float>()[0] : 1.0f;
                        float* p = param.data<float>();
                        const float* g = grad.data<float>();
                        float* mm = m.data<float>();
                        float* vv = v.data<float>();
                        for_each_piece(pieces, c0 * kChunk, std::min(n, c1 * kChunk),
                                       [&](int64_t b, int64_t e, const ParamSegment& s) {
                                         ks.decay = s.decay ? decay : 1.0f;
                                         adamw_run(p + b, g + b, mm + b, vv + b, e - b, ks);
                                       });
                      });
}

}  // namespace

void adamw_step(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v,
                const std::vector<ParamSegment>& segments, const AdamWConfig& c, int64_t step,
                const Tensor& grad_scale) {
  launch_adamw(param, grad, m, v, segments, c, step, nullptr, grad_scale);
}

void adamw_step(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v,
                const std::vector<ParamSegment>& segments, const AdamWConfig& c, const AdamWStepValues& at,
                const Tensor& grad_scale) {
  launch_adamw(param, grad, m, v, segments, c, 0, &at, grad_scale);
}

void adamw_step(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v,
                const AdamWConfig& config, int64_t step, const Tensor& grad_scale) {
  adamw_step(param, grad, m, v, {ParamSegment{0, param.numel(), true}}, config, step, grad_scale);
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
