// coremesh::shmem -- the C++ face of the SHMEM layer (the C face is
// <shmem.h>; both share one implementation).
//
// A Session initialises the library (joining the job started by
// `coremesh run -n N` or by OpenMPI's mpirun, or running as a single PE)
// and finalises it when it goes out of scope. Errors are exceptions (coremesh::Error and subclasses)
// with file:line and a hint.
//
// Thread safety: RMA, atomics and waits may be called from any thread;
// collectives on one team must not run concurrently with each other.
#pragma once

#include <cstddef>

namespace coremesh::shmem {

struct InitOptions {
  // Bytes of the symmetric heap of each PE; 0: COREMESH_HEAP_SIZE
  // (e.g. "512M"), else SHMEM_SYMMETRIC_SIZE, else 512 MiB. Must be the
  // same on every PE.
  size_t heap_bytes = 0;
};

class Session {
 public:
  explicit Session(const InitOptions& options = {});
  ~Session();  // quiet + barrier, then unmaps the heaps
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

 private:
  bool owner_ = false;  // false when the library was already initialised
};

bool initialized();
int my_pe();
int n_pes();
// The transport in use: "shm" or "shm-rma" (coremesh run), "ucx" or "mpi"
// (mpirun; the network engine between hosts) (COREMESH_TRANSPORT,
// docs/shmem.md).
const char* transport_name();
// A process about to exit: from now on sym_free leaves blocks where they
// are (the heap goes with the process), so objects destroyed while it tears
// down, in whatever order each PE destroys them, wait for no peer.
void keep_heap_until_exit();
// Stops every PE of the job with `status` (the launcher reports it).
[[noreturn]] void global_exit(int status);

// Load/store address of symmetric `sym` on `pe` (nullptr if the transport
// cannot map it).
void* peer_ptr(const void* sym, int pe);
template <typename T>
T* peer_ptr(T* sym, int pe) {
  return static_cast<T*>(peer_ptr(static_cast<const void*>(sym), pe));
}

// Ordering: fence orders this PE's puts to each PE; quiet completes them
// (including every *_nbi operation).
void fence();
void quiet();

}  // namespace coremesh::shmem
