// Collective symmetric allocation. Every call is collective over the world:
// each PE publishes its request in its world SyncArea, a barrier makes them
// visible, and every PE compares all requests -- so a mismatch raises the
// same error, naming every PE's request, on every PE. Then each PE runs the
// same deterministic allocator step and gets the same offset.
#include <cstdio>
#include <cstring>

#include "coremesh/core/error.hpp"
#include "internal.hpp"

namespace coremesh::shmem::internal {

namespace {
// Publishes (a, b) for this call and checks every member published the same.
void agree(State& s, const char* api, const char* what, int64_t a, int64_t b) {
  Group world = team_group(s.world, api);
  const uint64_t call = ++s.allocations;
  const int64_t mine[2] = {a, b};
  const std::vector<int64_t> all = exchange(world, begin_call(world), mine, api);
  bool same = true;
  std::string text;
  for (int pe = 0; pe < s.n_pes; ++pe) {
    const int64_t pa = all[2 * pe], pb = all[2 * pe + 1];
    same = same && pa == a && pb == b;
    text += fmt::format("{}PE {}: {}", pe ? ", " : "", pe, fmt::format(fmt::runtime(what), pa, pb));
  }
  CM_CHECK(same,
           "symmetric allocation is collective: every PE must make the same calls with the same "
           "arguments in the same order",
           "{} (collective allocation #{}) differs between PEs: {}", api, call, text);
}
}  // namespace

void* sym_alloc(size_t bytes, size_t alignment, bool zero, const char* api, OnFull on_full) {
  State& s = state(api);
  if (bytes == 0) return nullptr;
  // OpenSHMEM 1.5, 9.3: the implicit barrier quiets the default context. A
  // put still in flight would land after the barrier (in a realloc's old
  // block, or in one freed and handed out again).
  quiet();
  agree(s, api, "{} B at alignment {}", static_cast<int64_t>(bytes),
        static_cast<int64_t>(alignment));
  // OpenSHMEM 1.5, 9.3.1: an alignment that is not a power of two, or one
  // larger than the heap's base alignment (1 GiB), cannot be met: NULL on
  // every PE (they all passed it), not an error.
  if (alignment == 0 || (alignment & (alignment - 1)) != 0 || alignment > kHeapBaseAlignment) {
    std::fprintf(stderr, "%s: alignment %zu is not a power of two up to %zu (returning NULL)\n", api, alignment,
                 size_t(kHeapBaseAlignment));
    return nullptr;
  }
  std::optional<size_t> offset;
  {
    std::lock_guard lock(s.mutex);
    offset = s.allocator.allocate(bytes, alignment);
    if (!offset) {
      // Every PE made the same calls on a heap of the same size: all fail here.
      const std::string what = fmt::format("{}: symmetric heap exhausted on PE {}: cannot allocate {} B; {}", api,
                                           s.my_pe, bytes, s.allocator.describe_usage());
      const char* fix = "free buffers you no longer need or start with a larger heap (SHMEM_SYMMETRIC_SIZE, "
                        "coremesh run --heap SIZE, COREMESH_HEAP_SIZE, or InitOptions::heap_bytes)";
      CM_CHECK(on_full == OnFull::null, fix, "{}", what);
      // OpenSHMEM 1.5, 9.3.1: the routine returns a null pointer; say why.
      std::fprintf(stderr, "%s (returning NULL); %s\n", what.c_str(), fix);
      return nullptr;
    }
  }
  void* ptr = s.base + *offset;
  if (zero) {
    std::memset(ptr, 0, bytes);
    // Nobody may write into the block before every PE has cleared it.
    Group world = team_group(s.world, api);
    group_sync(world, api);
  }
  return ptr;
}

void sym_free(void* ptr, const char* api) {
  if (ptr == nullptr) return;
  State& s = state(api);
  if (s.exiting.load(std::memory_order_relaxed)) return;  // the heap goes with the process
  const size_t offset = sym_offset(ptr, 0, api);
  CM_CHECK(s.allocator.owns(offset), "free only pointers returned by the symmetric allocator",
           "{}: {} is not the start of a live symmetric block", api, ptr);
  quiet();
  agree(s, api, "free of heap offset {} ({} B)", static_cast<int64_t>(offset),
        static_cast<int64_t>(s.allocator.block_size(offset)));
  std::lock_guard lock(s.mutex);
  s.allocator.release(offset);
}

void* sym_realloc(void* ptr, size_t bytes, const char* api) {
  if (ptr == nullptr) return sym_alloc(bytes, kHeapAlignment, false, api, OnFull::null);  // as shmem_malloc
  State& s = state(api);
  if (bytes == 0) {
    sym_free(ptr, api);
    return nullptr;
  }
  const size_t old_offset = sym_offset(ptr, 0, api);
  const size_t old_bytes = s.allocator.block_size(old_offset);
  CM_CHECK(old_bytes != 0, "realloc only pointers returned by the symmetric allocator",
           "{}: {} is not the start of a live symmetric block", api, ptr);
  // In place where the block can be (a shrink always: 9.3.1 fails a realloc
  // only when the space cannot be had): every PE decides alike, as their
  // heaps made the same calls.
  quiet();
  agree(s, api, "{} B for the block at heap offset {}", static_cast<int64_t>(bytes), static_cast<int64_t>(old_offset));
  bool in_place = false;
  {
    std::lock_guard lock(s.mutex);
    in_place = s.allocator.resize(old_offset, bytes);
  }
  if (in_place) {
    group_sync(team_group(s.world, api), api);  // as a move: nobody writes before everyone resized
    return ptr;
  }
  void* fresh = sym_alloc(bytes, kHeapAlignment, false, api, OnFull::null);
  if (fresh == nullptr) return nullptr;  // 9.3.1: the block stays as it was
  std::memcpy(fresh, ptr, std::min(old_bytes, bytes));
  {
    std::lock_guard lock(s.mutex);
    s.allocator.release(old_offset);
  }
  Group world = team_group(s.world, api);
  group_sync(world, api);  // the copy is done everywhere before anyone writes
  return fresh;
}

}  // namespace coremesh::shmem::internal
