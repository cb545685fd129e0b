// RMSNorm (plain / residual / FP8), SiLU, GELU, SwiGLU, softmax: reference
// comparison under every core limit, sentinels, and finite differences.
#include "coremesh/ops/activation.hpp"
#include "coremesh/ops/norm.hpp"
#include "harness.hpp"

#include <cmath>
#include <limits>
#include <vector>

namespace coremesh::ops {
namespace {

using namespace testing;

TEST(OpsNorm, RMSNormForwardBackward) {
  for (Shape shape : {Shape{37, 129}, Shape{3, 5, 64}, Shape{1, 7}, Shape{0, 8}}) {
    SCOPED_TRACE(shape_str(shape));
    Tensor x = randn(shape, 1), w = randn({shape.back()}, 2), dy = randn(shape, 3);
    RMSNormOut ref = reference::rmsnorm(x, w, 1e-5f);
    RMSNormGrads gref = reference::rmsnorm_backward(dy, x, w, ref.rstd);
    for_each_limit([&](const LimitCase&) {
      Guarded y(shape), rstd({x.numel() / shape.back()});
      rmsnorm_out(x, w, 1e-5f, y.tensor, rstd.tensor);
      RMSNormGrads g = rmsnorm_backward(dy, x, w, ref.rstd);
      test_stream().synchronize();
      EXPECT_NMSE(y.tensor, ref.y, 1e-12);
      EXPECT_NMSE(rstd.tensor, ref.rstd, 1e-12);
      EXPECT_TRUE(y.intact() && rstd.intact());
      EXPECT_NMSE(g.dx, gref.dx, 1e-11);
      EXPECT_NMSE(g.dw, gref.dw, 1e-11);
    });
  }
  Tensor x = randn({5, 12}, 4), w = randn({12}, 5), dy = randn({5, 12}, 6);
  RMSNormGrads g;
  run_on_stream([&] { g = rmsnorm_backward(dy, x, w, rmsnorm(x, w).rstd); });
  auto loss = [&] {
    RMSNormOut o;
    run_on_stream([&] { o = rmsnorm(x, w); });
    return dot(o.y, dy);
  };
  EXPECT_LT(grad_check(x, g.dx, loss), 1e-2);
  EXPECT_LT(grad_check(w, g.dw, loss), 1e-2);
}

TEST(OpsNorm, NegativeOrNanEpsIsRefused) {
  Tensor x = Tensor::zeros({2, 4}), w = Tensor::full({4}, 1.0f);
  for (float eps : {-1e-6f, std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()})
    EXPECT_THROW(rmsnorm(x, w, eps), InvalidArgument) << eps;
}

TEST(OpsNorm, BackwardAddsIncomingGradientAndAccumulatesDw) {
  Tensor x = randn({23, 70}, 31), w = randn({70}, 32), dy = randn({23, 70}, 33);
  Tensor plus = randn({23, 70}, 34), dw0 = randn({70}, 35);
  RMSNormGrads gref = reference::rmsnorm_backward(dy, x, w, reference::rmsnorm(x, w).rstd);
  Tensor dx_want = gref.dx.clone(), dw_want = gref.dw.clone();
  for (int64_t i = 0; i < dx_want.numel(); ++i) dx_want.data<float>()[i] += plus.data<float>()[i];
  for (int64_t i = 0; i < dw_want.numel(); ++i) dw_want.data<float>()[i] += dw0.data<float>()[i];
  for_each_limit([&](const LimitCase&) {
    Tensor dw = dw0.clone();
    RMSNormGrads g = rmsnorm_backward(dy, x, w, reference::rmsnorm(x, w).rstd, plus, dw);
    test_stream().synchronize();
    EXPECT_EQ(g.dw.raw_data(), dw.raw_data());
    EXPECT_NMSE(g.dx, dx_want, 1e-11);
    EXPECT_NMSE(dw, dw_want, 1e-11);
    Tensor fresh = Tensor::full({70}, std::numeric_limits<float>::quiet_NaN());  // dw_beta 0: never read
    rmsnorm_backward(dy, x, w, reference::rmsnorm(x, w).rstd, plus, fresh, 0.0f);
    test_stream().synchronize();
    EXPECT_NMSE(fresh, gref.dw, 1e-11);
  });
  EXPECT_THROW(rmsnorm_backward(dy, x, w, reference::rmsnorm(x, w).rstd, Tensor::zeros({23, 7})),
               InvalidArgument);
}

TEST(OpsNorm, ResidualAndFP8) {
  Tensor x = randn({19, 300}, 7), res = randn({19, 300}, 8), w = randn({300}, 9);
  Tensor h = x.clone();
  for (int64_t i = 0; i < h.numel(); ++i) h.data<float>()[i] += res.data<float>()[i];
  RMSNormOut ref = reference::rmsnorm(h, w);
  QuantizedTensor qref = reference::quantize_fp8_act(ref.y);
  for_each_limit([&](const LimitCase&) {
    RMSNormResidualOut r = rmsnorm_residual(x, res, w);
    RMSNormFP8Out q = rmsnorm_fp8(h, w);
    test_stream().synchronize();
    EXPECT_TRUE(bitwise_equal(r.h, h));
    EXPECT_NMSE(r.y, ref.y, 1e-12);
    // FP8 output: the quantization of the (float) normalized output; scales
    // may differ in the last ulp from the double reference, so compare the
    // dequantized values.
    EXPECT_NMSE(reference::dequantize_fp8_act(q.y), reference::dequantize_fp8_act(qref), 1e-6);
    EXPECT_NMSE(q.rstd, ref.rstd, 1e-12);
  });
}

TEST(OpsActivation, PointwiseForwardBackward) {
  Tensor x = randn({13, 1001}, 10, 2.0f), dy = randn({13, 1001}, 11);
  for_each_limit([&](const LimitCase&) {
    Tensor s = silu(x), ds = silu_backward(dy, x);
    Tensor g = gelu(x), dg = gelu_backward(dy, x);
    Tensor ge = gelu(x, GeluApprox::none), dge = gelu_backward(dy, x, GeluApprox::none);
    test_stream().synchronize();
    EXPECT_NMSE(s, reference::silu(x), 1e-12);
    EXPECT_NMSE(ds, reference::silu_backward(dy, x), 1e-12);
    EXPECT_NMSE(g, reference::gelu(x), 1e-12);
    EXPECT_NMSE(dg, reference::gelu_backward(dy, x), 1e-9);
    EXPECT_NMSE(ge, reference::gelu(x, GeluApprox::none), 1e-12);
    EXPECT_NMSE(dge, reference::gelu_backward(dy, x, GeluApprox::none), 1e-9);
  });
}

// Rows of 0 columns have no mean square: refused (the rstd came back with
// shape [0] for 3 rows).
TEST(OpsNorm, RowsWithoutColumnsAreRefused) {
  EXPECT_THROW(rmsnorm(Tensor::zeros({3, 0}), Tensor::zeros({0}), 1e-5f), InvalidArgument);
}

TEST(OpsActivation, SwiGLUAndSoftmax) {
  Tensor gu = randn({2, 9, 2 * 77}, 12), dy = randn({2, 9, 77}, 13);
  Tensor x = randn({31, 67}, 14, 3.0f), dsm = randn({31, 67}, 15);
  for_each_limit([&](const LimitCase&) {
    Guarded out({2, 9, 77});
    swiglu_out(gu, out.tensor);
    Tensor d = swiglu_backward(dy, gu);
    Tensor y = softmax(x);
    Tensor dx = softmax_backward(dsm, reference::softmax(x));
    test_stream().synchronize();
    EXPECT_NMSE(out.tensor, reference::swiglu(gu), 1e-12);
    EXPECT_TRUE(out.intact());
    EXPECT_NMSE(d, reference::swiglu_backward(dy, gu), 1e-12);
    EXPECT_NMSE(y, reference::softmax(x), 1e-12);
    EXPECT_NMSE(dx, reference::softmax_backward(dsm, reference::softmax(x)), 1e-11);
  });
  // Large logits stay finite (max subtraction).
  Tensor big = Tensor::from_vector<float>({1000.0f, 1001.0f, -1000.0f}, {1, 3}), yb;
  run_on_stream([&] { yb = softmax(big); });
  EXPECT_NEAR(yb.item({0, 1}), 1.0f / (1.0f + std::exp(-1.0f)), 1e-6);
  // Masked entries (-inf), and logits more than 87.3 below the row's max
  // (exp under FLT_MIN), are exactly 0, in the 8-wide and the scalar tail
  // (they were 1.6e-38); NaN stays NaN.
  constexpr float kInf = std::numeric_limits<float>::infinity();
  std::vector<float> masked(19, -kInf);
  masked[3] = 0.0f, masked[11] = 0.0f, masked[17] = -87.5f, masked[18] = -87.2f;
  Tensor ym;
  run_on_stream([&] { ym = softmax(Tensor::from_vector<float>(masked, {1, 19})); });
  for (int64_t i = 0; i < 19; ++i)
    if (i == 3 || i == 11) EXPECT_FLOAT_EQ(ym.item({0, i}), 0.5f);
    else if (i == 18) EXPECT_GT(ym.item({0, i}), 0.0f);  // exp(-87.2) is a normal float
    else EXPECT_EQ(ym.item({0, i}), 0.0f) << "entry " << i;
  Tensor yn;
  run_on_stream([&] { yn = softmax(Tensor::from_vector<float>({0.0f, std::nanf("")}, {1, 2})); });
  EXPECT_TRUE(std::isnan(yn.item({0, 1})));
}

TEST(OpsActivation, GradientChecks) {
  Tensor x = randn({4, 10}, 16), dy = randn({4, 10}, 17);
  Tensor gu = randn({4, 20}, 18);
  auto check = [&](Tensor input, Tensor grad, std::function<Tensor()> fwd, const Tensor& weight) {
    return grad_check(input, grad, [&] {
      Tensor y;
      run_on_stream([&] { y = fwd(); });
      return dot(y, weight);
    });
  };
  Tensor g;
  run_on_stream([&] { g = silu_backward(dy, x); });
  EXPECT_LT(check(x, g, [&] { return silu(x); }, dy), 1e-2);
  run_on_stream([&] { g = gelu_backward(dy, x); });
  EXPECT_LT(check(x, g, [&] { return gelu(x); }, dy), 1e-2);
  run_on_stream([&] { g = gelu_backward(dy, x, GeluApprox::none); });
  EXPECT_LT(check(x, g, [&] { return gelu(x, GeluApprox::none); }, dy), 1e-2);
  Tensor dsw = randn({4, 10}, 19);
  run_on_stream([&] { g = swiglu_backward(dsw, gu); });
  EXPECT_LT(check(gu, g, [&] { return swiglu(gu); }, dsw), 1e-2);
  run_on_stream([&] { g = softmax_backward(dy, softmax(x)); });
  EXPECT_LT(check(x, g, [&] { return softmax(x); }, dy), 1e-2);
}

// Row by row, the normalized rows may replace their inputs; weights, rstd
// and the SwiGLU output may not overlap what the kernel reads.
TEST(OpsNorm, OutputsInPlaceOrDisjoint) {
  run_on_stream([] {
    Tensor x = randn({6, 32}, 1), res = randn({6, 32}, 2), w = randn({32}, 3);
    const RMSNormOut want = rmsnorm(x, w);
    const RMSNormResidualOut want_res = rmsnorm_residual(x, res, w);
    Tensor y = x.clone(), rstd = Tensor::empty({6});
    rmsnorm_out(y, w, 1e-6f, y, rstd);  // in place
    Tensor h = x.clone(), r = res.clone();
    rmsnorm_residual_out(h, r, w, 1e-6f, {h, r, Tensor::empty({6})});  // h over x, y over the residual
    test_stream().synchronize();
    EXPECT_TRUE(bitwise_equal(y, want.y));
    EXPECT_TRUE(bitwise_equal(h, want_res.h));
    EXPECT_TRUE(bitwise_equal(r, want_res.y));
    Tensor rows = randn({7, 32}, 4);
    EXPECT_THROW(rmsnorm_out(rows.slice(0, 0, 6), w, 1e-6f, rows.slice(0, 1, 7), rstd), InvalidArgument);
    EXPECT_THROW(rmsnorm_out(x, w, 1e-6f, y, x.view({-1}).slice(0, 0, 6)), InvalidArgument);  // rstd in x
    Tensor wy = randn({1, 32}, 5);
    EXPECT_THROW(rmsnorm_out(wy, wy.view({32}), 1e-6f, wy, Tensor::empty({1})), InvalidArgument);  // y over w
    EXPECT_THROW(softmax(Tensor::full({}, 2.0f)), InvalidArgument);  // returned uninitialized memory
    EXPECT_THROW(softmax_backward(Tensor::full({}, 1.0f), Tensor::full({}, 1.0f)), InvalidArgument);
    Tensor gate_up = randn({6, 64}, 6);
    EXPECT_THROW(swiglu_out(gate_up, gate_up.view({-1}).slice(0, 0, 6 * 32).view({6, 32})), InvalidArgument);
  });
}

}  // namespace
}  // namespace coremesh::ops
