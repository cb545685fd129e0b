// Dense GEMM vs the naive reference: transposes, batching (also a shared 2-D
// operand), bf16 inputs, accumulation, FP8 block-scaled, backward + FD check.
#include "coremesh/ops/gemm.hpp"

#include <cstring>

#include "harness.hpp"

namespace coremesh::ops {
namespace {

using namespace testing;

Tensor operand(int64_t batch, int64_t rows, int64_t cols, bool trans, uint64_t seed) {
  Shape s = trans ? Shape{cols, rows} : Shape{rows, cols};
  if (batch > 0) s.insert(s.begin(), batch);
  return randn(s, seed);
}

TEST(OpsGemm, TransposesAndOddSizes) {
  const int64_t M = 67, K = 45, N = 83;
  for (int t = 0; t < 4; ++t) {
    const bool ta = t & 1, tb = t & 2;
    SCOPED_TRACE(::testing::Message() << "ta=" << ta << " tb=" << tb);
    Tensor a = operand(0, M, K, ta, 1), b = operand(0, K, N, tb, 2);
    Tensor ref = reference::matmul(a, b, ta, tb);
    for_each_limit([&](const LimitCase&) {
      Guarded c({M, N});
      matmul_out(a, b, c.tensor, ta, tb);
      test_stream().synchronize();
      EXPECT_NMSE(c.tensor, ref, 1e-12);
      EXPECT_TRUE(c.intact());
    });
  }
}

TEST(OpsGemm, LargeEnoughToTile) {
  Tensor a = randn({300, 200}, 3), b = randn({200, 129}, 4);
  Tensor ref = reference::matmul(a, b);
  for_each_limit([&](const LimitCase&) {
    Tensor c = matmul(a, b);
    test_stream().synchronize();
    EXPECT_NMSE(c, ref, 1e-12);
  });
}

// Large enough to tile over blocks, K over several of the GEMM kernel's
// 256-deep blocks, ragged M and N, every transpose, and beta 1 accumulating
// into what c held (c is guarded: nothing outside it may change).
TEST(OpsGemm, AccumulatesOverSeveralKBlocksUnderEveryLimit) {
  const int64_t M = 389, K = 531, N = 83;
  for (int t = 0; t < 4; ++t) {
    const bool ta = t & 1, tb = t & 2;
    SCOPED_TRACE(::testing::Message() << "ta=" << ta << " tb=" << tb);
    Tensor a = operand(0, M, K, ta, 21), b = operand(0, K, N, tb, 22), c0 = randn({M, N}, 23);
    Tensor ref = reference::matmul(a, b, ta, tb);
    for (int64_t i = 0; i < ref.numel(); ++i) ref.data<float>()[i] += c0.data<float>()[i];
    for_each_limit([&](const LimitCase&) {
      Guarded c({M, N});
      std::memcpy(c.tensor.raw_data(), c0.raw_data(), static_cast<size_t>(M * N) * sizeof(float));
      matmul_out(a, b, c.tensor, ta, tb, 1.0f);
      test_stream().synchronize();
      EXPECT_NMSE(c.tensor, ref, 1e-12);
      EXPECT_TRUE(c.intact());
    });
  }
}

TEST(OpsGemm, BatchedAndShared) {
  Tensor a = randn({5, 17, 9}, 5), b = randn({5, 9, 21}, 6), w = randn({21, 9}, 7);
  Tensor ref = reference::matmul(a, b), refw = reference::matmul(a, w, false, true);
  for_each_limit([&](const LimitCase&) {
    Tensor c = matmul(a, b), cw = matmul(a, w, false, true);
    test_stream().synchronize();
    EXPECT_NMSE(c, ref, 1e-12);
    EXPECT_NMSE(cw, refw, 1e-12);
  });
}

TEST(OpsGemm, BF16AndAccumulate) {
  Tensor a = randn({33, 40}, 8).to(DType::bf16), b = randn({50, 40}, 9).to(DType::bf16);
  Tensor ref = reference::matmul(a, b, false, true);
  for_each_limit([&](const LimitCase&) {
    Tensor c = matmul(a, b, false, true);
    Tensor acc = ref.clone();
    matmul_out(a, b, acc, false, true, 1.0f);  // acc = ref + a b^T = 2 ref
    test_stream().synchronize();
    EXPECT_NMSE(c, ref, 1e-12);
    Tensor twice = ref.clone();
    for (int64_t i = 0; i < twice.numel(); ++i) twice.data<float>()[i] *= 2;
    EXPECT_NMSE(acc, twice, 1e-12);
  });
  Tensor at = randn({40, 33}, 10).to(DType::bf16);  // transposed bf16 a
  Tensor c;
  run_on_stream([&] { c = matmul(at, b, true, true); });
  EXPECT_NMSE(c, reference::matmul(at, b, true, true), 1e-12);
}

TEST(OpsGemm, FP8BlockScaled) {
  Tensor x = randn({70, 300}, 11), w = randn({150, 300}, 12, 0.05f);
  QuantizedTensor xq = reference::quantize_fp8_act(x), wq = reference::quantize_fp8_weight(w);
  Tensor ref = reference::matmul(reference::dequantize_fp8_act(xq),
                                 reference::dequantize_fp8_weight(wq), false, true);
  for_each_limit([&](const LimitCase&) {
    Tensor y = matmul_fp8(xq, wq);
    test_stream().synchronize();
    EXPECT_NMSE(y, ref, 1e-11);
  });
}

TEST(OpsGemm, BackwardAllTransposes) {
  for (int t = 0; t < 4; ++t) {
    const bool ta = t & 1, tb = t & 2;
    for (int mode = 0; mode < 3; ++mode) {  // 2-D, batched, batched a with shared b
      SCOPED_TRACE(::testing::Message() << "ta=" << ta << " tb=" << tb << " mode=" << mode);
      const int64_t batch = mode == 0 ? 0 : 3, M = 7, K = 5, N = 6;
      Tensor a = operand(batch, M, K, ta, 13), b = operand(mode == 1 ? 3 : 0, K, N, tb, 14);
      Tensor dc = randn(batch ? Shape{batch, M, N} : Shape{M, N}, 15);
      MatmulGrads ref = reference::matmul_backward(dc, a, b, ta, tb);
      for_each_limit([&](const LimitCase&) {
        MatmulGrads g = matmul_backward(dc, a, b, ta, tb);
        test_stream().synchronize();
        EXPECT_NMSE(g.da, ref.da, 1e-12);
        EXPECT_NMSE(g.db, ref.db, 1e-12);
      });
      MatmulGrads g;
      run_on_stream([&] { g = matmul_backward(dc, a, b, ta, tb); });
      auto loss = [&] {
        Tensor c;
        run_on_stream([&] { c = matmul(a, b, ta, tb); });
        return dot(c, dc);
      };
      EXPECT_LT(grad_check(a, g.da, loss), 1e-2);
      EXPECT_LT(grad_check(b, g.db, loss), 1e-2);
    }
  }
}

TEST(Gemm, AnOutputSharingAnInputsMemoryIsRefused) {
  run_on_stream([] {
    Tensor a = randn({16, 16}, 1), b = randn({16, 16}, 2);
    EXPECT_THROW(matmul_out(a, b, a), InvalidArgument);
    EXPECT_THROW(matmul_out(a, b, b), InvalidArgument);
    Tensor rows = randn({32, 16}, 3);
    Tensor top = rows.slice(0, 0, 16), middle = rows.slice(0, 8, 24);
    EXPECT_THROW(matmul_out(top, b, middle), InvalidArgument);
    Tensor bottom = rows.slice(0, 16, 32);
    const Tensor want = matmul(top, b);
    matmul_out(top, b, bottom);  // the same buffer, other rows: fine
    test_stream().synchronize();
    EXPECT_TRUE(bitwise_equal(bottom, want));
  });
}

// No batches: a 2-D operand is shared by none of them (it gave [1, M, N] and
// read the empty operand; both 3-D divided by zero).
TEST(Gemm, ZeroBatchesGiveAnEmptyBatch) {
  run_on_stream([] {
    EXPECT_EQ(matmul(Tensor::empty({0, 4, 8}), randn({8, 4}, 1)).shape(), (Shape{0, 4, 4}));
    EXPECT_EQ(matmul(randn({4, 8}, 2), Tensor::empty({0, 8, 4})).shape(), (Shape{0, 4, 4}));
    EXPECT_EQ(matmul(Tensor::empty({0, 4, 8}), Tensor::empty({0, 8, 4})).shape(), (Shape{0, 4, 4}));
  });
}

}  // namespace
}  // namespace coremesh::ops
