// Element-wise arithmetic on the current stream (vector kernels).
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

}  // namespace coremesh::ops
