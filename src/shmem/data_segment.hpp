// Symmetric global and static variables: the executable's writable data
// (.data + .bss) is moved into a shared memory object (POSIX shm or memfd) at the same address, so that
// peers can map it. See data_segment.cpp for the mechanism and its limits.
#pragma once

#include <cstddef>
#include <cstdint>

namespace coremesh::shmem::internal {

struct DataRange {
  std::byte* base = nullptr;  // page aligned; nullptr: none (disabled)
  size_t bytes = 0;           // page multiple
  uint64_t image_offset = 0;  // base minus the load bias: equal for the same binary
};

// The main program's writable data that is not RELRO, page aligned; empty
// when COREMESH_SYMMETRIC_DATA=0.
DataRange find_data_range();

// Threads of this process (1 when /proc cannot tell).
int count_threads();

// Moves `range` into the shm object `fd` (already sized to range.bytes): copies
// the current contents into it, then maps it MAP_FIXED|MAP_SHARED over the same
// addresses. Must run while this is the only thread (checked). Also makes a
// forked child privatise the range again (pthread_atfork), so that a child's
// writes do not reach its parent's globals.
void move_into_shm(const DataRange& range, int fd);

}  // namespace coremesh::shmem::internal
