// Embedding lookup (rows of the table) and backward (scatter-add by id).
// Notation: V vocabulary, C channels, N ids.
#include "coremesh/ops/embedding.hpp"

#include <algorithm>
#include <cstring>

#include "detail/checks.hpp"
#include "detail/launch.hpp"

namespace coremesh::ops {
namespace {

int64_t id_at(const Tensor& ids, int64_t i, int64_t V) {
  const int64_t id = ids.dtype() == DType::i64 ? ids.data<int64_t>()[i] : ids.data<int32_t>()[i];
  CM_CHECK(id >= 0 && id < V, "token ids must be in [0, vocab)", "id {} at {} is out of range for V={}",
           id, i, V);
  return id;
}

// The slice's whole vocabulary, checked against the (rows, C) tensor held.
VocabSlice resolve(VocabSlice s, int64_t rows) {
  if (s.vocab < 0) s.vocab = rows;
  CM_CHECK(s.begin >= 0 && s.begin + rows <= s.vocab, "give a slice inside the vocabulary",
           "rows [{}, {}) of a vocabulary of {}", s.begin, s.begin + rows, s.vocab);
  return s;
}

void check_ids(const Tensor& ids) {
  detail::check_contiguous(ids, "ids");
  CM_CHECK(ids.dtype() == DType::i64 || ids.dtype() == DType::i32, "pass i32 or i64 ids",
           "ids are {}", dtype_name(ids.dtype()));
}

}  // namespace

// out[i,:] = table[ids[i],:]
Tensor embedding(const Tensor& table, const Tensor& ids, VocabSlice slice) {
  detail::check_contiguous(table, "table");
  detail::check_dtype(table, DType::f32, "table");
  CM_CHECK(table.dim() == 2, "pass a (V,C) table", "table must be 2-D, got {}", table.describe());
  check_ids(ids);
  const int64_t V = table.size(0), C = table.size(1), N = ids.numel();
  const VocabSlice s = resolve(slice, V);
  Shape shape = ids.shape();
  shape.push_back(C);
  Tensor out = Tensor::empty(shape);
  detail::launch_rows("embedding", detail::KernelKind::vector, {table.shape(), ids.shape()},
                      {DType::f32, ids.dtype()}, "", {{table, ids}, {out}}, N, C, [table, ids, out, V, C, s](int64_t i0, int64_t i1) {
                        for (int64_t i = i0; i < i1; ++i) {
                          const int64_t row = id_at(ids, i, s.vocab) - s.begin;
                          float* o = out.data<float>() + i * C;
                          if (row < 0 || row >= V) std::fill(o, o + C, 0.0f);
                          else std::memcpy(o, table.data<float>() + row * C, static_cast<size_t>(C) * sizeof(float));
                        }
                      });
  return out;
}

// dtable[v,c] = sum_{i: ids[i]=v} dy[i,c]; block b owns columns split_range(C, b, n).
Tensor embedding_backward(const Tensor& dy, const Tensor& ids, int64_t V) {
  CM_CHECK(dy.dim() >= 1, "dy must be (..., C) with one row per id", "dy is a scalar");
  Tensor dtable = Tensor::empty({V, dy.size(-1)});
  embedding_backward_into(dy, ids, dtable, 0.0f);
  return dtable;
}

void embedding_backward_into(const Tensor& dy, const Tensor& ids, Tensor dtable, float beta, VocabSlice slice) {
  detail::check_contiguous(dy, "dy");
  detail::check_dtype(dy, DType::f32, "dy");
  check_ids(ids);
  const int64_t N = ids.numel();
  CM_CHECK(dy.dim() >= 1 && dy.numel() == N * dy.size(-1), "dy must be (..., C) with one row per id",
           "dy {} does not match {} ids", dy.describe(), N);
  const int64_t C = dy.size(-1);
  CM_CHECK(dtable.dim() == 2, "pass dtable as (vocab, C)", "dtable {} is not 2-D", dtable.describe());
  const int64_t V = dtable.size(0);
  const VocabSlice s = resolve(slice, V);
  detail::check_shape(dtable, {V, C}, "dtable");
  detail::check_contiguous(dtable, "dtable");
  detail::check_dtype(dtable, DType::f32, "dtable");
  if (V * C == 0) return;
  detail::Plan plan = detail::plan("embedding_backward", detail::KernelKind::vector,
                                   {dy.shape(), {V, C}}, {DType::f32, ids.dtype()},
                                   "", [&](int max_blocks) {
                                     detail::Tiling t;
                                     t.align = 16;  // whole cache lines of columns per block
                                     t.block_dim = static_cast<int>(std::min<int64_t>(
                                         max_blocks, detail::ceil_div(C, 16)));
                                     return t;
                                   });
  detail::launch(std::move(plan), {beta == 0.0f ? std::vector<Tensor>{dy, ids} : std::vector<Tensor>{dy, ids, dtable}, {dtable}},
                 [dy, ids, dtable, N, V, C, beta, s](const detail::BlockContext& ctx) {
                   auto [c0, c1] = detail::split_range(C, ctx.block_idx, ctx.block_dim, 16);
                   float* out = dtable.data<float>();
                   if (beta != 1.0f) {
                     for (int64_t v = 0; v < V; ++v)
                       for (int64_t c = c0; c < c1; ++c)
                         out[v * C + c] = beta == 0.0f ? 0.0f : beta * out[v * C + c];
                   }
                   for (int64_t i = 0; i < N; ++i) {
                     const int64_t r = id_at(ids, i, s.vocab) - s.begin;
                     if (r < 0 || r >= V) continue;  // a row held by another slice
                     const float* g = dy.data<float>() + i * C;
                     float* row = out + r * C;
                     for (int64_t c = c0; c < c1; ++c) row[c] += g[c];
                   }
                 });
}

}  // namespace coremesh::ops
