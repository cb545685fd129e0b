// Host allocator: 64-byte aligned memory for tensor storage, with a cache of
// freed large blocks (like PyTorch's caching allocators).
//
// Why: every training step allocates fresh activations. Large blocks come
// from mmap and go back with munmap, so each step faulted its pages in again
// (~45k minor faults per step of the demo model). Freed blocks of 64 KiB and
// more are kept on per-size-class free lists and handed to the next request
// of the same class; their pages stay mapped.
//
//   request < 64 KiB      -> std::aligned_alloc, rounded up to 64 bytes (malloc
//                            serves these from its heap; no cache needed)
//   request >= 64 KiB     -> rounded up to a size class (4 per power of two,
//                            so at most 25% waste): 64K 80K 96K 112K 128K 160K ...
//                            reused from that class's free list, or mapped
//                            with mmap on a miss (given back with munmap, so
//                            its pages leave the process: malloc would keep
//                            them in its heap)
//   free of a large block -> kept while cached bytes stay within the limit,
//                            otherwise unmapped
//
// The cache limit defaults to 1 GiB; COREMESH_ALLOC_CACHE_MB (read once, at the
// first allocation) sets it in MiB, 0 turns caching off. Under AddressSanitizer
// the default is 0: a reused block would hide a use-after-free.
//
// Thread safety: every function may be called from any thread (tensors are
// allocated on the host thread and freed on runtime workers). One mutex guards
// the free lists; the system calls run outside it.
#pragma once

#include <cstddef>
#include <cstdint>

namespace coremesh {

struct HostAllocatorStats {
  size_t allocated_bytes = 0;    // live blocks handed out, at their rounded size
  size_t peak_allocated_bytes = 0;  // the most allocated_bytes has been (since the last reset)
  size_t cached_bytes = 0;       // freed blocks kept for reuse
  size_t cache_limit_bytes = 0;  // cached_bytes never exceeds this
  uint64_t hits = 0;             // large requests served from the cache
  uint64_t misses = 0;           // large requests that went to the system
  uint64_t system_allocs = 0;    // successful std::aligned_alloc calls (all sizes)
  uint64_t system_frees = 0;     // blocks given back with std::free (all sizes)
};

// Returns at least `bytes` (0 is allowed) of 64-byte aligned memory, owned by
// the caller until free_host. When the system is out of memory, releases the
// cache and retries once, then throws InvalidArgument ("out of memory").
void* alloc_host(size_t bytes);
// Returns a block from alloc_host; `bytes` must be the size it was allocated
// with (it selects the size class). free_host(nullptr, n) does nothing.
void free_host(void* p, size_t bytes) noexcept;

// A snapshot; fields are read one by one, so concurrent calls may skew them.
HostAllocatorStats host_allocator_stats();
// Run-ahead backpressure. The runtime queues kernels ahead of its workers and
// each queued kernel keeps its tensors alive, so a host thread that runs a
// whole training step ahead holds every temporary of the step at once. With
// a soft limit set, an allocation that would take allocated_bytes past it
// first calls the pressure hook (the runtime installs one that waits while
// queued work makes progress), then allocates anyway: the limit slows the
// host down, it never fails an allocation.
using HostPressureHook = bool (*)();  // returns true if memory may have been freed
void set_host_pressure_hook(HostPressureHook hook);
// Under a soft limit a miss also gives cached blocks back until live plus
// cached bytes fit in it. 0 turns the limit off; the default is
// COREMESH_HOST_SOFT_LIMIT_MB (MiB, read at the first allocation) or 0.
// The trainer sets one from its memory estimate (Trainer::limit_run_ahead).
void set_host_soft_limit(size_t bytes);
size_t host_soft_limit();
// Live plus cached bytes the allocator keeps under a soft limit: the limit
// and an eighth, so that a step's mix of sizes stays cached (the memory
// estimate counts it: model::estimate_memory's callers add it).
size_t host_footprint_limit(size_t soft_limit);

// Starts peak_allocated_bytes again from the bytes allocated now.
void reset_host_peak();
// Gives every cached block back to the system (live blocks are untouched).
void empty_host_cache();
// Sets the cache limit (overrides COREMESH_ALLOC_CACHE_MB; 0 = caching off)
// and frees cached blocks, largest first, until the cache fits in it.
void set_host_cache_limit(size_t bytes);

}  // namespace coremesh
