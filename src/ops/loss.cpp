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

// The slice's whole vocabulary, checked against the V columns held.
VocabSlice resolve(VocabSlice s, int64_t V) {
  if (s.vocab < 0) s.vocab = V;
  CM_CHECK(s.begin >= 0 && s.begin + V <= s.vocab, "give a slice inside the vocabulary",
           "logit columns [{}, {}) of a vocabulary of {}", s.begin, s.begin + V, s.vocab);
  return s;
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
                              const Tensor& lse, int64_t ignore, VocabSlice slice) {
  check_inputs(logits, targets);
  const int64_t N = logits.size(0), V = logits.size(1);
  const VocabSlice s = resolve(slice, V);
  detail::check_shape(dloss, {N}, "dloss");
  detail::check_shape(lse, {N}, "lse");
  Tensor dz = Tensor::empty({N, V});
  detail::launch_rows("cross_entropy_backward", detail::KernelKind::vector, {logits.shape()},
                      {DType::f32, targets.dtype()}, "", {{dloss, logits, targets, lse}, {dz}}, N, V,
                      [dloss, logits, targets, lse, dz, V, ignore, s](int64_t r0, int64_t r1) {
                        for (int64_t n = r0; n < r1; ++n) {
                          const float* z = logits.data<float>() + n * V;
                          float* d = dz.data<float>() + n * V;
                          const int64_t t = checked_target(targets, n, s.vocab, ignore);
                          if (t < 0) {
                            std::fill(d, d + V, 0.0f);
                            continue;
                          }
                          const float g = dloss.data<float>()[n], l = lse.data<float>()[n];
                          detail::exp_sub_sum(z, d, V, l);  // softmax
                          for (int64_t v = 0; v < V; ++v) d[v] *= g;
                          if (t >= s.begin && t < s.begin + V) d[t - s.begin] -= g;
                        }
                      });
  return dz;
}

Tensor cross_entropy_slice_stats(const Tensor& logits, const Tensor& targets, VocabSlice slice, int64_t ignore) {
  check_inputs(logits, targets);
  const int64_t N = logits.size(0), V = logits.size(1);
  const VocabSlice s = resolve(slice, V);
  CM_CHECK(V > 0 && s.vocab % V == 0 && s.begin % V == 0, "cut the vocabulary into equal slices",
           "a slice of {} columns at {} of a vocabulary of {}", V, s.begin, s.vocab);
  const int64_t P = s.vocab / V, r = s.begin / V;
  Tensor stats = Tensor::empty({P + 1, N});
  detail::launch_rows("cross_entropy_slice_stats", detail::KernelKind::vector, {logits.shape()},
                      {DType::f32, targets.dtype()}, "", {{logits, targets}, {stats}}, N, 2 * V,
                      [logits, targets, stats, N, V, P, r, s, ignore](int64_t r0, int64_t r1) {
                        float* out = stats.data<float>();
                        for (int64_t n = r0; n < r1; ++n) {
                          const float* z = logits.data<float>() + n * V;
                          const float m = detail::max_of(z, V);
                          for (int64_t p = 0; p < P; ++p) out[p * N + n] = 0.0f;
                          const int64_t t = checked_target(targets, n, s.vocab, ignore);
                          out[r * N + n] = m + std::log(detail::sum_exp(z, V, m));
                          out[P * N + n] = t >= s.begin && t < s.begin + V ? z[t - s.begin] : 0.0f;
                        }
                      });
  return stats;
}

CrossEntropyOut cross_entropy_from_slice_stats(const Tensor& summed, const Tensor& targets, int64_t ignore) {
  detail::check_contiguous(summed, "summed stats");
  detail::check_dtype(summed, DType::f32, "summed stats");
  CM_CHECK(summed.dim() == 2 && summed.size(0) >= 2, "pass the (P + 1, N) sum of cross_entropy_slice_stats",
           "stats are {}", summed.describe());
  const int64_t P = summed.size(0) - 1, N = summed.size(1);
  detail::check_shape(targets, {N}, "targets");
  CrossEntropyOut out{Tensor::empty({N}), Tensor::empty({N})};
  Tensor loss = out.loss, lse = out.lse;
  detail::launch_rows("cross_entropy_from_slice_stats", detail::KernelKind::vector, {summed.shape()},
                      {DType::f32, targets.dtype()}, "", {{summed, targets}, {loss, lse}}, N, 2 * P,
                      [summed, targets, loss, lse, P, N, ignore](int64_t r0, int64_t r1) {
                        const float* st = summed.data<float>();
                        for (int64_t n = r0; n < r1; ++n) {
                          float m = st[n];
                          for (int64_t p = 1; p < P; ++p) m = std::max(m, st[p * N + n]);
                          float sum = 0.0f;
                          for (int64_t p = 0; p < P; ++p) sum += std::exp(st[p * N + n] - m);
                          const float l = m + std::log(sum);
                          lse.data<float>()[n] = l;
                          loss.data<float>()[n] = target_at(targets, n) == ignore ? 0.0f : l - st[P * N + n];
                        }
                      });
  return out;
}

}  // namespace coremesh::ops
