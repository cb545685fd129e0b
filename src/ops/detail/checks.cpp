#include "checks.hpp"

#include "coremesh/core/error.hpp"

namespace coremesh::ops::detail {

void check_contiguous(const Tensor& t, const char* what) {
  CM_CHECK(t.defined(), "pass a defined tensor", "{} is undefined", what);
  CM_CHECK(t.is_contiguous(), "call .contiguous() first", "{} must be contiguous, got {}", what,
           t.describe());
}

void check_dtype(const Tensor& t, DType dtype, const char* what) {
  CM_CHECK(t.dtype() == dtype, "convert it with .to(dtype)", "{} must be {}, got {}", what,
           dtype_name(dtype), dtype_name(t.dtype()));
}

void check_shape(const Tensor& t, const Shape& shape, const char* what) {
  CM_CHECK(t.shape() == shape, "pass a tensor of the expected shape", "{} must have shape {}, got {}",
           what, shape_str(shape), shape_str(t.shape()));
}

}  // namespace coremesh::ops::detail
