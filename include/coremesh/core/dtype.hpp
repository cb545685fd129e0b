// Element types and exact conversions between them.
//
// bf16: the upper half of an IEEE f32, rounded to nearest even.
// fp8 (OCP FP8, as used by DeepSeek-V3):
//   e4m3 ("e4m3fn"): 1 sign, 4 exponent (bias 7), 3 mantissa; max 448; no
//                    infinity; NaN = S.1111.111.
//   e5m2:            1 sign, 5 exponent (bias 15), 2 mantissa; max 57344;
//                    IEEE-style infinities and NaNs.
// f32 -> fp8 rounds to nearest even and saturates: finite values beyond the
// largest finite value and infinities become +-max (NVIDIA's SATFINITE
// behaviour); NaN stays NaN; subnormals are kept exactly.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace coremesh {

enum class DType : uint8_t { f32, bf16, f8e4m3, f8e5m2, i32, i64 };

size_t dtype_size(DType dtype);
std::string_view dtype_name(DType dtype);
// Parses "f32", "bf16", "f8e4m3", "f8e5m2", "i32", "i64".
DType parse_dtype(std::string_view name);

struct bf16 {
  uint16_t bits = 0;
};
struct f8e4m3 {
  uint8_t bits = 0;
};
struct f8e5m2 {
  uint8_t bits = 0;
};

bf16 to_bf16(float value);
float to_float(bf16 value);
f8e4m3 to_f8e4m3(float value);
float to_float(f8e4m3 value);
f8e5m2 to_f8e5m2(float value);
float to_float(f8e5m2 value);

inline constexpr float kF8E4M3Max = 448.0f;
inline constexpr float kF8E5M2Max = 57344.0f;

template <typename T>
constexpr DType dtype_of();
template <> constexpr DType dtype_of<float>() { return DType::f32; }
template <> constexpr DType dtype_of<bf16>() { return DType::bf16; }
template <> constexpr DType dtype_of<f8e4m3>() { return DType::f8e4m3; }
template <> constexpr DType dtype_of<f8e5m2>() { return DType::f8e5m2; }
template <> constexpr DType dtype_of<int32_t>() { return DType::i32; }
template <> constexpr DType dtype_of<int64_t>() { return DType::i64; }

}  // namespace coremesh
