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

void check_disjoint(const Tensor& out, const char* out_what, const Tensor& in, const char* in_what, bool in_place) {
  if (!out.overlaps(in)) return;
  const bool same = out.raw_data() == in.raw_data() && out.shape() == in.shape() &&
                    out.strides() == in.strides() && out.dtype() == in.dtype();
  CM_CHECK(in_place && same,
           in_place ? "write into a separate tensor, or into the input itself (in place)"
                    : "write into a separate tensor (this op cannot run in place)",
           "{} {} overlaps {} {} in memory", out_what, out.describe(), in_what, in.describe());
}

}  // namespace coremesh::ops::detail
