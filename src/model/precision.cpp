#include "precision.hpp"

#include "coremesh/ops/elementwise.hpp"
#include "coremesh/ops/gemm.hpp"
#include "coremesh/ops/grouped_gemm.hpp"
#include "coremesh/ops/transpose.hpp"
#include "layers.hpp"

namespace coremesh::model::detail {
namespace {

Tensor round_bf16(const Tensor& t) { return ops::cast(ops::cast(t, DType::bf16), DType::f32); }

// dw (E,out,in) = per expert e, the sum over sources s in order of
// dy_es^T x_es (+ beta dw): each source's product on its own, then added.
void grouped_wgrad(const Tensor& dy, const Tensor& x, const Tensor& offsets, const RowSources& src,
                   const Tensor& dw, float beta) {
  const int S = src.sources;
  if (S == 1) return ops::grouped_matmul_dw(dy, x, offsets, dw, ops::WeightLayout::nk, beta);
  const int64_t E = dw.size(0), groups = src.source_offsets.numel() - 1;  // + shadow groups past E x S
  const Tensor parts = Tensor::empty({groups, dw.size(1), dw.size(2)});
  ops::grouped_matmul_dw(dy, x, src.source_offsets, parts, ops::WeightLayout::nk, 0.0f);
  if (src.exchange) src.exchange(parts);
  for (int64_t e = 0; e < E; ++e) {
    Tensor out = dw.select(0, e), sum = beta == 0.0f ? out : Tensor::empty(out.shape());
    ops::add_out(parts.select(0, e * S), parts.select(0, e * S + 1), sum);  // ((p0 + p1) + p2) ...
    for (int s = 2; s < S; ++s) ops::add_out(sum, parts.select(0, e * S + s), sum);
    if (beta != 0.0f) ops::add_out(out, sum, out);
  }
}

}  // namespace

GemmWeight gemm_weight(const Tensor& master, Precision p) {
  GemmWeight w{p, master, {}};
  if (p == Precision::bf16) w.bf16 = ops::cast(master, DType::bf16);
  return w;
}

GemmInput gemm_input(const Tensor& x, Precision p) {
  GemmInput in{p, {}, {}};
  switch (p) {
    case Precision::f32: in.x = x; break;
    case Precision::bf16: in.x = ops::cast(x, DType::bf16); break;
    case Precision::fp8: in.fp8 = ops::quantize_fp8_act(x); break;  // 1x128 tiles along in
  }
  return in;
}

// ---- dense: y = x W^T

Tensor linear(const GemmInput& x, const GemmWeight& w) {
  switch (x.precision) {
    case Precision::f32: return linear(x.x, w.master);
    case Precision::bf16: return ops::matmul(x.x, w.bf16, false, true);
    case Precision::fp8: break;
  }
  // W in 128x128 blocks (made here: the backward needs W^T, not W)
  return ops::matmul_fp8(x.fp8, ops::quantize_fp8_weight(w.master));
}

Tensor linear_backward(const Tensor& dy, const GemmInput& x, const GemmWeight& w, const GradRef& dw,
                       WgradSink& sink) {
  switch (x.precision) {
    case Precision::f32: return linear_backward(dy, x.x, w.master, dw, sink);
    case Precision::bf16: {
      // dW = bf16(dy)^T bf16(x) + beta dW,  dx = bf16(dy) bf16(W)
      const Tensor dyb = ops::cast(dy, DType::bf16), xb = x.x;
      sink.add(dw, [dyb, xb](const Tensor& g, float beta) {
        Tensor out = g;
        ops::matmul_out(dyb, xb, out, /*trans_a=*/true, /*trans_b=*/false, beta);
      });
      return ops::matmul(dyb, w.bf16);
    }
    case Precision::fp8: break;
  }
  // dgrad dx = dy W = dy (W^T)^T: dy in 1x128 tiles along out, W^T in 128x128
  // blocks. The blocks are square, so W^T's blocks hold the elements of W's
  // blocks transposed: the same scales and codes as reusing W's quantization.
  const Tensor dx = ops::matmul_fp8(ops::quantize_fp8_act(dy),
                                    ops::quantize_fp8_weight(ops::transpose(w.master)));
  // wgrad dW = dy^T x + beta dW over tokens, in 1x128 tiles along them; x is
  // the forward's fp8 x re-tiled.
  const ops::QuantizedTensor x8 = x.fp8;
  sink.add(dw, [dy, x8](const Tensor& g, float beta) {
    Tensor out = g;
    ops::matmul_fp8_wgrad_out(dy, ops::dequantize_fp8_act(x8), out, beta);
  });
  return dx;
}

// ---- grouped (routed experts): y_e = x_e W_e^T

Tensor grouped_linear(const GemmInput& x, const GemmWeight& w, const Tensor& offsets, const Tensor& out,
                      ops::GroupRange groups) {
  if (x.precision == Precision::fp8)
    return ops::grouped_matmul_fp8(x.fp8, ops::quantize_fp8_weight(w.master), offsets, out, groups);
  const Tensor& wx = x.precision == Precision::f32 ? w.master : w.bf16;
  if (!out.defined()) return ops::grouped_matmul(x.x, wx, offsets);
  ops::grouped_matmul_out(x.x, wx, offsets, out, ops::WeightLayout::nk, groups);
  return out;
}

Tensor grouped_linear_dgrad(const Tensor& dy, Precision precision, const GemmWeight& w, const Tensor& offsets,
                            const Tensor& dx_out) {
  using ops::WeightLayout;
  // dx_e = dy_e W_e: the layout-B product with W_e (out,in) read as (K,N) = kn
  auto product = [&](const Tensor& a, const Tensor& b) {
    if (!dx_out.defined()) return ops::grouped_matmul(a, b, offsets, WeightLayout::kn);
    ops::grouped_matmul_out(a, b, offsets, dx_out, WeightLayout::kn);
    return dx_out;
  };
  switch (precision) {
    case Precision::f32: return product(dy, w.master);
    // The grouped GEMMs here take f32: f32 copies of the bf16 values give
    // exactly the bf16 products.
    case Precision::bf16: return product(round_bf16(dy), ops::cast(w.bf16, DType::f32));
    case Precision::fp8: break;
  }
  // as in linear_backward, per expert: W_e^T in 128x128 blocks.
  return ops::grouped_matmul_fp8(ops::quantize_fp8_act(dy), ops::quantize_fp8_weight(ops::transpose(w.master)),
                                 offsets, dx_out);
}

void grouped_linear_wgrad(const Tensor& dy, const GemmInput& x, const Tensor& offsets, const GradRef& dw,
                          WgradSink& sink, const RowSources& src) {
  switch (x.precision) {
    case Precision::f32: {
      const Tensor xf = x.x;
      sink.add(dw, [dy, xf, offsets, src](const Tensor& g, float beta) { grouped_wgrad(dy, xf, offsets, src, g, beta); });
      return;
    }
    case Precision::bf16: {
      const Tensor xb = x.x;
      sink.add(dw, [dy, xb, offsets, src](const Tensor& g, float beta) {
        grouped_wgrad(round_bf16(dy), ops::cast(xb, DType::f32), offsets, src, g, beta);
      });
      return;
    }
    case Precision::fp8: break;
  }
  // 1x128 tiles along the permuted rows, counted from row 0 (the group list
  // is only known on the stream, so a tile may span two experts; its scale
  // then covers both). The rounded values go back to row-major for the f32
  // grouped weight gradient.
  const ops::QuantizedTensor x8 = x.fp8;
  sink.add(dw, [dy, x8, offsets, src](const Tensor& g, float beta) {
    const Tensor dy8 = ops::transpose(ops::fp8_round_transposed(dy));
    const Tensor xr = ops::transpose(ops::fp8_round_transposed(ops::dequantize_fp8_act(x8)));
    grouped_wgrad(dy8, xr, offsets, src, g, beta);
  });
}

Tensor grouped_linear_backward(const Tensor& dy, const GemmInput& x, const GemmWeight& w,
                               const Tensor& offsets, const GradRef& dw, WgradSink& sink,
                               const RowSources& src, const Tensor& dx_out) {
  const Tensor dx = grouped_linear_dgrad(dy, x.precision, w, offsets, dx_out);
  grouped_linear_wgrad(dy, x, offsets, dw, sink, src);
  return dx;
}

}  // namespace coremesh::model::detail
