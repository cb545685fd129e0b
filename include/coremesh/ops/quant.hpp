// Quantization kernels: DeepSeek-V3 fine-grained FP8 (e4m3) scaling and casts.
//
// Notation: M rows (tokens), N output features, K input features; B = 128.
// Activations use 1xB tiles: one scale per row and per B consecutive columns.
// Weights (stored (N,K) like nn.Linear) use BxB blocks. A scale is
// amax(tile) / 448 (1 for an all-zero tile, and for a tile holding inf or
// NaN: its infinities saturate to +-448 and its other values keep scale 1, so
// an overflow upstream shows as a NaN only where one was), q = fp8(x / scale)
// rounded to nearest even and saturating (core/dtype.hpp), and
// dequantization is q * scale. Partial tiles at the edges are allowed. The
// trainer stops on a non-finite loss or gradient norm, which is where an
// overflow in fp8 training shows.
//
// All kernels are asynchronous on the current stream; outputs are valid once
// the stream reaches them.
#pragma once

#include <cstdint>

#include "coremesh/core/tensor.hpp"

namespace coremesh::ops {

inline constexpr int64_t kQuantBlock = 128;

// FP8 data with its f32 scales.
struct QuantizedTensor {
  Tensor data;   // f8e4m3, same shape as the source
  Tensor scale;  // f32: (M, ceil(K/128)) for activations, (ceil(N/128), ceil(K/128)) for weights
};

// x (M,K) f32 or bf16 -> data (M,K) f8e4m3, scale (M, ceil(K/128)).
QuantizedTensor quantize_fp8_act(const Tensor& x);
void quantize_fp8_act_out(const Tensor& x, const Tensor& data, const Tensor& scale);
// q (M,K), scale (M, ceil(K/128)) -> (M,K) f32.
Tensor dequantize_fp8_act(const QuantizedTensor& q);

// w (N,K) f32 or bf16 -> data (N,K) f8e4m3, scale (ceil(N/128), ceil(K/128));
// stacked w (G,N,K) -> scale (G, ceil(N/128), ceil(K/128)).
QuantizedTensor quantize_fp8_weight(const Tensor& w);
// q (N,K), scale (ceil(N/128), ceil(K/128)) -> (N,K) f32.
Tensor dequantize_fp8_weight(const QuantizedTensor& q);

// t (M,K) f32 -> t^T (K,M) holding the values of its fp8 quantization in 1x128
// tiles along M: an fp8 wgrad's operand, whose reduction runs over the M
// tokens (DeepSeek-V3 re-tiles 1x128 tiles into 128x1 ones for it).
Tensor fp8_round_transposed(const Tensor& t);

// Element-wise conversion between f32, bf16 and fp8 on the current stream
// (bf16/fp8 exact rounding).
Tensor cast(const Tensor& x, DType dtype);

namespace reference {
QuantizedTensor quantize_fp8_act(const Tensor& x);
QuantizedTensor quantize_fp8_weight(const Tensor& w);
Tensor dequantize_fp8_act(const QuantizedTensor& q);
Tensor dequantize_fp8_weight(const QuantizedTensor& q);
}  // namespace reference

}  // namespace coremesh::ops
