// Transpose of the last two dimensions.
// Notation: x (..., R, C) with G = the product of the leading dimensions.
#pragma once

#include "coremesh/core/tensor.hpp"

namespace coremesh::ops {

// x (..., R, C) contiguous -> y (..., C, R) contiguous: y[..., c, r] = x[..., r, c].
// Any dtype (f32, bf16, f8e4m3, f8e5m2, i32, i64): elements move as bits, so
// the result is exact (NaN payloads included). Needs x.dim() >= 2.
// A vector kernel on the current stream over square tiles (32x32 elements of
// 4 and 8 bytes, 64x64 of 1 and 2 bytes), split over blocks; asynchronous.
// The backward of y = transpose(x) is dx = transpose(dy).
Tensor transpose(const Tensor& x);
// The same into y (..., C, R), contiguous, x's dtype.
void transpose_out(const Tensor& x, const Tensor& y);

namespace reference {
Tensor transpose(const Tensor& x);
}  // namespace reference

}  // namespace coremesh::ops
