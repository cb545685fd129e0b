// Element conversion between float and the storage dtypes (exact for bf16
// and fp8, rounding as core/dtype.hpp).
#pragma once

#include <cstdint>

#include "coremesh/core/dtype.hpp"

namespace coremesh::ops::detail {

// Exact decode table of all 256 f8e4m3 codes.
const float* f8e4m3_table();

// Converts n elements of `dtype` at src to float (exact for bf16 and fp8).
void load_float(const void* src, DType dtype, int64_t n, float* dst);

// Converts n floats to `dtype` at dst (rounding of core/dtype.hpp).
void store_float(const float* src, int64_t n, DType dtype, void* dst);

inline float bf16_to_float(uint16_t bits) {
  uint32_t u = static_cast<uint32_t>(bits) << 16;
  float f;
  __builtin_memcpy(&f, &u, 4);
  return f;
}

}  // namespace coremesh::ops::detail
