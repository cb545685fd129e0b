// Exact conversion tables for bf16 and the two FP8 formats (core/dtype.hpp):
// round to nearest even, saturation to the largest finite value, NaN, signed
// zero and subnormals.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <limits>

#include "coremesh/core/dtype.hpp"
#include "coremesh/core/tensor.hpp"

namespace coremesh {
namespace {

struct Case {
  float value;
  uint8_t code;
};

TEST(DTypeF8E4M3, EncodeTable) {
  const float inf = std::numeric_limits<float>::infinity();
  const Case cases[] = {
      {0.0f, 0x00},        {-0.0f, 0x80},       {1.0f, 0x38},          {-1.0f, 0xB8},
      {2.0f, 0x40},        {0.5f, 0x30},        {1.125f, 0x39},        {1.0625f, 0x38},  // tie -> even
      {1.1875f, 0x3A},     // tie between 1.125 (odd) and 1.25 (even) -> 1.25
      {1.0624f, 0x38},     {1.0626f, 0x39},     {448.0f, 0x7E},        {-448.0f, 0xFE},
      {449.0f, 0x7E},      {464.0f, 0x7E},      {480.0f, 0x7E},        {1e6f, 0x7E},
      {inf, 0x7E},         {-inf, 0xFE},        {240.0f, 0x77},        {256.0f, 0x78},
      {std::ldexp(1.0f, -6), 0x08},   // smallest normal
      {std::ldexp(7.0f, -9), 0x07},   // largest subnormal
      {std::ldexp(1.0f, -9), 0x01},   // smallest subnormal
      {std::ldexp(1.0f, -10), 0x00},  // half the smallest subnormal: tie -> even (0)
      {std::ldexp(3.0f, -10), 0x02},  // 1.5 units -> 2 (even)
      {std::ldexp(5.0f, -10), 0x02},  // 2.5 units -> 2 (even)
      {std::ldexp(1.1f, -10), 0x01},  // above half a unit -> 1
      {-std::ldexp(3.0f, -9), 0x83},  {std::ldexp(15.5f, -10), 0x08},  // 7.75 units -> 8 = 2^-6
      {1e-30f, 0x00},      {-1e-30f, 0x80},
  };
  for (const Case& c : cases)
    EXPECT_EQ(to_f8e4m3(c.value).bits, c.code) << "value " << c.value;
}

TEST(DTypeF8E4M3, NaN) {
  EXPECT_EQ(to_f8e4m3(std::nanf("")).bits & 0x7F, 0x7F);
  EXPECT_EQ(to_f8e4m3(-std::nanf("")).bits, 0xFF);
  EXPECT_TRUE(std::isnan(to_float(f8e4m3{0x7F})));
  EXPECT_TRUE(std::isnan(to_float(f8e4m3{0xFF})));
}

TEST(DTypeF8E4M3, DecodeTableAndRoundTrip) {
  EXPECT_EQ(to_float(f8e4m3{0x7E}), 448.0f);
  EXPECT_EQ(to_float(f8e4m3{0x01}), std::ldexp(1.0f, -9));
  EXPECT_EQ(to_float(f8e4m3{0x08}), std::ldexp(1.0f, -6));
  EXPECT_EQ(to_float(f8e4m3{0x3C}), 1.5f);
  EXPECT_EQ(to_float(f8e4m3{0xC4}), -3.0f);
  int nans = 0;
  float previous = -1.0f;
  for (int c = 0; c < 256; ++c) {
    const float v = to_float(f8e4m3{static_cast<uint8_t>(c)});
    if (std::isnan(v)) {
      ++nans;
      continue;
    }
    EXPECT_EQ(to_f8e4m3(v).bits, c) << "code " << c;  // every finite code round-trips
    if (c > 0 && c < 0x7F) {
      EXPECT_GT(v, previous) << "codes increase monotonically";
    }
    if (c < 0x7F) previous = v;
  }
  EXPECT_EQ(nans, 2);
}

TEST(DTypeF8E5M2, Table) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(to_f8e5m2(1.0f).bits, 0x3C);
  EXPECT_EQ(to_f8e5m2(57344.0f).bits, 0x7B);
  EXPECT_EQ(to_f8e5m2(61440.0f).bits, 0x7B);  // saturates (SATFINITE)
  EXPECT_EQ(to_f8e5m2(inf).bits, 0x7B);
  EXPECT_EQ(to_f8e5m2(-inf).bits, 0xFB);
  EXPECT_EQ(to_f8e5m2(std::ldexp(1.0f, -16)).bits, 0x01);  // smallest subnormal
  EXPECT_EQ(to_f8e5m2(std::ldexp(1.0f, -17)).bits, 0x00);  // tie -> even
  EXPECT_EQ(to_f8e5m2(1.125f).bits, 0x3C);                 // tie -> even (1.0)
  EXPECT_EQ(to_f8e5m2(1.375f).bits, 0x3E);                 // tie -> even (1.5)
  EXPECT_TRUE(std::isnan(to_float(to_f8e5m2(std::nanf("")))));
  EXPECT_EQ(to_float(f8e5m2{0x7C}), inf);
  EXPECT_EQ(to_float(f8e5m2{0xFC}), -inf);
  for (int c = 0; c < 256; ++c) {
    const float v = to_float(f8e5m2{static_cast<uint8_t>(c)});
    if (std::isfinite(v)) {
      EXPECT_EQ(to_f8e5m2(v).bits, c) << "code " << c;
    }
  }
}

TEST(DTypeBF16, RoundToNearestEven) {
  EXPECT_EQ(to_bf16(1.0f).bits, 0x3F80);
  EXPECT_EQ(to_bf16(std::bit_cast<float>(0x3F808000u)).bits, 0x3F80);  // tie, even stays
  EXPECT_EQ(to_bf16(std::bit_cast<float>(0x3F818000u)).bits, 0x3F82);  // tie, odd rounds up
  EXPECT_EQ(to_bf16(std::bit_cast<float>(0x3F808001u)).bits, 0x3F81);
  EXPECT_EQ(to_bf16(-2.0f).bits, 0xC000);
  EXPECT_TRUE(std::isnan(to_float(to_bf16(std::nanf("")))));
  EXPECT_EQ(to_float(to_bf16(std::numeric_limits<float>::infinity())),
            std::numeric_limits<float>::infinity());
  EXPECT_EQ(to_float(bf16{0x0001}), std::ldexp(1.0f, -133));  // subnormal kept
}

TEST(DTypeTensor, ConvertThroughTensor) {
  Tensor t = Tensor::from_vector<float>({1.0f, 1000.0f, -0.0f, std::ldexp(3.0f, -10)}, {4});
  Tensor q = t.to(DType::f8e4m3);
  EXPECT_EQ(q.data<f8e4m3>()[0].bits, 0x38);
  EXPECT_EQ(q.data<f8e4m3>()[1].bits, 0x7E);
  EXPECT_EQ(q.data<f8e4m3>()[2].bits, 0x80);
  EXPECT_EQ(q.data<f8e4m3>()[3].bits, 0x02);
  EXPECT_EQ(q.to(DType::f32).item({1}), 448.0f);
}

}  // namespace
}  // namespace coremesh
