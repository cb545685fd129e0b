#include "coremesh/core/dtype.hpp"

#include <bit>
#include <cmath>

#include "coremesh/core/error.hpp"

namespace coremesh {
namespace {

// A small float format: `mantissa_bits` explicit mantissa bits, exponent
// bias, the code of the largest finite magnitude and of NaN.
struct MiniFloat {
  int mantissa_bits;
  int bias;
  uint8_t max_code;
  uint8_t nan_code;
  bool has_infinity;
  float max_value;
};

constexpr MiniFloat kE4M3{3, 7, 0x7E, 0x7F, false, kF8E4M3Max};
constexpr MiniFloat kE5M2{2, 15, 0x7B, 0x7E, true, kF8E5M2Max};

uint8_t encode(const MiniFloat& f, float value) {
  const uint8_t sign = std::signbit(value) ? 0x80 : 0x00;
  if (std::isnan(value)) return sign | f.nan_code;
  float magnitude = std::fabs(value);
  if (magnitude > f.max_value) return sign | f.max_code;  // saturate, also +-inf
  if (magnitude == 0.0f) return sign;
  int exponent = 0;
  std::frexp(magnitude, &exponent);  // magnitude = m * 2^exponent, m in [0.5, 1)
  exponent = std::max(exponent - 1, 1 - f.bias);  // subnormals share the min exponent
  // Scale so that one unit in the last place is 1, then round to nearest even
  // (the default floating-point rounding mode). Scaling by 2^k is exact.
  float units = std::nearbyint(std::ldexp(magnitude, f.mantissa_bits - exponent));
  int mantissa = static_cast<int>(units);
  const int implicit_one = 1 << f.mantissa_bits;
  if (mantissa >= 2 * implicit_one) {  // rounding carried into the next binade
    mantissa >>= 1;
    ++exponent;
  }
  if (mantissa < implicit_one) return sign | static_cast<uint8_t>(mantissa);  // subnormal
  int biased = exponent + f.bias;
  return sign | static_cast<uint8_t>((biased << f.mantissa_bits) | (mantissa - implicit_one));
}

float decode(const MiniFloat& f, uint8_t code) {
  const float sign = (code & 0x80) ? -1.0f : 1.0f;
  const uint8_t body = code & 0x7F;
  if (body == f.nan_code || (f.has_infinity && body > f.max_code + 1)) return std::nanf("");
  if (f.has_infinity && body == f.max_code + 1) return sign * INFINITY;
  if (!f.has_infinity && body > f.max_code) return std::nanf("");
  const int mantissa = body & ((1 << f.mantissa_bits) - 1);
  const int biased = body >> f.mantissa_bits;
  if (biased == 0) return sign * std::ldexp(static_cast<float>(mantissa), 1 - f.bias - f.mantissa_bits);
  return sign * std::ldexp(static_cast<float>(mantissa + (1 << f.mantissa_bits)),
                           biased - f.bias - f.mantissa_bits);
}

}  // namespace

size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::f32: return 4;
    case DType::bf16: return 2;
    case DType::f8e4m3:
    case DType::f8e5m2: return 1;
    case DType::i32: return 4;
    case DType::i64: return 8;
  }
  return 0;
}

std::string_view dtype_name(DType dtype) {
  switch (dtype) {
    case DType::f32: return "f32";
    case DType::bf16: return "bf16";
    case DType::f8e4m3: return "f8e4m3";
    case DType::f8e5m2: return "f8e5m2";
    case DType::i32: return "i32";
    case DType::i64: return "i64";
  }
  return "?";
}

DType parse_dtype(std::string_view name) {
  for (DType d : {DType::f32, DType::bf16, DType::f8e4m3, DType::f8e5m2, DType::i32, DType::i64})
    if (dtype_name(d) == name) return d;
  CM_CHECK(false, "use one of f32, bf16, f8e4m3, f8e5m2, i32, i64", "unknown dtype '{}'", name);
  return DType::f32;
}

bf16 to_bf16(float value) {
  uint32_t bits = std::bit_cast<uint32_t>(value);
  if (std::isnan(value)) return bf16{static_cast<uint16_t>((bits >> 16) | 0x0040)};  // quiet NaN
  uint32_t rounding = 0x7FFF + ((bits >> 16) & 1);
  return bf16{static_cast<uint16_t>((bits + rounding) >> 16)};
}

float to_float(bf16 value) { return std::bit_cast<float>(static_cast<uint32_t>(value.bits) << 16); }

f8e4m3 to_f8e4m3(float value) { return f8e4m3{encode(kE4M3, value)}; }
float to_float(f8e4m3 value) { return decode(kE4M3, value.bits); }
f8e5m2 to_f8e5m2(float value) { return f8e5m2{encode(kE5M2, value)}; }
float to_float(f8e5m2 value) { return decode(kE5M2, value.bits); }

}  // namespace coremesh
