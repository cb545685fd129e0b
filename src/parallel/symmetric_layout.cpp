#include "coremesh/parallel/symmetric_layout.hpp"

#include "coremesh/core/error.hpp"
#include "coremesh/parallel/comm.hpp"

namespace coremesh::parallel {

int SymmetricLayout::add(std::string name, Shape shape, DType dtype) {
  for (int64_t d : shape) CM_CHECK(d >= 0, "give regions non-negative sizes", "region '{}' of size {}", name, d);
  const int64_t size = shape_numel(shape) * int64_t(dtype_size(dtype));
  regions_.push_back({std::move(name), std::move(shape), dtype, bytes_});
  bytes_ += (size + 63) / 64 * 64;
  return int(regions_.size()) - 1;
}

std::vector<Tensor> SymmetricLayout::allocate() const {
  const Tensor block = symmetric_tensor({std::max<int64_t>(bytes_ / 8, 8)}, DType::i64);  // bytes_: 64-byte units
  std::vector<Tensor> out;
  for (const Region& r : regions_)
    out.push_back(Tensor::wrap(static_cast<std::byte*>(block.raw_data()) + r.offset, r.shape, r.dtype,
                              std::shared_ptr<void>(block.storage(), block.raw_data())));
  return out;
}

}  // namespace coremesh::parallel
