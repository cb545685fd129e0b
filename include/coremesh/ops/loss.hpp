// Fused, numerically stable cross-entropy from logits.
// Notation: N rows (tokens), V classes (vocabulary).
//   lse[n]  = log sum_v exp(logits[n,v])        (max-subtracted)
//   loss[n] = lse[n] - logits[n, target[n]]     (0 where target == ignore_index)
//   dlogits[n,v] = dloss[n] * (softmax[n,v] - [v == target[n]])
// The softmax is never materialized: the backward recomputes it from lse.
#pragma once

#include <cstdint>

#include "coremesh/core/tensor.hpp"
#include "coremesh/ops/embedding.hpp"

namespace coremesh::ops {

struct CrossEntropyOut {
  Tensor loss;  // (N)
  Tensor lse;   // (N)
};
// logits (N,V) f32, targets (N) i32 or i64 in [0, V) or ignore_index.
CrossEntropyOut cross_entropy(const Tensor& logits, const Tensor& targets,
                              int64_t ignore_index = -100);
// dloss (N) -> dlogits (N,V). With a slice, logits are the slice's columns,
// lse the whole vocabulary's and targets whole-vocabulary indices: the
// slice's columns of the whole dlogits.
Tensor cross_entropy_backward(const Tensor& dloss, const Tensor& logits, const Tensor& targets,
                              const Tensor& lse, int64_t ignore_index = -100, VocabSlice slice = {});

// Vocabulary-parallel cross entropy (Megatron-LM): P ranks each hold the
// logits of one equal slice of the vocabulary, (N, V/P); the whole logits
// never exist. Each rank computes
//   stats = cross_entropy_slice_stats(logits, targets, slice)      (P + 1, N)
//     row r (the slice's index, begin / (V/P)): the slice's log-sum-exp;
//     the other P - 1 rows 0; row P: the target's logit where the slice
//     holds it, else 0;
// the ranks sum their stats (an all-reduce, exact: every entry has one
// non-zero term), and each computes from the sum the whole vocabulary's
//   lse[n] = m + log sum_r exp(lse_r[n] - m),  m = max_r lse_r[n]  (r in order)
//   loss[n] = lse[n] - logit[n, target[n]]
// with cross_entropy_from_slice_stats; the backward is the sliced one above.
Tensor cross_entropy_slice_stats(const Tensor& logits, const Tensor& targets, VocabSlice slice,
                                 int64_t ignore_index = -100);
CrossEntropyOut cross_entropy_from_slice_stats(const Tensor& summed, const Tensor& targets,
                                               int64_t ignore_index = -100);

namespace reference {
CrossEntropyOut cross_entropy(const Tensor& logits, const Tensor& targets,
                              int64_t ignore_index = -100);
Tensor cross_entropy_backward(const Tensor& dloss, const Tensor& logits, const Tensor& targets,
                              const Tensor& lse, int64_t ignore_index = -100);
}  // namespace reference

}  // namespace coremesh::ops
