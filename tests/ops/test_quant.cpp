// FP8 fine-grained quantization kernels vs the reference: bit-exact data and
// scales, edges that are not multiples of 128, zero tiles, saturation.
#include "coremesh/ops/quant.hpp"
#include "harness.hpp"

namespace coremesh::ops {
namespace {

using namespace testing;

TEST(OpsQuant, ActivationTilesBitExact) {
  Tensor x = randn({7, 300}, 1, 3.0f);
  for (int64_t k = 0; k < 300; ++k) x.data<float>()[2 * 300 + k] = 0.0f;  // an all-zero row
  x.data<float>()[5 * 300 + 7] = 1e9f;                                    // a huge outlier
  QuantizedTensor ref = reference::quantize_fp8_act(x);
  for_each_limit([&](const LimitCase&) {
    Guarded data({7, 300}, DType::f8e4m3), scale({7, 3});
    quantize_fp8_act_out(x, data.tensor, scale.tensor);
    test_stream().synchronize();
    EXPECT_TRUE(bitwise_equal(data.tensor, ref.data));
    EXPECT_TRUE(bitwise_equal(scale.tensor, ref.scale));
    EXPECT_TRUE(data.intact() && scale.intact());
  });
  EXPECT_EQ(ref.scale.item({2, 0}), 1.0f);  // zero tile
  EXPECT_EQ(ref.scale.item({5, 0}), 1e9f / 448.0f);
  // Round trip error of e4m3 (3 mantissa bits): relative error <= 2^-4 per element.
  Tensor y;
  run_on_stream([&] { y = dequantize_fp8_act(quantize_fp8_act(x)); });
  EXPECT_TRUE(bitwise_equal(y, reference::dequantize_fp8_act(ref)));
  Tensor xs = x.clone();
  xs.data<float>()[5 * 300 + 7] = y.item({5, 7});
  EXPECT_NMSE(y, xs, 2e-3);
}

TEST(OpsQuant, WeightBlocksBitExact) {
  for (Shape shape : {Shape{130, 260}, Shape{3, 129, 128}, Shape{1, 1}}) {
    SCOPED_TRACE(shape_str(shape));
    Tensor w = randn(shape, 2, 0.05f);
    QuantizedTensor ref = reference::quantize_fp8_weight(w);
    for_each_limit([&](const LimitCase&) {
      QuantizedTensor q = quantize_fp8_weight(w);
      Tensor back = dequantize_fp8_weight(q);
      test_stream().synchronize();
      EXPECT_TRUE(bitwise_equal(q.data, ref.data));
      EXPECT_TRUE(bitwise_equal(q.scale, ref.scale));
      EXPECT_TRUE(bitwise_equal(back, reference::dequantize_fp8_weight(ref)));
      EXPECT_NMSE(back, w, 2e-3);
    });
  }
}

TEST(OpsQuant, BF16InputAndCast) {
  Tensor x = randn({33, 129}, 3).to(DType::bf16);
  QuantizedTensor ref = reference::quantize_fp8_act(x);
  for_each_limit([&](const LimitCase&) {
    QuantizedTensor q = quantize_fp8_act(x);
    Tensor c = cast(x, DType::f8e4m3), f = cast(x, DType::f32);
    test_stream().synchronize();
    EXPECT_TRUE(bitwise_equal(q.data, ref.data));
    EXPECT_TRUE(bitwise_equal(c, x.to(DType::f8e4m3)));
    EXPECT_TRUE(bitwise_equal(f, x.to(DType::f32)));
  });
}

}  // namespace
}  // namespace coremesh::ops
