// Argument checks at the ops API boundary: each failure says what to change.
#pragma once

#include "coremesh/core/tensor.hpp"

namespace coremesh::ops::detail {

void check_contiguous(const Tensor& t, const char* what);
void check_dtype(const Tensor& t, DType dtype, const char* what);
void check_shape(const Tensor& t, const Shape& shape, const char* what);
// An output may not share memory with an input (the kernel would read what it
// already wrote), except, where `in_place` allows, as exactly that input (a
// row-by-row or element-wise kernel that reads each element before writing it).
void check_disjoint(const Tensor& out, const char* out_what, const Tensor& in, const char* in_what,
                    bool in_place = false);

}  // namespace coremesh::ops::detail
