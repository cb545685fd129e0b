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

namespace reference {
Tensor embedding(const Tensor& table, const Tensor& ids);
Tensor embedding_backward(const Tensor& dy, const Tensor& ids, int64_t vocab);
}  // namespace reference

}  // namespace coremesh::ops
