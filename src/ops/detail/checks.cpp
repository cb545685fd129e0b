#include "checks.hpp"

#include <cstdint>
#include <utility>

#include "coremesh/core/error.hpp"

namespace coremesh::ops::detail {
namespace {

// The bytes [first, end) a view can touch: from its lowest to its highest element.
std::pair<uintptr_t, uintptr_t> byte_span(const Tensor& t) {
  int64_t low = 0, high = 0;
  for (size_t i = 0; i < t.shape().size(); ++i) {
    const int64_t reach = (t.shape()[i] - 1) * t.strides()[i];
    (reach < 0 ? low : high) += reach;
  }
  const auto at = reinterpret_cast<uintptr_t>(t.raw_data());
  const auto size = static_cast<int64_t>(dtype_size(t.dtype()));
  return {at + uintptr_t(low * size), at + uintptr_t((high + 1) * size)};
}

}  // namespace

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
  if (!out.defined() || !in.defined() || out.numel() == 0 || in.numel() == 0) return;
  const auto [out_first, out_end] = byte_span(out);
  const auto [in_first, in_end] = byte_span(in);
  if (out_end <= in_first || in_end <= out_first) return;
  const bool same = out.raw_data() == in.raw_data() && out.shape() == in.shape() &&
                    out.strides() == in.strides() && out.dtype() == in.dtype();
  CM_CHECK(in_place && same,
           in_place ? "write into a separate tensor, or into the input itself (in place)"
                    : "write into a separate tensor (this op cannot run in place)",
           "{} {} overlaps {} {} in memory", out_what, out.describe(), in_what, in.describe());
}

}  // namespace coremesh::ops::detail
