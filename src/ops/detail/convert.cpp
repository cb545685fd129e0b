#include "convert.hpp"

#include <array>
#include <cstring>

#include "coremesh/core/error.hpp"

namespace coremesh::ops::detail {

const float* f8e4m3_table() {
  static const std::array<float, 256> table = [] {
    std::array<float, 256> t{};
    for (int c = 0; c < 256; ++c) t[c] = to_float(f8e4m3{static_cast<uint8_t>(c)});
    return t;
  }();
  return table.data();
}

void load_float(const void* src, DType dtype, int64_t n, float* dst) {
  switch (dtype) {
    case DType::f32: std::memcpy(dst, src, static_cast<size_t>(n) * 4); return;
    case DType::bf16: {
      const uint16_t* s = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_float(s[i]);
      return;
    }
    case DType::f8e4m3: {
      const uint8_t* s = static_cast<const uint8_t*>(src);
      const float* table = f8e4m3_table();
      for (int64_t i = 0; i < n; ++i) dst[i] = table[s[i]];
      return;
    }
    case DType::f8e5m2: {
      const f8e5m2* s = static_cast<const f8e5m2*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = to_float(s[i]);
      return;
    }
    default:
      CM_CHECK(false, "pass a floating-point tensor", "cannot load {} as float", dtype_name(dtype));
  }
}

void store_float(const float* src, int64_t n, DType dtype, void* dst) {
  switch (dtype) {
    case DType::f32: std::memcpy(dst, src, static_cast<size_t>(n) * 4); return;
    case DType::bf16: {
      bf16* d = static_cast<bf16*>(dst);
      for (int64_t i = 0; i < n; ++i) d[i] = to_bf16(src[i]);
      return;
    }
    case DType::f8e4m3: {
      f8e4m3* d = static_cast<f8e4m3*>(dst);
      for (int64_t i = 0; i < n; ++i) d[i] = to_f8e4m3(src[i]);
      return;
    }
    case DType::f8e5m2: {
      f8e5m2* d = static_cast<f8e5m2*>(dst);
      for (int64_t i = 0; i < n; ++i) d[i] = to_f8e5m2(src[i]);
      return;
    }
    default:
      CM_CHECK(false, "pass a floating-point dtype", "cannot store float as {}", dtype_name(dtype));
  }
}

}  // namespace coremesh::ops::detail
