// On-stream SHMEM: comm kernels on runtime streams (see stream_ops.hpp).
#include "coremesh/shmem/stream_ops.hpp"

#include <atomic>
#include <cstring>
#include <memory>

#include "coremesh/core/error.hpp"
#include "coremesh/runtime/device.hpp"
#include "coremesh/runtime/op_desc.hpp"
#include "internal.hpp"
#include "reduce.hpp"
#include "wait.hpp"

namespace coremesh::shmem {

namespace {
constexpr size_t kMinBlockBytes = 64 * 1024;

// A comm kernel's launch. Its op descriptor names the op and lists no
// tensors (the API takes addresses), which is what graph capture needs to
// record it; see stream_ops.hpp for the memory a captured one may touch.
runtime::LaunchInfo comm(const char* name, int block_dim) {
  runtime::LaunchInfo info;
  info.name = name;
  info.kind = runtime::KernelKind::comm;
  info.block_dim = block_dim;
  runtime::OpKey key;
  key.op = name;
  info.op = std::make_shared<const runtime::OpDesc>(runtime::OpDesc{std::move(key), {}, {}});
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
  const size_t offset = bytes ? internal::sym_offset(dest, bytes, api) : 0;
  const size_t signal_offset = signal ? internal::sym_offset(signal, sizeof(uint64_t), api) : 0;
  internal::Transport* t = &internal::transport();
  const int blocks = comm_block_dim(stream, bytes);
  auto left = std::make_shared<std::atomic<int>>(blocks);
  const auto* source = static_cast<const std::byte*>(src);
  stream.launch(comm(signal ? "shmem_put_signal" : "shmem_put", blocks),
                [=](const runtime::BlockContext& ctx) {
                  auto [lo, hi] = block_range(bytes, ctx.block_idx, ctx.block_dim, 64);
                  if (hi > lo) t->put(pe, offset + lo, source + lo, hi - lo);
                  // The last block to finish signals: every block's put is
                  // complete (blocking) and happens-before this point. It
                  // rearms the count for the next run (a replayed graph).
                  if (left->fetch_sub(1, std::memory_order_acq_rel) != 1) return;
                  left->store(blocks, std::memory_order_relaxed);
                  if (!signal) return;
                  t->atomic(pe, signal_offset,
                            op == SignalOp::add ? internal::AmoOp::add : internal::AmoOp::set, 8,
                            value, 0);
                });
}
}  // namespace detail

static_assert(int(Cmp::eq) == int(runtime::WaitCmp::eq) && int(Cmp::ne) == int(runtime::WaitCmp::ne) &&
              int(Cmp::gt) == int(runtime::WaitCmp::gt) && int(Cmp::ge) == int(runtime::WaitCmp::ge) &&
              int(Cmp::lt) == int(runtime::WaitCmp::lt) && int(Cmp::le) == int(runtime::WaitCmp::le));

void signal_wait_on_stream(runtime::Stream& stream, uint64_t* signal, Cmp cmp, uint64_t value,
                           std::string what, std::string name) {
  const size_t offset = internal::sym_offset(signal, sizeof(uint64_t), "signal_wait_on_stream");
  runtime::ValueWait wait;
  wait.word = signal;
  wait.cmp = static_cast<runtime::WaitCmp>(cmp);
  wait.value = value;
  wait.name = std::move(name);
  wait.describe = [me = internal::state().my_pe, offset, what = std::move(what)] {
    return what.empty() ? fmt::format("PE {} waits in signal_wait_on_stream on the signal at offset {}", me, offset)
                        : fmt::format("PE {} {} (signal at offset {})", me, what, offset);
  };
  // What a sleeping wait does between checks: let a polled transport's
  // incoming RMA land, and stop when the job is being stopped.
  wait.poll = [] {
    if (internal::PollHook hook = internal::poll_hook()) hook();
    internal::check_job_alive();
  };
  // Local writers ring this PE's doorbell after writing a signal: sleep on it
  // (and let a network engine's progress thread serve meanwhile).
  wait.sleep = [signal, cmp, value](std::chrono::nanoseconds most) {
    if (internal::SleepHook hook = internal::sleep_hook()) hook();
    internal::Bell& bell = internal::my_doorbell();
    const uint32_t seq = bell.seq.load(std::memory_order_seq_cst);
    bell.sleepers.fetch_add(1, std::memory_order_seq_cst);
    if (!detail::compare(std::atomic_ref<uint64_t>(*signal).load(std::memory_order_acquire), cmp, value))
      internal::futex_wait(&bell.seq, seq, most.count());
    bell.sleepers.fetch_sub(1, std::memory_order_seq_cst);
  };
  wait.timeout = std::chrono::milliseconds(static_cast<int64_t>(internal::wait_policy().timeout_s * 1000.0));
  stream.wait_value(std::move(wait));
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

// Collectives as kernels: sync | pull (blocks) | sync [| pull | sync].
// The pulls are reductions of this PE's chunk (reduce.hpp, member order) or
// copies through the transport split over the blocks.
namespace {
using Copies = std::shared_ptr<std::vector<internal::CopySpan>>;

void launch_copies(runtime::Stream& stream, const char* name, Copies copies) {
  size_t bytes = 0;
  for (const internal::CopySpan& c : *copies) bytes += c.bytes;
  stream.launch(comm(name, comm_block_dim(stream, bytes)),
                [copies](const runtime::BlockContext& ctx) {
                  internal::run_copies(*copies, ctx.block_idx, ctx.block_dim);
                });
}

template <typename T, internal::ReduceKind K>
void reduce_kernels(runtime::Stream& stream, const internal::Group& g, T* dest, const T* src,
                    size_t n, bool scatter, const char* api) {
  CM_CHECK(!scatter || n % g.size == 0, "reduce_scatter takes count_per_pe * team size elements",
           "{}: {} elements do not split evenly over {} PEs", api, n, g.size);
  auto chunk_lo = [n, size = g.size](int r) { return n * static_cast<size_t>(r) / size; };
  const size_t my_lo = chunk_lo(g.my_index), my_hi = chunk_lo(g.my_index + 1);
  const size_t src_offset = n ? internal::sym_offset(src, n * sizeof(T), api) : 0;
  const size_t dest_offset =
      n ? internal::sym_offset(dest, (scatter ? my_hi - my_lo : n) * sizeof(T), api) : 0;
  internal::begin_call(g);
  launch_sync(stream, g, api);
  T* out = scatter ? dest : dest + my_lo;
  const int reduce_blocks = comm_block_dim(stream, (my_hi - my_lo) * sizeof(T) * g.size);
  stream.launch(comm(scatter ? "shmem_reduce_scatter" : "shmem_allreduce_reduce", reduce_blocks),
                [=](const runtime::BlockContext& ctx) {
                  auto [lo, hi] = block_range(my_hi - my_lo, ctx.block_idx, ctx.block_dim, 16);
                  if (hi > lo)
                    internal::reduce_chunk<T, K>(g, src_offset, my_lo + lo, my_lo + hi, out + lo);
                });
  launch_sync(stream, g, api);
  if (scatter) return;
  auto copies = std::make_shared<std::vector<internal::CopySpan>>();
  for (int k = 1; k < g.size; ++k) {
    const int r = (g.my_index + k) % g.size;
    const size_t lo = chunk_lo(r), hi = chunk_lo(r + 1);
    if (hi > lo)
      copies->push_back({reinterpret_cast<std::byte*>(dest + lo), g.world_pe(r),
                         dest_offset + lo * sizeof(T), (hi - lo) * sizeof(T)});
  }
  launch_copies(stream, "shmem_allreduce_gather", copies);
  launch_sync(stream, g, api);
}

template <typename T>
void reduce_on_stream(runtime::Stream& stream, const Team& team, T* dest, const T* src, size_t n,
                      ReduceOp op, bool scatter, const char* api) {
  internal::Group g = group_of(team, api);
  using K = internal::ReduceKind;
  switch (op) {
    case ReduceOp::sum: return reduce_kernels<T, K::sum>(stream, g, dest, src, n, scatter, api);
    case ReduceOp::max: return reduce_kernels<T, K::max>(stream, g, dest, src, n, scatter, api);
    case ReduceOp::min: return reduce_kernels<T, K::min>(stream, g, dest, src, n, scatter, api);
    case ReduceOp::prod: return reduce_kernels<T, K::prod>(stream, g, dest, src, n, scatter, api);
  }
}
}  // namespace

template <typename T>
void allreduce_on_stream(runtime::Stream& stream, const Team& team, T* dest, const T* src,
                         size_t count, ReduceOp op) {
  reduce_on_stream(stream, team, dest, src, count, op, false, "allreduce_on_stream");
}

template <typename T>
void reduce_scatter_on_stream(runtime::Stream& stream, const Team& team, T* dest, const T* src,
                              size_t count_per_pe, ReduceOp op) {
  CM_CHECK(team.valid(), "use a valid team", "reduce_scatter_on_stream on an invalid team");
  reduce_on_stream(stream, team, dest, src, count_per_pe * static_cast<size_t>(team.n_pes()), op,
                   true, "reduce_scatter_on_stream");
}

namespace detail {
void allgather_on_stream_bytes(runtime::Stream& stream, const Team& team, void* dest,
                               const void* src, size_t bytes) {
  const char* api = "allgather_on_stream";
  internal::Group g = group_of(team, api);
  const size_t src_offset = bytes ? internal::sym_offset(src, bytes, api) : 0;
  if (bytes) internal::sym_offset(dest, bytes * g.size, api);
  auto copies = std::make_shared<std::vector<internal::CopySpan>>();
  for (int k = 0; k < g.size && bytes; ++k) {
    const int i = (g.my_index + k) % g.size;
    copies->push_back({static_cast<std::byte*>(dest) + i * bytes, g.world_pe(i), src_offset, bytes});
  }
  internal::begin_call(g);
  launch_sync(stream, g, api);
  launch_copies(stream, "shmem_allgather", copies);
  launch_sync(stream, g, api);
}

void broadcast_on_stream_bytes(runtime::Stream& stream, const Team& team, void* dest,
                               const void* src, size_t bytes, int root) {
  const char* api = "broadcast_on_stream";
  internal::Group g = group_of(team, api);
  CM_CHECK(root >= 0 && root < g.size, "root is a PE index within the team",
           "{}: root {} is not in {} of {} PEs", api, root, g.label, g.size);
  const size_t src_offset = bytes ? internal::sym_offset(src, bytes, api) : 0;
  if (bytes) internal::sym_offset(dest, bytes, api);
  auto copies = std::make_shared<std::vector<internal::CopySpan>>();
  // The root copies its own src too (a local get), unless dest is src.
  if (bytes && (g.my_index != root || dest != src))
    copies->push_back({static_cast<std::byte*>(dest), g.world_pe(root), src_offset, bytes});
  internal::begin_call(g);
  launch_sync(stream, g, api);
  launch_copies(stream, "shmem_broadcast", copies);
  launch_sync(stream, g, api);
}
}  // namespace detail

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
  // the call's parity now, in call order with the other collectives enqueued from this thread
  const int parity = internal::begin_call(g);
  stream.launch(comm("shmem_alltoallv_exchange", 1),
                [=, rc = std::move(recv_counts), ro = std::move(recv_offsets),
                 sc = std::move(send_counts),
                 so = std::move(send_offsets)](const runtime::BlockContext&) {
                  *copies = internal::alltoallv_exchange(g, dest, rc.data(), ro.data(), src,
                                                         sc.data(), so.data(), sizeof(T), api, parity);
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
  template void reduce_scatter_on_stream<T>(runtime::Stream&, const Team&, T*, const T*,      \
                                            size_t, ReduceOp);                                \
  template void alltoallv_on_stream<T>(runtime::Stream&, const Team&, T*, std::vector<size_t>, \
                                       std::vector<size_t>, const T*, std::vector<size_t>,    \
                                       std::vector<size_t>);
INSTANTIATE(float)
INSTANTIATE(double)
INSTANTIATE(bf16)
INSTANTIATE(int32_t)
INSTANTIATE(int64_t)
#undef INSTANTIATE

}  // namespace coremesh::shmem
