// The internal tier: process state, address translation, groups and the
// operations both faces (C API, C++ API) are built from. It reaches other
// PEs through the Transport (transport.hpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "allocator.hpp"
#include "layout.hpp"
#include "transport.hpp"

namespace coremesh::shmem::internal {

// A team: the world PEs start, start + stride, ... (size of them). Teams of
// one machine are always strided sets of world PEs (split_strided and
// split_2d of strided sets are strided).
struct TeamData {
  int start = 0;
  int stride = 1;
  int size = 0;
  int my_index = -1;  // this PE's index in the team; -1: not a member
  int slot = -1;      // team slot (its SyncArea) in every member's heap
  int num_contexts = 0;
  int64_t calls = 0;  // collective calls this PE made on the team
  std::string label;  // "team world", "team 3 (start 0, stride 2, size 4)"

  int world_pe(int index) const { return start + index * stride; }
  // The team index of a world PE, or -1.
  int index_of(int world_pe) const;
};

// What a collective needs: the member set, where the SyncArea is (a team
// slot or a user pSync array) and this PE's call counter for that area.
struct Group {
  int start = 0;
  int stride = 1;
  int size = 1;
  int my_index = 0;
  size_t sync_offset = 0;      // segment offset of the SyncArea, on every member
  int64_t* calls = nullptr;    // this PE's call counter
  const std::string* label = nullptr;
  bool has_team_slot = false;  // the alltoallv metadata area exists

  int world_pe(int index) const { return start + index * stride; }
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
  TeamData world;
  TeamData shared;
  std::vector<std::unique_ptr<TeamData>> teams;  // created by splits
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
// (segment_bytes + offset in the data segment). peer_address maps both back.
size_t sym_offset(const void* addr, size_t bytes, const char* api);
void check_pe(int pe, const char* api);
std::byte* peer_address(int pe, size_t offset);
inline SyncArea* sync_area(int pe, size_t offset) {
  return reinterpret_cast<SyncArea*>(peer_address(pe, offset));
}
Bell& doorbell(int pe);

// Groups.
Group team_group(TeamData& team, const char* api);
// An active set (deprecated API): PEs start, start + 2^log_stride, ...
Group active_set_group(int start, int log_stride, int size, long* psync, const char* api);
// Synchronises the members (no quiet): returns when all have entered.
void group_sync(const Group& group, const char* what);
// Starts a collective call: returns the parity (published[] index).
int begin_call(const Group& group);

// Teams.
TeamData* team_split_strided(TeamData& parent, int start, int stride, int size, int contexts);
void team_split_2d(TeamData& parent, int xrange, TeamData** xteam, TeamData** yteam);
void team_destroy(TeamData* team);
int team_translate(const TeamData& from, int pe, const TeamData& to);

// Memory (collective over the world).
void* sym_alloc(size_t bytes, size_t alignment, bool zero, const char* api);
void sym_free(void* ptr, const char* api);
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
void quiet();
void fence();
void notify(int pe);

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
  std::byte* dst;
  const std::byte* src;
  size_t bytes;
};
std::vector<CopySpan> alltoallv_exchange(const Group& g, void* dest, const size_t* recv_counts,
                                         const size_t* recv_offsets, const void* src,
                                         const size_t* send_counts, const size_t* send_offsets,
                                         size_t elem_bytes, const char* api);
void run_copies(const std::vector<CopySpan>& copies, size_t part, size_t parts);

}  // namespace coremesh::shmem::internal
