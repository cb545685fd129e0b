// Fused stable cross-entropy: one pass for lse and loss, one for dlogits.
// Notation: N rows, V classes.
#include "coremesh/ops/loss.hpp"

#include <cmath>

#include "detail/checks.hpp"
#include "detail/launch.hpp"
#include "detail/vec_math.hpp"

namespace coremesh::ops {
namespace {

int64_t target_at(const Tensor& targets, int64_t n) {
  return targets.dtype() == DType::i64 ? targets.data<int64_t>()[n] : targets.data<int32_t>()[n];
}

void check_inputs(const Tensor& logits, const Tensor& targets) {
  detail::check_contiguous(logits, "logits");
  detail::check_dtype(logits, DType::f32, "logits");
  CM_CHECK(logits.dim() == 2, "flatten logits to (N,V)", "logits must be 2-D, got {}", logits.describe());
  detail::check_contiguous(targets, "targets");
  CM_CHECK(targets.dtype() == DType::i64 || targets.dtype() == DType::i32, "pass i32 or i64 targets",
           "targets are {}", dtype_name(targets.dtype()));
  detail::check_shape(targets, {logits.size(0)}, "targets");
}

// Checked class index of row n (-1 when ignored); throws from the kernel.
int64_t checked_target(const Tensor& targets, int64_t n, int64_t V, int64_t ignore) {
  const int64_t t = target_at(targets, n);
  if (t == ignore) return -1;
  CM_CHECK(t >= 0 && t < V, "targets must be class indices in [0, V) or ignore_index",
           "target {} of row {} is out of range for V={}", t, n, V);
  return t;
}

}  // namespace

CrossEntropyOut cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore) {
  check_inputs(logits, targets);
  const int64_t N = logits.size(0), V = logits.size(1);
  CrossEntropyOut out{Tensor::empty({N}), Tensor::empty({N})};
  Tensor loss = out.loss, lse = out.lse;
  detail::launch_rows("cross_entropy", detail::KernelKind::vector, {logits.shape()},
                      {DType::f32, targets.dtype()}, "", {{logits, targets}, {loss, lse}}, N, 2 * V,
                      [logits, targets, loss, lse, V, ignore](int64_t r0, int64_t r1) {
                        for (int64_t n = r0; n < r1; ++n) {
                          const float* z = logits.data<float>() + n * V;
                          const float m = detail::max_of(z, V);
                          const float l = m + std::log(detail::sum_exp(z, V, m));
                          lse.data<float>()[n] = l;
                          const int64_t t = checked_target(targets, n, V, ignore);
                          loss.data<float>()[n] = t < 0 ? 0.0f : l - z[t];
                        }
                      });
  return out;
}

// d loss[n] / d z[n,v] = softmax[n,v] - [v == t],  softmax = exp(z - lse)
Tensor cross_entropy_backward(const Tensor& dloss, const Tensor& logits, const Tensor& targets,
                              const Tensor& lse, int64_t ignore) {
  check_inputs(logits, targets);
  const int64_t N = logits.size(0), V = logits.size(1);
  detail::check_shape(dloss, {N}, "dloss");
  detail::check_shape(lse, {N}, "lse");
  Tensor dz = Tensor::empty({N, V});
  detail::launch_rows("cross_entropy_backward", detail::KernelKind::vector, {logits.shape()},
                      {DType::f32, targets.dtype()}, "", {{dloss, logits, targets, lse}, {dz}}, N, V,
                      [dloss, logits, targets, lse, dz, V, ignore](int64_t r0, int64_t r1) {
                        for (int64_t n = r0; n < r1; ++n) {
                          const float* z = logits.data<float>() + n * V;
                          float* d = dz.data<float>() + n * V;
                          const int64_t t = checked_target(targets, n, V, ignore);
                          if (t < 0) {
                            std::fill(d, d + V, 0.0f);
                            continue;
                          }
                          const float g = dloss.data<float>()[n], l = lse.data<float>()[n];
                          detail::exp_sub_sum(z, d, V, l);  // softmax
                          for (int64_t v = 0; v < V; ++v) d[v] *= g;
                          d[t] -= g;
                        }
                      });
  return dz;
}

}  // namespace coremesh::ops
