// Teams, groups and the barrier.
//
// Barrier: a counter and a generation Bell in the SyncArea of the group's
// first PE. Each member reads the generation, increments the counter; the
// last one resets the counter and bumps the generation, which wakes the
// others (futex). O(n) atomics on one cache line: right for the few PEs of
// one machine.
//
// Team slots: a split picks a slot index that is free on every PE of the
// parent (an AND of the members' free masks, exchanged through the parent's
// SyncAreas); slots are per-PE storage, so only members mark it used.
#include <bit>

#include "coremesh/core/error.hpp"
#include "internal.hpp"
#include "wait.hpp"

namespace coremesh::shmem::internal {

std::string describe_group(const Group& g) {
  if (g.label != nullptr) return *g.label;
  return fmt::format("active set (start {}, stride {}, size {})", g.start, g.stride, g.size);
}

Group team_group(TeamData& team, const char* api) {
  State& s = state(api);
  CM_CHECK(team.my_index >= 0, "call collectives only on teams this PE belongs to",
           "{}: PE {} is not a member of {}", api, s.my_pe, team.label);
  Group g;
  g.start = team.start;
  g.stride = team.stride;
  g.size = team.size;
  g.my_index = team.my_index;
  g.sync_offset = kHeaderBytes + static_cast<size_t>(team.slot) * s.slot_bytes;
  g.calls = &team.calls;
  g.label = &team.label;
  g.has_team_slot = true;
  return g;
}

Group active_set_group(int start, int log_stride, int size, long* psync, const char* api) {
  State& s = state(api);
  CM_CHECK(log_stride >= 0 && log_stride < 31 && size >= 1 && start >= 0,
           "pass PE_start >= 0, 0 <= logPE_stride < 31, PE_size >= 1",
           "{}: invalid active set (start {}, log stride {}, size {})", api, start, log_stride,
           size);
  Group g;
  g.start = start;
  g.stride = 1 << log_stride;
  g.size = size;
  const int64_t last = start + int64_t{g.stride} * (size - 1);
  CM_CHECK(last < s.n_pes, "the active set must lie within the job's PEs",
           "{}: active set (start {}, stride {}, size {}) reaches PE {} but the job has {} PEs",
           api, start, g.stride, size, last, s.n_pes);
  const int delta = s.my_pe - start;
  g.my_index = delta >= 0 && delta % g.stride == 0 && delta / g.stride < size ? delta / g.stride
                                                                               : -1;
  CM_CHECK(g.my_index >= 0, "only members of an active set may call its collectives",
           "{}: PE {} is not in the active set (start {}, stride {}, size {})", api, s.my_pe,
           start, g.stride, size);
  g.sync_offset = sym_offset(psync, sizeof(SyncArea), api);
  g.calls = &sync_area(s.my_pe, g.sync_offset)->calls;  // our own copy; only we touch it
  return g;
}

int begin_call(const Group& group) { return static_cast<int>((*group.calls)++ & 1); }

void group_sync(const Group& g, const char* what) {
  if (g.size == 1) return;
  State& s = state(what);
  SyncArea* mine = sync_area(s.my_pe, g.sync_offset);
  SyncArea* root = sync_area(g.world_pe(0), g.sync_offset);
  const int64_t entered = ++mine->entered;
  const uint32_t generation = root->generation.seq.load(std::memory_order_acquire);
  if (root->arrived.fetch_add(1, std::memory_order_acq_rel) == static_cast<uint32_t>(g.size - 1)) {
    root->arrived.store(0, std::memory_order_relaxed);
    ring(root->generation);  // seq_cst: publishes the reset and everything before
    return;
  }
  wait_until_ready(
      root->generation,
      [&] { return root->generation.seq.load(std::memory_order_acquire) != generation; },
      [&] {
        std::string late;
        for (int i = 0; i < g.size; ++i) {
          if (sync_area(g.world_pe(i), g.sync_offset)->entered < entered)
            late += (late.empty() ? "" : ", ") + std::to_string(g.world_pe(i));
        }
        return fmt::format("PE {} waits in {} (barrier #{} on {}) for PEs {} to arrive", s.my_pe,
                           what, entered, describe_group(g), late.empty() ? "?" : late);
      });
}

namespace {
// The lowest `count` slot indices free on every member of `parent`.
std::vector<int> agree_on_free_slots(TeamData& parent, int count, const char* api) {
  State& s = state(api);
  Group g = team_group(parent, api);
  const int parity = begin_call(g);
  SyncArea* mine = sync_area(s.my_pe, g.sync_offset);
  mine->published[parity][0] = static_cast<int64_t>(s.free_slots);
  group_sync(g, api);
  uint64_t common = ~uint64_t{0};
  for (int i = 0; i < g.size; ++i)
    common &= static_cast<uint64_t>(sync_area(g.world_pe(i), g.sync_offset)->published[parity][0]);
  std::vector<int> slots;
  while (static_cast<int>(slots.size()) < count && common != 0) {
    const int slot = std::countr_zero(common);
    slots.push_back(slot);
    common &= common - 1;
  }
  CM_CHECK(static_cast<int>(slots.size()) == count, "destroy teams you no longer need",
           "{}: no free team slot left ({} teams at most per PE)", api, kMaxTeams);
  return slots;
}

TeamData* make_team(State& s, int start, int stride, int size, int slot, int contexts) {
  auto team = std::make_unique<TeamData>();
  team->start = start;
  team->stride = stride;
  team->size = size;
  team->slot = slot;
  team->num_contexts = contexts;
  team->my_index = team->index_of(s.my_pe);
  team->label = fmt::format("team in slot {} (world start {}, stride {}, size {})", slot, start,
                            stride, size);
  if (team->my_index < 0) return nullptr;
  s.free_slots &= ~(uint64_t{1} << slot);
  SyncArea* mine = sync_area(s.my_pe, kHeaderBytes + static_cast<size_t>(slot) * s.slot_bytes);
  mine->entered = 0;
  std::lock_guard lock(s.mutex);
  s.teams.push_back(std::move(team));
  return s.teams.back().get();
}
}  // namespace

TeamData* team_split_strided(TeamData& parent, int start, int stride, int size, int contexts) {
  const char* api = "shmem_team_split_strided";
  State& s = state(api);
  CM_CHECK(size >= 1 && start >= 0 && start < parent.size && stride >= 1 &&
               start + int64_t{stride} * (size - 1) < parent.size,
           "the new team must lie inside its parent: 0 <= start, stride >= 1, size >= 1 and "
           "start + stride * (size - 1) < parent size",
           "{}: start {}, stride {}, size {} do not fit a parent of {} PEs", api, start, stride,
           size, parent.size);
  const int slot = agree_on_free_slots(parent, 1, api)[0];
  return make_team(s, parent.world_pe(start), parent.stride * stride, size, slot, contexts);
}

void team_split_2d(TeamData& parent, int xrange, TeamData** xteam, TeamData** yteam) {
  const char* api = "shmem_team_split_2d";
  State& s = state(api);
  CM_CHECK(xrange >= 1, "xrange must be positive", "{}: xrange {} < 1", api, xrange);
  xrange = std::min(xrange, parent.size);
  const int rows = (parent.size + xrange - 1) / xrange;
  // Rows get the first `rows` agreed slots, columns the next `xrange`.
  const std::vector<int> slots = agree_on_free_slots(parent, rows + xrange, api);
  const int row = parent.my_index / xrange, column = parent.my_index % xrange;
  const int row_size = std::min(xrange, parent.size - row * xrange);
  const int column_size = (parent.size - column + xrange - 1) / xrange;
  *xteam = make_team(s, parent.world_pe(row * xrange), parent.stride, row_size, slots[row], 0);
  *yteam = make_team(s, parent.world_pe(column), parent.stride * xrange, column_size,
                     slots[rows + column], 0);
}

void team_destroy(TeamData* team) {
  if (team == nullptr || !is_initialized()) return;
  State& s = state("shmem_team_destroy");
  CM_CHECK(team != &s.world && team != &s.shared, "predefined teams cannot be destroyed",
           "shmem_team_destroy: {} is predefined", team->label);
  std::lock_guard lock(s.mutex);
  for (auto it = s.teams.begin(); it != s.teams.end(); ++it) {
    if (it->get() != team) continue;
    s.free_slots |= uint64_t{1} << team->slot;
    s.teams.erase(it);
    return;
  }
  CM_CHECK(false, "destroy each team once", "shmem_team_destroy: unknown or destroyed team");
}

int team_translate(const TeamData& from, int pe, const TeamData& to) {
  if (pe < 0 || pe >= from.size) return -1;
  return to.index_of(from.world_pe(pe));
}

}  // namespace coremesh::shmem::internal
