// The 5D mesh as pure functions: coordinates <-> rank, groups, validation
// messages; checked at the seed's 15,872-PE layout without starting a process.
#include <gtest/gtest.h>

#include <set>

#include "coremesh/core/error.hpp"
#include "coremesh/parallel/mesh.hpp"

using namespace coremesh;
using namespace coremesh::parallel;

namespace {

ParallelConfig degrees(int dp, int cp, int pp, int ep, int tp) {
  ParallelConfig p;
  p.dp = dp, p.cp = cp, p.pp = pp, p.ep = ep, p.tp = tp;
  return p;
}

// Every rank is in exactly one group of the kind, of the given size, and
// the group of each member is the same group.
void expect_partition(const Mesh& m, const std::function<std::vector<int>(int)>& group, size_t size,
                      const char* what) {
  std::vector<int> seen(size_t(m.world()), 0);
  for (int r = 0; r < m.world(); ++r) {
    if (seen[size_t(r)]) continue;
    const std::vector<int> g = group(r);
    ASSERT_EQ(g.size(), size) << what;
    for (size_t i = 0; i < g.size(); ++i) {
      if (i > 0) {
        ASSERT_LT(g[i - 1], g[i]) << what << ": members in increasing rank order";
      }
      ASSERT_EQ(seen[size_t(g[i])]++, 0) << what << ": rank " << g[i] << " in two groups";
    }
    ASSERT_EQ(group(g.back()), g) << what;
  }
}

}  // namespace

TEST(Mesh, SeedLayoutOf15872Pes) {
  // TP1 PP8 CP4 EP16 DP31 (seed 002's 16,000-card deployment).
  const Mesh m(degrees(31, 4, 8, 16, 1), 15872, {256, 128, 61, 4096});
  for (int r = 0; r < m.world(); ++r) ASSERT_EQ(m.rank(m.coords(r)), r);
  const Coords c = m.coords(12345);
  EXPECT_EQ(m.rank(c), 12345);
  // 12345 = ((dp * 4 + cp) * 8 + pp) * 16 + ep
  EXPECT_EQ(((c[Dim::dp] * 4 + c[Dim::cp]) * 8 + c[Dim::pp]) * 16 + c[Dim::ep], 12345);
  EXPECT_EQ(c[Dim::tp], 0);
  for (Dim d : kDims)
    expect_partition(m, [&](int r) { return m.group(d, r); }, size_t(m.degree(d)), dim_name(d));
  expect_partition(m, [&](int r) { return m.dense_grad_group(r); }, 31 * 4 * 16, "dense grads");
  expect_partition(m, [&](int r) { return m.expert_grad_group(r); }, 31 * 4, "expert grads");
  expect_partition(m, [&](int r) { return m.data_group(r); }, 31 * 16, "data");
  // The EP group of a rank: its 16 expert shards, consecutive ranks (EP is inner to PP).
  const std::vector<int> ep = m.group(Dim::ep, 12345);
  EXPECT_EQ(ep.front(), 12345 - c[Dim::ep]);
  EXPECT_EQ(ep.back(), ep.front() + 15);
  // Data indices number the dp x ep ranks of a (cp, pp, tp) slice once each.
  std::set<int> idx;
  for (int r : m.data_group(12345)) idx.insert(m.data_index(r));
  EXPECT_EQ(idx.size(), 31u * 16u);
  EXPECT_EQ(*idx.rbegin(), 31 * 16 - 1);
}

TEST(Mesh, SmallLayoutsFollowTheWorkedExample) {
  const Mesh m(degrees(2, 1, 1, 2, 1), 4);
  EXPECT_EQ(m.group(Dim::ep, 2), (std::vector<int>{2, 3}));
  EXPECT_EQ(m.group(Dim::dp, 2), (std::vector<int>{0, 2}));
  EXPECT_EQ(m.dense_grad_group(1), (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(m.expert_grad_group(1), (std::vector<int>{1, 3}));
  EXPECT_EQ(m.data_index(3), 3);
  EXPECT_EQ(m.describe(), "dp 2 x cp 1 x pp 1 x ep 2 x tp 1 = 4 PEs");
  // With pp and tp the gradient groups are not strided sets of the world.
  const Mesh n(degrees(2, 1, 2, 1, 2), 8);
  EXPECT_EQ(n.dense_grad_group(5), (std::vector<int>{1, 5}));
  EXPECT_EQ(n.group(Dim::pp, 5), (std::vector<int>{5, 7}));
}

TEST(Mesh, BadLayoutsSayWhichFactorToChange) {
  auto message = [](const ParallelConfig& p, int world, SplitSizes s) {
    try {
      Mesh m(p, world, s);
    } catch (const InvalidArgument& e) {
      return std::string(e.what());
    }
    return std::string("(accepted)");
  };
  std::string e = message(degrees(2, 1, 1, 2, 1), 3, {8, 4, 2, 64});
  EXPECT_NE(e.find("= 4 PEs, but the job has 3"), std::string::npos) << e;
  e = message(degrees(1, 1, 1, 3, 1), 3, {8, 4, 2, 64});
  EXPECT_NE(e.find("ep = 3 does not divide the 8 routed experts: choose ep among the divisors of 8"),
            std::string::npos) << e;
  e = message(degrees(1, 1, 1, 1, 3), 3, {8, 4, 2, 64});
  EXPECT_NE(e.find("tp = 3 does not divide the 4 query heads"), std::string::npos) << e;
  e = message(degrees(1, 3, 1, 1, 1), 3, {8, 4, 2, 64});
  EXPECT_NE(e.find("does not divide seq_len = 64: choose seq_len a multiple of 6"), std::string::npos) << e;
  ParallelConfig ulysses = degrees(1, 2, 1, 1, 2);
  ulysses.cp_comm = CpComm::ulysses;
  e = message(ulysses, 4, {8, 4, 2, 64, 2});
  EXPECT_NE(e.find("Ulysses splits the 2 key/value heads over cp x tp = 2 x 2 = 4 PEs: choose cp x tp among the "
                   "divisors of 2, or cp_comm ring"),
            std::string::npos) << e;
  EXPECT_EQ(e.find("query heads"), std::string::npos) << e;
  ParallelConfig contiguous = degrees(1, 3, 1, 1, 1);
  contiguous.cp_zigzag = false;
  EXPECT_EQ(message(contiguous, 3, {8, 4, 2, 66}), "(accepted)");  // 3 chunks of 22, not 6
  e = message(contiguous, 3, {8, 4, 2, 64});
  EXPECT_NE(e.find("cp = 3 splits each sequence into 3 chunks, which does not divide seq_len = 64"),
            std::string::npos) << e;
  e = message(degrees(0, 1, 1, 1, 1), 1, {});
  EXPECT_NE(e.find("parallel.dp = 0 must be positive"), std::string::npos) << e;
}
