// The caching host allocator: size classes, reuse, the cache limit, threads.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "coremesh/core/allocator.hpp"
#include "coremesh/core/error.hpp"
#include "coremesh/core/tensor.hpp"

#if defined(__SANITIZE_ADDRESS__)
#define TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TEST_ASAN 1
#endif
#endif

#ifdef TEST_ASAN
// Impossible sizes return null (and so reach coremesh's out-of-memory error)
// instead of aborting the test process.
extern "C" const char* __asan_default_options() { return "allocator_may_return_null=1"; }
#endif

namespace coremesh {
namespace {

constexpr size_t kKiB = size_t{1} << 10;
constexpr size_t kMiB = size_t{1} << 20;

bool aligned64(const void* p) { return reinterpret_cast<uintptr_t>(p) % 64 == 0; }

// Each test starts with an empty cache and a 64 MiB limit (so it also runs
// under ASan, where caching is off by default) and restores the limit.
class HostAllocator : public ::testing::Test {
 protected:
  void SetUp() override {
    saved_limit_ = host_allocator_stats().cache_limit_bytes;
    set_host_cache_limit(64 * kMiB);
    empty_host_cache();
    before_ = host_allocator_stats();
  }
  void TearDown() override { set_host_cache_limit(saved_limit_); }

  size_t saved_limit_ = 0;
  HostAllocatorStats before_;
};

// First in the file, so no test has changed the limit yet.
TEST(HostAllocatorDefaults, LimitComesFromTheEnvironmentOr1GiB) {
  const char* env = std::getenv("COREMESH_ALLOC_CACHE_MB");
#ifdef TEST_ASAN
  const size_t fallback = 0;  // a reused block would hide a use-after-free
#else
  const size_t fallback = 1024 * kMiB;
#endif
  const size_t expected = env && *env ? std::strtoull(env, nullptr, 10) * kMiB : fallback;
  EXPECT_EQ(host_allocator_stats().cache_limit_bytes, expected);
#ifdef TEST_ASAN
  // With the cache off, ASan still sees a use-after-free of a large block.
  if (expected == 0) {
    EXPECT_DEATH(
        {
          auto* p = static_cast<volatile char*>(alloc_host(1 * kMiB));
          free_host(const_cast<char*>(p), 1 * kMiB);
          p[0] = 1;
        },
        "heap-use-after-free");
  }
#endif
}

TEST_F(HostAllocator, FreedBlockIsReusedByTheNextRequestOfItsClass) {
  void* p = alloc_host(1 * kMiB);
  free_host(p, 1 * kMiB);
  EXPECT_EQ(host_allocator_stats().cached_bytes, 1 * kMiB);
  // 1 MiB - 100 rounds up to the same class (step 256 KiB).
  void* q = alloc_host(1 * kMiB - 100);
  EXPECT_EQ(q, p);
  HostAllocatorStats s = host_allocator_stats();
  EXPECT_EQ(s.hits, before_.hits + 1);
  EXPECT_EQ(s.misses, before_.misses + 1);
  EXPECT_EQ(s.system_allocs, before_.system_allocs + 1);
  EXPECT_EQ(s.cached_bytes, 0u);
  // Another class does not take it.
  void* r = alloc_host(2 * kMiB);
  EXPECT_NE(r, q);
  EXPECT_EQ(host_allocator_stats().misses, before_.misses + 2);
  free_host(q, 1 * kMiB - 100);
  free_host(r, 2 * kMiB);
}

TEST_F(HostAllocator, SizeClassesWasteAtMostAQuarter) {
  // 100 KiB lies in [64 KiB, 128 KiB) with step 16 KiB -> 112 KiB;
  // 128 KiB + 1 -> 160 KiB; 64 KiB - 1 is small: rounded to 64 bytes.
  struct Case {
    size_t request, block;
  } cases[] = {{100 * kKiB, 112 * kKiB},
               {64 * kKiB, 64 * kKiB},
               {128 * kKiB + 1, 160 * kKiB},
               {3 * kMiB + 7, 3 * kMiB + 512 * kKiB},
               {64 * kKiB - 1, 64 * kKiB},
               {100, 128}};
  for (const Case& c : cases) {
    const size_t live = host_allocator_stats().allocated_bytes;
    void* p = alloc_host(c.request);
    EXPECT_EQ(host_allocator_stats().allocated_bytes - live, c.block) << c.request;
    EXPECT_LE(c.block - c.request, c.request / 4 + 63) << c.request;
    free_host(p, c.request);
    EXPECT_EQ(host_allocator_stats().allocated_bytes, live) << c.request;
  }
}

TEST_F(HostAllocator, BlocksAre64ByteAlignedAndWritable) {
  for (size_t n : {size_t{0}, size_t{1}, size_t{63}, size_t{64}, size_t{65}, size_t{4095},
                   64 * kKiB - 1, 64 * kKiB, 100'000 * size_t{1}, 3 * kMiB + 7}) {
    void* p = alloc_host(n);
    ASSERT_NE(p, nullptr) << n;
    EXPECT_TRUE(aligned64(p)) << n;
    std::memset(p, 0xab, n);
    free_host(p, n);
    void* q = alloc_host(n);  // a reused block is aligned too
    EXPECT_TRUE(aligned64(q)) << n;
    free_host(q, n);
  }
}

TEST_F(HostAllocator, ZeroBytesGivesDistinctFreeablePointers) {
  void* a = alloc_host(0);
  void* b = alloc_host(0);
  EXPECT_NE(a, nullptr);
  EXPECT_NE(a, b);
  EXPECT_EQ(host_allocator_stats().allocated_bytes, before_.allocated_bytes + 128);
  free_host(a, 0);
  free_host(b, 0);
  free_host(nullptr, 0);
  EXPECT_EQ(host_allocator_stats().allocated_bytes, before_.allocated_bytes);
  Tensor t = Tensor::empty({0, 4});
  EXPECT_NE(t.storage()->data(), nullptr);
}

TEST_F(HostAllocator, SmallBlocksAreNotCached) {
  void* p = alloc_host(1000);
  free_host(p, 1000);
  HostAllocatorStats s = host_allocator_stats();
  EXPECT_EQ(s.cached_bytes, 0u);
  EXPECT_EQ(s.hits + s.misses, before_.hits + before_.misses);
  EXPECT_EQ(s.system_frees, before_.system_frees + 1);
}

TEST_F(HostAllocator, BlocksOverTheLimitGoBackToTheSystem) {
  set_host_cache_limit(1 * kMiB);
  void* a = alloc_host(768 * kKiB);  // a class of its own (512 + 2 * 128 KiB)
  void* b = alloc_host(768 * kKiB);
  free_host(a, 768 * kKiB);  // fits: cached
  free_host(b, 768 * kKiB);  // 1.5 MiB > 1 MiB: freed
  HostAllocatorStats s = host_allocator_stats();
  EXPECT_EQ(s.cached_bytes, 768 * kKiB);
  EXPECT_EQ(s.system_frees, before_.system_frees + 1);
  // A block larger than the whole limit is never cached.
  void* big = alloc_host(2 * kMiB);
  free_host(big, 2 * kMiB);
  EXPECT_EQ(host_allocator_stats().cached_bytes, 768 * kKiB);
  EXPECT_EQ(host_allocator_stats().system_frees, before_.system_frees + 2);
  // Lowering the limit trims the cache; 0 turns caching off.
  set_host_cache_limit(0);
  EXPECT_EQ(host_allocator_stats().cached_bytes, 0u);
  EXPECT_EQ(host_allocator_stats().system_frees, before_.system_frees + 3);
  void* c = alloc_host(1 * kMiB);
  free_host(c, 1 * kMiB);
  s = host_allocator_stats();
  EXPECT_EQ(s.cached_bytes, 0u);
  EXPECT_EQ(s.hits, before_.hits);
  EXPECT_EQ(s.system_frees, before_.system_frees + 4);
}

TEST_F(HostAllocator, EmptyCacheReleasesEveryCachedBlock) {
  std::vector<std::pair<void*, size_t>> blocks;
  for (size_t n : {64 * kKiB, 64 * kKiB, 200 * kKiB, 5 * kMiB}) blocks.emplace_back(alloc_host(n), n);
  void* live = alloc_host(1 * kMiB);
  for (auto [p, n] : blocks) free_host(p, n);
  EXPECT_EQ(host_allocator_stats().cached_bytes, 2 * 64 * kKiB + 224 * kKiB + 5 * kMiB);
  // A lower limit frees the largest blocks first.
  set_host_cache_limit(1 * kMiB);
  EXPECT_EQ(host_allocator_stats().cached_bytes, 2 * 64 * kKiB + 224 * kKiB);
  EXPECT_EQ(host_allocator_stats().system_frees, before_.system_frees + 1);
  empty_host_cache();
  HostAllocatorStats s = host_allocator_stats();
  EXPECT_EQ(s.cached_bytes, 0u);
  EXPECT_EQ(s.system_frees, before_.system_frees + 4);
  EXPECT_EQ(s.allocated_bytes, before_.allocated_bytes + 1 * kMiB);
  free_host(live, 1 * kMiB);
}

TEST_F(HostAllocator, TensorStorageComesFromTheCache) {
  void* first = nullptr;
  {
    Tensor t = Tensor::empty({256, 1024});  // 1 MiB of f32
    first = t.raw_data();
    EXPECT_EQ(host_allocator_stats().allocated_bytes, before_.allocated_bytes + 1 * kMiB);
  }
  EXPECT_EQ(host_allocator_stats().cached_bytes, 1 * kMiB);
  Tensor u = Tensor::zeros({1024, 256});
  EXPECT_EQ(u.raw_data(), first);
  EXPECT_EQ(host_allocator_stats().hits, before_.hits + 1);
  EXPECT_EQ(u.item({1023, 255}), 0.0f);  // zeros() cleared the reused block
}

TEST_F(HostAllocator, OutOfMemoryReleasesTheCacheAndThrows) {
  void* p = alloc_host(1 * kMiB);
  free_host(p, 1 * kMiB);
  ASSERT_EQ(host_allocator_stats().cached_bytes, 1 * kMiB);
  try {
    alloc_host(size_t{1} << 60);  // more than the address space
    FAIL() << "expected an out-of-memory error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("out of memory"), std::string::npos) << e.what();
  }
  // The cache was released before the retry.
  EXPECT_EQ(host_allocator_stats().cached_bytes, 0u);
  EXPECT_EQ(host_allocator_stats().allocated_bytes, before_.allocated_bytes);
  EXPECT_THROW(alloc_host(SIZE_MAX), Error);
  EXPECT_THROW(Tensor::empty({int64_t{1} << 58}), Error);
}

// 4 threads allocate, fill and free blocks of mixed classes, and free blocks
// the other threads allocated (as runtime workers free host tensors). A
// block handed to two owners at once shows up as a broken fill pattern.
TEST_F(HostAllocator, ThreadsShareTheCacheSafely) {
  constexpr int kThreads = 4;
  constexpr int kOps = 4000;
  const size_t sizes[] = {100, 64 * kKiB, 80 * kKiB, 200 * kKiB, 1 * kMiB};
  struct Block {
    unsigned char* p;
    size_t n;
    unsigned char tag;
  };
  // Blocks handed from thread t to thread t + 1 to free.
  std::vector<std::vector<Block>> handoff(kThreads);
  std::vector<std::mutex> handoff_mu(kThreads);
  std::atomic<int> broken{0};
  auto check_and_free = [&](const Block& b) {
    const size_t span = std::min<size_t>(b.n, 256);
    for (size_t i = 0; i < span; ++i)
      if (b.p[i] != b.tag || b.p[b.n - 1 - i] != b.tag) {
        broken.fetch_add(1);
        break;
      }
    free_host(b.p, b.n);
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      std::mt19937 rng(static_cast<unsigned>(t + 1));
      std::vector<Block> mine;
      for (int op = 0; op < kOps; ++op) {
        if (mine.size() < 8 && rng() % 3 != 0) {
          const size_t n = sizes[rng() % std::size(sizes)];
          auto* p = static_cast<unsigned char*>(alloc_host(n));
          const auto tag = static_cast<unsigned char>(t * 64 + op % 64);
          const size_t span = std::min<size_t>(n, 256);
          std::memset(p, tag, span);
          std::memset(p + n - span, tag, span);
          mine.push_back({p, n, tag});
        } else if (!mine.empty()) {
          Block b = mine.back();
          mine.pop_back();
          if (rng() % 2) {
            check_and_free(b);
          } else {
            std::lock_guard lock(handoff_mu[(t + 1) % kThreads]);
            handoff[(t + 1) % kThreads].push_back(b);
          }
        }
        if (op % 16 == 0) {
          std::vector<Block> theirs;
          {
            std::lock_guard lock(handoff_mu[t]);
            theirs.swap(handoff[t]);
          }
          for (const Block& b : theirs) check_and_free(b);
        }
      }
      for (const Block& b : mine) check_and_free(b);
    });
  for (auto& th : threads) th.join();
  for (auto& list : handoff)
    for (const Block& b : list) check_and_free(b);
  EXPECT_EQ(broken.load(), 0);
  HostAllocatorStats s = host_allocator_stats();
  EXPECT_EQ(s.allocated_bytes, before_.allocated_bytes);
  EXPECT_GT(s.hits, before_.hits);  // the cache was used, not bypassed
  EXPECT_LE(s.cached_bytes, s.cache_limit_bytes);
}

// A soft limit asks the pressure hook before passing it, as long as the hook
// says memory may have been freed, then allocates anyway.
bool g_release_on_pressure = true;
int g_pressure_calls = 0;
void* g_releasable = nullptr;
bool free_one_block() {
  ++g_pressure_calls;
  if (!g_release_on_pressure || g_releasable == nullptr) return false;
  free_host(g_releasable, 4 * kMiB);
  g_releasable = nullptr;
  return true;
}

TEST_F(HostAllocator, SoftLimitAsksThePressureHookThenAllocatesAnyway) {
  set_host_pressure_hook(&free_one_block);
  reset_host_peak();
  const size_t base = host_allocator_stats().allocated_bytes;
  set_host_soft_limit(base + 6 * kMiB);
  g_pressure_calls = 0;
  g_releasable = alloc_host(4 * kMiB);  // within the limit: no call
  EXPECT_EQ(g_pressure_calls, 0);
  void* second = alloc_host(4 * kMiB);  // would pass it: the hook frees the first
  EXPECT_EQ(g_pressure_calls, 1);
  EXPECT_EQ(g_releasable, nullptr);
  EXPECT_LE(host_allocator_stats().peak_allocated_bytes, base + 6 * kMiB);
  g_release_on_pressure = false;  // nothing more to free: the request is served
  void* third = alloc_host(4 * kMiB);
  EXPECT_EQ(g_pressure_calls, 2);
  EXPECT_EQ(host_allocator_stats().allocated_bytes, base + 8 * kMiB);
  EXPECT_EQ(host_allocator_stats().peak_allocated_bytes, base + 8 * kMiB);
  free_host(second, 4 * kMiB);
  free_host(third, 4 * kMiB);
  set_host_soft_limit(0);
  set_host_pressure_hook(nullptr);
  g_release_on_pressure = true;
}

#ifndef TEST_ASAN
// Under a soft limit a miss gives cached blocks of other sizes back first,
// so that live and cached bytes together stay within it.
TEST_F(HostAllocator, SoftLimitBoundsLivePlusCachedBytes) {
  const size_t base = host_allocator_stats().allocated_bytes;
  void* a = alloc_host(16 * kMiB);
  free_host(a, 16 * kMiB);
  EXPECT_EQ(host_allocator_stats().cached_bytes, 16 * kMiB);
  const size_t limit = base + 10 * kMiB;
  EXPECT_EQ(host_footprint_limit(limit), limit + limit / 8);
  set_host_soft_limit(limit);
  void* b = alloc_host(3 * kMiB);  // another class: a miss; 3 + 16 cached would pass the footprint limit
  const HostAllocatorStats s = host_allocator_stats();
  EXPECT_LE(s.allocated_bytes + s.cached_bytes, host_footprint_limit(limit));
  EXPECT_EQ(s.cached_bytes, 0u);
  free_host(b, 3 * kMiB);
  set_host_soft_limit(0);
}
#endif

}  // namespace
}  // namespace coremesh
