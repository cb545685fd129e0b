// Naive transpose of the last two dimensions: one element at a time, as bytes.
#include <cstring>

#include "coremesh/ops/transpose.hpp"

namespace coremesh::ops::reference {

Tensor transpose(const Tensor& x) {
  const Tensor xc = x.contiguous();
  const int64_t R = x.size(-2), C = x.size(-1), G = R * C == 0 ? 0 : x.numel() / (R * C);
  Shape shape = x.shape();
  std::swap(shape[shape.size() - 2], shape[shape.size() - 1]);
  Tensor y = Tensor::empty(shape, x.dtype());
  const size_t es = dtype_size(x.dtype());
  const char* src = static_cast<const char*>(xc.raw_data());
  char* dst = static_cast<char*>(y.raw_data());
  for (int64_t g = 0; g < G; ++g)
    for (int64_t r = 0; r < R; ++r)
      for (int64_t c = 0; c < C; ++c)
        std::memcpy(dst + ((g * C + c) * R + r) * es, src + ((g * R + r) * C + c) * es, es);
  return y;
}

}  // namespace coremesh::ops::reference
