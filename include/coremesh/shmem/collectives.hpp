// Collectives on teams. Buffers are symmetric; every member calls with the
// same counts (alltoallv: matching per-peer counts, checked on every PE).
// All are blocking: on return `dest` is complete and `src` may be reused.
#pragma once

#include <cstddef>
#include <span>

#include "coremesh/shmem/team.hpp"

namespace coremesh::shmem {

enum class ReduceOp { sum, max, min, prod };

// quiet + sync: completes this PE's puts, then waits for every member.
void barrier(const Team& team = Team::world());
// Collective over `team`: returns when every member passed the same `value`
// (a size, a dtype code), else throws InvalidArgument on every member naming
// each one's. For callers whose members may disagree (Python's arrays): a
// collective of mismatched sizes would give wrong results silently.
void check_agreement(const Team& team, int64_t value, const char* api, const char* what);
// Waits for every member (no quiet; blocking puts are already complete).
void sync(const Team& team = Team::world());

namespace detail {
void broadcast_bytes(const Team& team, void* dest, const void* src, size_t bytes, int root);
void allgather_bytes(const Team& team, void* dest, const void* src, size_t bytes);
void alltoall_bytes(const Team& team, void* dest, const void* src, size_t bytes_per_pe);
void alltoallv_bytes(const Team& team, void* dest, std::span<const size_t> recv_counts,
                     std::span<const size_t> recv_offsets, const void* src,
                     std::span<const size_t> send_counts, std::span<const size_t> send_offsets,
                     size_t elem_bytes);
}  // namespace detail

// dest on every member (the root included) gets the root's src.
template <typename T>
void broadcast(const Team& team, T* dest, const T* src, size_t count, int root) {
  detail::broadcast_bytes(team, dest, src, count * sizeof(T), root);
}
// dest[k * count ...] = src of member k (fcollect).
template <typename T>
void allgather(const Team& team, T* dest, const T* src, size_t count) {
  detail::allgather_bytes(team, dest, src, count * sizeof(T));
}
// dest[k * count ...] = member k's src[my_pe * count ...].
template <typename T>
void alltoall(const Team& team, T* dest, const T* src, size_t count_per_pe) {
  detail::alltoall_bytes(team, dest, src, count_per_pe * sizeof(T));
}
// Member i sends src[send_offsets[j] .. + send_counts[j]] to member j, which
// stores it at dest[recv_offsets[i] .. + recv_counts[i]]. Counts and offsets
// are in elements, one per member; zero counts are fine.
template <typename T>
void alltoallv(const Team& team, T* dest, std::span<const size_t> recv_counts,
               std::span<const size_t> recv_offsets, const T* src,
               std::span<const size_t> send_counts, std::span<const size_t> send_offsets) {
  detail::alltoallv_bytes(team, dest, recv_counts, recv_offsets, src, send_counts, send_offsets,
                          sizeof(T));
}

// Element-wise reduction over the members; dest may equal src. Defined for
// float, double, bf16, int32_t, int64_t (sum, max, min, prod). Deterministic
// and rank-ordered: dest[i] = ((src_0[i] op src_1[i]) op src_2[i]) ... with
// src_m the buffer of team member m, evaluated left to right (bf16 in float,
// rounded once), identical bits on every member.
template <typename T>
void allreduce(const Team& team, T* dest, const T* src, size_t count, ReduceOp op);
// src holds count_per_pe * n_pes elements; dest receives this member's
// reduced chunk of count_per_pe elements.
template <typename T>
void reduce_scatter(const Team& team, T* dest, const T* src, size_t count_per_pe, ReduceOp op);

}  // namespace coremesh::shmem
