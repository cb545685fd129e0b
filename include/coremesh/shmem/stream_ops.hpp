// On-stream SHMEM: operations enqueued on a runtime Stream and run as
// KernelKind::comm kernels, in stream order with the stream's other work.
//
// Each copy is split into block_dim blocks (at least 64 KiB per block),
// bounded by max_blocks(stream.effective_limits(), KernelKind::comm) -- the
// stream's vector-core limit, the RFC's "one-sided communication uses 4-8
// vector cores". A signal wait parks the stream without occupying a core
// (runtime::Stream::wait_value), so other streams' kernels run meanwhile; a
// barrier occupies one block while it sleeps. Errors surface at the stream's next synchronize()/query().
//
// Arguments are checked when the call enqueues; buffers must stay valid
// until the work has run. Graph capture records these kernels with an op
// descriptor that lists no tensors: a captured one may touch only memory
// that the graph does not own (symmetric buffers, arenas, tensors the caller
// keeps), since a pass could otherwise rewrite a temporary it reads. Collectives on a team must not be interleaved
// with host collectives on the same team while they are in flight.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "coremesh/core/dtype.hpp"
#include "coremesh/runtime/stream.hpp"
#include "coremesh/shmem/collectives.hpp"
#include "coremesh/shmem/rma.hpp"
#include "coremesh/shmem/team.hpp"

namespace coremesh::shmem {

// Blocks a copy of `bytes` gets on `stream` now.
int comm_block_dim(const runtime::Stream& stream, size_t bytes);

namespace detail {
void put_on_stream_bytes(runtime::Stream& stream, void* dest, const void* src, size_t bytes,
                         int pe, uint64_t* signal, uint64_t value, SignalOp op);
void allgather_on_stream_bytes(runtime::Stream& stream, const Team& team, void* dest,
                               const void* src, size_t bytes);
void broadcast_on_stream_bytes(runtime::Stream& stream, const Team& team, void* dest,
                               const void* src, size_t bytes, int root);
}  // namespace detail

template <typename T>
void put_on_stream(runtime::Stream& stream, T* dest, const T* src, size_t count, int pe) {
  detail::put_on_stream_bytes(stream, dest, src, count * sizeof(T), pe, nullptr, 0,
                              SignalOp::set);
}
// The signal is updated after every block of the copy has finished.
template <typename T>
void put_signal_on_stream(runtime::Stream& stream, T* dest, const T* src, size_t count,
                          uint64_t* signal, uint64_t value, SignalOp op, int pe) {
  detail::put_on_stream_bytes(stream, dest, src, count * sizeof(T), pe, signal, value, op);
}
// Later work on `stream` waits until `*signal cmp value` holds on this PE.
// `what` completes the watchdog's message "PE <me> <what>" (e.g. "waits for
// PE 1's rows of layer 3"); `name` is the parked interval's in the profiler.
void signal_wait_on_stream(runtime::Stream& stream, uint64_t* signal, Cmp cmp, uint64_t value,
                           std::string what = "", std::string name = "shmem_signal_wait");
void quiet_on_stream(runtime::Stream& stream);
void barrier_on_stream(runtime::Stream& stream, const Team& team = Team::world());

// Collectives on a stream. Each is collective over the team (every member
// enqueues the same sequence of collectives on the team) and runs as comm
// kernels: a barrier, the data movement in blocks, a barrier.
//
// Reductions are deterministic and rank-ordered: element i of the result is
//   ((src_0[i] op src_1[i]) op src_2[i]) ... op src_{n-1}[i]
// where src_m is the buffer of team member m (team order, Team::my_pe()),
// evaluated left to right in the element type (bf16: in float, rounded once
// at the end) -- the same bits on every member, and the same bits as adding
// the members' buffers in member order on one PE.
// Defined for float, double, bf16, int32_t, int64_t and sum, max, min, prod.
template <typename T>
void allreduce_on_stream(runtime::Stream& stream, const Team& team, T* dest, const T* src,
                         size_t count, ReduceOp op);
// ZeRO-1's gradient reduction: src holds count_per_pe * n_pes elements;
// member r's dest receives the reduction of chunk r, src[r * count_per_pe ..
// (r + 1) * count_per_pe), in the order above.
template <typename T>
void reduce_scatter_on_stream(runtime::Stream& stream, const Team& team, T* dest, const T* src,
                              size_t count_per_pe, ReduceOp op);
// ZeRO-1's parameter gather: dest[k * count ...] = member k's src[0 .. count).
template <typename T>
void allgather_on_stream(runtime::Stream& stream, const Team& team, T* dest, const T* src,
                         size_t count) {
  detail::allgather_on_stream_bytes(stream, team, dest, src, count * sizeof(T));
}
// dest on every member (the root included) gets member `root`'s src.
template <typename T>
void broadcast_on_stream(runtime::Stream& stream, const Team& team, T* dest, const T* src,
                         size_t count, int root) {
  detail::broadcast_on_stream_bytes(stream, team, dest, src, count * sizeof(T), root);
}
// Counts/offsets are copied at the call.
template <typename T>
void alltoallv_on_stream(runtime::Stream& stream, const Team& team, T* dest,
                         std::vector<size_t> recv_counts, std::vector<size_t> recv_offsets,
                         const T* src, std::vector<size_t> send_counts,
                         std::vector<size_t> send_offsets);

}  // namespace coremesh::shmem
