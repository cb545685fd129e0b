// Naive FP8 quantization references: element by element through Tensor::item.
#include <cmath>

#include "coremesh/ops/gemm.hpp"
#include "coremesh/ops/quant.hpp"

namespace coremesh::ops::reference {
namespace {

constexpr int64_t B = kQuantBlock;

int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Quantizes x with one scale per (br x bc) block.
QuantizedTensor quantize_blocks(const Tensor& x, int64_t br, int64_t bc) {
  const int64_t R = x.size(0), C = x.size(1);
  Tensor data = Tensor::empty({R, C}, DType::f8e4m3);
  Tensor scale = Tensor::empty({cdiv(R, br), cdiv(C, bc)});
  f8e4m3* q = data.data<f8e4m3>();
  for (int64_t i = 0; i < cdiv(R, br); ++i) {
    for (int64_t j = 0; j < cdiv(C, bc); ++j) {
      float amax = 0.0f;
      for (int64_t r = i * br; r < std::min(R, (i + 1) * br); ++r)
        for (int64_t c = j * bc; c < std::min(C, (j + 1) * bc); ++c) {
          float v = std::fabs(x.item({r, c}));
          if (v > amax) amax = v;
        }
      const float s = (amax > 0.0f && std::isfinite(amax)) ? amax / 448.0f : 1.0f;
      scale.data<float>()[i * cdiv(C, bc) + j] = s;
      for (int64_t r = i * br; r < std::min(R, (i + 1) * br); ++r)
        for (int64_t c = j * bc; c < std::min(C, (j + 1) * bc); ++c)
          q[r * C + c] = to_f8e4m3(x.item({r, c}) / s);
    }
  }
  return {data, scale};
}

Tensor dequantize_blocks(const QuantizedTensor& q, int64_t br, int64_t bc) {
  const int64_t R = q.data.size(0), C = q.data.size(1);
  Tensor y = Tensor::empty({R, C});
  for (int64_t r = 0; r < R; ++r)
    for (int64_t c = 0; c < C; ++c)
      y.data<float>()[r * C + c] = q.data.item({r, c}) * q.scale.item({r / br, c / bc});
  return y;
}

}  // namespace

QuantizedTensor quantize_fp8_act(const Tensor& x) { return quantize_blocks(x, 1, B); }

// 128x1 tiles of dy and x in place (the tokens' direction), no transposes.
Tensor matmul_fp8_wgrad(const Tensor& dy, const Tensor& x) {
  const Tensor dyr = dequantize_blocks(quantize_blocks(dy, B, 1), B, 1);
  const Tensor xr = dequantize_blocks(quantize_blocks(x, B, 1), B, 1);
  return matmul(dyr, xr, true, false);
}
QuantizedTensor quantize_fp8_weight(const Tensor& w) {
  if (w.dim() == 2) return quantize_blocks(w, B, B);
  const int64_t G = w.size(0), N = w.size(1), K = w.size(2);
  QuantizedTensor out{Tensor::empty(w.shape(), DType::f8e4m3),
                      Tensor::empty({G, cdiv(N, B), cdiv(K, B)})};
  for (int64_t g = 0; g < G; ++g) {
    QuantizedTensor one = quantize_blocks(w.select(0, g), B, B);
    out.data.select(0, g).copy_from(one.data);
    out.scale.select(0, g).copy_from(one.scale);
  }
  return out;
}
Tensor dequantize_fp8_act(const QuantizedTensor& q) { return dequantize_blocks(q, 1, B); }
Tensor dequantize_fp8_weight(const QuantizedTensor& q) {
  if (q.data.dim() == 2) return dequantize_blocks(q, B, B);
  Tensor y = Tensor::empty(q.data.shape());
  for (int64_t g = 0; g < q.data.size(0); ++g)
    y.select(0, g).copy_from(
        dequantize_blocks({q.data.select(0, g).contiguous(), q.scale.select(0, g).contiguous()}, B, B));
  return y;
}

}  // namespace coremesh::ops::reference
