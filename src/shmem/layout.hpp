// Memory layouts shared between processes: the job control block (created by
// the launcher, one per job) and the reserved head of every PE's heap
// segment. Everything here lives in MAP_SHARED memory, so it holds only
// trivially copyable data and lock-free atomics (which work across processes
// on the same physical page, whatever the virtual address).
//
// One PE's heap segment:
//
//   0                  kHeaderBytes        user_base                 segment end
//   | HeapHeader        | team slots        | user heap (allocator)  |
//   | doorbell, lock... | kMaxTeams x slot  | shmem_malloc & co.     |
//
// A symmetric address is (segment base of the PE) + offset; offsets are the
// same on every PE because every PE computes the same layout.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>

namespace coremesh::shmem::internal {

// A futex word plus a count of sleepers, so that writers make the wake-up
// system call only when somebody sleeps. `seq` changes on every event.
struct Bell {
  std::atomic<uint32_t> seq{0};
  std::atomic<uint32_t> sleepers{0};
};
static_assert(std::atomic<uint32_t>::is_always_lock_free);
static_assert(std::atomic<uint64_t>::is_always_lock_free);

// Synchronisation state of one group (team slot or user pSync array).
// Barriers are dissemination barriers (transport.cpp): in round k a member
// adds 1 to `arrivals[k]` of the member 2^k places on, and waits until its
// own arrivals[k] exceeds consumed[k]. The counters only grow, so a slot
// is reusable at once by any group. A user's pSync array (an active set)
// is back at zero when each call returns (Transport::counting_sync,
// restore_sync_area). `published` holds small
// per-call values that the other members read (double buffered by call
// parity, so one barrier per call suffices). Every field is 0 initially,
// which is SHMEM_SYNC_VALUE.
struct SyncArea {
  std::atomic<uint32_t> arrivals[8];  // written by peers (atomic add)
  uint32_t consumed[8];               // written by this PE only
  int64_t entered;                    // barriers this PE entered (watchdog info)
  int64_t calls;                      // collective calls this PE made (pSync groups)
  uint64_t pad[6];
  int64_t published[2][8];            // per-call values, [call parity][item]
};
static_assert(sizeof(SyncArea) == 256);
static_assert(offsetof(SyncArea, entered) == 64);
static_assert(offsetof(SyncArea, published) == 128);
inline constexpr size_t kSyncAreaLongs = sizeof(SyncArea) / sizeof(long);

struct alignas(64) HeapHeader {
  uint64_t magic;
  uint64_t segment_bytes;
  alignas(64) Bell doorbell;   // rung after every remote write to this PE
  alignas(64) Bell sync_bell;  // rung by barrier arrivals (transport.cpp)
};

inline constexpr uint64_t kHeapMagic = 0x636d2d68656170ULL;  // "cm-heap"
inline constexpr size_t kHeaderBytes = 4096;
inline constexpr int kMaxTeams = 64;  // team slots per PE (bit mask of 64)
inline constexpr int kMaxPes = 256;
inline constexpr size_t kHeapAlignment = 128;
// This PE's heap segment starts at a multiple of this (transport.cpp,
// map_heap_segment), so a block at an offset aligned to A <= it is at an
// address aligned to A on every PE: shmem_align's largest alignment.
inline constexpr size_t kHeapBaseAlignment = size_t{1} << 30;

// Bytes of one team slot: a SyncArea plus, per member, room for alltoallv
// metadata (send counts, send offsets, recv counts), double buffered.
inline size_t team_slot_bytes(int n_pes) {
  size_t bytes = sizeof(SyncArea) + 2 * 3 * sizeof(int64_t) * static_cast<size_t>(n_pes);
  return (bytes + kHeapAlignment - 1) / kHeapAlignment * kHeapAlignment;
}

// Landing areas of the small allreduce across hosts (reduce.hpp), one for
// each of the first kLandingTeams team slots: per call parity and sending
// PE, a slot for the sender's vector, which arrives in chunks of at most
// kLandingChunkBytes (the ucx engine's largest message), each with its
// signal word. A slot holds 1 MiB / (n_pes - 1) (4 KiB - 1 MiB): a PE
// receives at most 1 MiB per call. The areas are 8-16 MiB of address
// space, touched only where used.
inline constexpr int kLandingTeams = 4;
inline constexpr size_t kLandingChunkBytes = 64 * 1024;
inline constexpr size_t kLandingChunks = 16;  // per slot
inline size_t landing_slot_bytes(int n_pes) {
  const size_t share = (kLandingChunks * kLandingChunkBytes / std::max<size_t>(1, n_pes - 1)) / 4096 * 4096;
  return std::clamp<size_t>(share, 4096, kLandingChunks * kLandingChunkBytes);
}
struct LandingArea {
  size_t base = 0;  // segment offset of the area
  int n_pes = 1;
  size_t signal(int parity, int sender, size_t chunk) const {
    return base + ((static_cast<size_t>(parity) * n_pes + sender) * kLandingChunks + chunk) * sizeof(uint64_t);
  }
  size_t slot(int parity, int sender) const {
    return base + signals_bytes() + (static_cast<size_t>(parity) * n_pes + sender) * landing_slot_bytes(n_pes);
  }
  size_t signals_bytes() const { return (2 * n_pes * kLandingChunks * sizeof(uint64_t) + 4095) / 4096 * 4096; }
  size_t bytes() const { return signals_bytes() + 2 * static_cast<size_t>(n_pes) * landing_slot_bytes(n_pes); }
};
inline size_t landing_areas_base(int n_pes) { return kHeaderBytes + kMaxTeams * team_slot_bytes(n_pes); }
inline LandingArea landing_area(int n_pes, int team_slot) {
  LandingArea area{0, n_pes};
  area.base = landing_areas_base(n_pes) + static_cast<size_t>(team_slot) * area.bytes();
  return area;
}

inline size_t user_heap_base(int n_pes) {
  size_t end = landing_area(n_pes, kLandingTeams).base;
  return (end + 4095) / 4096 * 4096;
}

// Per-PE bootstrap state in the job control block.
struct alignas(64) PeSlot {
  std::atomic<uint32_t> state;  // PeState
  int32_t pid;
  uint64_t heap_bytes;  // user heap size this PE asked for
  uint64_t data_bytes;         // size of its global data segment
  uint64_t data_image_offset;  // where that segment starts in the executable
};
// pe_exited: the launcher reaped it (status 0) without it finalizing.
enum PeState : uint32_t { pe_absent = 0, pe_created = 1, pe_mapped = 2, pe_finalized = 3, pe_exited = 4 };

// The job control block: launcher <-> PEs. The launcher creates it, passes
// its file descriptor to the PEs and unlinks its name at once.
struct alignas(64) JobControl {
  uint64_t magic;
  uint32_t n_pes;
  alignas(64) Bell created;  // seq counts PEs that created their segment
  alignas(64) Bell mapped;   // seq counts PEs that mapped every segment
  alignas(64) Bell abort;    // seq != 0: the job is being stopped
  int32_t abort_pe;
  int32_t abort_status;
  uint32_t global_exit;      // 1: abort_pe called shmem_global_exit
  char stop_reason[112];     // the launcher's, written before it rings abort ("PE 1 was killed ...")
  PeSlot pes[1];             // n_pes entries (allocated past the struct)
};
inline constexpr uint64_t kJobMagic = 0x636d2d6a6f62ULL;  // "cm-job"
inline size_t job_control_bytes(int n_pes) {
  return sizeof(JobControl) + sizeof(PeSlot) * static_cast<size_t>(n_pes);
}

}  // namespace coremesh::shmem::internal
