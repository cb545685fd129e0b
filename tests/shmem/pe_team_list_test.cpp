// Teams of arbitrary PE lists (Team::from_pes, Team::split) and the
// on-stream reduce_scatter / allgather / broadcast that ZeRO-1 uses, against
// a host reference that sums the members' buffers in member order: results
// must be bit-identical, on host and on-stream paths alike.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "coremesh/core/dtype.hpp"
#include "coremesh/core/error.hpp"
#include "coremesh/runtime/device.hpp"
#include "coremesh/runtime/stream.hpp"
#include "coremesh/shmem/shmem.hpp"

namespace shmem = coremesh::shmem;
namespace rt = coremesh::runtime;
using coremesh::bf16;

namespace {
int me() { return shmem::my_pe(); }
int npes() { return shmem::n_pes(); }

// Values of very different magnitudes: float addition is not associative
// on them, so only the member-order sum matches bit for bit.
float value_f(int pe, size_t i) {
  const float scale = (pe + static_cast<int>(i)) % 3 == 0 ? 1e6f : (pe % 2 ? 1e-3f : 1.0f);
  return scale * static_cast<float>((pe * 7919 + static_cast<int>(i) * 104729) % 1009 - 504) / 7.0f;
}
template <typename T>
T value(int pe, size_t i) {
  if constexpr (std::is_same_v<T, bf16>) return coremesh::to_bf16(value_f(pe, i));
  else if constexpr (std::is_integral_v<T>) return static_cast<T>(value_f(pe, i) * 3);
  else return static_cast<T>(value_f(pe, i));
}
// Sum over the members, in member order, as the header promises.
template <typename T>
T reference_sum(const std::vector<int>& members, size_t i) {
  if constexpr (std::is_same_v<T, bf16>) {
    float acc = coremesh::to_float(value<T>(members[0], i));
    for (size_t m = 1; m < members.size(); ++m) acc += coremesh::to_float(value<T>(members[m], i));
    return coremesh::to_bf16(acc);
  } else {
    T acc = value<T>(members[0], i);
    for (size_t m = 1; m < members.size(); ++m) acc = acc + value<T>(members[m], i);
    return acc;
  }
}
template <typename T>
bool same_bits(T a, T b) {
  return std::memcmp(&a, &b, sizeof(T)) == 0;
}

// `wanted` vector cores, at most the device's (a PE bound to one CPU has one).
int vector_limit(int wanted) {
  return std::min(wanted, rt::Device::default_device().spec().vector);
}

// A permutation that is not a strided set: n-1, 0, n-2, 1, ...
std::vector<int> zigzag(int n) {
  std::vector<int> pes;
  for (int lo = 0, hi = n - 1; lo <= hi; ++lo, --hi) {
    pes.push_back(hi);
    if (lo != hi) pes.push_back(lo);
  }
  return pes;
}

// Teams every test runs on: a zigzag of the world, and split() groups by
// me % 3 ordered by descending world PE.
std::vector<shmem::Team> list_teams() {
  shmem::Team world = shmem::Team::world();
  return {shmem::Team::from_pes(world, zigzag(npes())), world.split(me() % 3, -me())};
}

template <typename T>
void check_reductions(const shmem::Team& team, rt::Stream& stream) {
  const int k = team.n_pes(), r = team.my_pe();
  const std::vector<int> members = team.world_pes();
  const size_t per_pe = 1031;  // odd: uneven 64-byte cuts between blocks
  const size_t n = per_pe * static_cast<size_t>(npes());  // sizes are collective
  T* src = static_cast<T*>(shmem::sym_calloc(n, sizeof(T)));
  T* dst = static_cast<T*>(shmem::sym_calloc(n, sizeof(T)));
  T* got = static_cast<T*>(shmem::sym_calloc(n, sizeof(T)));
  for (size_t i = 0; i < n; ++i) src[i] = value<T>(me(), i);
  const size_t used = per_pe * static_cast<size_t>(k);
  // Host and on-stream allreduce, on-stream reduce_scatter.
  shmem::allreduce(team, dst, src, used, shmem::ReduceOp::sum);
  shmem::allreduce_on_stream(stream, team, got, src, used, shmem::ReduceOp::sum);
  stream.synchronize();
  size_t bad_host = 0, bad_stream = 0;
  for (size_t i = 0; i < used; ++i) {
    const T want = reference_sum<T>(members, i);
    bad_host += !same_bits(dst[i], want);
    bad_stream += !same_bits(got[i], want);
  }
  EXPECT_EQ(bad_host, 0u) << "allreduce on a team of " << k;
  EXPECT_EQ(bad_stream, 0u) << "allreduce_on_stream on a team of " << k;
  shmem::reduce_scatter_on_stream(stream, team, got, src, per_pe, shmem::ReduceOp::sum);
  stream.synchronize();
  size_t bad_scatter = 0;
  for (size_t i = 0; i < per_pe; ++i)
    bad_scatter += !same_bits(got[i], reference_sum<T>(members, r * per_pe + i));
  EXPECT_EQ(bad_scatter, 0u) << "reduce_scatter_on_stream, member " << r << " of " << k;
  shmem::barrier();
  shmem::sym_free(got);
  shmem::sym_free(dst);
  shmem::sym_free(src);
}
}  // namespace

TEST(TeamList, FromPesAndSplitHaveTheRequestedMembers) {
  shmem::Team world = shmem::Team::world();
  const std::vector<int> order = zigzag(npes());
  shmem::Team zz = shmem::Team::from_pes(world, order);
  ASSERT_TRUE(zz.valid());
  EXPECT_EQ(zz.world_pes(), order);
  const int index = static_cast<int>(std::find(order.begin(), order.end(), me()) - order.begin());
  EXPECT_EQ(zz.my_pe(), index);
  EXPECT_EQ(zz.translate(index, world), me());
  // Only the odd PEs, in a team of their own; the even ones get an invalid Team.
  std::vector<int> odd;
  for (int pe = npes() - 1; pe >= 0; --pe)
    if (pe % 2) odd.push_back(pe);
  if (!odd.empty()) {
    shmem::Team t = shmem::Team::from_pes(world, odd);
    EXPECT_EQ(t.valid(), me() % 2 == 1);
    if (t.valid()) {
      EXPECT_EQ(t.n_pes(), static_cast<int>(odd.size()));
      shmem::barrier(t);
    }
  }
  // split: by me % 3, descending world PE; color -1 opts out.
  shmem::Team mod3 = world.split(me() % 3, -me());
  ASSERT_TRUE(mod3.valid());
  std::vector<int> want;
  for (int pe = npes() - 1; pe >= 0; --pe)
    if (pe % 3 == me() % 3) want.push_back(pe);
  EXPECT_EQ(mod3.world_pes(), want);
  EXPECT_FALSE(world.split(me() == 0 ? -1 : 0).valid() && me() == 0);
  // Teams of a team: split the zigzag team in halves by its own indices.
  shmem::Team half = zz.split(zz.my_pe() < (npes() + 1) / 2 ? 0 : 1);
  ASSERT_TRUE(half.valid());
  shmem::sync(half);
  shmem::barrier();
}

TEST(TeamList, DifferentListsFailOnEveryPe) {
  if (npes() == 1) GTEST_SKIP() << "needs two PEs";
  std::vector<int> list{0};
  if (me() == 1) list = {1};
  try {
    shmem::Team::from_pes(shmem::Team::world(), list);
    ADD_FAILURE() << "expected a mismatch error";
  } catch (const coremesh::InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("passed a different list"), std::string::npos) << e.what();
  }
  EXPECT_THROW(shmem::Team::from_pes(shmem::Team::world(), std::vector<int>{0, 0}),
               coremesh::InvalidArgument);
  EXPECT_THROW(shmem::Team::from_pes(shmem::Team::world(), std::vector<int>{npes()}),
               coremesh::InvalidArgument);
  shmem::barrier();
}

TEST(TeamList, RankOrderedReductionsOnListTeams) {
  rt::Stream stream;
  rt::StreamLimitGuard limit(stream, -1, vector_limit(1 + me() % 2));  // 1 or 2 vector cores
  for (const shmem::Team& team : list_teams()) {
    check_reductions<float>(team, stream);
    check_reductions<bf16>(team, stream);
    check_reductions<int64_t>(team, stream);
  }
}

TEST(TeamList, AllgatherAndBroadcastOnStream) {
  rt::Stream stream;
  rt::StreamLimitGuard limit(stream, -1, vector_limit(2));
  for (const shmem::Team& team : list_teams()) {
    const int k = team.n_pes();
    const std::vector<int> members = team.world_pes();
    const size_t n = 70001;  // > 64 KiB per member: several blocks
    auto* src = static_cast<int32_t*>(shmem::sym_malloc(n * sizeof(int32_t)));
    auto* dst = static_cast<int32_t*>(shmem::sym_calloc(n * npes(), sizeof(int32_t)));
    for (size_t i = 0; i < n; ++i) src[i] = me() * 1000003 + static_cast<int32_t>(i);
    shmem::allgather_on_stream(stream, team, dst, src, n);
    stream.synchronize();
    size_t bad = 0;
    for (int m = 0; m < k; ++m)
      for (size_t i = 0; i < n; i += 7) bad += dst[m * n + i] != members[m] * 1000003 + int32_t(i);
    EXPECT_EQ(bad, 0u) << "allgather_on_stream on a team of " << k;
    const int root = k - 1;
    shmem::broadcast_on_stream(stream, team, dst, src, n, root);
    shmem::broadcast_on_stream(stream, team, src, src, n, 0);  // in place, back to back
    stream.synchronize();
    bad = 0;
    for (size_t i = 0; i < n; i += 7) {
      bad += dst[i] != members[root] * 1000003 + int32_t(i);
      bad += src[i] != members[0] * 1000003 + int32_t(i);
    }
    EXPECT_EQ(bad, 0u) << "broadcast_on_stream on a team of " << k;
    // Zero-length collectives still synchronise and touch nothing.
    shmem::allgather_on_stream<int32_t>(stream, team, nullptr, nullptr, 0);
    shmem::reduce_scatter_on_stream<float>(stream, team, nullptr, nullptr, 0, shmem::ReduceOp::sum);
    stream.synchronize();
    shmem::barrier();
    shmem::sym_free(dst);
    shmem::sym_free(src);
  }
}
