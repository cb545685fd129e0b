// ShardedSum at every PE count: the sum over a group is the members' copies
// added in member order (bit for bit the host's sequential sum), over
// uneven ranges, groups that are not the world, f32 and i64; all_gather
// gives every member every shard.
#include <gtest/gtest.h>

#include <random>

#include "coremesh/parallel/comm.hpp"
#include "coremesh/runtime/stream.hpp"
#include "coremesh/shmem/shmem.hpp"

using namespace coremesh;
using namespace coremesh::parallel;

namespace {

// PE `pe`'s element i at round `step` (a plain value: no product left for the
// compiler to fuse into the sums below).
float value_of(int pe, int64_t i, int step = 0) {
  std::mt19937 rng(uint32_t(pe * 100003 + i * 7 + step));
  return std::uniform_real_distribution<float>(-1.0f, 1.0f)(rng) * float(1 + i % 7);
}

}  // namespace

TEST(ShardedSum, SumsInMemberOrderAndGathers) {
  const int me = shmem::my_pe(), n = shmem::n_pes();
  const int64_t N = 10007;  // ranges that do not split evenly
  // group 0: the world; group 1: the even PEs and the odd PEs apart.
  std::vector<int> world, mine;
  for (int p = 0; p < n; ++p) world.push_back(p);
  for (int p = me % 2; p < n; p += 2) mine.push_back(p);
  std::vector<Group> groups{Group::of(world, me), Group::of(mine, me)};
  std::vector<ShardedSum::Range> ranges{{0, 3000, 0}, {3000, 3001, 1}, {3001, 9000, 1}, {9000, N, 0}};
  Tensor arena = symmetric_tensor({N});
  ShardedSum sum(arena, groups, ranges, 64);
  runtime::Stream comm;
  for (int step = 0; step < 3; ++step) {  // signals count up across rounds
    for (int64_t i = 0; i < N; ++i) arena.data<float>()[i] = value_of(me, i, step);
    for (int r = 0; r < 4; ++r) sum.reduce_scatter(r, comm);
    for (int r = 0; r < 4; ++r) sum.all_gather(r, arena, comm);
    comm.synchronize();
    int bad = 0;
    for (int r = 0; r < 4; ++r) {
      const Group& g = groups[size_t(ranges[size_t(r)].group)];
      for (int64_t i = ranges[size_t(r)].begin; i < ranges[size_t(r)].end; ++i) {
        float want = value_of(g.pes[0], i, step);
        for (int m = 1; m < g.size(); ++m) want += value_of(g.pes[size_t(m)], i, step);
        bad += std::memcmp(&want, arena.data<float>() + i, 4) != 0;
      }
    }
    EXPECT_EQ(bad, 0) << "step " << step;
  }
  // Shards cover each range once, cut at multiples of 64.
  for (int r = 0; r < 4; ++r) {
    int64_t at = ranges[size_t(r)].begin;
    for (int m = 0; m < sum.group(r).size(); ++m) {
      const auto [b, e] = sum.shard(r, m);
      EXPECT_EQ(b, at);
      if (e != ranges[size_t(r)].end) {
        EXPECT_EQ(e % 64, 0);
      }
      at = e;
    }
    EXPECT_EQ(at, ranges[size_t(r)].end);
  }
  shmem::barrier();
}

TEST(ShardedSum, CountsInI64) {
  const int me = shmem::my_pe(), n = shmem::n_pes();
  std::vector<int> world;
  for (int p = 0; p < n; ++p) world.push_back(p);
  Tensor counts = symmetric_tensor({9}, DType::i64);
  for (int i = 0; i < 9; ++i) counts.data<int64_t>()[i] = int64_t(me + 1) * (i + 1);
  ShardedSum sum(counts, {Group::of(world, me)}, {{0, 9, 0}}, 1);
  runtime::Stream s;
  sum.reduce_scatter(0, s);
  sum.all_gather(0, counts, s);
  s.synchronize();
  for (int i = 0; i < 9; ++i) EXPECT_EQ(counts.data<int64_t>()[i], int64_t(n) * (n + 1) / 2 * (i + 1));
  shmem::barrier();
}
