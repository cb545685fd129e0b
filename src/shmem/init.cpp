// Library setup: the one State of this process, translation and checks.
#include <unistd.h>

#include <cstdio>
#include <thread>

#include "coremesh/core/env.hpp"
#include "coremesh/core/error.hpp"
#include "coremesh/runtime/profiler.hpp"
#include "internal.hpp"
#include "wait.hpp"

namespace coremesh::shmem::internal {

namespace {
std::unique_ptr<State> g_state;

void set_wait_policy(int n_pes) {
  auto& policy = wait_policy();
  // Spinning only helps when every PE has a CPU; beyond that it steals the
  // CPU from the PE we wait for.
  const long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  const int64_t default_spin_us = n_pes <= cpus ? 20 : 0;
  policy.spin_ns = env::get_int("COREMESH_SPIN_US", default_spin_us) * 1000;
  policy.timeout_s = env::get_double("COREMESH_WAIT_TIMEOUT_S", 300.0);
}

void init_team(TeamData& team, int slot, int n_pes, int my_pe, const char* label) {
  team.start = 0;
  team.stride = 1;
  team.size = n_pes;
  team.my_index = my_pe;
  team.slot = slot;
  team.label = label;
}
}  // namespace

int TeamData::index_of(int world_pe) const {
  const int delta = world_pe - start;
  if (stride == 0) return delta == 0 ? 0 : -1;
  if (delta % stride != 0) return -1;
  const int index = delta / stride;
  return index >= 0 && index < size ? index : -1;
}

bool is_initialized() { return g_state != nullptr; }

State& state(const char* api) {
  CM_CHECK(g_state != nullptr, "call shmem_init() (or create a coremesh::shmem::Session) first",
           "{} called before shmem init", api);
  return *g_state;
}

void init(size_t heap_bytes) {
  if (g_state) return;  // repeated init is a no-op, as in most OpenSHMEMs
  auto s = std::make_unique<State>();
  s->transport = make_shm_transport(heap_bytes);
  s->my_pe = s->transport->my_pe();
  s->n_pes = s->transport->n_pes();
  s->base = s->transport->local_base();
  s->segment_bytes = s->transport->segment_bytes();
  s->user_base = user_heap_base(s->n_pes);
  s->slot_bytes = team_slot_bytes(s->n_pes);
  s->data_base = s->transport->local_data_base();
  s->data_bytes = s->transport->data_bytes();
  s->allocator = SymmetricAllocator(s->user_base, s->segment_bytes - s->user_base);
  init_team(s->world, 0, s->n_pes, s->my_pe, "team world");
  init_team(s->shared, 1, s->n_pes, s->my_pe, "team shared");
  s->free_slots = ~uint64_t{0} << 2;
  set_wait_identity(s->my_pe, s->transport->job());
  set_wait_policy(s->n_pes);
  runtime::profiler_set_pe(s->my_pe);
  g_state = std::move(s);
  Group world = team_group(g_state->world, "shmem_init");
  group_sync(world, "shmem_init");
}

void finalize() {
  if (!g_state) return;
  quiet();
  Group world = team_group(g_state->world, "shmem_finalize");
  group_sync(world, "shmem_finalize");
  g_state->transport->close();
  g_state.reset();
  runtime::profiler_set_pe(-1);
}

void global_exit(int status) {
  if (g_state) {
    if (JobControl* job = g_state->transport->job()) {
      job->abort_pe = g_state->my_pe;
      job->abort_status = status;
      job->global_exit = 1;
      ring(job->abort);  // abort.seq != 0 now: every waiting PE stops
    }
  }
  std::fflush(stdout);
  std::fflush(stderr);
  _exit(status);
}

namespace {
// [p, p + bytes) within [lo, lo + size)?
bool within(uintptr_t p, size_t bytes, uintptr_t lo, size_t size) {
  return p >= lo && p - lo <= size && bytes <= size - (p - lo);
}
}  // namespace

size_t sym_offset(const void* addr, size_t bytes, const char* api) {
  const State& s = state(api);
  const auto p = reinterpret_cast<uintptr_t>(addr);
  const auto base = reinterpret_cast<uintptr_t>(s.base);
  if (within(p, bytes, base + s.user_base, s.segment_bytes - s.user_base)) return p - base;
  const auto data = reinterpret_cast<uintptr_t>(s.data_base);
  if (s.data_bytes != 0 && within(p, bytes, data, s.data_bytes))
    return s.segment_bytes + (p - data);
  CM_CHECK(false,
           "symmetric are memory from shmem_malloc/shmem_calloc/shmem_align (or a SymmetricHeap "
           "buffer) and the program's global and static variables; stack, malloc'ed, "
           "thread-local and shared-library variables are not",
           "{}: address {} (+{} bytes) is not symmetric on PE {}: heap [{}, {}), globals [{}, {})",
           api, addr, bytes, s.my_pe, static_cast<const void*>(s.base + s.user_base),
           static_cast<const void*>(s.base + s.segment_bytes),
           static_cast<const void*>(s.data_base),
           static_cast<const void*>(s.data_base + s.data_bytes));
  return 0;
}

void check_pe(int pe, const char* api) {
  const State& s = state(api);
  CM_CHECK(pe >= 0 && pe < s.n_pes, "PE numbers run from 0 to shmem_n_pes() - 1",
           "{}: PE {} is out of range; the job has {} PEs", api, pe, s.n_pes);
}

std::byte* peer_address(int pe, size_t offset) {
  const State& s = *g_state;
  if (offset < s.segment_bytes) return s.transport->peer_base(pe) + offset;
  return s.transport->peer_data_base(pe) + (offset - s.segment_bytes);
}

Bell& doorbell(int pe) {
  return reinterpret_cast<HeapHeader*>(g_state->transport->peer_base(pe))->doorbell;
}

}  // namespace coremesh::shmem::internal
