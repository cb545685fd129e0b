// The transport tier (SOS style): shmem_* (C API) and coremesh::shmem (C++)
// call the internal tier (internal.hpp), which reaches another PE's memory
// only through a Transport. Nothing above this table touches a peer's
// memory: RMA, atomics, signals, ordering and synchronisation are calls
// here; `peer_pointer` is an optional fast path that a transport may refuse
// (nullptr), and then every access goes through the calls.
//
// Implementations (chosen in init.cpp from COREMESH_TRANSPORT):
//   shm      shm_transport.cpp: POSIX shared memory, every PE maps every
//            heap and data segment; peer_pointer is the mapping.
//   shm-rma  the shm transport with peer_pointer refused: proves that the
//            internal tier needs nothing but the calls (what a network
//            transport offers).
// Under mpirun, host_transport.cpp composes two of them per target PE:
//   shm      over the segments of the PEs of this host (mapped at bootstrap),
//   ucx|mpi  a network engine for the PEs of other hosts: ucx_transport.cpp
//            (UCX's own API, a progress thread) or mpi_transport.cpp (MPI-3
//            RMA; waits poll, peers cannot ring this PE's futex bells).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "data_segment.hpp"
#include "layout.hpp"

namespace coremesh::shmem::internal {

enum class SignalOp : int { set = 0, add = 1 };
// Atomic memory operations on a 4- or 8-byte word. Integers of either
// signedness add alike in two's complement, and fetch/set/swap move bits,
// so one bit-level table serves every OpenSHMEM AMO type.
enum class AmoOp : int { fetch, set, swap, compare_swap, add, band, bor, bxor };

// Who takes part in a synchronisation and where its SyncArea is.
struct SyncSpec {
  std::span<const int> world_pes;  // members in team order
  int my_index = 0;
  size_t sync_offset = 0;  // symmetric offset of the SyncArea, the same on every member
  std::function<std::string()> describe;  // "barrier #3 on team world" for the watchdog
  // A user's pSync array (an active set): its words are back at
  // SHMEM_SYNC_VALUE when the barrier returns (OpenSHMEM 1.5, 9.9).
  bool restores = false;
};

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
  // The executable's writable data (global and static variables,
  // data_segment.hpp) on this PE; its size is the same on every PE, 0 when
  // globals are not symmetric.
  virtual std::byte* local_data_base() const = 0;
  virtual size_t data_bytes() const = 0;

  // Offsets below are symmetric offsets, already bounds-checked:
  // [0, segment_bytes) is the heap segment, [segment_bytes, segment_bytes +
  // data_bytes) the data segment.

  // Optional fast path: a load/store address of `offset` on `pe`, or
  // nullptr when the transport cannot (or will not) map it. Callers that
  // get an address must ring notify(pe) after storing through it.
  virtual std::byte* peer_pointer(int pe, size_t offset) const = 0;

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
  // A collective's delivery: put, then set the signal, which is the whole
  // completion its receiver waits for. src is reusable on return; quiet
  // and fence need not cover it, so a network engine sends no
  // acknowledgement (a small allreduce across hosts, reduce.hpp).
  virtual void push(int pe, size_t offset, const void* src, size_t bytes, size_t signal_offset,
                    uint64_t value) {
    put_signal(pe, offset, src, bytes, signal_offset, value, SignalOp::set, /*nbi=*/false);
  }
  // Atomic `op` on the `width`-byte (4 or 8) word at `offset` on `pe`;
  // returns the old value (zero-extended bits). `compare` is used by
  // compare_swap only. Complete on return, ordered after earlier blocking
  // operations of this PE.
  virtual uint64_t atomic(int pe, size_t offset, AmoOp op, int width, uint64_t operand,
                          uint64_t compare) = 0;
  // Completes all outstanding non-blocking operations of this PE.
  virtual void quiet() = 0;
  // Orders every earlier put, put_nbi, AMO and store to each PE before
  // later ones to the same PE.
  virtual void fence() = 0;
  // Wakes whoever on `pe` sleeps waiting for its memory to change: `data`
  // waiters (wait_until, signal waits, locks; put, put_signal and atomic
  // wake them by themselves) or `sync` waiters (barriers, rung by sync()
  // only, so that puts to a PE sleeping in a barrier cost no wake-up).
  enum class Wake { data, sync };
  virtual void notify(int pe, Wake who = Wake::data) = 0;

  // Returns when every member of `spec` has entered (no quiet). The default
  // is a dissemination barrier built from atomic adds on the members'
  // SyncAreas and waits on this PE's own one (transport.cpp); a transport
  // with a native barrier may override it.
  virtual void sync(const SyncSpec& spec);

  // Whether atomic() is atomic with respect to CPU atomics on the target's
  // memory (a PE of the target's host updating the same word by load/store).
  virtual bool cpu_atomics() const { return true; }

  // The job control block; nullptr when the process runs alone.
  virtual JobControl* job() const = 0;
  // Tears down the mappings; called once by finalize.
  virtual void close() = 0;

 private:
  void counting_sync(const SyncSpec& spec, SyncArea& mine);
};

// Maps `bytes` of `fd` shared (fd < 0: anonymous shared memory) at an
// address that is a multiple of kHeapBaseAlignment; nullptr (errno set)
// when it cannot. Unmapped with a plain munmap(p, bytes).
std::byte* map_heap_segment(int fd, size_t bytes);

// Creates the shm transport. `user_heap_bytes` = 0: the environment
// (init.cpp) decides. Inside a job started by `coremesh run` it joins the
// job; otherwise it runs as a single PE.
std::unique_ptr<Transport> make_shm_transport(size_t user_heap_bytes);
// `inner` without its fast path: peer_pointer() is always nullptr.
std::unique_ptr<Transport> without_peer_pointers(std::unique_ptr<Transport> inner);

// The segments a shm transport reaches by load/store, already mapped:
// every PE's heap segment and data segment, nullptr for PEs (or data
// segments) it cannot reach. The transport unmaps them all at close, except
// this PE's data segment (the program's globals).
struct ShmSegments {
  int my_pe = 0;
  int n_pes = 1;
  size_t segment_bytes = 0;
  std::vector<std::byte*> heaps;  // [pe]
  std::vector<std::byte*> datas;  // [pe]; datas[my_pe] == data.base
  DataRange data;
};
std::unique_ptr<Transport> make_shm_transport(ShmSegments segments);

// What a network engine registers and offers its peers: this PE's heap
// segment and global data (already created by the bootstrap).
struct LocalMemory {
  int my_pe = 0;
  int n_pes = 1;
  std::byte* base = nullptr;
  size_t segment_bytes = 0;
  DataRange data;
};
// Network engines (MPI is up; every PE creates one, collectively).
std::unique_ptr<Transport> make_mpi_transport(const LocalMemory& memory);
std::unique_ptr<Transport> make_ucx_transport(const LocalMemory& memory);
// The transport under mpirun (host_transport.cpp): bootstrap over MPI, shm
// between the PEs of one host, `network` ("ucx" or "mpi") between hosts.
std::unique_ptr<Transport> make_host_transport(size_t user_heap_bytes, const std::string& network);

}  // namespace coremesh::shmem::internal
