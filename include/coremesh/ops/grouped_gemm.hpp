// Grouped GEMM: G independent matmuls in one kernel (MoE experts).
//
// Notation: G groups, M_g rows of group g, K input features, N output features.
// Weights are (N,K) per group as nn.Linear stores them (y = x w^T), or (K,N)
// with WeightLayout::kn (y = x w). Inputs may be f32 or bf16 (accumulation is
// always f32); FP8 inputs go through grouped_matmul_fp8.
//
// The four data layouts of seed 002 (aclnnGroupedMatmul's split_item):
//   A  lists of x, w, y                          grouped_matmul(xs, ws)
//   B  one x split by a group list, one w, one y grouped_matmul(x, w, offsets)
//   C  lists of x and w, one y (rows stacked)     grouped_matmul_stacked(xs, ws)
//   D  one x and y split by a group list, w list  grouped_matmul(x, ws, offsets)
// A group list is `offsets` (G+1) i64: group g owns rows [offsets[g],
// offsets[g+1]); offsets[0] = 0, non-decreasing, offsets[G] <= M; empty
// groups are allowed and rows from offsets[G] on are written as zeros. The
// offsets are read when the kernel runs, so they may come from an earlier
// kernel on the same stream (MoE permute) without a host synchronization.
#pragma once

#include <vector>

#include "coremesh/core/tensor.hpp"
#include "coremesh/ops/quant.hpp"

namespace coremesh::ops {

enum class WeightLayout { nk, kn };

// Groups [begin, end) of a layout-B product (end -1: G): the rows of the
// other groups are left as they are, and the rows past offsets[G] are zeroed
// only by a range that ends at G. A product run group by group, e.g. to send
// each group's rows on as soon as they are done, gives the bits of one run.
struct GroupRange {
  int64_t begin = 0, end = -1;
};

// Layout B. x (M,K), w (G,N,K) [nk] or (G,K,N) [kn], offsets (G+1) i64 -> y (M,N).
Tensor grouped_matmul(const Tensor& x, const Tensor& w, const Tensor& offsets,
                      WeightLayout layout = WeightLayout::nk);
void grouped_matmul_out(const Tensor& x, const Tensor& w, const Tensor& offsets, const Tensor& y,
                        WeightLayout layout = WeightLayout::nk, GroupRange groups = {});
// Layout D. x (M,K), ws[g] (N,K) [nk] or (K,N) [kn], offsets (G+1) -> y (M,N).
Tensor grouped_matmul(const Tensor& x, const std::vector<Tensor>& ws, const Tensor& offsets,
                      WeightLayout layout = WeightLayout::nk);
// Layout A. xs[g] (M_g,K), ws[g] -> ys[g] (M_g,N).
std::vector<Tensor> grouped_matmul(const std::vector<Tensor>& xs, const std::vector<Tensor>& ws,
                                   WeightLayout layout = WeightLayout::nk);
// Layout C. xs[g] (M_g,K), ws[g] -> y (sum M_g, N), groups stacked in order.
Tensor grouped_matmul_stacked(const std::vector<Tensor>& xs, const std::vector<Tensor>& ws,
                              WeightLayout layout = WeightLayout::nk);

// Backward of layout B (f32). dy (M,N) -> dx (M,K) (zeros past offsets[G]),
// dw (G,N,K) [nk] or (G,K,N) [kn] (zeros for empty groups). With `dw_into`
// (w's shape, e.g. a view into a gradient arena) it becomes dw + dw_beta *
// dw_into in the GEMM itself (dw_beta 0: only written) and is returned as
// grads.dw: no separate accumulation.
struct GroupedMatmulGrads {
  Tensor dx, dw;
};
GroupedMatmulGrads grouped_matmul_backward(const Tensor& dy, const Tensor& x, const Tensor& w,
                                           const Tensor& offsets,
                                           WeightLayout layout = WeightLayout::nk,
                                           const Tensor& dw_into = {}, float dw_beta = 1.0f);

// The weight-gradient half alone (f32): dw[g] = dy_g^T x_g [nk] or x_g^T dy_g
// [kn] + beta * dw[g], written into `dw` (w's shape, e.g. an arena view;
// beta 0 overwrites). The input-gradient half is the layout-B product
// grouped_matmul(dy, w, offsets) with the other layout. Zero-bubble pipeline
// schedules run the two halves at different times.
void grouped_matmul_dw(const Tensor& dy, const Tensor& x, const Tensor& offsets, const Tensor& dw,
                       WeightLayout layout = WeightLayout::nk, float beta = 0.0f);

// FP8 layout B with DeepSeek-V3 scales: x data (M,K) + scale (M,ceil(K/128)),
// w data (G,N,K) + scale (G,ceil(N/128),ceil(K/128)) -> y (M,N) f32, written
// into `out` when given (contiguous (M,N) f32).
Tensor grouped_matmul_fp8(const QuantizedTensor& x, const QuantizedTensor& w,
                          const Tensor& offsets, const Tensor& out = {}, GroupRange groups = {});

namespace reference {
Tensor grouped_matmul(const Tensor& x, const Tensor& w, const Tensor& offsets,
                      WeightLayout layout = WeightLayout::nk);
GroupedMatmulGrads grouped_matmul_backward(const Tensor& dy, const Tensor& x, const Tensor& w,
                                           const Tensor& offsets,
                                           WeightLayout layout = WeightLayout::nk);
}  // namespace reference

}  // namespace coremesh::ops
