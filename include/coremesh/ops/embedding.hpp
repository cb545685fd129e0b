// Embedding lookup and its backward.
// Notation: V vocabulary rows, C channels, N ids (any shape).
#pragma once

#include "coremesh/core/tensor.hpp"

namespace coremesh::ops {

// table (V,C) f32, ids (...) i32/i64 in [0,V) -> (..., C)
Tensor embedding(const Tensor& table, const Tensor& ids);
// dy (..., C), ids (...) -> dtable (V,C) = sum of dy rows per id. Blocks own
// column ranges, so the sum is deterministic and needs no atomics.
Tensor embedding_backward(const Tensor& dy, const Tensor& ids, int64_t vocab);
// dtable (vocab, C) = d table + beta * dtable, in place (beta 0: dtable is
// only written, e.g. the first backward into a gradient arena).
void embedding_backward_into(const Tensor& dy, const Tensor& ids, Tensor dtable, float beta = 1.0f);

namespace reference {
Tensor embedding(const Tensor& table, const Tensor& ids);
Tensor embedding_backward(const Tensor& dy, const Tensor& ids, int64_t vocab);
}  // namespace reference

}  // namespace coremesh::ops
