// The transport tier (SOS style): shmem_* (C API) and coremesh::shmem (C++)
// call the internal tier (internal.hpp), which calls a Transport for
// everything that depends on how PEs reach each other's memory.
//
// Implementations: shm (shm_transport.cpp; POSIX shared memory, every PE maps
// every heap segment). An MPI transport would implement the same table with
// RMA windows and return nullptr from peer_base(), which makes the internal
// tier use put/get instead of load/store (see collectives.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "layout.hpp"

namespace coremesh::shmem::internal {

enum class SignalOp : int { set = 0, add = 1 };

class Transport {
 public:
  virtual ~Transport() = default;
  virtual const char* name() const = 0;
  virtual int my_pe() const = 0;
  virtual int n_pes() const = 0;

  // This PE's heap segment (header, team slots, user heap) and its size,
  // which is the same on every PE.
  virtual std::byte* local_base() const = 0;
  virtual size_t segment_bytes() const = 0;
  // Load/store address of `pe`'s segment; nullptr when not mapped (optional).
  virtual std::byte* peer_base(int pe) const = 0;
  // The executable's writable data (global and static variables,
  // data_segment.hpp) on this PE / on `pe`; its size is the same on every PE,
  // 0 when globals are not symmetric.
  virtual std::byte* local_data_base() const = 0;
  virtual size_t data_bytes() const = 0;
  virtual std::byte* peer_data_base(int pe) const = 0;

  // Offsets below are symmetric offsets, already bounds-checked:
  // [0, segment_bytes) is the heap segment, [segment_bytes, segment_bytes +
  // data_bytes) the data segment.
  // Blocking RMA: returns when `src` may be reused (put) / `dst` holds the data (get).
  virtual void put(int pe, size_t offset, const void* src, size_t bytes) = 0;
  virtual void get(void* dst, int pe, size_t offset, size_t bytes) = 0;
  // Non-blocking RMA: completes by quiet(); buffers must stay valid until then.
  virtual void put_nbi(int pe, size_t offset, const void* src, size_t bytes) = 0;
  virtual void get_nbi(void* dst, int pe, size_t offset, size_t bytes) = 0;
  // Put, then update the 64-bit signal at `signal_offset`: a PE that sees the
  // signal sees the data.
  virtual void put_signal(int pe, size_t offset, const void* src, size_t bytes,
                          size_t signal_offset, uint64_t value, SignalOp op, bool nbi) = 0;
  // Completes all outstanding non-blocking operations of this PE.
  virtual void quiet() = 0;
  // Orders earlier puts to each PE before later ones.
  virtual void fence() = 0;
  // Wakes whoever sleeps waiting for memory of `pe` to change.
  virtual void notify(int pe) = 0;

  // The job control block; nullptr when the process runs alone.
  virtual JobControl* job() const = 0;
  // Tears down the mappings; called once by finalize.
  virtual void close() = 0;
};

// Creates the shm transport. `user_heap_bytes` = 0: COREMESH_HEAP_SIZE or
// the default (128 MiB). Inside a job started by `coremesh run` it joins the
// job; otherwise it runs as a single PE.
std::unique_ptr<Transport> make_shm_transport(size_t user_heap_bytes);

}  // namespace coremesh::shmem::internal
