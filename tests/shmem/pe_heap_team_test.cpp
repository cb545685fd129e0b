// Symmetric heap (named buffers, determinism, bad input) and teams.
#include <gtest/gtest.h>

#include "coremesh/core/error.hpp"
#include "coremesh/shmem/shmem.hpp"

namespace shmem = coremesh::shmem;

namespace {
int me() { return shmem::my_pe(); }
int npes() { return shmem::n_pes(); }

// Every PE's value of `v`, via allgather.
std::vector<int64_t> gather(int64_t v) {
  auto* in = static_cast<int64_t*>(shmem::sym_malloc(sizeof(int64_t)));
  auto* out = static_cast<int64_t*>(shmem::sym_malloc(sizeof(int64_t) * npes()));
  *in = v;
  shmem::allgather(shmem::Team::world(), out, in, 1);
  std::vector<int64_t> all(out, out + npes());
  shmem::sym_free(out);
  shmem::sym_free(in);
  return all;
}
}  // namespace

TEST(Heap, SameCallsGiveSameOffsetsEverywhere) {
  auto& heap = shmem::SymmetricHeap::instance();
  auto a = heap.alloc<float>("act_in", 1000);
  auto b = heap.calloc<int32_t>("pp_signal", 17);
  auto c = heap.alloc<double>("aligned", 10, 4096);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a.data()) % 128, 0u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(c.data()) % 4096, 0u);
  for (int32_t v : b) EXPECT_EQ(v, 0);
  const auto base = reinterpret_cast<intptr_t>(shmem::sym_malloc(128));  // probe
  for (void* p : {static_cast<void*>(a.data()), static_cast<void*>(b.data()), static_cast<void*>(c.data())}) {
    const int64_t offset = reinterpret_cast<intptr_t>(p) - base;
    for (int64_t o : gather(offset)) EXPECT_EQ(o, offset);
  }
  shmem::sym_free(reinterpret_cast<void*>(base));
  // Same name, same request: the same buffer. Lookup by name.
  EXPECT_EQ(heap.alloc<float>("act_in", 1000).data(), a.data());
  EXPECT_EQ(heap.find<float>("act_in").data(), a.data());
  EXPECT_EQ(heap.find<float>("act_in").size(), 1000u);
  EXPECT_THROW(heap.alloc<float>("act_in", 999), coremesh::InvalidArgument);
  EXPECT_THROW(heap.find<double>("act_in"), coremesh::InvalidArgument);
  EXPECT_THROW(heap.find<float>("missing"), coremesh::InvalidArgument);
  const auto stats = heap.stats();
  EXPECT_EQ(stats.named_buffers, 3u);
  EXPECT_GE(stats.used, stats.named_bytes);
  EXPECT_NE(heap.dump().find("'pp_signal'"), std::string::npos);
  auto bulk = heap.alloc_bulk<int64_t>({{"g0", 8}, {"g1", 16}});
  EXPECT_EQ(bulk[1].size(), 16u);
  heap.free_all();
  EXPECT_EQ(heap.stats().named_buffers, 0u);
  EXPECT_FALSE(heap.contains("act_in"));
}

TEST(Heap, MismatchedSizesFailOnEveryPeNamingThem) {
  if (npes() == 1) GTEST_SKIP() << "needs two PEs";
  try {
    shmem::sym_malloc(me() == 1 ? 2048 : 1024);
    ADD_FAILURE() << "expected a mismatch error";
  } catch (const coremesh::InvalidArgument& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("PE 0: 1024 B"), std::string::npos) << what;
    EXPECT_NE(what.find("PE 1: 2048 B"), std::string::npos) << what;
  }
  // The heap is still usable and consistent afterwards.
  void* p = shmem::sym_malloc(256);
  EXPECT_NE(p, nullptr);
  shmem::sym_free(p);
}

TEST(Heap, ExhaustedHeapNamesUsage) {
  try {
    shmem::sym_malloc(size_t{1} << 40);
    ADD_FAILURE() << "expected heap exhaustion";
  } catch (const coremesh::InvalidArgument& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("symmetric heap exhausted on PE " + std::to_string(me())), std::string::npos) << what;
    EXPECT_NE(what.find("largest free range"), std::string::npos) << what;
    EXPECT_NE(what.find("--heap"), std::string::npos) << what;
  }
}

TEST(Team, SplitStridedAndTranslate) {
  shmem::Team world = shmem::Team::world();
  // Even PEs.
  const int evens = (npes() + 1) / 2;
  shmem::Team even = world.split_strided(0, 2, evens);
  EXPECT_EQ(even.valid(), me() % 2 == 0);
  if (even.valid()) {
    EXPECT_EQ(even.n_pes(), evens);
    EXPECT_EQ(even.my_pe(), me() / 2);
    for (int i = 0; i < evens; ++i) EXPECT_EQ(even.translate(i, world), 2 * i);
  }
  EXPECT_EQ(world.translate(me(), world), me());
  EXPECT_THROW(world.split_strided(0, 1, npes() + 1), coremesh::InvalidArgument);
}

TEST(Team, Split2dRowsAndColumns) {
  shmem::Team world = shmem::Team::world();
  const int xrange = 2;
  auto [row, column] = world.split_2d(xrange);
  ASSERT_TRUE(row.valid());
  ASSERT_TRUE(column.valid());
  EXPECT_EQ(row.my_pe(), me() % xrange);
  EXPECT_EQ(column.my_pe(), me() / xrange);
  EXPECT_EQ(row.world_pe(0), me() / xrange * xrange);
  EXPECT_EQ(column.world_pe(0), me() % xrange);
  EXPECT_EQ(column.n_pes(), (npes() - me() % xrange + xrange - 1) / xrange);
  // Barriers on the sub-teams work independently.
  shmem::barrier(row);
  shmem::barrier(column);
}

TEST(Team, ManySplitsReuseSlots) {
  shmem::Team world = shmem::Team::world();
  for (int i = 0; i < 100; ++i) {  // more than the 64 slots: destroyed teams free theirs
    shmem::Team t = world.split_strided(0, 1, npes());
    shmem::sync(t);
  }
}
