// Teams, groups and the barrier.
//
// A team is a list of world PEs. Strided splits (the C API) and arbitrary
// lists (Team::from_pes, Team::split in the C++ API) are built the same
// way: collective over the parent, whose members agree on a team slot free
// on every one of them (an AND of their free masks, exchanged through the
// parent's SyncArea); slots are per-PE storage, so only members mark it
// used and destroy is local. Disjoint teams made by one call share a slot.
//
// The barrier is the transport's sync (a dissemination barrier over AMOs by
// default, transport.cpp).
#include <algorithm>
#include <bit>
#include <map>

#include "coremesh/core/error.hpp"
#include "internal.hpp"
#include "wait.hpp"

namespace coremesh::shmem::internal {

std::string describe_group(const Group& g) { return g.label; }

Group team_group(TeamData& team, const char* api) {
  State& s = state(api);
  CM_CHECK(team.my_index >= 0, "call collectives only on teams this PE belongs to",
           "{}: PE {} is not a member of {}", api, s.my_pe, team.label);
  Group g;
  g.pes = team.pes;
  g.size = team.size();
  g.my_index = team.my_index;
  g.sync_offset = kHeaderBytes + static_cast<size_t>(team.slot) * s.slot_bytes;
  g.calls = &team.calls;
  g.label = team.label;
  g.team_slot = team.slot;
  return g;
}

Group active_set_group(int start, int log_stride, int size, long* psync, const char* api) {
  State& s = state(api);
  CM_CHECK(log_stride >= 0 && log_stride < 31 && size >= 1 && start >= 0,
           "pass PE_start >= 0, 0 <= logPE_stride < 31, PE_size >= 1",
           "{}: invalid active set (start {}, log stride {}, size {})", api, start, log_stride,
           size);
  const int stride = 1 << log_stride;
  const int64_t last = start + int64_t{stride} * (size - 1);
  CM_CHECK(last < s.n_pes, "the active set must lie within the job's PEs",
           "{}: active set (start {}, stride {}, size {}) reaches PE {} but the job has {} PEs",
           api, start, stride, size, last, s.n_pes);
  Group g;
  for (int i = 0; i < size; ++i) g.pes.push_back(start + i * stride);
  g.size = size;
  const int delta = s.my_pe - start;
  g.my_index = delta >= 0 && delta % stride == 0 && delta / stride < size ? delta / stride : -1;
  g.label = fmt::format("active set (start {}, stride {}, size {})", start, stride, size);
  CM_CHECK(g.my_index >= 0, "only members of an active set may call its collectives",
           "{}: PE {} is not in the {}", api, s.my_pe, g.label);
  g.sync_offset = sym_offset(psync, sizeof(SyncArea), api);
  g.calls = &my_sync_area(g.sync_offset)->calls;  // our own copy; only we touch it
  return g;
}

void restore_sync_area(const Group& g) {
  if (g.team_slot >= 0) return;
  SyncArea* mine = my_sync_area(g.sync_offset);
  // The arrival counts are zero already (counting_sync); the rest only this PE writes.
  std::fill(std::begin(mine->consumed), std::end(mine->consumed), 0u);
  mine->entered = 0, mine->calls = 0;
  std::fill(std::begin(mine->pad), std::end(mine->pad), 0u);
  std::fill(&mine->published[0][0], &mine->published[0][0] + 16, int64_t{0});
}

int begin_call(const Group& group) { return static_cast<int>((*group.calls)++ & 1); }

void group_sync(const Group& g, const char* what) {
  if (g.size == 1) return;
  State& s = state(what);
  const int64_t barrier = my_sync_area(g.sync_offset)->entered + 1;
  // Who is late: the members whose barrier count (fetched through the
  // transport, only when the watchdog fires) is behind ours.
  auto late = [&] {
    std::string who;
    for (int i = 0; i < g.size; ++i) {
      int64_t entered = barrier;
      if (i != g.my_index)
        s.transport->get(&entered, g.world_pe(i), g.sync_offset + offsetof(SyncArea, entered),
                         sizeof entered);
      if (entered < barrier) who += fmt::format("{}{}", who.empty() ? "" : ", ", g.world_pe(i));
    }
    return who.empty() ? std::string("?") : who;
  };
  SyncSpec spec{g.pes, g.my_index, g.sync_offset,
                [&] {
                  return fmt::format("PE {} waits in {} (barrier #{} on {}) for PEs {} to arrive",
                                     s.my_pe, what, barrier, describe_group(g), late());
                },
                g.team_slot < 0};
  s.transport->sync(spec);
}

bool valid_triplet(int parent_size, int start, int stride, int size) {
  if (size < 1 || start < 0 || start >= parent_size) return false;
  if (size > 1 && stride == 0) return false;  // a PE may appear once
  const int64_t last = start + int64_t{stride} * (size - 1);
  return last >= 0 && last < parent_size;
}

namespace {
// The lowest `count` slot indices free on every member of `parent`.
std::vector<int> agree_on_free_slots(TeamData& parent, int count, const char* api) {
  State& s = state(api);
  Group g = team_group(parent, api);
  const int64_t mine = static_cast<int64_t>(s.free_slots);
  const std::vector<int64_t> all = exchange(g, begin_call(g), {&mine, 1}, api);
  uint64_t common = ~uint64_t{0};
  for (int64_t m : all) common &= static_cast<uint64_t>(m);
  std::vector<int> slots;
  while (static_cast<int>(slots.size()) < count && common != 0) {
    slots.push_back(std::countr_zero(common));
    common &= common - 1;
  }
  if (static_cast<int>(slots.size()) < count) {
    CM_THROW(NoFreeTeamSlot, "destroy teams you no longer need",
             "{}: no free team slot left on every PE of {} ({} teams at most per PE, the "
             "predefined ones included)",
             api, parent.label, kMaxTeams);
  }
  return slots;
}

std::string list_label(const std::vector<int>& pes) {
  std::string out;
  for (size_t i = 0; i < pes.size() && i < 16; ++i) out += fmt::format("{}{}", i ? ", " : "", pes[i]);
  if (pes.size() > 16) out += fmt::format(", ... ({} PEs)", pes.size());
  return out;
}

TeamData* make_team(State& s, std::vector<int> pes, int slot, int contexts) {
  auto team = std::make_unique<TeamData>();
  team->pes = std::move(pes);
  team->slot = slot;
  team->num_contexts = contexts;
  team->my_index = team->index_of(s.my_pe);
  team->label = fmt::format("team in slot {} (world PEs {})", slot, list_label(team->pes));
  if (team->my_index < 0) return nullptr;
  // The barrier count is only read by peers' watchdogs: count this team's.
  my_sync_area(kHeaderBytes + static_cast<size_t>(slot) * s.slot_bytes)->entered = 0;
  std::lock_guard lock(s.mutex);
  s.free_slots &= ~(uint64_t{1} << slot);
  s.teams.push_back(std::move(team));
  return s.teams.back().get();
}
}  // namespace

TeamData* team_split_strided(TeamData& parent, int start, int stride, int size, int contexts) {
  const char* api = "shmem_team_split_strided";
  State& s = state(api);
  CM_CHECK(valid_triplet(parent.size(), start, stride, size),
           "the new team must lie inside its parent: size >= 1 and start + stride * i in "
           "[0, parent size) for every i < size (stride may be negative; 0 only for size 1)",
           "{}: start {}, stride {}, size {} do not fit a parent of {} PEs", api, start, stride,
           size, parent.size());
  const int slot = agree_on_free_slots(parent, 1, api)[0];
  std::vector<int> pes;
  for (int i = 0; i < size; ++i) pes.push_back(parent.world_pe(start + i * stride));
  return make_team(s, std::move(pes), slot, contexts);
}

void team_split_2d(TeamData& parent, int xrange, int x_contexts, int y_contexts, TeamData** xteam,
                   TeamData** yteam) {
  const char* api = "shmem_team_split_2d";
  State& s = state(api);
  CM_CHECK(xrange >= 1, "xrange must be positive", "{}: xrange {} < 1", api, xrange);
  xrange = std::min(xrange, parent.size());
  // Rows are disjoint, and so are columns: one slot for all rows, one for all columns.
  const std::vector<int> slots = agree_on_free_slots(parent, 2, api);
  const int row = parent.my_index / xrange, column = parent.my_index % xrange;
  std::vector<int> row_pes, column_pes;
  for (int i = row * xrange; i < std::min(parent.size(), (row + 1) * xrange); ++i)
    row_pes.push_back(parent.world_pe(i));
  for (int i = column; i < parent.size(); i += xrange) column_pes.push_back(parent.world_pe(i));
  *xteam = make_team(s, std::move(row_pes), slots[0], x_contexts);
  *yteam = make_team(s, std::move(column_pes), slots[1], y_contexts);
}

TeamData* team_from_pes(TeamData& parent, std::span<const int> world_pes) {
  const char* api = "Team::from_pes";
  State& s = state(api);
  std::vector<int> pes(world_pes.begin(), world_pes.end());
  std::vector<int> sorted = pes;
  std::sort(sorted.begin(), sorted.end());
  CM_CHECK(!pes.empty() && std::adjacent_find(sorted.begin(), sorted.end()) == sorted.end(),
           "list each world PE of the new team once", "{}: the list [{}] is empty or repeats a PE",
           api, list_label(pes));
  for (int pe : pes) {
    CM_CHECK(parent.index_of(pe) >= 0, "a team's PEs must all belong to its parent team",
             "{}: world PE {} is not a member of {}", api, pe, parent.label);
  }
  // Every member of the parent must pass the same list: compare a hash.
  uint64_t hash = 1469598103934665603ULL;
  for (int pe : pes) hash = (hash ^ static_cast<uint64_t>(pe)) * 1099511628211ULL;
  Group g = team_group(parent, api);
  const int64_t mine[2] = {static_cast<int64_t>(hash), static_cast<int64_t>(pes.size())};
  const std::vector<int64_t> all = exchange(g, begin_call(g), mine, api);
  for (int i = 0; i < g.size; ++i) {
    CM_CHECK(all[2 * i] == mine[0] && all[2 * i + 1] == mine[1],
             "every member of the parent team passes the same PE list to from_pes",
             "{}: PE {} passed a different list ({} PEs) than PE {} ([{}])", api, g.world_pe(i),
             all[2 * i + 1], s.my_pe, list_label(pes));
  }
  const int slot = agree_on_free_slots(parent, 1, api)[0];
  return make_team(s, std::move(pes), slot, 0);
}

TeamData* team_split_color(TeamData& parent, int color, int key) {
  const char* api = "Team::split";
  State& s = state(api);
  Group g = team_group(parent, api);
  const int64_t mine[2] = {color, key};
  const std::vector<int64_t> all = exchange(g, begin_call(g), mine, api);
  const int slot = agree_on_free_slots(parent, 1, api)[0];
  if (color < 0) return nullptr;
  std::vector<std::pair<int64_t, int>> members;  // (key, parent index)
  for (int i = 0; i < g.size; ++i)
    if (all[2 * i] == color) members.push_back({all[2 * i + 1], i});
  std::sort(members.begin(), members.end());
  std::vector<int> pes;
  for (const auto& m : members) pes.push_back(parent.world_pe(m.second));
  return make_team(s, std::move(pes), slot, 0);
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
  if (pe < 0 || pe >= from.size()) return -1;
  return to.index_of(from.world_pe(pe));
}

}  // namespace coremesh::shmem::internal
