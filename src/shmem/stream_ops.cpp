// On-stream SHMEM: comm kernels on runtime streams (see stream_ops.hpp).
#include "coremesh/shmem/stream_ops.hpp"

#include <atomic>
#include <cstring>
#include <memory>

#include "coremesh/core/error.hpp"
#include "coremesh/runtime/device.hpp"
#include "internal.hpp"
#include "reduce.hpp"

namespace coremesh::shmem {

namespace {
constexpr size_t kMinBlockBytes = 64 * 1024;

runtime::LaunchInfo comm(const char* name, int block_dim) {
  runtime::LaunchInfo info;
  info.name = name;
  info.kind = runtime::KernelKind::comm;
  info.block_dim = block_dim;
  return info;
}

// [lo, hi) of block `b` of `parts` over `n` items, cut at multiples of `grain`.
std::pair<size_t, size_t> block_range(size_t n, int b, int parts, size_t grain) {
  auto cut = [&](int p) { return p == parts ? n : n * p / parts / grain * grain; };
  return {cut(b), cut(b + 1)};
}

internal::Group group_of(const Team& team, const char* api) {
  CM_CHECK(team.valid(), "use a valid team", "{} on an invalid team", api);
  return internal::team_group(*team.handle(), api);
}

void launch_sync(runtime::Stream& stream, const internal::Group& g, const char* name) {
  stream.launch(comm(name, 1), [g, name](const runtime::BlockContext&) {
    internal::group_sync(g, name);
  });
}
}  // namespace

int comm_block_dim(const runtime::Stream& stream, size_t bytes) {
  const int most = runtime::max_blocks(stream.effective_limits(), runtime::KernelKind::comm);
  const size_t wanted = (bytes + kMinBlockBytes - 1) / kMinBlockBytes;
  return static_cast<int>(std::clamp<size_t>(wanted, 1, static_cast<size_t>(std::max(most, 1))));
}

namespace detail {
void put_on_stream_bytes(runtime::Stream& stream, void* dest, const void* src, size_t bytes,
                         int pe, uint64_t* signal, uint64_t value, SignalOp op) {
  const char* api = signal ? "put_signal_on_stream" : "put_on_stream";
  internal::check_pe(pe, api);
  std::byte* target = internal::peer_address(pe, internal::sym_offset(dest, bytes, api));
  std::atomic<uint64_t>* sig = nullptr;
  if (signal) {
    sig = reinterpret_cast<std::atomic<uint64_t>*>(
        internal::peer_address(pe, internal::sym_offset(signal, sizeof(uint64_t), api)));
  }
  const int blocks = comm_block_dim(stream, bytes);
  auto left = std::make_shared<std::atomic<int>>(blocks);
  const auto* source = static_cast<const std::byte*>(src);
  stream.launch(comm(signal ? "shmem_put_signal" : "shmem_put", blocks),
                [=](const runtime::BlockContext& ctx) {
                  auto [lo, hi] = block_range(bytes, ctx.block_idx, ctx.block_dim, 64);
                  std::memcpy(target + lo, source + lo, hi - lo);
                  // The last block to finish publishes: every copy happens-before it.
                  if (left->fetch_sub(1, std::memory_order_acq_rel) != 1) return;
                  if (sig) {
                    if (op == SignalOp::add) sig->fetch_add(value, std::memory_order_release);
                    else sig->store(value, std::memory_order_release);
                  }
                  internal::notify(pe);
                });
}
}  // namespace detail

void signal_wait_on_stream(runtime::Stream& stream, uint64_t* signal, Cmp cmp, uint64_t value) {
  internal::sym_offset(signal, sizeof(uint64_t), "signal_wait_on_stream");
  stream.launch(comm("shmem_signal_wait", 1), [=](const runtime::BlockContext&) {
    signal_wait_until(signal, cmp, value);
  });
}

void quiet_on_stream(runtime::Stream& stream) {
  stream.launch(comm("shmem_quiet", 1), [](const runtime::BlockContext&) { internal::quiet(); });
}

void barrier_on_stream(runtime::Stream& stream, const Team& team) {
  internal::Group g = group_of(team, "barrier_on_stream");
  stream.launch(comm("shmem_barrier", 1), [g](const runtime::BlockContext&) {
    internal::quiet();
    internal::group_sync(g, "barrier_on_stream");
  });
}

// allreduce as kernels: sync | reduce my chunk (blocks) | sync | gather the
// other chunks (blocks) | sync.
namespace {
template <typename T, internal::ReduceKind K>
void allreduce_kernels(runtime::Stream& stream, const internal::Group& g, T* dest, const T* src,
                       size_t n) {
  const char* api = "allreduce_on_stream";
  const size_t src_offset = internal::sym_offset(src, n * sizeof(T), api);
  const size_t dest_offset = internal::sym_offset(dest, n * sizeof(T), api);
  auto chunk_lo = [n, size = g.size](int r) { return n * static_cast<size_t>(r) / size; };
  const size_t my_lo = chunk_lo(g.my_index), my_hi = chunk_lo(g.my_index + 1);
  internal::begin_call(g);
  launch_sync(stream, g, api);
  const int reduce_blocks = comm_block_dim(stream, (my_hi - my_lo) * sizeof(T) * g.size);
  stream.launch(comm("shmem_allreduce_reduce", reduce_blocks),
                [=](const runtime::BlockContext& ctx) {
                  auto [lo, hi] = block_range(my_hi - my_lo, ctx.block_idx, ctx.block_dim, 16);
                  internal::reduce_chunk<T, K>(g, src_offset, my_lo + lo, my_lo + hi,
                                               dest + my_lo + lo);
                });
  launch_sync(stream, g, api);
  auto copies = std::make_shared<std::vector<internal::CopySpan>>();
  for (int k = 1; k < g.size; ++k) {
    const int r = (g.my_index + k) % g.size;
    const size_t lo = chunk_lo(r), hi = chunk_lo(r + 1);
    copies->push_back({reinterpret_cast<std::byte*>(dest + lo),
                       internal::peer_address(g.world_pe(r), dest_offset + lo * sizeof(T)),
                       (hi - lo) * sizeof(T)});
  }
  const int gather_blocks = comm_block_dim(stream, (n - (my_hi - my_lo)) * sizeof(T));
  stream.launch(comm("shmem_allreduce_gather", gather_blocks),
                [copies](const runtime::BlockContext& ctx) {
                  internal::run_copies(*copies, ctx.block_idx, ctx.block_dim);
                });
  launch_sync(stream, g, api);
}
}  // namespace

template <typename T>
void allreduce_on_stream(runtime::Stream& stream, const Team& team, T* dest, const T* src,
                         size_t count, ReduceOp op) {
  internal::Group g = group_of(team, "allreduce_on_stream");
  using K = internal::ReduceKind;
  switch (op) {
    case ReduceOp::sum: return allreduce_kernels<T, K::sum>(stream, g, dest, src, count);
    case ReduceOp::max: return allreduce_kernels<T, K::max>(stream, g, dest, src, count);
    case ReduceOp::min: return allreduce_kernels<T, K::min>(stream, g, dest, src, count);
    case ReduceOp::prod: return allreduce_kernels<T, K::prod>(stream, g, dest, src, count);
  }
}

template <typename T>
void alltoallv_on_stream(runtime::Stream& stream, const Team& team, T* dest,
                         std::vector<size_t> recv_counts, std::vector<size_t> recv_offsets,
                         const T* src, std::vector<size_t> send_counts,
                         std::vector<size_t> send_offsets) {
  const char* api = "alltoallv_on_stream";
  internal::Group g = group_of(team, api);
  const size_t n = static_cast<size_t>(g.size);
  CM_CHECK(recv_counts.size() == n && recv_offsets.size() == n && send_counts.size() == n &&
               send_offsets.size() == n,
           "pass one count and one offset per team member", "{}: team of {} PEs, got {}/{}/{}/{}",
           api, n, recv_counts.size(), recv_offsets.size(), send_counts.size(),
           send_offsets.size());
  size_t bytes = 0;
  for (size_t c : recv_counts) bytes += c * sizeof(T);
  auto copies = std::make_shared<std::vector<internal::CopySpan>>();
  stream.launch(comm("shmem_alltoallv_exchange", 1),
                [=, rc = std::move(recv_counts), ro = std::move(recv_offsets),
                 sc = std::move(send_counts),
                 so = std::move(send_offsets)](const runtime::BlockContext&) {
                  *copies = internal::alltoallv_exchange(g, dest, rc.data(), ro.data(), src,
                                                         sc.data(), so.data(), sizeof(T), api);
                });
  stream.launch(comm("shmem_alltoallv_copy", comm_block_dim(stream, bytes)),
                [copies](const runtime::BlockContext& ctx) {
                  internal::run_copies(*copies, ctx.block_idx, ctx.block_dim);
                });
  launch_sync(stream, g, api);
}

#define INSTANTIATE(T)                                                                        \
  template void allreduce_on_stream<T>(runtime::Stream&, const Team&, T*, const T*, size_t,   \
                                       ReduceOp);                                             \
  template void alltoallv_on_stream<T>(runtime::Stream&, const Team&, T*, std::vector<size_t>, \
                                       std::vector<size_t>, const T*, std::vector<size_t>,    \
                                       std::vector<size_t>);
INSTANTIATE(float)
INSTANTIATE(bf16)
INSTANTIATE(int32_t)
INSTANTIATE(int64_t)
#undef INSTANTIATE

}  // namespace coremesh::shmem
