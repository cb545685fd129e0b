// Collectives on the world and on sub-teams from split_strided / split_2d.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "coremesh/core/dtype.hpp"
#include "coremesh/core/error.hpp"
#include "coremesh/shmem/shmem.hpp"

namespace shmem = coremesh::shmem;
using coremesh::bf16;

namespace {
int me() { return shmem::my_pe(); }
int npes() { return shmem::n_pes(); }

template <typename T>
T* sym(size_t n) {
  return static_cast<T*>(shmem::sym_calloc(n, sizeof(T)));
}

// Every team shape the tests run on: the world, the even PEs (odd PEs get
// the odd ones), rows and columns of a 2D split.
std::vector<shmem::Team> my_teams() {
  shmem::Team world = shmem::Team::world();
  std::vector<shmem::Team> teams{world};
  shmem::Team even = world.split_strided(0, 2, (npes() + 1) / 2);
  shmem::Team odd = npes() > 1 ? world.split_strided(1, 2, npes() / 2) : shmem::Team();
  teams.push_back(even.valid() ? even : odd);
  auto [row, column] = world.split_2d(npes() >= 4 ? 2 : 1);
  teams.push_back(row);
  teams.push_back(column);
  return teams;
}

float value_f(int pe, size_t i) { return static_cast<float>((pe + 1) * 0.25 + (i % 13)); }

template <typename T>
T value(int pe, size_t i) {
  if constexpr (std::is_same_v<T, bf16>) return coremesh::to_bf16(value_f(pe, i));
  else return static_cast<T>(value_f(pe, i) * 4);  // exact in every type
}
template <typename T>
double as_double(T v) {
  if constexpr (std::is_same_v<T, bf16>) return coremesh::to_float(v);
  else return static_cast<double>(v);
}

template <typename T>
void check_allreduce(const shmem::Team& team, size_t n) {
  T* src = sym<T>(n);
  T* dst = sym<T>(n);
  const int k = team.valid() ? team.n_pes() : 0;
  for (size_t i = 0; i < n; ++i) src[i] = value<T>(me(), i);
  for (shmem::ReduceOp op : {shmem::ReduceOp::sum, shmem::ReduceOp::max, shmem::ReduceOp::min}) {
    if (!team.valid()) continue;
    shmem::allreduce(team, dst, src, n, op);
    size_t bad = 0;
    for (size_t i = 0; i < n; ++i) {
      double want = as_double(value<T>(team.world_pe(0), i));
      for (int m = 1; m < k; ++m) {
        const double v = as_double(value<T>(team.world_pe(m), i));
        want = op == shmem::ReduceOp::sum ? want + v : op == shmem::ReduceOp::max ? std::max(want, v) : std::min(want, v);
      }
      if constexpr (std::is_same_v<T, bf16>) want = coremesh::to_float(coremesh::to_bf16(static_cast<float>(want)));
      bad += std::abs(as_double(dst[i]) - want) > 1e-6 * std::abs(want);
    }
    EXPECT_EQ(bad, 0u) << "op " << int(op) << " n " << n << " team of " << k;
  }
  shmem::barrier();
  shmem::sym_free(dst);
  shmem::sym_free(src);
}
}  // namespace

TEST(Collectives, AllreduceAllTypesOnAllTeams) {
  const size_t large = std::string(shmem::transport_name()).rfind("shm", 0) != 0 ? 1031 : 10007;
  for (const shmem::Team& team : my_teams()) {
    for (size_t n : {size_t{1}, size_t{7}, large}) {
      check_allreduce<float>(team, n);
      check_allreduce<bf16>(team, n);
      check_allreduce<int32_t>(team, n);
      check_allreduce<int64_t>(team, n);
    }
  }
}

// f32 sums whose value depends on the order of the additions: every PE must
// hold exactly the sum taken in member order, ((s_0 + s_1) + s_2) ..., for a
// small vector (across hosts pushed to every PE, or reduced whole by each)
// and a large one (reduce-scatter + allgather).
TEST(Collectives, AllreduceSumsInMemberOrderExactly) {
  auto term = [](int pe, size_t i) {  // magnitudes 2^-10 .. 2^23: another order rounds otherwise
    const uint64_t p = static_cast<uint64_t>(pe), h = (p * 7919 + i * 104729 + p * i * 31) % 100003;
    const float mantissa = static_cast<float>(static_cast<int>(h % 2001) - 1000) / 1024.0f;
    return std::ldexp(mantissa, static_cast<int>(h / 2001 % 24));
  };
  for (const shmem::Team& team : my_teams()) {
    for (size_t n : {size_t{1031}, size_t{70000}}) {
      float* src = sym<float>(n);
      float* dst = sym<float>(n);
      for (size_t i = 0; i < n; ++i) src[i] = term(me(), i);
      if (team.valid()) {
        shmem::allreduce(team, dst, src, n, shmem::ReduceOp::sum);
        size_t bad = 0;
        for (size_t i = 0; i < n; ++i) {
          float want = term(team.world_pe(0), i);
          for (int m = 1; m < team.n_pes(); ++m) want += term(team.world_pe(m), i);
          bad += std::memcmp(&want, &dst[i], sizeof want) != 0;
        }
        EXPECT_EQ(bad, 0u) << "n " << n << " team of " << team.n_pes();
      }
      shmem::barrier();
      shmem::sym_free(dst);
      shmem::sym_free(src);
    }
  }
}

TEST(Collectives, AllreduceInPlace) {
  for (const size_t n : {size_t{4099}, size_t{30000}}) {  // one part, and two across hosts
    float* buf = sym<float>(n);
    for (size_t i = 0; i < n; ++i) buf[i] = static_cast<float>(me() + i);
    shmem::allreduce(shmem::Team::world(), buf, buf, n, shmem::ReduceOp::sum);
    const double pes = npes();
    for (size_t i = 0; i < n; i += 97) EXPECT_EQ(buf[i], static_cast<float>(pes * (pes - 1) / 2 + pes * i));
    shmem::barrier();
    shmem::sym_free(buf);
  }
}

// Allreduces back to back with no barrier between (across hosts a small
// one is one message per pair into double-buffered landing slots), on two
// overlapping teams in turn, each call with its own values; then teams of
// other members created again and again in the same slots.
TEST(Collectives, BackToBackAllreducesKeepEachCallsVectors) {
  constexpr size_t kMax = 17000;  // 136 KiB: parts of 64 KiB
  int64_t* src = sym<int64_t>(kMax);
  int64_t* dst = sym<int64_t>(kMax);
  auto value = [](int pe, int call, size_t i) { return int64_t{pe + 1} * 1'000'003 + call * 1009 + int64_t(i); };
  auto check = [&](const shmem::Team& team, int call, size_t n) {
    for (size_t i = 0; i < n; ++i) src[i] = value(me(), call, i);
    shmem::allreduce(team, dst, src, n, shmem::ReduceOp::sum);
    size_t bad = 0;
    for (size_t i = 0; i < n; ++i) {
      int64_t want = 0;
      for (int m = 0; m < team.n_pes(); ++m) want += value(team.world_pe(m), call, i);
      bad += dst[i] != want;
    }
    EXPECT_EQ(bad, 0u) << "call " << call << " n " << n << " team of " << team.n_pes();
  };
  shmem::Team world = shmem::Team::world();
  shmem::Team half = world.split_strided(0, 1, std::max(1, npes() - 1));
  for (int call = 0; call < 120; ++call) {
    const size_t n = call % 10 == 9 ? kMax : 1 + static_cast<size_t>(call * 37) % 300;
    check(world, call, n);
    if (half.valid()) check(half, call, n);
  }
  half = shmem::Team();
  for (int round = 0; round < 6; ++round) {  // members change, slots are reused
    shmem::Team team = round % 2 == 0 ? world.split_strided(round % npes(), 1, npes() - round % npes())
                                      : world.split_strided(0, 2, (npes() + 1) / 2);
    for (int call = 0; call < 4 && team.valid(); ++call) check(team, 1000 * round + call, 1 + 50 * call);
    shmem::barrier();
  }
  shmem::barrier();
  shmem::sym_free(dst);
  shmem::sym_free(src);
}

// SHMEM_THREAD_MULTIPLE: two threads of every PE run allreduces at once,
// each on its own team of every PE (team slots, and across hosts landing
// areas, apart), with vectors of one part and of three.
TEST(Collectives, ThreadsRunAllreducesOnTheirOwnTeamsAtOnce) {
  constexpr size_t kMax = 17000;
  shmem::Team world = shmem::Team::world();
  const shmem::Team teams[2] = {world.split_strided(0, 1, npes()), world.split_strided(0, 1, npes())};
  int64_t* src[2] = {sym<int64_t>(kMax), sym<int64_t>(kMax)};
  int64_t* dst[2] = {sym<int64_t>(kMax), sym<int64_t>(kMax)};
  auto value = [](int pe, int thread, int call, size_t i) {
    return int64_t{pe + 1} * 1'000'003 + thread * 500'009 + call * 1009 + int64_t(i);
  };
  size_t bad[2] = {0, 0};
  auto run = [&](int thread) {
    for (int call = 0; call < 60; ++call) {
      const size_t n = call % 6 == 5 ? kMax : 1 + static_cast<size_t>(call * 41) % 500;
      for (size_t i = 0; i < n; ++i) src[thread][i] = value(me(), thread, call, i);
      shmem::allreduce(teams[thread], dst[thread], src[thread], n, shmem::ReduceOp::sum);
      for (size_t i = 0; i < n; ++i) {
        int64_t want = 0;
        for (int pe = 0; pe < npes(); ++pe) want += value(pe, thread, call, i);
        bad[thread] += dst[thread][i] != want;
      }
    }
  };
  std::thread other(run, 1);
  run(0);
  other.join();
  EXPECT_EQ(bad[0], 0u);
  EXPECT_EQ(bad[1], 0u);
  shmem::barrier();
  for (int t = 0; t < 2; ++t) {
    shmem::sym_free(dst[t]);
    shmem::sym_free(src[t]);
  }
}

TEST(Collectives, BroadcastAllgatherAlltoallReduceScatterOnAllTeams) {
  for (const shmem::Team& team : my_teams()) {
    const size_t n = 301;
    const int k = team.valid() ? team.n_pes() : 1;
    // Sizes are collective: the same on every PE, whatever its team's size.
    auto* src = sym<int32_t>(n * npes());
    auto* dst = sym<int32_t>(n * npes());
    for (size_t i = 0; i < n * k; ++i) src[i] = me() * 100000 + static_cast<int32_t>(i);
    if (team.valid()) {
      const int root = k - 1;
      shmem::broadcast(team, dst, src, n, root);
      for (size_t i = 0; i < n; i += 10) EXPECT_EQ(dst[i], team.world_pe(root) * 100000 + int32_t(i));
      shmem::allgather(team, dst, src, n);
      for (int m = 0; m < k; ++m) EXPECT_EQ(dst[m * n + 5], team.world_pe(m) * 100000 + 5);
      shmem::alltoall(team, dst, src, n);
      for (int m = 0; m < k; ++m)
        EXPECT_EQ(dst[m * n + 3], team.world_pe(m) * 100000 + int32_t(team.my_pe() * n + 3));
      shmem::reduce_scatter(team, dst, src, n, shmem::ReduceOp::sum);
      int64_t pe_sum = 0;
      for (int m = 0; m < k; ++m) pe_sum += team.world_pe(m);
      EXPECT_EQ(dst[2], pe_sum * 100000 + k * int32_t(team.my_pe() * n + 2));
    }
    shmem::barrier();
    shmem::sym_free(dst);
    shmem::sym_free(src);
  }
}

// MoE-style alltoallv: PE i sends (i + j) % 3 elements to PE j (some zero),
// packed in peer order; receivers place them in peer order too.
TEST(Collectives, AlltoallvWithZeroCounts) {
  for (const shmem::Team& team : my_teams()) {
    if (!team.valid()) {
      shmem::barrier();
      continue;
    }
    const int k = team.n_pes(), r = team.my_pe();
    auto count = [](int from, int to) { return size_t((from + to) % 3); };
    std::vector<size_t> send_counts(k), send_offsets(k), recv_counts(k), recv_offsets(k);
    size_t s = 0, t = 0;
    for (int j = 0; j < k; ++j) {
      send_counts[j] = count(r, j), send_offsets[j] = s, s += send_counts[j];
      recv_counts[j] = count(j, r), recv_offsets[j] = t, t += recv_counts[j];
    }
    auto* src = sym<int64_t>(3 * npes() + 1);
    auto* dst = sym<int64_t>(3 * npes() + 1);
    for (int j = 0; j < k; ++j)
      for (size_t e = 0; e < send_counts[j]; ++e) src[send_offsets[j] + e] = r * 1000 + j * 10 + int64_t(e);
    shmem::alltoallv<int64_t>(team, dst, recv_counts, recv_offsets, src, send_counts, send_offsets);
    for (int j = 0; j < k; ++j)
      for (size_t e = 0; e < recv_counts[j]; ++e)
        EXPECT_EQ(dst[recv_offsets[j] + e], j * 1000 + r * 10 + int64_t(e));
    // Mismatched counts fail on every member, naming the pair.
    if (k > 1) {
      std::vector<size_t> wrong = recv_counts;
      wrong[(r + 1) % k] += 1;
      EXPECT_THROW(shmem::alltoallv<int64_t>(team, dst, wrong, recv_offsets, src, send_counts, send_offsets),
                   coremesh::InvalidArgument);
      shmem::sync(team);
    }
    shmem::barrier();
    shmem::sym_free(dst);
    shmem::sym_free(src);
  }
}
