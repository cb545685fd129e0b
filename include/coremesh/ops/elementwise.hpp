// Element-wise arithmetic and the bias add on the current stream (vector kernels).
#pragma once

#include "coremesh/core/tensor.hpp"

namespace coremesh::ops {

// out = a + b / a * b for f32 tensors of equal shape (contiguous).
// The elements are split into block_dim contiguous chunks, block_dim <= the
// effective vector limit.
Tensor add(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
void add_out(const Tensor& a, const Tensor& b, Tensor& out);
void mul_out(const Tensor& a, const Tensor& b, Tensor& out);

// out[r, c] = x[r, c] + bias[c]: x (..., C) f32 contiguous, bias (C); out
// has x's shape and may be x.
Tensor add_bias(const Tensor& x, const Tensor& bias);
void add_bias_out(const Tensor& x, const Tensor& bias, const Tensor& out);

namespace reference {
Tensor add_bias(const Tensor& x, const Tensor& bias);
}  // namespace reference

}  // namespace coremesh::ops
