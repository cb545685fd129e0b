// coremesh::shmem collectives: team handles -> internal groups.
#include <algorithm>
#include <string>
#include <vector>

#include "coremesh/core/dtype.hpp"
#include "coremesh/core/error.hpp"
#include "coremesh/shmem/collectives.hpp"
#include "internal.hpp"
#include "reduce.hpp"

namespace coremesh::shmem {

namespace {
internal::Group group_of(const Team& team, const char* api) {
  CM_CHECK(team.valid(), "use a valid team (split returns an invalid Team on non-members)",
           "{} on an invalid team", api);
  return internal::team_group(*team.handle(), api);
}
}  // namespace

void barrier(const Team& team) {
  internal::quiet();
  internal::group_sync(group_of(team, "barrier"), "barrier");
}
void sync(const Team& team) { internal::group_sync(group_of(team, "sync"), "sync"); }

void check_agreement(const Team& team, int64_t value, const char* api, const char* what) {
  const internal::Group g = group_of(team, api);
  if (g.size == 1) return;
  const std::vector<int64_t> all = internal::exchange(g, internal::begin_call(g), {&value, 1}, api);
  if (std::all_of(all.begin(), all.end(), [&](int64_t v) { return v == all[0]; })) return;
  std::string each;
  for (int i = 0; i < g.size; ++i) each += fmt::format("{}PE {}: {}", i ? ", " : "", g.world_pe(i), all[size_t(i)]);
  CM_THROW(InvalidArgument, "give every member of a collective the same sizes and dtype",
           "{}: the members' {} differ ({})", api, what, each);
}

namespace detail {
void broadcast_bytes(const Team& team, void* dest, const void* src, size_t bytes, int root) {
  internal::broadcast(group_of(team, "broadcast"), dest, src, bytes, root, true, "broadcast");
}
void allgather_bytes(const Team& team, void* dest, const void* src, size_t bytes) {
  internal::fcollect(group_of(team, "allgather"), dest, src, bytes, "allgather");
}
void alltoall_bytes(const Team& team, void* dest, const void* src, size_t bytes_per_pe) {
  internal::alltoall(group_of(team, "alltoall"), dest, src, bytes_per_pe, "alltoall");
}
void alltoallv_bytes(const Team& team, void* dest, std::span<const size_t> recv_counts,
                     std::span<const size_t> recv_offsets, const void* src,
                     std::span<const size_t> send_counts, std::span<const size_t> send_offsets,
                     size_t elem_bytes) {
  internal::Group g = group_of(team, "alltoallv");
  const size_t n = static_cast<size_t>(g.size);
  CM_CHECK(recv_counts.size() == n && recv_offsets.size() == n && send_counts.size() == n &&
               send_offsets.size() == n,
           "pass one count and one offset per team member",
           "alltoallv on {} of {} PEs: got {} recv counts, {} recv offsets, {} send counts, {} "
           "send offsets",
           g.label, n, recv_counts.size(), recv_offsets.size(), send_counts.size(),
           send_offsets.size());
  internal::alltoallv(g, dest, recv_counts.data(), recv_offsets.data(), src, send_counts.data(),
                      send_offsets.data(), elem_bytes, "alltoallv");
}
}  // namespace detail

namespace {
template <typename T>
void dispatch(const Team& team, T* dest, const T* src, size_t count, ReduceOp op, bool scatter,
              const char* api) {
  internal::Group g = group_of(team, api);
  using K = internal::ReduceKind;
  switch (op) {
    case ReduceOp::sum: return internal::reduce<T, K::sum>(g, dest, src, count, scatter, api);
    case ReduceOp::max: return internal::reduce<T, K::max>(g, dest, src, count, scatter, api);
    case ReduceOp::min: return internal::reduce<T, K::min>(g, dest, src, count, scatter, api);
    case ReduceOp::prod: return internal::reduce<T, K::prod>(g, dest, src, count, scatter, api);
  }
}
}  // namespace

template <typename T>
void allreduce(const Team& team, T* dest, const T* src, size_t count, ReduceOp op) {
  dispatch(team, dest, src, count, op, false, "allreduce");
}
template <typename T>
void reduce_scatter(const Team& team, T* dest, const T* src, size_t count_per_pe, ReduceOp op) {
  dispatch(team, dest, src, count_per_pe * static_cast<size_t>(team.n_pes()), op, true,
           "reduce_scatter");
}

#define COREMESH_SHMEM_REDUCE_TYPES(X) X(float) X(double) X(bf16) X(int32_t) X(int64_t)
#define INSTANTIATE(T)                                                            \
  template void allreduce<T>(const Team&, T*, const T*, size_t, ReduceOp);        \
  template void reduce_scatter<T>(const Team&, T*, const T*, size_t, ReduceOp);
COREMESH_SHMEM_REDUCE_TYPES(INSTANTIATE)
#undef INSTANTIATE

}  // namespace coremesh::shmem
