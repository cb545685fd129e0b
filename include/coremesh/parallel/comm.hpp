// Communication the parallel layer builds from SHMEM's one-sided operations:
// groups of PEs, symmetric tensors, and deterministic sums over groups on a
// stream.
//
// ShardedSum reduces ranges of a symmetric arena over groups of PEs. Each
// range is cut into one shard per member; every member puts its copy of a
// shard into the owner's staging slot with a signal, and the owner sums the
// copies in member order, ((x_0 + x_1) + x_2) ... -- the order in which one PE
// adds its micro-batches' gradients, so a data-parallel run whose members
// hold consecutive micro-batches gets the same bits. all_gather() then puts
// each owner's shard into every member's arena. No barrier: each PE waits
// only for the signals of the data it needs; signals count up over the run
// (one round per step), so buffers are reused without resetting them.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "coremesh/core/tensor.hpp"
#include "coremesh/runtime/stream.hpp"

namespace coremesh::parallel {

// PEs that communicate (an MPI communicator's shape): world PE numbers in
// member order, and this PE's index among them.
struct Group {
  std::vector<int> pes;
  int me = 0;
  int size() const { return int(pes.size()); }
  // `pes` must hold `my_pe`.
  static Group of(std::vector<int> pes, int my_pe);
};

// A zeroed tensor in the symmetric heap. Allocation is collective: every PE of the
// job allocates the same shape in the same order (and frees in the same
// order when the tensor dies).
Tensor symmetric_tensor(const Shape& shape, DType dtype = DType::f32);

// Later work on `stream` waits until `count` signal additions arrived at the
// symmetric *signal on this PE beyond those earlier waits took, and takes
// them (subtracts count). Each wait thus stands for itself, so a replayed
// graph's waits wait for each step's arrivals, as eager ones do. The stream
// parks without holding a core (compute streams run meanwhile). If the
// watchdog (COREMESH_WAIT_TIMEOUT_S) expires, the stream fails with an error
// that says "PE <me> <what>": who is waited for and why.
void wait_signal_on_stream(runtime::Stream& stream, uint64_t* signal, uint64_t count, std::string what);

// The LaunchInfo of a kernel of this layer, with the op descriptor that
// graph capture and the profiler read: it reads `in` and writes `out`
// (every tensor whose memory it touches).
runtime::LaunchInfo launch_info(std::string name, runtime::KernelKind kind, int block_dim,
                                std::vector<Tensor> in = {}, std::vector<Tensor> out = {});

// "PEs 1, 3" for the members of a group other than this PE.
std::string others(const Group& group);

// The element-wise largest of every PE's `values` (collective over the
// world, on the host): symmetric layouts must be the same on every PE.
std::vector<int64_t> max_over_world(const std::vector<int64_t>& values);
// The PEs of this job: 1 where SHMEM does not run.
int job_pes();

// Collective over the world (every PE, in the same order; nothing on one
// PE): throws on every PE when the members of some group were given
// another member list (or order) or other `args` (a constructor's sizes)
// than each other; `what` names the object for the message. A mismatch
// exchanged the wrong rows silently.
void check_members_agree(const Group& group, const std::vector<int64_t>& args, const char* what);

// On `stream`: src (contiguous; alive until the stream gets there) into
// elements [at, at + src.numel()) of PE pe's `dst` (symmetric, src's dtype;
// pe's may be longer than this PE's view of it),
// then 1 added to PE pe's *signal (symmetric). No completion wait here: the
// receiver waits for the signal (wait_signal_on_stream).
void put_on_stream(runtime::Stream& stream, const Tensor& dst, int64_t at, const Tensor& src, uint64_t* signal,
                   int pe);

// Host, blocking: elements [at, at + n) of PE pe's symmetric `src` into `dst`
// (pe's may be longer than this PE's view of it).
void get_from(void* dst, const Tensor& src, int64_t at, int64_t n, int pe);

// Host: every PE of the job waits for the others.
void world_barrier();

// Host values of every PE, after a step's synchronization (collective over
// the world; its buffer is symmetric, allocated once).
class WorldGather {
 public:
  explicit WorldGather(int64_t capacity);  // values per PE in one round (more take rounds)
  // Every PE's `mine` (the same count on each), PE after PE.
  std::vector<int64_t> gather(const std::vector<int64_t>& mine);
  std::vector<double> gather(const std::vector<double>& mine);
  // Element-wise sums over the PEs, added in PE order.
  std::vector<double> sum(const std::vector<double>& mine);

 private:
  Tensor buffer_;
  int64_t capacity_ = 0;
};

// dst = src (contiguous, the same bytes) on the current stream.
void copy_on_stream(const Tensor& src, const Tensor& dst);
// t = 0 (contiguous, any dtype) on the current stream.
void zero_on_stream(const Tensor& t);

// out = ((inputs[0] + inputs[1]) + inputs[2]) ..., element-wise, f32 or i64,
// on the current stream (out may be one of the inputs).
void sum_in_order(const std::vector<Tensor>& inputs, const Tensor& out);

// Member m's shard of a range [begin, end) cut over `members`: the even cut
// rounded to multiples of `align` (from element 0), the range's own ends kept.
std::pair<int64_t, int64_t> shard_bounds(int64_t begin, int64_t end, int members, int member, int64_t align);

class ShardedSum {
 public:
  struct Range {
    int64_t begin = 0, end = 0;  // elements of the arena
    int group = 0;               // index into the groups
  };
  // `arena` is symmetric (the same layout on every member of each group);
  // shard boundaries are multiples of `align` elements from the arena's
  // start (ranges' own ends excepted). Allocates the staging buffers
  // (collective). f32 or i64 arenas.
  ShardedSum(Tensor arena, std::vector<Group> groups, std::vector<Range> ranges, int64_t align = 16);

  const std::vector<Range>& ranges() const { return ranges_; }
  const Group& group(int range) const { return groups_[size_t(ranges_[size_t(range)].group)]; }
  // [begin, end) of range r that member m owns.
  std::pair<int64_t, int64_t> shard(int range, int member) const;
  std::pair<int64_t, int64_t> my_shard(int range) const { return shard(range, group(range).me); }

  // On `stream`: afterwards this PE's shard of the range holds the members'
  // sum (the rest of the range is unchanged).
  void reduce_scatter(int range, runtime::Stream& stream);
  // On `stream`: puts this PE's shard of `arena` (symmetric, the layout of
  // the one summed; may be another arena, e.g. the weights) into every
  // member's, and waits for the members' shards.
  void all_gather(int range, const Tensor& arena, runtime::Stream& stream);
  // On `stream`: `tensors` packed one after the other into the arena (the
  // first range covers them), summed over its group and unpacked, each
  // replaced by the members' sum (expert loads of several layers).
  void sum_packed(const std::vector<Tensor>& tensors, runtime::Stream& stream);
  // Bytes this PE has put (data, not signals), counted as the puts are enqueued.
  int64_t bytes_put() const { return bytes_put_; }

 private:
  Tensor arena_, staging_, signals_;  // signals_: per range, reduce-scatter and all-gather counters (u64)
  std::vector<Group> groups_;
  std::vector<Range> ranges_;
  std::vector<int64_t> staging_offset_, slot_size_;
  std::vector<uint64_t> rs_rounds_, ag_rounds_;
  int64_t align_;
  int64_t bytes_put_ = 0;
};

}  // namespace coremesh::parallel
