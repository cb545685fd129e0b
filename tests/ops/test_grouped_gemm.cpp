// Grouped GEMM: the four layouts of seed 002, empty groups, bf16 and FP8
// inputs, backward vs reference and finite differences.
#include "coremesh/ops/grouped_gemm.hpp"
#include "harness.hpp"

#include <limits>

namespace coremesh::ops {
namespace {

using namespace testing;

Tensor offsets_of(const std::vector<int64_t>& v) {
  return Tensor::from_vector<int64_t>(v, {static_cast<int64_t>(v.size())});
}

// Rows [offsets[g], offsets[g+1]) of x as a separate tensor.
std::vector<Tensor> split_rows(const Tensor& x, const std::vector<int64_t>& off) {
  std::vector<Tensor> parts;
  for (size_t g = 0; g + 1 < off.size(); ++g) parts.push_back(x.slice(0, off[g], off[g + 1]).clone());
  return parts;
}

TEST(OpsGroupedGemm, LayoutBWithEmptyGroups) {
  const int64_t M = 37, K = 19, N = 23;
  const std::vector<int64_t> off{0, 10, 10, 25, 25, 33};  // groups 1 and 3 empty, 4 tail rows
  for (WeightLayout layout : {WeightLayout::nk, WeightLayout::kn}) {
    Tensor x = randn({M, K}, 1);
    Tensor w = layout == WeightLayout::nk ? randn({5, N, K}, 2) : randn({5, K, N}, 2);
    Tensor ref = reference::grouped_matmul(x, w, offsets_of(off), layout);
    for_each_limit([&](const LimitCase&) {
      Guarded y({M, N});
      grouped_matmul_out(x, w, offsets_of(off), y.tensor, layout);
      test_stream().synchronize();
      EXPECT_NMSE(y.tensor, ref, 1e-12);
      EXPECT_TRUE(y.intact());
      EXPECT_EQ(y.tensor.item({35, 3}), 0.0f);  // rows past the last group are zero
    });
  }
}

TEST(OpsGroupedGemm, AllLayoutsAgree) {
  const int64_t K = 40, N = 70;
  const std::vector<int64_t> off{0, 0, 65, 66, 130};
  Tensor x = randn({130, K}, 3);
  Tensor w = randn({4, N, K}, 4);
  std::vector<Tensor> ws;
  for (int64_t g = 0; g < 4; ++g) ws.push_back(w.select(0, g).clone());
  std::vector<Tensor> xs = split_rows(x, off);
  Tensor ref = reference::grouped_matmul(x, w, offsets_of(off));
  for_each_limit([&](const LimitCase&) {
    Tensor yb = grouped_matmul(x, w, offsets_of(off));                // B
    Tensor yd = grouped_matmul(x, ws, offsets_of(off));               // D
    std::vector<Tensor> ya = grouped_matmul(xs, ws);                  // A
    Tensor yc = grouped_matmul_stacked(xs, ws);                       // C
    test_stream().synchronize();
    EXPECT_NMSE(yb, ref, 1e-12);
    EXPECT_TRUE(bitwise_equal(yd, yb));
    EXPECT_TRUE(bitwise_equal(yc, yb));
    ASSERT_EQ(ya.size(), 4u);
    EXPECT_EQ(ya[0].size(0), 0);
    for (size_t g = 0; g < 4; ++g)
      EXPECT_NMSE(ya[g], ref.slice(0, off[g], off[g + 1]).contiguous(), 1e-12);
  });
}

TEST(OpsGroupedGemm, BF16Inputs) {
  const std::vector<int64_t> off{0, 20, 20, 41};
  Tensor x = randn({41, 33}, 5).to(DType::bf16);
  Tensor w = randn({3, 17, 33}, 6).to(DType::bf16);
  Tensor ref = reference::grouped_matmul(x, w, offsets_of(off));
  for_each_limit([&](const LimitCase&) {
    Tensor y = grouped_matmul(x, w, offsets_of(off));
    Tensor y2 = grouped_matmul(x.to(DType::f32), w, offsets_of(off));  // mixed f32 x bf16
    test_stream().synchronize();
    EXPECT_NMSE(y, ref, 1e-12);
    EXPECT_NMSE(y2, ref, 1e-12);
  });
}

TEST(OpsGroupedGemm, FP8BlockScaled) {
  const int64_t M = 150, K = 260, N = 140;
  const std::vector<int64_t> off{0, 64, 64, 150};
  Tensor x = randn({M, K}, 7);
  Tensor w = randn({3, N, K}, 8, 0.1f);
  QuantizedTensor xq = reference::quantize_fp8_act(x);
  QuantizedTensor wq = reference::quantize_fp8_weight(w);
  // Reference: f32 product of the exactly dequantized operands.
  Tensor ref = reference::grouped_matmul(reference::dequantize_fp8_act(xq),
                                         reference::dequantize_fp8_weight(wq), offsets_of(off));
  Tensor exact = reference::grouped_matmul(x, w, offsets_of(off));
  for_each_limit([&](const LimitCase&) {
    Tensor y = grouped_matmul_fp8(xq, wq, offsets_of(off));
    test_stream().synchronize();
    EXPECT_NMSE(y, ref, 1e-11);
    EXPECT_NMSE(y, exact, 5e-3);  // fp8 quantization error only
  });
}

// A product run group by group (GroupRange) leaves the other groups' rows
// as they were, zeroes the tail only with the last range, and gives the bits
// of one run (f32 and fp8); a range outside [0, G] is refused.
TEST(OpsGroupedGemm, GroupByGroupGivesTheBitsOfOneRun) {
  const int64_t M = 45, K = 19, N = 23;
  const std::vector<int64_t> off{0, 10, 10, 25, 40};  // group 1 empty, 5 tail rows
  Tensor x = randn({M, K}, 11), w = randn({4, N, K}, 12);
  runtime::StreamGuard on(test_stream());  // the quantization, ordered before the products
  const QuantizedTensor xq = quantize_fp8_act(x), wq = quantize_fp8_weight(w);
  for_each_limit([&](const LimitCase&) {
    Tensor one = grouped_matmul(x, w, offsets_of(off)), one8 = grouped_matmul_fp8(xq, wq, offsets_of(off));
    Tensor y = Tensor::full({M, N}, 7.0f), y8 = Tensor::full({M, N}, 7.0f);
    grouped_matmul_out(x, w, offsets_of(off), y, WeightLayout::nk, {2, 3});
    test_stream().synchronize();
    EXPECT_EQ(y.item({9, 0}), 7.0f);    // group 0: untouched
    EXPECT_EQ(y.item({42, 0}), 7.0f);   // the tail: not this range's
    EXPECT_EQ(y.item({25, 0}), 7.0f);   // group 3: untouched
    EXPECT_EQ(y.item({10, 0}), one.item({10, 0}));
    for (int64_t g : {3, 0, 1}) {  // any order
      grouped_matmul_out(x, w, offsets_of(off), y, WeightLayout::nk, {g, g + 1 == 4 ? -1 : g + 1});
      grouped_matmul_fp8(xq, wq, offsets_of(off), y8, {g, g + 1});
    }
    grouped_matmul_fp8(xq, wq, offsets_of(off), y8, {2, -1});
    test_stream().synchronize();
    EXPECT_TRUE(bitwise_equal(y, one));
    EXPECT_TRUE(bitwise_equal(y8, one8));
  });
  EXPECT_THROW(grouped_matmul_out(x, w, offsets_of(off), Tensor::empty({M, N}), WeightLayout::nk, {3, 5}),
               InvalidArgument);
  EXPECT_THROW(grouped_matmul_out(x, w, offsets_of(off), Tensor::empty({M, N}), WeightLayout::nk, {3, 2}),
               InvalidArgument);
}

TEST(OpsGroupedGemm, BackwardMatchesReference) {
  const std::vector<int64_t> off{0, 5, 5, 12, 19};  // empty group 1, 2 tail rows
  for (WeightLayout layout : {WeightLayout::nk, WeightLayout::kn}) {
    const int64_t M = 21, K = 9, N = 11;
    Tensor x = randn({M, K}, 9);
    Tensor w = layout == WeightLayout::nk ? randn({4, N, K}, 10) : randn({4, K, N}, 10);
    Tensor dy = randn({M, N}, 11);
    GroupedMatmulGrads ref = reference::grouped_matmul_backward(dy, x, w, offsets_of(off), layout);
    for_each_limit([&](const LimitCase&) {
      GroupedMatmulGrads g = grouped_matmul_backward(dy, x, w, offsets_of(off), layout);
      test_stream().synchronize();
      EXPECT_NMSE(g.dx, ref.dx, 1e-12);
      EXPECT_NMSE(g.dw, ref.dw, 1e-12);
    });
    GroupedMatmulGrads g;
    run_on_stream([&] { g = grouped_matmul_backward(dy, x, w, offsets_of(off), layout); });
    auto loss = [&] {
      Tensor y;
      run_on_stream([&] { y = grouped_matmul(x, w, offsets_of(off), layout); });
      return dot(y, dy);
    };
    EXPECT_LT(grad_check(x, g.dx, loss), 1e-2);
    EXPECT_LT(grad_check(w, g.dw, loss), 1e-2);
  }
}

TEST(OpsGroupedGemm, BackwardAccumulatesIntoGivenWeightGradient) {
  const std::vector<int64_t> off{0, 5, 5, 12, 19};  // an empty group keeps its old gradient
  const int64_t M = 21, K = 9, N = 11;
  Tensor x = randn({M, K}, 12), w = randn({4, N, K}, 13), dy = randn({M, N}, 14);
  const Tensor before = randn({4, N, K}, 15);
  GroupedMatmulGrads ref = reference::grouped_matmul_backward(dy, x, w, offsets_of(off));
  Tensor expected = before.clone();
  for (int64_t i = 0; i < expected.numel(); ++i)
    expected.data<float>()[i] += ref.dw.data<float>()[i];
  for_each_limit([&](const LimitCase&) {
    Tensor acc = before.clone();
    GroupedMatmulGrads g = grouped_matmul_backward(dy, x, w, offsets_of(off), WeightLayout::nk, acc);
    test_stream().synchronize();
    EXPECT_EQ(g.dw.raw_data(), acc.raw_data());
    EXPECT_NMSE(acc, expected, 1e-12);
    EXPECT_NMSE(g.dx, ref.dx, 1e-12);
    // dw_beta 0 only writes (NaN never read; the empty group gets zeros);
    // other betas scale the old gradient.
    Tensor fresh = Tensor::full({4, N, K}, std::numeric_limits<float>::quiet_NaN());
    grouped_matmul_backward(dy, x, w, offsets_of(off), WeightLayout::nk, fresh, 0.0f);
    Tensor half = before.clone();
    grouped_matmul_backward(dy, x, w, offsets_of(off), WeightLayout::nk, half, 0.5f);
    test_stream().synchronize();
    EXPECT_NMSE(fresh, ref.dw, 1e-12);
    Tensor want_half = ref.dw.clone();
    for (int64_t i = 0; i < want_half.numel(); ++i)
      want_half.data<float>()[i] += 0.5f * before.data<float>()[i];
    EXPECT_NMSE(half, want_half, 1e-12);
  });
  Tensor wrong = Tensor::zeros({4, K, N});
  EXPECT_THROW(grouped_matmul_backward(dy, x, w, offsets_of(off), WeightLayout::nk, wrong),
               InvalidArgument);
}

// The weight-gradient half alone: the same bits as the fused backward's dw.
TEST(OpsGroupedGemm, WeightGradientAloneMatchesTheFusedBackward) {
  const std::vector<int64_t> off{0, 5, 5, 12, 19};
  const int64_t M = 21, K = 9, N = 11;
  for (WeightLayout layout : {WeightLayout::nk, WeightLayout::kn}) {
    Tensor x = randn({M, K}, 16), dy = randn({M, N}, 17);
    Tensor w = layout == WeightLayout::nk ? randn({4, N, K}, 18) : randn({4, K, N}, 18);
    const Tensor before = randn(w.shape(), 19);
    for_each_limit([&](const LimitCase&) {
      Tensor fused = before.clone(), alone = before.clone();
      grouped_matmul_backward(dy, x, w, offsets_of(off), layout, fused, 1.0f);
      grouped_matmul_dw(dy, x, offsets_of(off), alone, layout, 1.0f);
      test_stream().synchronize();
      EXPECT_TRUE(bitwise_equal(alone, fused));
    });
  }
  Tensor bad = Tensor::zeros({4, K, N});
  EXPECT_THROW(grouped_matmul_dw(randn({M, N}, 1), randn({M, K}, 2), offsets_of(off), bad), InvalidArgument);
}

TEST(OpsGroupedGemm, RejectsBadOffsets) {
  Tensor x = randn({4, 3}, 1), w = randn({2, 5, 3}, 2);
  EXPECT_THROW(grouped_matmul(x, w, offsets_of({0, 2})), InvalidArgument);  // wrong length
  Tensor y;
  runtime::StreamGuard guard(test_stream());
  y = grouped_matmul(x, w, offsets_of({0, 3, 2}));  // decreasing: reported by the kernel
  EXPECT_THROW(test_stream().synchronize(), Error);
}

}  // namespace
}  // namespace coremesh::ops
