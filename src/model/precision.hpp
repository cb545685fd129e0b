// The block GEMMs in the model's precision (docs/architecture.md, "Precision").
//
// A block GEMM is one of the transformer block's linear layers: the packed
// qkv projection, wo, the dense and shared SwiGLU ([w1; w3], w2) and the
// routed experts (grouped). The embedding, the LM head and the router stay
// f32 and use layers.hpp's plain linear(). Each block GEMM y = x W^T runs
// three products, all with f32 accumulation and f32 outputs:
//
//   forward  y  = x W^T     reduction over in
//   dgrad    dx = dy W      reduction over out
//   wgrad    dW += dy^T x   reduction over tokens
//
//   f32   the operands as they are (the path of the f32 cross-check).
//   bf16  both operands rounded to bf16 (nearest even).
//   fp8   e4m3 with DeepSeek-V3 scales along each product's reduction:
//         forward x in 1x128 tiles along in, W in 128x128 blocks; dgrad dy
//         in 1x128 tiles along out, W^T in 128x128 blocks; wgrad dy^T and
//         x^T in 1x128 tiles along tokens (x is the forward's fp8 x,
//         re-tiled: dequantized, transposed, quantized again, as DeepSeek-V3
//         turns 1x128 tiles into 128x1 ones for the backward).
//
// Notation: N rows (tokens, or permuted rows R = N*K of the experts), E
// experts, out/in the weight's (out,in) shape. Everything launches on the
// current stream; nothing here synchronizes with the host.
#pragma once

#include <functional>

#include "coremesh/core/tensor.hpp"
#include "coremesh/model/config.hpp"
#include "coremesh/ops/grouped_gemm.hpp"
#include "coremesh/ops/quant.hpp"
#include "wgrad.hpp"

namespace coremesh::model::detail {

// A block-GEMM weight: its f32 master (a view into the arena) and, for bf16,
// the bf16 copy that the forward and the dgrad both read. It is made when the
// forward reaches the layer and kept with the activations until the next
// forward: one cast per forward/backward pass. fp8 keeps no copy: the forward
// quantizes W, the backward W^T, each once per pass where it is used.
struct GemmWeight {
  Precision precision = Precision::f32;
  Tensor master;  // (out,in) or stacked (E,out,in) f32
  Tensor bf16;    // bf16: the same shape in bf16
};
GemmWeight gemm_weight(const Tensor& master, Precision precision);

// A block GEMM's input in the form its GEMMs read it; the backward's wgrad
// reads the same form, so this is what a layer saves (the "bf16 activations"
// memory saving; fp8 saves 1 byte plus a scale per 128 elements).
struct GemmInput {
  Precision precision = Precision::f32;
  Tensor x;                  // (N,in): the f32 input itself (f32) or its bf16 copy (bf16)
  ops::QuantizedTensor fp8;  // fp8: data (N,in) + scale (N, ceil(in/128))
};
GemmInput gemm_input(const Tensor& x, Precision precision);

// y (N,out) = x (N,in) W^T.
Tensor linear(const GemmInput& x, const GemmWeight& w);
// y = x W^T  =>  dx (N,in) = dy W, returned;  dW (out,in) = dy^T x, a job for
// the sink (dw: the arena view).
Tensor linear_backward(const Tensor& dy, const GemmInput& x, const GemmWeight& w, const GradRef& dw,
                       WgradSink& sink);

// Routed experts on permuted rows: y (R,out) = x_e W_e^T for the rows
// [offsets[e], offsets[e+1]) of expert e; W (E,out,in), offsets (E+1) i64 (read
// on the stream). Rows from offsets[E] on give zeros. Written into `out` when
// given ((R,out) f32, contiguous; e.g. an expert exchange's send buffer).
// `groups`: only those experts' rows (ops::GroupRange; needs `out`).
Tensor grouped_linear(const GemmInput& x, const GemmWeight& w, const Tensor& offsets, const Tensor& out = {},
                      ops::GroupRange groups = {});
// Where the routed rows came from: expert e's rows are `sources` runs, one
// per source (another PE's tokens), in source order; (e, s) owns rows
// [source_offsets[e * sources + s], ...+1). One source: the whole group.
struct RowSources {
  int sources = 1;
  Tensor source_offsets;  // (E * sources [+ shadow slots] + 1) i64
  // With shadow groups past the (expert, source) ones: trades their parts
  // for the other sources' parts of this PE's shadowed experts
  // (ExpertDispatcher::Dispatched::exchange_parts), before the sums.
  std::function<void(const Tensor& parts)> exchange;
};
// The two halves of grouped_linear_backward: dx (into dx_out when given),
// and the weight gradient's job (dy and x as the whole exchange saw them).
Tensor grouped_linear_dgrad(const Tensor& dy, Precision precision, const GemmWeight& w, const Tensor& offsets,
                            const Tensor& dx_out = {});
void grouped_linear_wgrad(const Tensor& dy, const GemmInput& x, const Tensor& offsets, const GradRef& dw,
                          WgradSink& sink, const RowSources& sources = {});
// dx (R,in) = dy_e W_e, returned;  dW_e = dy_e^T x_e (dw: (E,out,in) arena
// view), a job for the sink. With several sources, each source's product is
// computed on its own and they are summed in source order (as one PE sums
// its micro-batches). dx is written into `dx_out` when given.
Tensor grouped_linear_backward(const Tensor& dy, const GemmInput& x, const GemmWeight& w,
                               const Tensor& offsets, const GradRef& dw, WgradSink& sink,
                               const RowSources& sources = {}, const Tensor& dx_out = {});

}  // namespace coremesh::model::detail
