// The symmetric allocator: first fit over offsets of the user heap.
//
// It is deterministic: its state is a function of the sequence of calls
// only, so PEs that make the same calls get the same offsets -- the property
// that makes a block symmetric. Blocks start on kHeapAlignment (128 B) or a
// larger requested power of two, and sizes are rounded up to 128 B.
//
// Thread safety: none; the caller serialises (internal::State's mutex).
#pragma once

#include <cstddef>
#include <map>
#include <optional>
#include <string>

namespace coremesh::shmem::internal {

struct HeapUsage {
  size_t capacity = 0;      // bytes of the user heap
  size_t used = 0;          // bytes in live blocks (after rounding)
  size_t peak = 0;          // highest `used` so far
  size_t blocks = 0;        // live blocks
  size_t largest_free = 0;  // the largest request that can still succeed (at 128 B alignment)
};

class SymmetricAllocator {
 public:
  SymmetricAllocator() = default;
  SymmetricAllocator(size_t base, size_t capacity);

  // Offset of a new block, or nullopt when no free range fits.
  std::optional<size_t> allocate(size_t bytes, size_t alignment);
  // Releases the block at `offset`; returns its size. Throws InvalidArgument
  // when no block starts there.
  size_t release(size_t offset);
  // Resizes the live block at `offset` where it lies (a shrink always; a
  // growth into the free range right after it); false, and nothing changed,
  // when that range is too small.
  bool resize(size_t offset, size_t bytes);
  // Size of the live block starting at `offset`, or 0.
  size_t block_size(size_t offset) const;
  bool owns(size_t offset) const { return used_.count(offset) != 0; }
  HeapUsage usage() const;
  std::string describe_usage() const;

 private:
  void insert_free(size_t offset, size_t bytes);

  size_t base_ = 0;
  size_t capacity_ = 0;
  size_t used_bytes_ = 0;
  size_t peak_ = 0;
  std::map<size_t, size_t> free_;  // offset -> bytes, coalesced
  std::map<size_t, size_t> used_;  // offset -> bytes
};

}  // namespace coremesh::shmem::internal
