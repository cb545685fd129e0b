// FP8 fine-grained quantization (DeepSeek-V3) and casts.
// Notation: M rows, K columns, B = kQuantBlock = 128, Kb = ceil(K/B).
// A tile's work is two passes over its (at most B) contiguous runs: fp8::amax,
// then fp8::encode_scaled (x / scale, then e4m3); dequantization is
// fp8::decode_scaled per run. fp8_codec.hpp's runs are AVX2 and bit-identical
// to core/dtype.hpp's element conversions and to reference::quantize_fp8_*.
#include "coremesh/ops/quant.hpp"

#include "coremesh/ops/transpose.hpp"

#include <cmath>

#include "detail/checks.hpp"
#include "detail/convert.hpp"
#include "detail/fp8_codec.hpp"
#include "detail/launch.hpp"

namespace coremesh::ops {
namespace {

using detail::ceil_div;
constexpr int64_t B = kQuantBlock;
constexpr int64_t kChunk = 4096;  // elements per cast work unit

float scale_of(float amax) { return amax > 0.0f && std::isfinite(amax) ? amax / kF8E4M3Max : 1.0f; }

void check_float_matrix(const Tensor& x, const char* what) {
  detail::check_contiguous(x, what);
  CM_CHECK(x.dim() == 2, "pass a 2-D (rows, columns) tensor", "{} must be 2-D, got {}", what,
           x.describe());
  CM_CHECK(x.dtype() == DType::f32 || x.dtype() == DType::bf16, "pass f32 or bf16",
           "{} must be f32 or bf16, got {}", what, dtype_name(x.dtype()));
}

// Rows [r0, r1) of x (M,K): per 1xB tile, its amax, its scale, its codes.
template <typename Src>
void quantize_rows(const Src* x, int64_t r0, int64_t r1, int64_t K, int64_t Kb, uint8_t* q, float* s) {
  for (int64_t r = r0; r < r1; ++r) {
    for (int64_t kb = 0; kb < Kb; ++kb) {
      const int64_t at = r * K + kb * B, n = std::min(B, K - kb * B);
      const float sc = scale_of(fp8::amax(x + at, n));
      s[r * Kb + kb] = sc;
      fp8::encode_scaled(x + at, n, sc, q + at);
    }
  }
}

}  // namespace

// x (M,K) -> data (M,K) f8, scale (M,Kb): one scale per 1xB tile of a row.
void quantize_fp8_act_out(const Tensor& x, const Tensor& data, const Tensor& scale) {
  check_float_matrix(x, "x");
  const int64_t M = x.size(0), K = x.size(1), Kb = ceil_div(K, B);
  detail::check_shape(data, {M, K}, "data");
  detail::check_dtype(data, DType::f8e4m3, "data");
  detail::check_shape(scale, {M, Kb}, "scale");
  detail::check_dtype(scale, DType::f32, "scale");
  detail::check_disjoint(data, "data", x, "x");
  detail::check_disjoint(scale, "scale", x, "x");
  detail::check_disjoint(scale, "scale", data, "data");
  detail::launch_rows(
      "quantize_fp8_act", detail::KernelKind::vector, {x.shape()}, {x.dtype()}, "", {{x}, {data, scale}}, M, K,
      [x, data, scale, K, Kb](int64_t r0, int64_t r1) {
        uint8_t* q = reinterpret_cast<uint8_t*>(data.data<f8e4m3>());
        float* s = scale.data<float>();
        if (x.dtype() == DType::f32)
          quantize_rows(x.data<float>(), r0, r1, K, Kb, q, s);
        else
          quantize_rows(reinterpret_cast<const uint16_t*>(x.data<bf16>()), r0, r1, K, Kb, q, s);
      });
}

QuantizedTensor quantize_fp8_act(const Tensor& x) {
  check_float_matrix(x, "x");
  QuantizedTensor out{Tensor::empty(x.shape(), DType::f8e4m3),
                      Tensor::empty({x.size(0), ceil_div(x.size(1), B)}, DType::f32)};
  quantize_fp8_act_out(x, out.data, out.scale);
  return out;
}

Tensor dequantize_fp8_act(const QuantizedTensor& q) {
  detail::check_contiguous(q.data, "q.data");
  detail::check_dtype(q.data, DType::f8e4m3, "q.data");
  CM_CHECK(q.data.dim() == 2, "pass 2-D fp8 data", "q.data must be 2-D");
  const int64_t M = q.data.size(0), K = q.data.size(1), Kb = ceil_div(K, B);
  detail::check_shape(q.scale, {M, Kb}, "q.scale");
  Tensor y = Tensor::empty({M, K});
  detail::launch_rows("dequantize_fp8_act", detail::KernelKind::vector, {q.data.shape()},
                      {DType::f8e4m3}, "", {{q.data, q.scale}, {y}}, M, K, [q, y, K, Kb](int64_t r0, int64_t r1) {
                        const uint8_t* d = reinterpret_cast<const uint8_t*>(q.data.raw_data());
                        const float* s = q.scale.data<float>();
                        float* out = y.data<float>();
                        for (int64_t r = r0; r < r1; ++r)
                          for (int64_t kb = 0; kb < Kb; ++kb) {
                            const int64_t at = r * K + kb * B;
                            fp8::decode_scaled(d + at, std::min(B, K - kb * B), s[r * Kb + kb], out + at);
                          }
                      });
  return y;
}

Tensor fp8_round_transposed(const Tensor& t) {
  return dequantize_fp8_act(quantize_fp8_act(transpose(t)));
}

// w (N,K) or (G,N,K) -> data, scale (Nb,Kb) or (G,Nb,Kb): one scale per BxB block.
namespace {
struct WeightDims {
  int64_t G, N, K, Nb, Kb;
};
WeightDims weight_dims(const Tensor& w) {
  CM_CHECK(w.dim() == 2 || w.dim() == 3, "pass weights (N,K) or stacked (G,N,K)",
           "weights must be 2-D or 3-D, got {}", w.describe());
  const int64_t G = w.dim() == 3 ? w.size(0) : 1, N = w.size(-2), K = w.size(-1);
  return {G, N, K, ceil_div(N, B), ceil_div(K, B)};
}
Shape scale_shape(const Tensor& w, const WeightDims& d) {
  return w.dim() == 3 ? Shape{d.G, d.Nb, d.Kb} : Shape{d.Nb, d.Kb};
}

// Blocks [b0, b1) of w, numbered (g, nb, kb) row-major: amax over the block's
// rows, then each row's codes.
template <typename Src>
void quantize_blocks(const Src* w, int64_t b0, int64_t b1, const WeightDims& d, uint8_t* q, float* s) {
  for (int64_t b = b0; b < b1; ++b) {
    const int64_t g = b / (d.Nb * d.Kb), n0 = b / d.Kb % d.Nb * B, k0 = b % d.Kb * B;
    const int64_t rows = std::min(B, d.N - n0), cols = std::min(B, d.K - k0);
    const int64_t base = g * d.N * d.K + n0 * d.K + k0;
    float amax = 0.0f;
    for (int64_t r = 0; r < rows; ++r) amax = std::max(amax, fp8::amax(w + base + r * d.K, cols));
    const float sc = scale_of(amax);
    s[b] = sc;
    for (int64_t r = 0; r < rows; ++r) fp8::encode_scaled(w + base + r * d.K, cols, sc, q + base + r * d.K);
  }
}
}  // namespace

QuantizedTensor quantize_fp8_weight(const Tensor& w) {
  detail::check_contiguous(w, "w");
  CM_CHECK(w.dtype() == DType::f32 || w.dtype() == DType::bf16, "pass f32 or bf16",
           "w must be f32 or bf16, got {}", dtype_name(w.dtype()));
  const WeightDims d = weight_dims(w);
  QuantizedTensor out{Tensor::empty(w.shape(), DType::f8e4m3),
                      Tensor::empty(scale_shape(w, d), DType::f32)};
  Tensor data = out.data, scale = out.scale;
  detail::launch_rows(
      "quantize_fp8_weight", detail::KernelKind::vector, {w.shape()}, {w.dtype()}, "", {{w}, {data, scale}},
      d.G * d.Nb * d.Kb, B * B, [w, data, scale, d](int64_t b0, int64_t b1) {
        uint8_t* q = reinterpret_cast<uint8_t*>(data.data<f8e4m3>());
        float* s = scale.data<float>();
        if (w.dtype() == DType::f32)
          quantize_blocks(w.data<float>(), b0, b1, d, q, s);
        else
          quantize_blocks(reinterpret_cast<const uint16_t*>(w.data<bf16>()), b0, b1, d, q, s);
      });
  return out;
}

Tensor dequantize_fp8_weight(const QuantizedTensor& q) {
  detail::check_contiguous(q.data, "q.data");
  detail::check_dtype(q.data, DType::f8e4m3, "q.data");
  const WeightDims d = weight_dims(q.data);
  detail::check_shape(q.scale, scale_shape(q.data, d), "q.scale");
  Tensor y = Tensor::empty(q.data.shape());
  detail::launch_rows("dequantize_fp8_weight", detail::KernelKind::vector, {q.data.shape()},
                      {DType::f8e4m3}, "", {{q.data, q.scale}, {y}}, d.G * d.N, d.K, [q, y, d](int64_t r0, int64_t r1) {
                        const uint8_t* data = reinterpret_cast<const uint8_t*>(q.data.raw_data());
                        const float* s = q.scale.data<float>();
                        float* out = y.data<float>();
                        for (int64_t r = r0; r < r1; ++r) {
                          const float* srow = s + (r / d.N * d.Nb + r % d.N / B) * d.Kb;
                          for (int64_t kb = 0; kb < d.Kb; ++kb) {
                            const int64_t at = r * d.K + kb * B;
                            fp8::decode_scaled(data + at, std::min(B, d.K - kb * B), srow[kb], out + at);
                          }
                        }
                      });
  return y;
}

Tensor cast(const Tensor& x, DType dtype) {
  detail::check_contiguous(x, "x");
  for (DType t : {x.dtype(), dtype})
    CM_CHECK(t != DType::i32 && t != DType::i64, "cast converts between f32, bf16 and fp8 (Tensor.to converts integers)",
             "cast of {} to {}", x.describe(), dtype_name(dtype));
  Tensor y = Tensor::empty(x.shape(), dtype);
  const int64_t n = x.numel();
  detail::launch_rows("cast", detail::KernelKind::vector, {x.shape()}, {x.dtype(), dtype}, "", {{x}, {y}},
                      detail::ceil_div(n, kChunk), kChunk, [x, y, n](int64_t c0, int64_t c1) {
                        float buf[kChunk];
                        const char* src = static_cast<const char*>(x.raw_data());
                        char* dst = static_cast<char*>(y.raw_data());
                        const size_t si = dtype_size(x.dtype()), so = dtype_size(y.dtype());
                        for (int64_t c = c0; c < c1; ++c) {
                          const int64_t i0 = c * kChunk, len = std::min(kChunk, n - i0);
                          detail::load_float(src + i0 * si, x.dtype(), len, buf);
                          detail::store_float(buf, len, y.dtype(), dst + i0 * so);
                        }
                      });
  return y;
}

}  // namespace coremesh::ops
