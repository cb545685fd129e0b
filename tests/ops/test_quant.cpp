// FP8 fine-grained quantization kernels vs the reference: bit-exact data and
// scales, edges that are not multiples of 128, zero tiles, saturation; the
// fast e4m3 encode against core/dtype.hpp's to_f8e4m3 on every boundary
// between codes, every bf16 value and a stride through all f32 bit patterns
// (all 2^32 in a disabled test); the decode against the table for every code.
#include <bit>
#include <cfloat>
#include <limits>

#include "coremesh/ops/gemm.hpp"
#include "coremesh/ops/grouped_gemm.hpp"
#include "coremesh/ops/quant.hpp"
#include "harness.hpp"

namespace coremesh::ops {
namespace {

using namespace testing;

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

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
  // integers are refused at the call, not by the kernel later
  EXPECT_THROW(cast(x, DType::i32), InvalidArgument);
  EXPECT_THROW(cast(Tensor::zeros({2}, DType::i64), DType::f32), InvalidArgument);
}

// ---- the e4m3 encode, element by element

// f32 values around every decision of f32 -> e4m3, both signs: each code's
// value, the midpoints between neighbours (ties to even), one f32 ulp either
// side of both, the saturation edge, subnormals of both formats, inf, NaNs.
std::vector<float> encode_boundaries() {
  std::vector<float> v;
  auto around = [&](float x) {
    v.push_back(x);
    v.push_back(std::nextafter(x, 0.0f));
    v.push_back(std::nextafter(x, INFINITY));
  };
  for (int c = 0; c < 0x7E; ++c) {
    const float lo = to_float(f8e4m3{static_cast<uint8_t>(c)});
    const float hi = to_float(f8e4m3{static_cast<uint8_t>(c + 1)});
    around(lo);
    around(0.5f * (lo + hi));  // exact: both have at most 4 significant bits
  }
  around(448.0f);
  around(464.0f);  // the midpoint to 480, which e4m3fn does not have
  for (float x : {0x1p-6f, 0x1p-9f, 0x1p-10f, 3 * 0x1p-10f, 15 * 0x1p-11f, 1e-20f, FLT_MIN,
                  std::numeric_limits<float>::denorm_min(), 0x1p-130f, FLT_MAX, 1e10f, 500.0f, 479.9f})
    around(x);
  v.push_back(INFINITY);
  v.push_back(std::bit_cast<float>(0x7FC00000u));  // quiet NaN
  v.push_back(std::bit_cast<float>(0x7F800001u));  // signalling NaN
  v.push_back(std::bit_cast<float>(0x7FFFFFFFu));  // NaN, all payload bits
  const size_t n = v.size();
  for (size_t i = 0; i < n; ++i) v.push_back(-v[i]);
  return v;
}

// Each row of x (rows, 128) starts with inf: the tile's amax is not finite, so
// its scale is 1 and the other 127 elements are encoded as they are, x / 1 = x.
// Returns x with `values` in columns 1..127 (the last row padded with zeros).
Tensor unit_scale_rows(const std::vector<float>& values) {
  const int64_t rows = ceil_div(static_cast<int64_t>(values.size()), 127);
  Tensor x = Tensor::zeros({rows, 128});
  float* p = x.data<float>();
  for (int64_t r = 0; r < rows; ++r) p[r * 128] = INFINITY;
  for (size_t i = 0; i < values.size(); ++i) p[(i / 127) * 128 + 1 + i % 127] = values[i];
  return x;
}

// Compares the codes of quantize_fp8_act(unit_scale_rows(values)) with
// to_f8e4m3 of each value; returns the number of mismatches (prints a few).
int64_t encode_mismatches(const std::vector<float>& values) {
  const Tensor x = unit_scale_rows(values);
  QuantizedTensor q;
  run_on_stream([&] { q = quantize_fp8_act(x); });
  const uint8_t* codes = reinterpret_cast<const uint8_t*>(q.data.raw_data());
  int64_t bad = 0;
  for (size_t i = 0; i < values.size(); ++i) {
    const uint8_t got = codes[(i / 127) * 128 + 1 + i % 127], want = to_f8e4m3(values[i]).bits;
    if (got != want && ++bad <= 5)
      ADD_FAILURE() << "f32 bits 0x" << std::hex << std::bit_cast<uint32_t>(values[i]) << ": code 0x"
                    << int(got) << ", to_f8e4m3 gives 0x" << int(want);
  }
  for (int64_t r = 0; r < q.scale.numel(); ++r) EXPECT_EQ(q.scale.data<float>()[r], 1.0f);
  return bad;
}

TEST(OpsQuantEncode, EveryBoundaryBetweenCodes) {
  const std::vector<float> values = encode_boundaries();
  EXPECT_EQ(encode_mismatches(values), 0);
  // The same values through the reference kernel (also the SIMD tails: 127 per row).
  const Tensor x = unit_scale_rows(values);
  for_each_limit([&](const LimitCase&) {
    QuantizedTensor q = quantize_fp8_act(x);
    test_stream().synchronize();
    EXPECT_TRUE(bitwise_equal(q.data, reference::quantize_fp8_act(x).data));
  });
}

TEST(OpsQuantEncode, StrideThroughAllF32Patterns) {
  // 2^32 / 4093 (a prime) ~ 1.05M patterns spread over every exponent and sign.
  std::vector<float> values;
  for (uint64_t bits = 0; bits < (uint64_t{1} << 32); bits += 4093)
    values.push_back(std::bit_cast<float>(static_cast<uint32_t>(bits)));
  EXPECT_EQ(encode_mismatches(values), 0);
}

TEST(OpsQuantEncode, EveryBF16Value) {
  // All 65536 bf16 patterns, 127 per row after a bf16 inf (scale 1).
  const int64_t rows = ceil_div(65536, 127);
  Tensor x = Tensor::zeros({rows, 128}, DType::bf16);
  bf16* p = x.data<bf16>();
  for (int64_t r = 0; r < rows; ++r) p[r * 128] = bf16{0x7F80};
  for (uint32_t i = 0; i < 65536; ++i) p[(i / 127) * 128 + 1 + i % 127] = bf16{static_cast<uint16_t>(i)};
  QuantizedTensor q;
  run_on_stream([&] { q = quantize_fp8_act(x); });
  const uint8_t* codes = reinterpret_cast<const uint8_t*>(q.data.raw_data());
  int64_t bad = 0;
  for (uint32_t i = 0; i < 65536; ++i)
    bad += codes[(i / 127) * 128 + 1 + i % 127] != to_f8e4m3(to_float(bf16{static_cast<uint16_t>(i)})).bits;
  EXPECT_EQ(bad, 0);
}

// ---- scales: tiles of every magnitude, NaNs inside a tile, tiny amax

TEST(OpsQuant, ScalesOfEveryMagnitudeBitExact) {
  // 64 rows x 300: row r scaled by 2^(5r - 190) (from f32 subnormal
  // amax, where amax/448 underflows, to 2^125), with NaNs, -0 and inf sprinkled in.
  const int64_t M = 64, K = 300;
  Tensor x = randn({M, K}, 21);
  float* p = x.data<float>();
  for (int64_t r = 0; r < M; ++r)
    for (int64_t k = 0; k < K; ++k) p[r * K + k] = std::ldexp(p[r * K + k], static_cast<int>(r * 5 - 190));
  p[3 * K + 5] = NAN;
  p[4 * K + 130] = -NAN;
  p[5 * K + 0] = -0.0f;
  p[6 * K + 299] = -INFINITY;
  for (int64_t k = 0; k < 128; ++k) p[7 * K + k] = k % 2 ? NAN : 0.0f;  // amax 0: scale 1
  for (int64_t k = 128; k < 256; ++k) p[7 * K + k] = k == 200 ? std::numeric_limits<float>::denorm_min() : 0.0f;
  for (Tensor in : {x, x.to(DType::bf16)}) {
    SCOPED_TRACE(dtype_name(in.dtype()));
    const QuantizedTensor ref = reference::quantize_fp8_act(in);
    const Tensor back = reference::dequantize_fp8_act(ref);
    for_each_limit([&](const LimitCase&) {
      QuantizedTensor q = quantize_fp8_act(in);
      Tensor y = dequantize_fp8_act(q);
      test_stream().synchronize();
      EXPECT_TRUE(bitwise_equal(q.data, ref.data));
      EXPECT_TRUE(bitwise_equal(q.scale, ref.scale));
      EXPECT_TRUE(bitwise_equal(y, back));
    });
  }
}

// ---- the decode: every code under scales of every kind

TEST(OpsQuant, DecodeEveryCodeBitExact) {
  const std::vector<float> scales{1.0f, 0.5f, 3.7e-3f, 1e30f, 1e-40f, 0.0f, FLT_MAX / 448.0f, 2.0f / 3.0f};
  const int64_t M = static_cast<int64_t>(scales.size()), K = 256 + 77;  // a partial tile too
  Tensor data = Tensor::empty({M, K}, DType::f8e4m3), scale = Tensor::empty({M, 3});
  for (int64_t r = 0; r < M; ++r) {
    for (int64_t k = 0; k < K; ++k) data.data<f8e4m3>()[r * K + k] = f8e4m3{static_cast<uint8_t>((k * 7 + r) % 256)};
    for (int64_t kb = 0; kb < 3; ++kb) scale.data<float>()[r * 3 + kb] = scales[(r + kb) % M];
  }
  const QuantizedTensor q{data, scale};
  const Tensor ref = reference::dequantize_fp8_act(q);
  for_each_limit([&](const LimitCase&) {
    Tensor y = dequantize_fp8_act(q);
    test_stream().synchronize();
    EXPECT_TRUE(bitwise_equal(y, ref));
  });
  // Weights: (2, 200, 333) codes with (2, 2, 3) block scales.
  Tensor wd = Tensor::empty({2, 200, K}, DType::f8e4m3), ws = Tensor::empty({2, 2, 3});
  for (int64_t i = 0; i < wd.numel(); ++i) wd.data<f8e4m3>()[i] = f8e4m3{static_cast<uint8_t>(i * 13 % 256)};
  for (int64_t i = 0; i < ws.numel(); ++i) ws.data<float>()[i] = scales[static_cast<size_t>(i) % scales.size()];
  const QuantizedTensor wq{wd, ws};
  const Tensor wref = reference::dequantize_fp8_weight(wq);
  for_each_limit([&](const LimitCase&) {
    Tensor y = dequantize_fp8_weight(wq);
    test_stream().synchronize();
    EXPECT_TRUE(bitwise_equal(y, wref));
  });
}

// The fp8 grouped GEMM dequantizes its operands exactly: the same bits as the
// f32 grouped GEMM on dequantize_fp8_act(x) and dequantize_fp8_weight(w).
TEST(OpsQuant, GroupedGemmDequantizesExactly) {
  const int64_t M = 150, K = 260, N = 140;
  const Tensor offsets = Tensor::from_vector<int64_t>({0, 64, 64, 150}, {4});
  Tensor x = randn({M, K}, 31), w = randn({3, N, K}, 32, 0.1f);
  const QuantizedTensor xq = reference::quantize_fp8_act(x), wq = reference::quantize_fp8_weight(w);
  const Tensor xd = reference::dequantize_fp8_act(xq), wd = reference::dequantize_fp8_weight(wq);
  for_each_limit([&](const LimitCase&) {
    Tensor y = grouped_matmul_fp8(xq, wq, offsets), want = grouped_matmul(xd, wd, offsets);
    test_stream().synchronize();
    EXPECT_TRUE(bitwise_equal(y, want));
  });
}

// The fp8 wgrad against the reference's 128x1 tiles taken in place (no
// transposes, double sums): tokens past one tile and a partial one; beta
// accumulates; and the rounding is real (not the f32 product).
TEST(OpsQuant, Fp8WgradRoundsAlongTheTokens) {
  const int64_t M = 300, N = 70, K = 140;
  const Tensor dy = randn({M, N}, 41), x = randn({M, K}, 42, 0.5f);
  const Tensor want = reference::matmul_fp8_wgrad(dy, x);
  const Tensor exact = reference::matmul(dy, x, true, false);
  for_each_limit([&](const LimitCase&) {
    const Tensor got = matmul_fp8_wgrad(dy, x);
    Tensor acc = Tensor::full({N, K}, 1.0f);
    matmul_fp8_wgrad_out(dy, x, acc, 2.0f);
    test_stream().synchronize();
    EXPECT_LT(nmse(got, want), 1e-12);
    EXPECT_GT(nmse(exact, want), 1e-6) << "fp8 rounding changes the product";
    double worst = 0;
    for (int64_t i = 0; i < N * K; ++i)
      worst = std::max(worst, double(std::fabs(acc.data<float>()[i] - (2.0f + got.data<float>()[i]))));
    EXPECT_LT(worst, 1e-4);
  });
  EXPECT_THROW(matmul_fp8_wgrad(dy, Tensor::zeros({M + 1, K})), InvalidArgument);
}

}  // namespace
}  // namespace coremesh::ops
