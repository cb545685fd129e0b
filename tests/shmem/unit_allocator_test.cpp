// The deterministic symmetric allocator, without any process around it.
#include <gtest/gtest.h>

#include <random>

#include "../../src/shmem/allocator.hpp"
#include "coremesh/core/error.hpp"

using coremesh::shmem::internal::SymmetricAllocator;

TEST(Allocator, SameSequenceSameOffsets) {
  SymmetricAllocator a(4096, 1 << 20), b(4096, 1 << 20);
  std::mt19937 rng(7);
  std::vector<size_t> live_a, live_b;
  for (int step = 0; step < 2000; ++step) {
    if (!live_a.empty() && rng() % 3 == 0) {
      const size_t i = rng() % live_a.size();
      EXPECT_EQ(a.release(live_a[i]), b.release(live_b[i]));
      live_a.erase(live_a.begin() + i);
      live_b.erase(live_b.begin() + i);
    } else {
      const size_t bytes = 1 + rng() % 5000, align = size_t{128} << (rng() % 4);
      auto oa = a.allocate(bytes, align), ob = b.allocate(bytes, align);
      ASSERT_EQ(oa, ob);
      if (!oa) continue;
      EXPECT_EQ(*oa % align, 0u);
      live_a.push_back(*oa);
      live_b.push_back(*ob);
    }
  }
  EXPECT_EQ(a.usage().used, b.usage().used);
}

TEST(Allocator, AlignsRoundsCoalescesAndReportsUsage) {
  SymmetricAllocator a(4096, 4096);
  auto x = a.allocate(1, 128);
  ASSERT_TRUE(x);
  EXPECT_EQ(*x, 4096u);
  EXPECT_EQ(a.block_size(*x), 128u);  // rounded to 128
  auto y = a.allocate(1000, 1024);
  ASSERT_TRUE(y);
  EXPECT_EQ(*y % 1024, 0u);
  EXPECT_FALSE(a.allocate(4096, 128));  // does not fit any more
  a.release(*x);
  a.release(*y);
  EXPECT_EQ(a.usage().largest_free, 4096u);  // neighbours merged back
  EXPECT_EQ(a.usage().peak, 128u + 1024u);
  EXPECT_THROW(a.release(12345), coremesh::InvalidArgument);
  EXPECT_THROW(a.allocate(8, 100), coremesh::InvalidArgument);
  EXPECT_NE(a.describe_usage().find("largest free range 4096 B"), std::string::npos);
}

// realloc in place: a shrink always (the tail goes back to the free ranges),
// a growth into the free range right after the block; else nothing changes.
TEST(Allocator, ResizesInPlaceWhereTheBlockCan) {
  SymmetricAllocator a(4096, 4096);
  const size_t x = *a.allocate(3000, 128);  // 3072 B: 1024 B free after it
  EXPECT_FALSE(a.resize(x, 4097));
  EXPECT_EQ(a.block_size(x), 3072u);
  EXPECT_TRUE(a.resize(x, 1000));  // shrink: 1024 B, 3072 B free
  EXPECT_EQ(a.block_size(x), 1024u);
  EXPECT_EQ(a.usage().largest_free, 3072u);
  const size_t y = *a.allocate(1024, 128);  // right after x
  EXPECT_EQ(y, x + 1024);
  EXPECT_FALSE(a.resize(x, 1025));  // y is in the way
  EXPECT_TRUE(a.resize(y, 3072));   // grows into the free range after it
  EXPECT_EQ(a.usage().used, 4096u);
  EXPECT_EQ(a.usage().largest_free, 0u);
  EXPECT_FALSE(a.allocate(1, 128));
  EXPECT_TRUE(a.resize(y, 128));
  EXPECT_EQ(a.usage().largest_free, 2944u);
  EXPECT_EQ(a.usage().peak, 4096u);
  EXPECT_THROW(a.resize(12345, 1), coremesh::InvalidArgument);
}
