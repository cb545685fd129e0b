// Argument checks at the ops API boundary: each failure says what to change.
#pragma once

#include "coremesh/core/tensor.hpp"

namespace coremesh::ops::detail {

void check_contiguous(const Tensor& t, const char* what);
void check_dtype(const Tensor& t, DType dtype, const char* what);
void check_shape(const Tensor& t, const Shape& shape, const char* what);

}  // namespace coremesh::ops::detail
