#include "coremesh/parallel/tensor_parallel.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "coremesh/core/error.hpp"

namespace coremesh::parallel {

ShmemTensor::ShmemTensor(Group group, std::vector<int64_t> sizes) : group_(std::move(group)) {
  std::vector<ShardedSum::Range> ranges;
  int64_t at = 0;
  for (int64_t n : sizes) {
    CM_CHECK(n > 0, "give the sizes of the tensors reduced", "tensor parallelism over {} elements", n);
    if (std::find(sizes_.begin(), sizes_.end(), n) != sizes_.end()) continue;
    sizes_.push_back(n);
    ranges.push_back({at, at + n, 0});
    at += (n + 15) / 16 * 16;
  }
  arena_ = symmetric_tensor({at});
  sum_ = std::make_unique<ShardedSum>(arena_, std::vector<Group>{group_}, std::move(ranges));
}

ShmemTensor::~ShmemTensor() = default;

int64_t ShmemTensor::bytes_put() const { return sum_->bytes_put(); }

int64_t ShmemTensor::symmetric_bytes(int tp, const std::vector<int64_t>& sizes) {
  int64_t floats = 0;  // the arena and the staging slots (one per member, rounded up), signals
  for (int64_t n : sizes) floats += (n + 15) / 16 * 16 + int64_t(tp) * ((n / tp + 16 + 15) / 16 * 16);
  return 4 * floats + 4096;
}

Tensor ShmemTensor::all_reduce(const Tensor& x) {
  if (group_.size() == 1) return x;
  const auto it = std::find(sizes_.begin(), sizes_.end(), x.numel());
  CM_CHECK(it != sizes_.end() && x.dtype() == DType::f32 && x.is_contiguous(),
           "run micro-batches of the configured batch_size x seq_len under tensor parallelism",
           "tensor-parallel all-reduce of {} (set up for {} f32)", x.describe(), fmt::join(sizes_, ", "));
  const int r = int(it - sizes_.begin());
  const int64_t b = sum_->ranges()[size_t(r)].begin, e = sum_->ranges()[size_t(r)].end;
  runtime::Stream s = runtime::current_stream();
  copy_on_stream(x, arena_.slice(0, b, e));  // into symmetric memory, where the peers' puts land
  sum_->reduce_scatter(r, s);
  sum_->all_gather(r, arena_, s);
  Tensor out = Tensor::empty(x.shape());
  copy_on_stream(arena_.slice(0, b, e), out);  // the arena is reused by the next call
  ++calls_;
  return out;
}

}  // namespace coremesh::parallel
