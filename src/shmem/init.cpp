// Library setup: the one State of this process, translation and checks.
#include <unistd.h>

#include <cstdio>
#include <thread>

#include "coremesh/core/env.hpp"
#include "coremesh/core/error.hpp"
#include "coremesh/shmem/launch.hpp"
#include "coremesh/runtime/profiler.hpp"
#include "internal.hpp"
#include "mpi_boot.hpp"
#include "wait.hpp"

namespace coremesh::shmem::internal {

namespace {
std::unique_ptr<State> g_state;
bool g_finalized = false;  // since the last init: a call now comes after shmem_finalize

void set_wait_policy(int n_pes) {
  auto& policy = wait_policy();
  // Spinning only helps when every PE has a CPU; beyond that it steals the
  // CPU from the PE we wait for.
  const long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  const int64_t default_spin_us = n_pes <= cpus ? 20 : 0;
  policy.spin_ns = env::get_int("COREMESH_SPIN_US", default_spin_us) * 1000;
  policy.timeout_s = env::wait_timeout_s();
}

void init_team(TeamData& team, int slot, int n_pes, int my_pe, const char* label) {
  team.pes.resize(static_cast<size_t>(n_pes));
  for (int pe = 0; pe < n_pes; ++pe) team.pes[static_cast<size_t>(pe)] = pe;
  team.my_index = my_pe;
  team.slot = slot;
  team.label = label;
}

constexpr size_t kDefaultHeapBytes = size_t{512} << 20;  // sparse: untouched pages cost nothing

// InitOptions, else COREMESH_HEAP_SIZE (`coremesh run --heap`), else the
// standard SHMEM_SYMMETRIC_SIZE, else 512 MiB.
size_t heap_bytes(size_t requested) {
  if (requested != 0) return requested;
  for (const char* name : {"COREMESH_HEAP_SIZE", "SHMEM_SYMMETRIC_SIZE"})
    if (auto text = env::get(name)) return static_cast<size_t>(env::parse_size(*text));
  return kDefaultHeapBytes;
}

// COREMESH_TRANSPORT: under `coremesh run` (and alone) shm, or shm-rma
// (shm without load/store); under mpirun the network engine between hosts,
// ucx (the default) or mpi, with shm between the PEs of a host.
std::unique_ptr<Transport> make_transport(size_t bytes) {
  const bool mpirun = launched_by_mpirun() && !env::get(kJobIdEnv);
  const std::string kind = env::get("COREMESH_TRANSPORT").value_or(mpirun ? "ucx" : "shm");
  CM_CHECK(kind == "shm" || kind == "shm-rma" || kind == "ucx" || kind == "mpi",
           "set COREMESH_TRANSPORT to shm or shm-rma (coremesh run), ucx or mpi (mpirun)",
           "unknown transport COREMESH_TRANSPORT={}", kind);
  if (kind == "ucx" || kind == "mpi") {
    CM_CHECK(mpirun, "start the PEs with mpirun -n N prog (or choose COREMESH_TRANSPORT=shm)",
             "COREMESH_TRANSPORT={} but this process was not started by mpirun", kind);
    return make_host_transport(bytes, kind);
  }
  CM_CHECK(!mpirun, "under mpirun, use COREMESH_TRANSPORT=ucx or mpi (or unset it)",
           "COREMESH_TRANSPORT={} cannot join a job started by mpirun", kind);
  auto shm = make_shm_transport(bytes);
  return kind == "shm-rma" ? without_peer_pointers(std::move(shm)) : std::move(shm);
}
// The standard environment variables that print: SHMEM_VERSION (the
// library version, PE 0), SHMEM_INFO (version and every variable the
// library reads, PE 0), SHMEM_DEBUG (one line per PE: transport and heap).
void report_environment(const State& s) {
  auto on = [](const char* name) {
    auto v = env::get(name);
    return v && !v->empty() && *v != "0";
  };
  if (s.my_pe == 0 && (on("SHMEM_VERSION") || on("SHMEM_INFO")))
    std::printf("coremesh 0.1: OpenSHMEM %d.%d (%s transport, %d PEs)\n", 1, 5,
                s.transport->name(), s.n_pes);
  if (s.my_pe == 0 && on("SHMEM_INFO")) {
    std::printf(
        "Environment variables:\n"
        "  SHMEM_SYMMETRIC_SIZE    symmetric heap bytes per PE (K/M/G suffixes; default 512M;\n"
        "                          COREMESH_HEAP_SIZE and `coremesh run --heap` take precedence)\n"
        "  SHMEM_VERSION           print the library version at start-up\n"
        "  SHMEM_INFO              print this text at start-up\n"
        "  SHMEM_DEBUG             print per-PE transport and heap details at start-up\n"
        "  COREMESH_TRANSPORT      shm (default) or shm-rma (no load/store between PEs); under\n"
        "                          mpirun ucx (default) or mpi between hosts\n"
        "  COREMESH_PES_PER_HOST   under mpirun: PEs [0,k), [k,2k)... form a host (simulated\n"
        "                          hosts on one machine; 1: the network between all PEs)\n"
        "  COREMESH_WAIT_TIMEOUT_S watchdog of every blocking wait (default 300 s; 0: none)\n"
        "  COREMESH_SPIN_US        spin before sleeping in a wait (default 20, 0 when PEs > CPUs)\n"
        "  COREMESH_SYMMETRIC_DATA 0: global variables are not symmetric\n");
  }
  if (on("SHMEM_DEBUG"))
    std::fprintf(stderr,
                 "[shmem debug] PE %d of %d: transport %s, %d PEs by load/store, heap %zu B at "
                 "%p, globals %zu B\n",
                 s.my_pe, s.n_pes, s.transport->name(), s.shared.size(),
                 s.segment_bytes - s.user_base, static_cast<void*>(s.base + s.user_base),
                 s.data_bytes);
  std::fflush(stdout);
}
}  // namespace

int TeamData::index_of(int world_pe) const {
  for (size_t i = 0; i < pes.size(); ++i)
    if (pes[i] == world_pe) return static_cast<int>(i);
  return -1;
}

bool is_initialized() { return g_state != nullptr; }

State& state(const char* api) {
  CM_CHECK(g_state != nullptr || !g_finalized, "make shmem_finalize the program's last OpenSHMEM call",
           "{} called after shmem_finalize", api);
  CM_CHECK(g_state != nullptr, "call shmem_init() (or create a coremesh::shmem::Session) first",
           "{} called before shmem init", api);
  return *g_state;
}

void init(size_t requested_heap_bytes) {
  if (g_state) return;  // repeated init is a no-op, as in most OpenSHMEMs
  auto s = std::make_unique<State>();
  s->transport = make_transport(heap_bytes(requested_heap_bytes));
  s->my_pe = s->transport->my_pe();
  s->n_pes = s->transport->n_pes();
  s->base = s->transport->local_base();
  s->segment_bytes = s->transport->segment_bytes();
  s->user_base = user_heap_base(s->n_pes);
  s->slot_bytes = team_slot_bytes(s->n_pes);
  s->landing_calls.assign(size_t{kLandingTeams} * static_cast<size_t>(s->n_pes), 0);
  s->data_base = s->transport->local_data_base();
  s->data_bytes = s->transport->data_bytes();
  s->allocator = SymmetricAllocator(s->user_base, s->segment_bytes - s->user_base);
  init_team(s->world, 0, s->n_pes, s->my_pe, "team world");
  init_team(s->shared, 1, s->n_pes, s->my_pe, "team shared");
  // SHMEM_TEAM_SHARED: the PEs whose memory this one reaches by load/store
  // (under mpirun, the PEs of its host).
  s->shared.pes.clear();
  for (int pe = 0; pe < s->n_pes; ++pe)
    if (pe == s->my_pe || s->transport->peer_pointer(pe, 0) != nullptr) s->shared.pes.push_back(pe);
  s->shared.my_index = s->shared.index_of(s->my_pe);
  s->free_slots = ~uint64_t{0} << 2;
  set_wait_identity(s->my_pe, s->transport->job());
  set_wait_policy(s->n_pes);
  runtime::profiler_set_pe(s->my_pe);
  g_state = std::move(s);
  g_finalized = false;
  Group world = team_group(g_state->world, "shmem_init");
  group_sync(world, "shmem_init");
  report_environment(*g_state);
}

void finalize() {
  if (!g_state) return;
  quiet();
  Group world = team_group(g_state->world, "shmem_finalize");
  group_sync(world, "shmem_finalize");
  g_state->transport->close();
  g_state.reset();
  g_finalized = true;
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
    if (launched_by_mpirun() && g_state->transport->job() == nullptr) {
      std::fflush(stdout);
      std::fflush(stderr);
      abort_mpi_job(status);  // mpirun stops every PE and reports the status
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

size_t span_bytes(size_t count, size_t stride, size_t elem_bytes) {
  if (count == 0) return 0;
  size_t elems = 0, bytes = 0;
  CM_CHECK(!__builtin_mul_overflow(count - 1, stride, &elems) && !__builtin_add_overflow(elems, 1, &elems) &&
               !__builtin_mul_overflow(elems, elem_bytes, &bytes),
           "pass the number of elements (not a negative count) and strides that fit the arrays",
           "{} elements of {} B, {} apart, span more bytes than the address space", count, elem_bytes, stride);
  return bytes;
}

void check_pe(int pe, const char* api) {
  const State& s = state(api);
  CM_CHECK(pe >= 0 && pe < s.n_pes, "PE numbers run from 0 to shmem_n_pes() - 1",
           "{}: PE {} is out of range; the job has {} PEs", api, pe, s.n_pes);
}

std::byte* local_address(size_t offset) {
  const State& s = *g_state;
  if (offset < s.segment_bytes) return s.base + offset;
  return s.data_base + (offset - s.segment_bytes);
}

Bell& my_doorbell() { return reinterpret_cast<HeapHeader*>(g_state->base)->doorbell; }
Transport& transport() { return *state().transport; }

const std::byte* view(int pe, size_t offset, size_t bytes, std::vector<std::byte>& scratch) {
  Transport& t = *g_state->transport;
  if (const std::byte* p = t.peer_pointer(pe, offset)) return p;
  scratch.resize(bytes);
  t.get(scratch.data(), pe, offset, bytes);
  return scratch.data();
}

std::vector<int64_t> exchange(const Group& g, int parity, std::span<const int64_t> values,
                              const char* what) {
  CM_ASSERT(values.size() <= 8);
  SyncArea* mine = my_sync_area(g.sync_offset);
  std::copy(values.begin(), values.end(), mine->published[parity]);
  group_sync(g, what);
  const size_t k = values.size();
  std::vector<int64_t> all(k * static_cast<size_t>(g.size));
  const size_t at = g.sync_offset + offsetof(SyncArea, published) + parity * 8 * sizeof(int64_t);
  for (int i = 0; i < g.size; ++i) {
    if (i == g.my_index) std::copy(values.begin(), values.end(), all.begin() + i * k);
    else transport().get(all.data() + i * k, g.world_pe(i), at, k * sizeof(int64_t));
  }
  return all;
}

}  // namespace coremesh::shmem::internal
