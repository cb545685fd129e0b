#include "coremesh/parallel/comm.hpp"

#include <algorithm>
#include <cstring>
#include <memory>

#include "coremesh/core/error.hpp"
#include "coremesh/shmem/collectives.hpp"
#include "coremesh/shmem/heap.hpp"
#include "coremesh/shmem/team.hpp"
#include "coremesh/shmem/rma.hpp"
#include "coremesh/shmem/session.hpp"
#include "coremesh/shmem/stream_ops.hpp"

namespace coremesh::parallel {

Group Group::of(std::vector<int> pes, int my_pe) {
  Group g;
  g.pes = std::move(pes);
  auto it = std::find(g.pes.begin(), g.pes.end(), my_pe);
  CM_CHECK(it != g.pes.end(), "build a group from a member", "PE {} is not in the group", my_pe);
  g.me = int(it - g.pes.begin());
  return g;
}

runtime::LaunchInfo launch_info(std::string name, runtime::KernelKind kind, int block_dim, std::vector<Tensor> in,
                                std::vector<Tensor> out) {
  runtime::LaunchInfo info{name, kind, block_dim, 0};
  runtime::OpKey key;
  key.op = std::move(name);
  for (const auto* list : {&in, &out})
    for (const Tensor& t : *list) key.shapes.push_back(t.shape()), key.dtypes.push_back(t.dtype());
  info.op = std::make_shared<const runtime::OpDesc>(runtime::OpDesc{std::move(key), std::move(in), std::move(out)});
  return info;
}

void wait_signal_on_stream(runtime::Stream& stream, uint64_t* signal, uint64_t count, std::string what) {
  shmem::signal_wait_on_stream(stream, signal, shmem::Cmp::ge, count, std::move(what));  // parks the stream
  stream.launch(launch_info("signal_take", runtime::KernelKind::comm, 1), [signal, count](const runtime::BlockContext&) {
    shmem::atomic_add(signal, uint64_t(0) - count, shmem::my_pe());  // take them
  });
}

std::string others(const Group& g) {
  std::string out;
  for (int m = 0; m < g.size(); ++m)
    if (m != g.me) out += (out.empty() ? "PE " : ", PE ") + std::to_string(g.pes[size_t(m)]);
  return out.empty() ? "nobody" : out;
}

Tensor symmetric_tensor(const Shape& shape, DType dtype) {
  const size_t bytes = std::max<size_t>(size_t(shape_numel(shape)) * dtype_size(dtype), 64);
  // zeroed everywhere before any PE returns: a peer may signal into it at once
  void* p = shmem::sym_calloc(1, bytes);
  // after shmem finalize the heap is gone with everything in it (a Python
  // object that outlives shmem.finalize(), say): nothing left to free
  std::shared_ptr<void> owner(p, [](void* q) {
    if (shmem::initialized()) shmem::sym_free(q);
  });
  return Tensor::wrap(p, shape, dtype, owner);
}

void put_on_stream(runtime::Stream& stream, const Tensor& dst, int64_t at, const Tensor& src, uint64_t* signal,
                   int pe) {
  // `at` may lie past this PE's view of dst: a peer's (symmetric, the largest size) may be longer
  CM_CHECK(src.is_contiguous() && src.dtype() == dst.dtype() && at >= 0,
           "put a contiguous tensor into a symmetric tensor of its dtype", "put of {} at {} into {}", src.describe(),
           at, dst.describe());
  const size_t elem = dtype_size(dst.dtype());
  shmem::put_signal_on_stream(stream, static_cast<std::byte*>(dst.raw_data()) + at * int64_t(elem),
                              static_cast<const std::byte*>(src.raw_data()), size_t(src.numel()) * elem, signal, 1,
                              shmem::SignalOp::add, pe);
}

void get_from(void* dst, const Tensor& src, int64_t at, int64_t n, int pe) {
  CM_CHECK(at >= 0 && n >= 0, "read a range of the tensor", "get [{}, {}) of {}", at, at + n, src.describe());
  const size_t elem = dtype_size(src.dtype());
  shmem::get(static_cast<std::byte*>(dst), static_cast<const std::byte*>(src.raw_data()) + at * int64_t(elem),
             size_t(n) * elem, pe);
}

void world_barrier() { shmem::barrier(); }

WorldGather::WorldGather(int64_t capacity)
    : buffer_(symmetric_tensor({std::max<int64_t>(capacity, 1) * (shmem::n_pes() + 1)}, DType::i64)),
      capacity_(std::max<int64_t>(capacity, 1)) {}

std::vector<int64_t> WorldGather::gather(const std::vector<int64_t>& mine) {
  const int64_t k = int64_t(mine.size()), n = shmem::n_pes();
  std::vector<int64_t> all(size_t(n * k));
  int64_t* v = buffer_.data<int64_t>();
  int64_t at = 0;
  do {  // more values than the buffer holds: in rounds (none: one round, it is collective)
    const int64_t m = std::min(capacity_, k - at);
    std::copy_n(mine.data() + at, m, v);
    shmem::allgather(shmem::Team::world(), v + capacity_, v, size_t(m));
    for (int64_t pe = 0; pe < n; ++pe) std::copy_n(v + capacity_ + pe * m, m, all.data() + pe * k + at);
    at += m;
  } while (at < k);
  return all;
}

std::vector<double> WorldGather::gather(const std::vector<double>& mine) {
  std::vector<int64_t> bits(mine.size());
  std::memcpy(bits.data(), mine.data(), mine.size() * sizeof(double));
  const std::vector<int64_t> all = gather(bits);
  std::vector<double> out(all.size());
  std::memcpy(out.data(), all.data(), all.size() * sizeof(double));
  return out;
}

std::vector<double> WorldGather::sum(const std::vector<double>& mine) {
  const std::vector<double> all = gather(mine);
  std::vector<double> out(mine.size(), 0.0);
  for (size_t pe = 0; pe * mine.size() < all.size(); ++pe)
    for (size_t i = 0; i < mine.size(); ++i) out[i] += all[pe * mine.size() + i];
  return out;
}

void copy_on_stream(const Tensor& src, const Tensor& dst) {
  CM_CHECK(src.nbytes() == dst.nbytes() && src.is_contiguous() && dst.is_contiguous(),
           "copy between contiguous tensors of the same size", "copy of {} into {}", src.describe(), dst.describe());
  runtime::current_stream().launch(launch_info("copy", runtime::KernelKind::vector, 1, {src}, {dst}),
                                   [src, dst](const runtime::BlockContext&) {
                                     std::memcpy(dst.raw_data(), src.raw_data(), src.nbytes());
                                   });
}

void zero_on_stream(const Tensor& t) {
  CM_CHECK(t.is_contiguous(), "zero a contiguous tensor", "zero of {}", t.describe());
  runtime::current_stream().launch(launch_info("zero", runtime::KernelKind::vector, 1, {}, {t}),
                                   [t](const runtime::BlockContext&) { std::memset(t.raw_data(), 0, t.nbytes()); });
}

void sum_in_order(const std::vector<Tensor>& inputs, const Tensor& out) {
  CM_CHECK(!inputs.empty(), "pass at least one input", "sum of nothing");
  for (const Tensor& t : inputs)
    CM_CHECK(t.numel() == out.numel() && t.dtype() == out.dtype() && t.is_contiguous(),
             "pass contiguous inputs of the output's size and dtype", "sum_in_order: {} vs {}", t.describe(),
             out.describe());
  CM_CHECK(out.dtype() == DType::f32 || out.dtype() == DType::i64, "sum f32 or i64 tensors", "sum of {}",
           dtype_name(out.dtype()));
  runtime::Stream stream = runtime::current_stream();
  const int64_t n = out.numel();
  const int blocks = int(std::clamp<int64_t>(n / 65536, 1,
                                             runtime::max_blocks(stream.effective_limits(), runtime::KernelKind::vector)));
  stream.launch(launch_info("sum_in_order", runtime::KernelKind::vector, blocks, inputs, {out}),
                [inputs, out, n](const runtime::BlockContext& ctx) {
                  const int64_t lo = n * ctx.block_idx / ctx.block_dim, hi = n * (ctx.block_idx + 1) / ctx.block_dim;
                  auto run = [&](auto* dst, auto tag) {
                    using T = decltype(tag);
                    std::vector<const T*> in;
                    for (const Tensor& t : inputs) in.push_back(static_cast<const T*>(t.raw_data()));
                    for (int64_t i = lo; i < hi; ++i) {
                      T s = in[0][i];
                      for (size_t k = 1; k < in.size(); ++k) s += in[k][i];
                      dst[i] = s;
                    }
                  };
                  if (out.dtype() == DType::f32) run(static_cast<float*>(out.raw_data()), float{});
                  else run(static_cast<int64_t*>(out.raw_data()), int64_t{});
                });
}

int job_pes() { return shmem::initialized() ? shmem::n_pes() : 1; }

std::vector<int64_t> max_over_world(const std::vector<int64_t>& values) {
  const int64_t n = std::max<int64_t>(int64_t(values.size()), 1);
  Tensor v = symmetric_tensor({2 * n}, DType::i64);
  int64_t* p = v.data<int64_t>();
  std::copy(values.begin(), values.end(), p);
  shmem::allreduce(shmem::Team::world(), p + n, p, size_t(n), shmem::ReduceOp::max);
  return std::vector<int64_t>(p + n, p + n + int64_t(values.size()));
}

// Each member puts its (list, args) hash at every member's index, and its
// negation beside it; the maxima over the world give, per PE, the largest and
// smallest hash any group listing it holds: equal exactly when they all agree.
// The maxima are the same on every PE, so every PE decides alike: all throw
// (a PE of another group waiting in the next collective would hang).
void check_members_agree(const Group& group, const std::vector<int64_t>& args, const char* what) {
  if (job_pes() == 1) return;
  uint64_t h = 1469598103934665603ULL;  // FNV-1a over the list and the args
  auto mix = [&](int64_t v) {
    for (int i = 0; i < 8; ++i) h = (h ^ uint64_t((v >> (8 * i)) & 0xFF)) * 1099511628211ULL;
  };
  mix(group.size());
  for (int pe : group.pes) mix(pe);
  for (int64_t a : args) mix(a);
  const int64_t mine = int64_t(h >> 2);  // 62 bits: its negation fits
  const int n = shmem::n_pes();
  std::vector<int64_t> v(size_t(2 * n), INT64_MIN);
  for (int pe : group.pes)
    if (pe >= 0 && pe < n) v[size_t(pe)] = mine, v[size_t(n + pe)] = -mine;
  const std::vector<int64_t> most = max_over_world(v);
  std::vector<int> differ;
  for (int pe = 0; pe < n; ++pe)
    if (most[size_t(pe)] != INT64_MIN && most[size_t(pe)] != -most[size_t(n + pe)]) differ.push_back(pe);
  CM_CHECK(differ.empty(),
           "construct it on every member with the same pes, in the same order, and the same sizes",
           "{}: PEs {} were listed by members given different member lists or sizes (this PE {}: [{}])", what,
           fmt::join(differ, ", "), shmem::my_pe(), fmt::join(group.pes, ", "));
}

ShardedSum::ShardedSum(Tensor arena, std::vector<Group> groups, std::vector<Range> ranges, int64_t align)
    : arena_(std::move(arena)), groups_(std::move(groups)), ranges_(std::move(ranges)), align_(align) {
  CM_CHECK(align_ >= 1 && arena_.is_contiguous(), "use a contiguous arena and align >= 1", "bad ShardedSum");
  std::vector<int64_t> slots;  // per range: slot size, then slots
  for (size_t r = 0; r < ranges_.size(); ++r) {
    const Range& x = ranges_[r];
    CM_CHECK(x.begin >= 0 && x.begin <= x.end && x.end <= arena_.numel() && x.group >= 0 &&
                 x.group < int(groups_.size()),
             "give ranges inside the arena and groups that exist", "range {} [{}, {}) group {}", r, x.begin, x.end,
             x.group);
    int64_t largest = 0;
    for (int m = 0; m < group(int(r)).size(); ++m) {
      const auto [b, e] = shard(int(r), m);
      largest = std::max(largest, e - b);
    }
    slots.push_back((largest + 15) / 16 * 16);
    slots.push_back(group(int(r)).size());
  }
  slots = max_over_world(slots);
  int64_t staging = 0;
  for (size_t r = 0; r < ranges_.size(); ++r) {
    staging_offset_.push_back(staging);
    slot_size_.push_back(slots[2 * r]);
    staging += slots[2 * r] * slots[2 * r + 1];
  }
  staging_ = symmetric_tensor({std::max<int64_t>(staging, 1)}, arena_.dtype());
  signals_ = symmetric_tensor({int64_t(2 * std::max<size_t>(ranges_.size(), 1))}, DType::i64);
  rs_rounds_.assign(ranges_.size(), 0);
  ag_rounds_.assign(ranges_.size(), 0);
}

std::pair<int64_t, int64_t> shard_bounds(int64_t begin, int64_t end, int members, int member, int64_t align) {
  auto cut = [&](int m) -> int64_t {
    if (m <= 0) return begin;
    if (m >= members) return end;
    const int64_t even = begin + (end - begin) * m / members;
    return std::clamp((even + align / 2) / align * align, begin, end);
  };
  return {cut(member), cut(member + 1)};
}

std::pair<int64_t, int64_t> ShardedSum::shard(int r, int member) const {
  const Range& x = ranges_.at(size_t(r));
  return shard_bounds(x.begin, x.end, group(r).size(), member, align_);
}

void ShardedSum::reduce_scatter(int r, runtime::Stream& stream) {
  const Group& g = group(r);
  if (g.size() == 1) return;
  const size_t elem = dtype_size(arena_.dtype());
  auto* base = static_cast<std::byte*>(arena_.raw_data());
  auto* stage = static_cast<std::byte*>(staging_.raw_data());
  auto* sig = static_cast<uint64_t*>(signals_.raw_data()) + 2 * r;
  // my copy of each owner's shard -> the owner's staging slot `me`
  for (int o = 0; o < g.size(); ++o) {
    if (o == g.me) continue;
    const auto [b, e] = shard(r, o);
    const int64_t slot = staging_offset_[size_t(r)] + g.me * slot_size_[size_t(r)];
    shmem::put_signal_on_stream(stream, stage + slot * elem, base + b * elem, size_t(e - b) * elem, sig, 1,
                                shmem::SignalOp::add, g.pes[size_t(o)]);
    bytes_put_ += (e - b) * int64_t(elem);
  }
  ++rs_rounds_[size_t(r)];
  wait_signal_on_stream(stream, sig, uint64_t(g.size() - 1),
                        fmt::format("waits for the copies of {} to sum range {} (round {})", others(g), r,
                                    rs_rounds_[size_t(r)]));
  // my shard = the members' copies summed in member order
  const auto [b, e] = my_shard(r);
  if (e == b) return;
  std::vector<Tensor> copies;
  for (int m = 0; m < g.size(); ++m) {
    if (m == g.me) copies.push_back(arena_.slice(0, b, e));
    else {
      const int64_t slot = staging_offset_[size_t(r)] + m * slot_size_[size_t(r)];
      copies.push_back(staging_.slice(0, slot, slot + (e - b)));
    }
  }
  runtime::StreamGuard on(stream);
  sum_in_order(copies, arena_.slice(0, b, e));
}

void ShardedSum::all_gather(int r, const Tensor& arena, runtime::Stream& stream) {
  const Group& g = group(r);
  if (g.size() == 1) return;
  CM_CHECK(arena.numel() == arena_.numel() && arena.dtype() == arena_.dtype(),
           "gather into an arena of the summed one's layout", "all_gather into {}", arena.describe());
  const size_t elem = dtype_size(arena.dtype());
  auto* base = static_cast<std::byte*>(arena.raw_data());
  auto* sig = static_cast<uint64_t*>(signals_.raw_data()) + 2 * r + 1;
  const auto [b, e] = my_shard(r);
  for (int m = 0; m < g.size(); ++m)
    if (m != g.me) {
      shmem::put_signal_on_stream(stream, base + b * elem, base + b * elem, size_t(e - b) * elem, sig, 1,
                                  shmem::SignalOp::add, g.pes[size_t(m)]);
      bytes_put_ += (e - b) * int64_t(elem);
    }
  ++ag_rounds_[size_t(r)];
  wait_signal_on_stream(stream, sig, uint64_t(g.size() - 1),
                        fmt::format("waits for the shards of {} of range {} (round {})", others(g), r,
                                    ag_rounds_[size_t(r)]));
}


void ShardedSum::sum_packed(const std::vector<Tensor>& tensors, runtime::Stream& stream) {
  runtime::StreamGuard on(stream);
  int64_t at = 0;
  for (const Tensor& t : tensors) copy_on_stream(t, arena_.slice(0, at, at + t.numel())), at += t.numel();
  CM_CHECK(!ranges_.empty() && ranges_[0].begin == 0 && at <= ranges_[0].end, "size the first range for the tensors",
           "{} elements packed into a range of {}", at, ranges_.empty() ? 0 : ranges_[0].end);
  reduce_scatter(0, stream);
  all_gather(0, arena_, stream);
  at = 0;
  for (const Tensor& t : tensors) copy_on_stream(arena_.slice(0, at, at + t.numel()), t), at += t.numel();
}

}  // namespace coremesh::parallel
