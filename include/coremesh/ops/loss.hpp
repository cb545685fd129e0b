// Fused, numerically stable cross-entropy from logits.
// Notation: N rows (tokens), V classes (vocabulary).
//   lse[n]  = log sum_v exp(logits[n,v])        (max-subtracted)
//   loss[n] = lse[n] - logits[n, target[n]]     (0 where target == ignore_index)
//   dlogits[n,v] = dloss[n] * (softmax[n,v] - [v == target[n]])
// The softmax is never materialized: the backward recomputes it from lse.
#pragma once

#include <cstdint>

#include "coremesh/core/tensor.hpp"

namespace coremesh::ops {

struct CrossEntropyOut {
  Tensor loss;  // (N)
  Tensor lse;   // (N)
};
// logits (N,V) f32, targets (N) i32 or i64 in [0, V) or ignore_index.
CrossEntropyOut cross_entropy(const Tensor& logits, const Tensor& targets,
                              int64_t ignore_index = -100);
// dloss (N) -> dlogits (N,V).
Tensor cross_entropy_backward(const Tensor& dloss, const Tensor& logits, const Tensor& targets,
                              const Tensor& lse, int64_t ignore_index = -100);

namespace reference {
CrossEntropyOut cross_entropy(const Tensor& logits, const Tensor& targets,
                              int64_t ignore_index = -100);
Tensor cross_entropy_backward(const Tensor& dloss, const Tensor& logits, const Tensor& targets,
                              const Tensor& lse, int64_t ignore_index = -100);
}  // namespace reference

}  // namespace coremesh::ops
