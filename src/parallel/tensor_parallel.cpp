#include "coremesh/parallel/tensor_parallel.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "coremesh/core/error.hpp"

namespace coremesh::parallel {

ShmemTensor::ShmemTensor(Group group, std::vector<int64_t> sizes, bool sequence_parallel, bool overlap,
                         int64_t fused_rows)
    : group_(std::move(group)), sequence_parallel_(sequence_parallel), overlap_(overlap) {
  std::vector<int64_t> args = {sequence_parallel, overlap, fused_rows};
  args.insert(args.end(), sizes.begin(), sizes.end());
  check_members_agree(group_, args, "a tensor-parallel group");
  CM_CHECK(!sizes.empty() && fused_rows >= 0, "give the sizes of the tensors reduced, the residual stream's first",
           "tensor parallelism over {} sizes, {} fused rows", sizes.size(), fused_rows);
  if (fused_rows > 0 && group_.size() > 1) fused_ = std::make_unique<FusedTensorComm>(group_, sizes[0], fused_rows);
  std::vector<ShardedSum::Range> ranges;
  int64_t at = 0;
  for (int64_t n : sizes) {
    CM_CHECK(n > 0, "give the sizes of the tensors reduced", "tensor parallelism over {} elements", n);
    if (std::find(sizes_.begin(), sizes_.end(), n) != sizes_.end()) continue;
    sizes_.push_back(n);
    ranges.push_back({at, at + n, 0});
    at += (n + 15) / 16 * 16;
  }
  last_half_.assign(sizes_.size(), Half::none);
  arena_ = symmetric_tensor({at});
  // sequence parallel: shards cut exactly at the ranks' rows (no rounding)
  sum_ = std::make_unique<ShardedSum>(arena_, std::vector<Group>{group_}, std::move(ranges),
                                      sequence_parallel_ ? 1 : 16);
}

ShmemTensor::~ShmemTensor() = default;

int64_t ShmemTensor::bytes_put() const { return sum_->bytes_put(); }

int64_t ShmemTensor::symmetric_bytes(int tp, const std::vector<int64_t>& sizes, int64_t fused_rows) {
  int64_t floats = 0;  // the arena and the staging slots (one per member, rounded up), signals
  for (int64_t n : sizes) floats += (n + 15) / 16 * 16 + int64_t(tp) * ((n / tp + 16 + 15) / 16 * 16);
  const int64_t fused =
      fused_rows > 0 && !sizes.empty() ? FusedTensorComm::symmetric_bytes(tp, sizes[0], fused_rows) : 0;
  return 4 * floats + 4096 + fused;
}

ShmemTensor::Entered ShmemTensor::enter_matmul(const Tensor& x, const Tensor& w) {
  if (!fused_ || !sequence_parallel_) return TensorParallel::enter_matmul(x, w);
  FusedTensorComm::Gathered g = fused_->allgather_matmul(x, w);
  fused_called();
  return {g.y, g.gathered};
}

void ShmemTensor::fused_called() {
  // A fused operator waits for data every peer put after it had finished
  // what came before on its stream (a previous half's sums included): a
  // handshake, after which a half of either kind may follow.
  std::fill(last_half_.begin(), last_half_.end(), Half::none);
  ++calls_;
}

Tensor ShmemTensor::matmul_exit(const Tensor& h, const Tensor& w) {
  if (!fused_) return TensorParallel::matmul_exit(h, w);
  Tensor y = sequence_parallel_ ? fused_->matmul_reduce_scatter(h, w) : fused_->matmul_allreduce(h, w);
  fused_called();
  return y;
}

ShmemTensor::EnteredFp8 ShmemTensor::enter_matmul(const ops::QuantizedTensor& x, const ops::QuantizedTensor& w) {
  CM_CHECK(fused_ || !sequence_parallel_, "gather fp8 rows through the fused comm (parallel.fused_comm)",
           "an fp8 enter_matmul under sequence parallelism without the fused comm");
  if (!sequence_parallel_) return TensorParallel::enter_matmul(x, w);
  FusedTensorComm::GatheredFp8 g = fused_->allgather_matmul(x, w);
  fused_called();
  return {g.y, g.gathered};
}

Tensor ShmemTensor::matmul_exit(const ops::QuantizedTensor& h, const ops::QuantizedTensor& w) {
  if (!fused_) return TensorParallel::matmul_exit(h, w);
  Tensor y = sequence_parallel_ ? fused_->matmul_reduce_scatter(h, w) : fused_->matmul_allreduce(h, w);
  fused_called();
  return y;
}

int ShmemTensor::range_of(int64_t whole, const Tensor& x, const char* call) const {
  const auto it = std::find(sizes_.begin(), sizes_.end(), whole);
  CM_CHECK(it != sizes_.end() && x.dtype() == DType::f32 && x.is_contiguous(),
           "run micro-batches of the configured batch_size x seq_len under tensor parallelism",
           "tensor-parallel {} of {} (set up for {} f32)", call, x.describe(), fmt::join(sizes_, ", "));
  return int(it - sizes_.begin());
}

Tensor ShmemTensor::all_reduce(const Tensor& x) {
  if (group_.size() == 1) return x;
  const int r = range_of(x.numel(), x, "all-reduce");
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

Tensor ShmemTensor::sequence_shard(const Tensor& x) {
  if (!sequence_parallel_ || group_.size() == 1) return x;
  const int64_t n = x.size(0), tp = group_.size();
  CM_CHECK(n % tp == 0, "choose batch_size x seq_len / cp divisible by tp under sequence parallelism",
           "the rows of {} split over tp {}", x.describe(), tp);
  return x.slice(0, group_.me * n / tp, (group_.me + 1) * n / tp).contiguous();
}

Tensor ShmemTensor::enter_backward_async(const Tensor& dx) {
  if (group_.size() == 1 || !overlap_) return enter_backward(dx);
  runtime::Stream cur = runtime::current_stream();
  if (!comm_) {
    comm_.emplace(cur.device());
    comm_->set_limit(-1, 1);  // copies and sums on one vector core: the weight gradient keeps the rest
  }
  comm_->wait_event(cur.record_event());  // dx is complete
  Tensor out;
  {
    runtime::StreamGuard on(*comm_);
    out = enter_backward(dx);
  }
  sent_ = comm_->record_event();
  in_flight_ = true;
  return out;
}

void ShmemTensor::join() {
  if (!in_flight_) return;
  runtime::current_stream().wait_event(sent_);
  in_flight_ = false;
}

namespace {

Shape with_rows(Shape s, int64_t rows) {
  s[0] = rows;
  return s;
}

}  // namespace

Tensor ShmemTensor::all_gather(const Tensor& x) {
  if (group_.size() == 1) return x;
  const int tp = group_.size();
  const int r = range_of(x.numel() * tp, x, "all-gather");
  CM_CHECK(last_half_[size_t(r)] != Half::gather, "alternate sequence-parallel gathers and scatters",
           "a second all-gather of {} in a row would overwrite the previous one's rows before they are read",
           x.describe());
  last_half_[size_t(r)] = Half::gather;
  const auto [b, e] = sum_->my_shard(r);
  CM_CHECK(e - b == x.numel(), "gather this rank's rows of the residual stream", "all-gather of {} into a shard of {}",
           x.describe(), e - b);
  runtime::Stream s = runtime::current_stream();
  copy_on_stream(x, arena_.slice(0, b, e));
  sum_->all_gather(r, arena_, s);
  const int64_t rb = sum_->ranges()[size_t(r)].begin;
  Tensor out = Tensor::empty(with_rows(x.shape(), x.size(0) * tp));
  copy_on_stream(arena_.slice(0, rb, rb + out.numel()), out);
  ++calls_;
  return out;
}

Tensor ShmemTensor::reduce_scatter(const Tensor& y) {
  if (group_.size() == 1) return y;
  const int tp = group_.size();
  const int r = range_of(y.numel(), y, "reduce-scatter");
  CM_CHECK(y.size(0) % tp == 0, "choose batch_size x seq_len / cp divisible by tp under sequence parallelism",
           "reduce-scatter of {} over tp {}", y.describe(), tp);
  CM_CHECK(last_half_[size_t(r)] != Half::scatter, "alternate sequence-parallel gathers and scatters",
           "a second reduce-scatter of {} in a row would overwrite the copies a peer may not have summed yet",
           y.describe());
  last_half_[size_t(r)] = Half::scatter;
  const int64_t rb = sum_->ranges()[size_t(r)].begin;
  runtime::Stream s = runtime::current_stream();
  copy_on_stream(y, arena_.slice(0, rb, rb + y.numel()));
  sum_->reduce_scatter(r, s);
  const auto [b, e] = sum_->my_shard(r);
  Tensor out = Tensor::empty(with_rows(y.shape(), y.size(0) / tp));
  copy_on_stream(arena_.slice(0, b, e), out);
  ++calls_;
  return out;
}

}  // namespace coremesh::parallel
