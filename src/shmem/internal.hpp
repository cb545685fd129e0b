// The internal tier: process state, address translation, groups and the
// operations both faces (C API, C++ API) are built from. It reaches other
// PEs through the Transport (transport.hpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <atomic>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "allocator.hpp"
#include "coremesh/core/error.hpp"
#include "layout.hpp"
#include "transport.hpp"

namespace coremesh::shmem::internal {

// A team: a list of distinct world PEs, in team order. The C API makes
// strided ones (split_strided, split_2d); the C++ API also any list
// (Team::from_pes, Team::split), the shape of an MPI communicator.
struct TeamData {
  std::vector<int> pes;  // world PE of each team index
  int my_index = -1;     // this PE's index in the team; -1: not a member
  int slot = -1;         // team slot (its SyncArea) in every member's heap
  int num_contexts = 0;
  int64_t calls = 0;  // collective calls this PE made on the team
  std::string label;  // "team world", "team in slot 3 (world PEs 0, 2, 4)"

  int size() const { return static_cast<int>(pes.size()); }
  int world_pe(int index) const { return pes[static_cast<size_t>(index)]; }
  // The team index of a world PE, or -1.
  int index_of(int world_pe) const;
};

// What a collective needs: the member list, where the SyncArea is (a team
// slot or a user pSync array) and this PE's call counter for that area.
struct Group {
  std::vector<int> pes;  // world PEs in member order
  int size = 1;
  int my_index = 0;
  size_t sync_offset = 0;      // symmetric offset of the SyncArea, on every member
  int64_t* calls = nullptr;    // this PE's call counter
  std::string label;           // for messages
  int team_slot = -1;          // a team's slot (its alltoallv metadata area); -1: an active set

  int world_pe(int index) const { return pes[static_cast<size_t>(index)]; }
};

struct State {
  std::unique_ptr<Transport> transport;
  int my_pe = 0;
  int n_pes = 1;
  std::byte* base = nullptr;  // this PE's segment
  size_t segment_bytes = 0;
  size_t user_base = 0;
  size_t slot_bytes = 0;
  std::byte* data_base = nullptr;  // this PE's global data segment (data_segment.hpp)
  size_t data_bytes = 0;           // 0: globals are not symmetric

  std::mutex mutex;  // allocator, team table
  SymmetricAllocator allocator;
  uint64_t allocations = 0;  // collective allocation calls, for messages
  uint64_t free_slots = ~uint64_t{0};
  // Allreduce calls through team slot t's landing area shared with world
  // PE p, at [t * n_pes + p] (reduce.hpp); they never restart, so that a
  // team created in a slot goes on where the last one stopped.
  std::vector<uint64_t> landing_calls;
  TeamData world;
  TeamData shared;
  std::vector<std::unique_ptr<TeamData>> teams;  // created by splits
  std::atomic<bool> exiting{false};  // keep_heap_until_exit(): frees are no-ops
};

bool is_initialized();
// The state; throws InvalidArgument naming `api` before init.
State& state(const char* api = "shmem");
void init(size_t heap_bytes);
void finalize();
[[noreturn]] void global_exit(int status);

// Translation. sym_offset checks that [addr, addr + bytes) lies in the
// symmetric heap or in the global data segment and returns its symmetric
// offset: heap offsets are [0, segment_bytes), data segment offsets follow
// (segment_bytes + offset in the data segment). local_address maps an
// offset back to this PE's memory.
size_t sym_offset(const void* addr, size_t bytes, const char* api);
// The bytes of `count` elements `stride` elements apart (the first to the end
// of the last), refused when they overflow size_t (a negative count cast, a
// made-up stride): the transfer's checks would pass a wrapped small size.
// The C API's error names the call.
size_t span_bytes(size_t count, size_t stride, size_t elem_bytes);
inline size_t array_bytes(size_t count, size_t elem_bytes) { return span_bytes(count, 1, elem_bytes); }
void check_pe(int pe, const char* api);
std::byte* local_address(size_t offset);
inline SyncArea* my_sync_area(size_t offset) {
  return reinterpret_cast<SyncArea*>(local_address(offset));
}
// This PE's doorbell: every remote write to this PE rings it.
Bell& my_doorbell();
Transport& transport();

// Reading peers' memory, always through the transport: `view` returns the
// transport's load/store address when it offers one, else gets the bytes
// into `scratch` and returns that.
const std::byte* view(int pe, size_t offset, size_t bytes, std::vector<std::byte>& scratch);
// Every member's `values` (same count on each): each member publishes its
// own in its SyncArea (call parity `parity`), a sync, then reads the others'.
// Returns values of member i at [i * values.size(), ...).
std::vector<int64_t> exchange(const Group& g, int parity, std::span<const int64_t> values,
                              const char* what);

// Groups.
Group team_group(TeamData& team, const char* api);
// An active set (deprecated API): PEs start, start + 2^log_stride, ...
Group active_set_group(int start, int log_stride, int size, long* psync, const char* api);
// An active set's pSync back at SHMEM_SYNC_VALUE on this PE (OpenSHMEM 1.5,
// 9.9), after the collective's last barrier; nothing for a team's slot.
void restore_sync_area(const Group& g);
// Synchronises the members (no quiet): returns when all have entered.
void group_sync(const Group& group, const char* what);
// Starts a collective call: returns the parity (published[] index).
int begin_call(const Group& group);

// Teams. Splits return nullptr on PEs outside the new team. Every way of
// making a team throws NoFreeTeamSlot when no team slot (kMaxTeams per PE)
// is free on every member of the parent: the members agree on the free
// slots, so all of them throw at the same call, and nothing was changed.
// The C API returns non-zero and SHMEM_TEAM_INVALID for it (9.4.6).
class NoFreeTeamSlot : public InvalidArgument {
  using InvalidArgument::InvalidArgument;
};
TeamData* team_split_strided(TeamData& parent, int start, int stride, int size, int contexts);
void team_split_2d(TeamData& parent, int xrange, int x_contexts, int y_contexts, TeamData** xteam,
                   TeamData** yteam);
// A team of `world_pes` (in that order); collective over `parent`, whose
// members all pass the same list.
TeamData* team_from_pes(TeamData& parent, std::span<const int> world_pes);
// MPI_Comm_split: members with equal color >= 0 form a team, ordered by
// (key, parent index); collective over `parent`.
TeamData* team_split_color(TeamData& parent, int color, int key);
void team_destroy(TeamData* team);
int team_translate(const TeamData& from, int pe, const TeamData& to);
bool valid_triplet(int parent_size, int start, int stride, int size);

// Memory (collective over the world).
// A full heap: the C++ API fails with the fix; the C API returns NULL (on
// every PE: allocations are collective), as OpenSHMEM 1.5 9.3.1 says.
enum class OnFull { fail, null };
void* sym_alloc(size_t bytes, size_t alignment, bool zero, const char* api, OnFull on_full = OnFull::fail);
void sym_free(void* ptr, const char* api);
// NULL when the heap is full (the block unchanged), as shmem_realloc.
void* sym_realloc(void* ptr, size_t bytes, const char* api);

// RMA.
void put(void* dest, const void* src, size_t bytes, int pe, const char* api);
void get(void* dest, const void* src, size_t bytes, int pe, const char* api);
void put_nbi(void* dest, const void* src, size_t bytes, int pe, const char* api);
void get_nbi(void* dest, const void* src, size_t bytes, int pe, const char* api);
void iput(void* dest, const void* src, ptrdiff_t dst, ptrdiff_t sst, size_t nelems,
          size_t elem_bytes, int pe, const char* api);
void iget(void* dest, const void* src, ptrdiff_t dst, ptrdiff_t sst, size_t nelems,
          size_t elem_bytes, int pe, const char* api);
void put_signal(void* dest, const void* src, size_t bytes, uint64_t* signal, uint64_t value,
                int sig_op, int pe, bool nbi, const char* api);
// Atomic op on a 4- or 8-byte symmetric word at `pe` (bits in and out).
uint64_t atomic(void* dest, int pe, AmoOp op, int width, uint64_t operand, uint64_t compare,
                const char* api);
void quiet();
void fence();

// Locks (a symmetric long; the lock word at PE 0 is the lock).
void set_lock(long* lock);
void clear_lock(long* lock);
bool test_lock(long* lock);

// Collectives (byte level; elements are opaque here).
void broadcast(const Group& g, void* dest, const void* src, size_t bytes, int root,
               bool root_copies, const char* api);
void fcollect(const Group& g, void* dest, const void* src, size_t bytes, const char* api);
void collect(const Group& g, void* dest, const void* src, size_t bytes, const char* api);
void alltoall(const Group& g, void* dest, const void* src, size_t bytes_per_pe, const char* api);
void alltoalls(const Group& g, void* dest, const void* src, ptrdiff_t dst, ptrdiff_t sst,
               size_t nelems, size_t elem_bytes, const char* api);
void alltoallv(const Group& g, void* dest, const size_t* recv_counts, const size_t* recv_offsets,
               const void* src, const size_t* send_counts, const size_t* send_offsets,
               size_t elem_bytes, const char* api);

std::string describe_group(const Group& g);

// alltoallv in phases (the on-stream variant runs them as separate kernels):
// exchange publishes the counts, synchronises, checks the count matrix on
// every PE and returns this PE's copies; run_copies performs part `part` of
// `parts` of them; a final group_sync ends the call.
struct CopySpan {
  std::byte* dst;  // local
  int pe;          // source PE and symmetric offset there
  size_t offset;
  size_t bytes;
};
// `parity`: the call's, from begin_call() when the call was made (an
// on-stream alltoallv runs later, on a worker: taken there, it raced the
// host's later begin_calls and the members disagreed); -1: begin_call() here.
std::vector<CopySpan> alltoallv_exchange(const Group& g, void* dest, const size_t* recv_counts,
                                         const size_t* recv_offsets, const void* src,
                                         const size_t* send_counts, const size_t* send_offsets,
                                         size_t elem_bytes, const char* api, int parity = -1);
void run_copies(const std::vector<CopySpan>& copies, size_t part, size_t parts);

}  // namespace coremesh::shmem::internal
