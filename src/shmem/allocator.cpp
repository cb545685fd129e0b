#include "allocator.hpp"

#include <fmt/format.h>

#include "coremesh/core/error.hpp"
#include "layout.hpp"

namespace coremesh::shmem::internal {

namespace {
size_t align_up(size_t value, size_t alignment) {
  return (value + alignment - 1) / alignment * alignment;
}
}  // namespace

SymmetricAllocator::SymmetricAllocator(size_t base, size_t capacity)
    : base_(base), capacity_(capacity) {
  if (capacity > 0) free_[base] = capacity;
}

std::optional<size_t> SymmetricAllocator::allocate(size_t bytes, size_t alignment) {
  CM_CHECK(alignment != 0 && (alignment & (alignment - 1)) == 0,
           "pass a power of two as the alignment", "alignment {} is not a power of two",
           alignment);
  alignment = std::max(alignment, kHeapAlignment);
  if (bytes > capacity_) return std::nullopt;  // also keeps align_up below from wrapping (SIZE_MAX)
  bytes = align_up(std::max<size_t>(bytes, 1), kHeapAlignment);
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    const size_t start = it->first, length = it->second;
    const size_t aligned = align_up(start, alignment);
    if (aligned + bytes > start + length) continue;
    free_.erase(it);
    if (aligned > start) free_[start] = aligned - start;
    if (aligned + bytes < start + length) free_[aligned + bytes] = start + length - aligned - bytes;
    used_[aligned] = bytes;
    used_bytes_ += bytes;
    peak_ = std::max(peak_, used_bytes_);
    return aligned;
  }
  return std::nullopt;
}

size_t SymmetricAllocator::release(size_t offset) {
  auto it = used_.find(offset);
  CM_CHECK(it != used_.end(), "free only pointers returned by the symmetric allocator",
           "no symmetric block starts at heap offset {}", offset);
  const size_t bytes = it->second;
  used_.erase(it);
  used_bytes_ -= bytes;
  insert_free(offset, bytes);
  return bytes;
}

void SymmetricAllocator::insert_free(size_t offset, size_t bytes) {
  auto next = free_.lower_bound(offset);
  if (next != free_.end() && offset + bytes == next->first) {
    bytes += next->second;
    next = free_.erase(next);
  }
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == offset) {
      prev->second += bytes;
      return;
    }
  }
  free_[offset] = bytes;
}

bool SymmetricAllocator::resize(size_t offset, size_t bytes) {
  auto it = used_.find(offset);
  CM_CHECK(it != used_.end(), "resize only pointers returned by the symmetric allocator",
           "no symmetric block starts at heap offset {}", offset);
  if (bytes > capacity_) return false;
  bytes = align_up(std::max<size_t>(bytes, 1), kHeapAlignment);
  const size_t old = it->second, end = offset + old;
  if (bytes > old) {
    auto next = free_.find(end);
    if (next == free_.end() || next->second < bytes - old) return false;
    const size_t rest = next->second - (bytes - old);
    free_.erase(next);
    if (rest) free_[offset + bytes] = rest;
    used_bytes_ += bytes - old;
    peak_ = std::max(peak_, used_bytes_);
  } else if (bytes < old) {
    insert_free(offset + bytes, old - bytes);
    used_bytes_ -= old - bytes;
  }
  it->second = bytes;
  return true;
}

size_t SymmetricAllocator::block_size(size_t offset) const {
  auto it = used_.find(offset);
  return it == used_.end() ? 0 : it->second;
}

HeapUsage SymmetricAllocator::usage() const {
  HeapUsage u;
  u.capacity = capacity_;
  u.used = used_bytes_;
  u.peak = peak_;
  u.blocks = used_.size();
  for (const auto& [offset, bytes] : free_) {
    const size_t aligned = align_up(offset, kHeapAlignment);
    if (aligned < offset + bytes) u.largest_free = std::max(u.largest_free, offset + bytes - aligned);
  }
  return u;
}

std::string SymmetricAllocator::describe_usage() const {
  const HeapUsage u = usage();
  return fmt::format("heap {} B, {} B used in {} blocks (peak {} B), largest free range {} B",
                     u.capacity, u.used, u.blocks, u.peak, u.largest_free);
}

}  // namespace coremesh::shmem::internal
