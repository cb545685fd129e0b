// Embedding lookup and its backward.
// Notation: V vocabulary rows, C channels, N ids (any shape).
#pragma once

#include "coremesh/core/tensor.hpp"

namespace coremesh::ops {

// The rows [begin, begin + V) of a table of `vocab` rows, held as a (V, C)
// tensor: vocabulary parallelism gives each tensor-parallel rank one slice.
// {} is a whole table (vocab = its own rows).
struct VocabSlice {
  int64_t begin = 0;
  int64_t vocab = -1;  // rows of the whole table; -1: the tensor's own
};

// table (V,C) f32, ids (...) i32/i64 in [0, vocab) -> (..., C); with a slice,
// the rows of ids held elsewhere are zero (the slices' lookups sum to the
// whole table's).
Tensor embedding(const Tensor& table, const Tensor& ids, VocabSlice slice = {});
// dy (..., C), ids (...) -> dtable (V,C) = sum of dy rows per id. Blocks own
// column ranges, so the sum is deterministic and needs no atomics.
Tensor embedding_backward(const Tensor& dy, const Tensor& ids, int64_t vocab);
// dtable (vocab, C) = d table + beta * dtable, in place (beta 0: dtable is
// only written, e.g. the first backward into a gradient arena). With a slice,
// dtable holds its rows and ids held elsewhere add nothing.
void embedding_backward_into(const Tensor& dy, const Tensor& ids, Tensor dtable, float beta = 1.0f,
                             VocabSlice slice = {});

namespace reference {
Tensor embedding(const Tensor& table, const Tensor& ids);
Tensor embedding_backward(const Tensor& dy, const Tensor& ids, int64_t vocab);
}  // namespace reference

}  // namespace coremesh::ops
