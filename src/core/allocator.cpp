// Caching host allocator; the design is in coremesh/core/allocator.hpp.
#include "coremesh/core/allocator.hpp"

#include <malloc.h>
#include <sys/mman.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <cassert>
#include <cstdlib>
#include <mutex>
#include <new>

#include "coremesh/core/env.hpp"
#include "coremesh/core/error.hpp"
#include "coremesh/core/log.hpp"

#if defined(__SANITIZE_ADDRESS__)
#define COREMESH_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define COREMESH_ASAN 1
#endif
#endif

namespace coremesh {
namespace {

constexpr size_t kAlignment = 64;
constexpr size_t kMiB = size_t{1} << 20;
constexpr size_t kDefaultCacheLimit = size_t{1} << 30;  // 1 GiB
// Requests in [2^kMinClassLog2, 2^kMaxClassLog2] are cached; larger ones are
// rare enough to go straight to the system.
constexpr int kMinClassLog2 = 16;  // 64 KiB
constexpr int kMaxClassLog2 = 40;  // 1 TiB
constexpr int kStepsPerDouble = 4;
constexpr int kNumClasses = (kMaxClassLog2 - kMinClassLog2) * kStepsPerDouble + 1;
// Above this, rounding up could overflow; no system can serve it anyway.
constexpr size_t kMaxRequest = SIZE_MAX / 2;

bool cacheable(size_t bytes) {
  return bytes >= (size_t{1} << kMinClassLog2) && bytes <= (size_t{1} << kMaxClassLog2);
}

struct SizeClass {
  int index;     // into the free lists
  size_t bytes;  // the block size every request of the class gets
};

// For a cacheable size: with 2^p <= bytes < 2^(p+1) and step = 2^p / 4, rounds
// up to a multiple of step. E.g. 100 KiB (p = 16, step 16 KiB) -> 112 KiB,
// index 2. A round-up to 2^(p+1) lands on the next power's first class.
SizeClass size_class(size_t bytes) {
  const int log2 = static_cast<int>(std::bit_width(bytes)) - 1;
  const size_t step = (size_t{1} << log2) / kStepsPerDouble;
  const size_t steps = (bytes + step - 1) / step;  // in [4, 8]
  return {(log2 - kMinClassLog2) * kStepsPerDouble + static_cast<int>(steps) - kStepsPerDouble,
          steps * step};
}

// The size actually allocated for a request.
size_t block_bytes(size_t bytes) {
  if (cacheable(bytes)) return size_class(bytes).bytes;
  return (std::max<size_t>(bytes, 1) + kAlignment - 1) / kAlignment * kAlignment;
}

size_t initial_cache_limit() {
#ifdef COREMESH_ASAN
  constexpr int64_t default_mb = 0;
#else
  constexpr int64_t default_mb = static_cast<int64_t>(kDefaultCacheLimit / kMiB);
#endif
  const int64_t mb = env::get_int("COREMESH_ALLOC_CACHE_MB", default_mb);
  CM_CHECK(mb >= 0 && mb < (int64_t{1} << 40),
           "set COREMESH_ALLOC_CACHE_MB to a size in MiB (0 turns the cache off)",
           "COREMESH_ALLOC_CACHE_MB={} is out of range", mb);
  CM_LOG_DEBUG("host allocator: caching blocks >= {} KiB up to {} MiB", 1 << (kMinClassLog2 - 10),
               mb);
  return static_cast<size_t>(mb) * kMiB;
}

// A cached block holds the link to the next one of its class in its first bytes.
struct FreeBlock {
  FreeBlock* next;
  size_t bytes;
};

// Blocks of the cached sizes are mapped straight from the kernel: given back,
// their pages leave the process at once. (From malloc, they would stay in its
// heap after a free and keep the resident set at its high-water mark.) Under
// AddressSanitizer they come from malloc, which it watches.
#ifdef COREMESH_ASAN
constexpr bool kMapBlocks = false;
#else
constexpr bool kMapBlocks = true;
#endif

class HostAllocator {
 public:
  HostAllocator() : limit_(initial_cache_limit()) {
    soft_limit.store(static_cast<size_t>(env::get_int("COREMESH_HOST_SOFT_LIMIT_MB", 0)) * kMiB);
  }

  void* allocate(size_t bytes) {
    CM_CHECK(bytes <= kMaxRequest, "reduce the tensor size or free memory",
             "out of memory allocating {} bytes", bytes);
    relieve_pressure(block_bytes(bytes));
    if (!cacheable(bytes)) return system_alloc(bytes, block_bytes(bytes));
    const SizeClass c = size_class(bytes);
    {
      std::lock_guard lock(mu_);
      if (FreeBlock* b = free_[c.index]) {
        free_[c.index] = b->next;
        cached_bytes_ -= c.bytes;
        hits_.fetch_add(1, std::memory_order_relaxed);
        note_allocated(c.bytes);
        return b;
      }
    }
    misses_.fetch_add(1, std::memory_order_relaxed);
    keep_footprint_within_soft_limit(c.bytes);
    return system_alloc(bytes, c.bytes);
  }

  void deallocate(void* p, size_t bytes) noexcept {
    const size_t block = block_bytes(bytes);
    assert((kMapBlocks && cacheable(bytes)) || malloc_usable_size(p) >= block);
    allocated_bytes_.fetch_sub(block, std::memory_order_relaxed);
    if (cacheable(bytes)) {
      const int index = size_class(bytes).index;
      std::lock_guard lock(mu_);
      if (cached_bytes_ + block <= limit_) {
        free_[index] = new (p) FreeBlock{free_[index], block};
        cached_bytes_ += block;
        return;
      }
    }
    system_free(p, bytes);
  }

  HostAllocatorStats stats() {
    HostAllocatorStats s;
    {
      std::lock_guard lock(mu_);
      s.cached_bytes = cached_bytes_;
      s.cache_limit_bytes = limit_;
    }
    s.allocated_bytes = allocated_bytes_.load(std::memory_order_relaxed);
    s.peak_allocated_bytes = peak_bytes_.load(std::memory_order_relaxed);
    s.hits = hits_.load(std::memory_order_relaxed);
    s.misses = misses_.load(std::memory_order_relaxed);
    s.system_allocs = system_allocs_.load(std::memory_order_relaxed);
    s.system_frees = system_frees_.load(std::memory_order_relaxed);
    return s;
  }

  void set_limit(size_t bytes) {
    {
      std::lock_guard lock(mu_);
      limit_ = bytes;
    }
    trim(bytes);
  }

  // Frees cached blocks, largest class first, until at most `target` bytes stay.
  void trim(size_t target) {
    FreeBlock* released = nullptr;
    {
      std::lock_guard lock(mu_);
      for (int i = kNumClasses - 1; i >= 0 && cached_bytes_ > target; --i) {
        while (free_[i] != nullptr && cached_bytes_ > target) {
          FreeBlock* b = free_[i];
          free_[i] = b->next;
          b->next = released;
          released = b;
          cached_bytes_ -= class_size(i);
        }
      }
    }
    while (released != nullptr) {
      FreeBlock* next = released->next;
      system_free(released, released->bytes);
      released = next;
    }
  }

  std::atomic<size_t> soft_limit{0};
  std::atomic<HostPressureHook> pressure_hook{nullptr};

  void reset_peak() { peak_bytes_.store(allocated_bytes_.load(std::memory_order_relaxed)); }

 private:
  // Waits (through the hook) while the request would pass the soft limit.
  void relieve_pressure(size_t block) {
    const size_t limit = soft_limit.load(std::memory_order_relaxed);
    if (limit == 0) return;
    const HostPressureHook hook = pressure_hook.load(std::memory_order_relaxed);
    while (hook != nullptr && allocated_bytes_.load(std::memory_order_relaxed) + block > limit && hook()) {
    }
  }

  // A miss under a soft limit: cached blocks of other sizes go back to the
  // system first, so that live plus cached bytes stay within
  // host_footprint_limit. Its slack keeps a step's mix of sizes cached: at
  // the limit itself every step gave back and faulted in again what it freed
  // (the demo model at 1 core: 0.51 s per step against 0.29 s with an eighth).
  void keep_footprint_within_soft_limit(size_t block) {
    const size_t limit = soft_limit.load(std::memory_order_relaxed);
    if (limit == 0) return;
    const size_t footprint = host_footprint_limit(limit);
    const size_t live = allocated_bytes_.load(std::memory_order_relaxed) + block;
    trim(live < footprint ? footprint - live : 0);
  }

  void note_allocated(size_t block) {
    const size_t now = allocated_bytes_.fetch_add(block, std::memory_order_relaxed) + block;
    size_t peak = peak_bytes_.load(std::memory_order_relaxed);
    while (now > peak && !peak_bytes_.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
    }
  }

  static size_t class_size(int index) {
    const int log2 = kMinClassLog2 + index / kStepsPerDouble;
    return (size_t{1} << log2) / kStepsPerDouble * (kStepsPerDouble + index % kStepsPerDouble);
  }

  void* system_alloc(size_t request, size_t block) {
    void* p = system_map(request, block);
    if (p == nullptr) {
      trim(0);  // the cached blocks may be what the system lacks
      p = system_map(request, block);
    }
    CM_CHECK(p != nullptr, "reduce the tensor size or free memory",
             "out of memory allocating {} bytes", request);
    system_allocs_.fetch_add(1, std::memory_order_relaxed);
    note_allocated(block);
    return p;
  }

  static void* system_map(size_t request, size_t block) {
    if (!kMapBlocks || !cacheable(request)) return std::aligned_alloc(kAlignment, block);
    void* p = ::mmap(nullptr, block, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? nullptr : p;
  }

  // `request`: the size asked for (it says how the block was made).
  void system_free(void* p, size_t request) noexcept {
    system_frees_.fetch_add(1, std::memory_order_relaxed);
    if (kMapBlocks && cacheable(request)) ::munmap(p, block_bytes(request));
    else std::free(p);
  }

  std::mutex mu_;
  std::array<FreeBlock*, kNumClasses> free_{};  // guarded by mu_
  size_t cached_bytes_ = 0;                     // guarded by mu_
  size_t limit_;                                // guarded by mu_
  std::atomic<size_t> allocated_bytes_{0}, peak_bytes_{0};
  std::atomic<uint64_t> hits_{0}, misses_{0}, system_allocs_{0}, system_frees_{0};
};

// Never destroyed: tensors held by static objects are freed after main returns.
HostAllocator& allocator() {
  static HostAllocator* const instance = new HostAllocator();
  return *instance;
}

}  // namespace

void* alloc_host(size_t bytes) { return allocator().allocate(bytes); }
void free_host(void* p, size_t bytes) noexcept {
  if (p != nullptr) allocator().deallocate(p, bytes);  // p != nullptr: allocator() exists
}
HostAllocatorStats host_allocator_stats() { return allocator().stats(); }
void set_host_pressure_hook(HostPressureHook hook) { allocator().pressure_hook.store(hook); }
void set_host_soft_limit(size_t bytes) { allocator().soft_limit.store(bytes); }
size_t host_soft_limit() { return allocator().soft_limit.load(); }
size_t host_footprint_limit(size_t soft_limit) { return soft_limit + soft_limit / 8; }
void reset_host_peak() { allocator().reset_peak(); }
void empty_host_cache() { allocator().trim(0); }
void set_host_cache_limit(size_t bytes) { allocator().set_limit(bytes); }

}  // namespace coremesh
