// C API: setup, query, memory, ordering, locks, teams.
#include <unistd.h>

#include <algorithm>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "c_api.hpp"
#include "coremesh/core/error.hpp"
#include "wait.hpp"

namespace cm = coremesh::shmem;
namespace in = coremesh::shmem::internal;

namespace coremesh::shmem::capi {

void fail(const char* api, const std::exception& e) {
  const int pe = in::is_initialized() ? in::state().my_pe : -1;
  if (const auto* err = dynamic_cast<const coremesh::Error*>(&e)) {
    std::fprintf(stderr, "shmem error on PE %d in %s: %s\n", pe, api, err->what());
  } else {
    std::fprintf(stderr, "shmem error on PE %d in %s: %s\n", pe, api, e.what());
  }
  std::fflush(stdout);
  std::fflush(stderr);
  _exit(1);
}

in::TeamData* team(shmem_team_t handle, const char* api) {
  in::State& s = in::state(api);
  if (handle == SHMEM_TEAM_WORLD) return &s.world;
  if (handle == SHMEM_TEAM_SHARED) return &s.shared;
  CM_CHECK(handle != SHMEM_TEAM_INVALID, "check the result of the team split",
           "{}: SHMEM_TEAM_INVALID passed", api);
  // A handle is a TeamData*: look it up among the live teams before using
  // it, so that a destroyed or made-up handle is refused instead of read
  // (under the table's lock: another thread may be splitting or destroying).
  {
    std::lock_guard lock(s.mutex);
    for (const auto& live : s.teams)
      if (reinterpret_cast<shmem_team_t>(live.get()) == handle) return live.get();
  }
  CM_CHECK(false,
           "pass SHMEM_TEAM_WORLD, SHMEM_TEAM_SHARED or a team returned by a split and not yet "
           "destroyed",
           "{}: team handle {} is not a live team (destroyed, or not made by a team split)", api,
           static_cast<const void*>(handle));
  return nullptr;
}

shmem_team_t handle(in::TeamData* team) {
  if (team == nullptr) return SHMEM_TEAM_INVALID;
  if (in::is_initialized() && team == &in::state().world) return SHMEM_TEAM_WORLD;
  if (in::is_initialized() && team == &in::state().shared) return SHMEM_TEAM_SHARED;
  return reinterpret_cast<shmem_team_t>(team);
}

Cmp cmp(int value, const char* api) {
  CM_CHECK(value >= SHMEM_CMP_EQ && value <= SHMEM_CMP_LE, "use one of SHMEM_CMP_EQ ... SHMEM_CMP_LE",
           "{}: unknown comparison {}", api, value);
  return static_cast<Cmp>(value);
}

}  // namespace coremesh::shmem::capi

using coremesh::shmem::capi::handle;
using coremesh::shmem::capi::team;

// Helpers stay outside extern "C": there, GCC gives even an unnamed
// namespace's functions external C names (a global `contexts` once clashed
// with programs' own; tests/shmem/exported_symbols.py checks the libraries).
namespace {
// OpenSHMEM programs may return from main without shmem_finalize.
void finalize_at_exit() {
  CM_C_API("shmem_finalize (at exit)", in::finalize());
}
// The thread level shmem_init_thread provided, for shmem_query_thread.
int g_thread_level = SHMEM_THREAD_MULTIPLE;
int team_contexts(const shmem_team_config_t* config, long mask) {
  return config && (mask & SHMEM_TEAM_NUM_CONTEXTS) ? config->num_contexts : 0;
}
}  // namespace

extern "C" {

void shmem_init(void) {
  CM_C_API("shmem_init", {
    if (in::is_initialized()) return;
    in::init(0);
    std::atexit(finalize_at_exit);
  });
}
int shmem_init_thread(int requested, int* provided) {
  shmem_init();
  // Everything but collectives on one team is thread safe (RMA, atomics,
  // waits, allocation under a mutex); concurrent collectives on one team are
  // erroneous in OpenSHMEM anyway. So the level asked for is the level given.
  g_thread_level = std::clamp(requested, int(SHMEM_THREAD_SINGLE), int(SHMEM_THREAD_MULTIPLE));
  if (provided) *provided = g_thread_level;
  return 0;
}
// 1.5, 9.1.3: the level shmem_init_thread provided (shmem_init: MULTIPLE).
void shmem_query_thread(int* provided) {
  if (provided) *provided = g_thread_level;
}
void shmem_finalize(void) {
  CM_C_API("shmem_finalize", {
    coremesh::shmem::capi::orphan_contexts(nullptr);
    in::finalize();
  });
}
void shmem_global_exit(int status) { in::global_exit(status); }
int shmem_my_pe(void) { CM_C_API("shmem_my_pe", return in::state("shmem_my_pe").my_pe); }
int shmem_n_pes(void) { CM_C_API("shmem_n_pes", return in::state("shmem_n_pes").n_pes); }
int _my_pe(void) { return shmem_my_pe(); }
int _num_pes(void) { return shmem_n_pes(); }
void shmem_info_get_version(int* major, int* minor) {
  *major = SHMEM_MAJOR_VERSION;
  *minor = SHMEM_MINOR_VERSION;
}
void shmem_info_get_name(char* name) {
  std::strncpy(name, SHMEM_VENDOR_STRING, SHMEM_MAX_NAME_LEN - 1);
  name[SHMEM_MAX_NAME_LEN - 1] = '\0';
}
int shmem_pe_accessible(int pe) {
  return in::is_initialized() && pe >= 0 && pe < in::state().n_pes;
}
int shmem_addr_accessible(const void* addr, int pe) {
  if (!shmem_pe_accessible(pe)) return 0;
  try {
    in::sym_offset(addr, 1, "shmem_addr_accessible");
    return 1;
  } catch (const coremesh::Error&) {
    return 0;
  }
}
// NULL where only RMA reaches `pe`; this PE's own memory always has its address.
void* shmem_ptr(const void* dest, int pe) {
  if (!shmem_addr_accessible(dest, pe)) return nullptr;
  if (pe == in::state().my_pe) return const_cast<void*>(dest);
  return in::transport().peer_pointer(pe, in::sym_offset(dest, 0, "shmem_ptr"));
}
// The address of `dest` on the team's PE `pe`, when load/store reaches it.
void* shmem_team_ptr(shmem_team_t t, const void* dest, int pe) {
  if (t == SHMEM_TEAM_INVALID) return nullptr;
  CM_C_API("shmem_team_ptr", {
    const in::TeamData* data = team(t, "shmem_team_ptr");
    if (pe < 0 || pe >= data->size()) return nullptr;
    return shmem_ptr(dest, data->world_pe(pe));
  });
}
void shmem_pcontrol(const int, ...) {}

void* shmem_malloc(size_t size) {
  CM_C_API("shmem_malloc", return in::sym_alloc(size, 128, false, "shmem_malloc", in::OnFull::null));
}
void* shmem_calloc(size_t count, size_t size) {
  size_t bytes = 0;
  if (__builtin_mul_overflow(count, size, &bytes)) return nullptr;  // 9.3.3: cannot be allocated
  CM_C_API("shmem_calloc", return in::sym_alloc(bytes, 128, true, "shmem_calloc", in::OnFull::null));
}
void* shmem_align(size_t alignment, size_t size) {
  CM_C_API("shmem_align", return in::sym_alloc(size, alignment, false, "shmem_align", in::OnFull::null));
}
void* shmem_realloc(void* ptr, size_t size) {
  CM_C_API("shmem_realloc", return in::sym_realloc(ptr, size, "shmem_realloc"));
}
void* shmem_malloc_with_hints(size_t size, long) {
  // Hints only tune placement; every block supports atomics and signals here.
  CM_C_API("shmem_malloc_with_hints", return in::sym_alloc(size, 128, false, "shmem_malloc_with_hints", in::OnFull::null));
}
void shmem_free(void* ptr) { CM_C_API("shmem_free", in::sym_free(ptr, "shmem_free")); }

void shmem_fence(void) { in::fence(); }
void shmem_quiet(void) { in::quiet(); }
void shmem_set_lock(long* lock) { CM_C_API("shmem_set_lock", in::set_lock(lock)); }
void shmem_clear_lock(long* lock) { CM_C_API("shmem_clear_lock", in::clear_lock(lock)); }
int shmem_test_lock(long* lock) { CM_C_API("shmem_test_lock", return in::test_lock(lock) ? 1 : 0); }

int shmem_team_my_pe(shmem_team_t t) {
  if (t == SHMEM_TEAM_INVALID) return -1;
  CM_C_API("shmem_team_my_pe", return team(t, "shmem_team_my_pe")->my_index);
}
int shmem_team_n_pes(shmem_team_t t) {
  if (t == SHMEM_TEAM_INVALID) return -1;
  CM_C_API("shmem_team_n_pes", return team(t, "shmem_team_n_pes")->size());
}
int shmem_team_get_config(shmem_team_t t, long mask, shmem_team_config_t* config) {
  if (t == SHMEM_TEAM_INVALID || config == nullptr) return -1;
  CM_C_API("shmem_team_get_config", {
    if (mask & SHMEM_TEAM_NUM_CONTEXTS) config->num_contexts = team(t, "shmem_team_get_config")->num_contexts;
    return 0;
  });
}
int shmem_team_translate_pe(shmem_team_t src, int src_pe, shmem_team_t dest) {
  if (src == SHMEM_TEAM_INVALID || dest == SHMEM_TEAM_INVALID) return -1;
  CM_C_API("shmem_team_translate_pe",
           return in::team_translate(*team(src, "shmem_team_translate_pe"), src_pe,
                                     *team(dest, "shmem_team_translate_pe")));
}
// An invalid parent or triplet is not an error in OpenSHMEM: the call
// returns non-zero on every PE (all see the same arguments) and yields
// SHMEM_TEAM_INVALID.
// So is a team the implementation cannot make (no team slot free on every
// PE of the parent: all of them see it at the same call) and a negative
// num_contexts.
int shmem_team_split_strided(shmem_team_t parent, int start, int stride, int size,
                             const shmem_team_config_t* config, long mask, shmem_team_t* new_team) {
  CM_C_API("shmem_team_split_strided", CM_CHECK(new_team != nullptr, "pass the address of a shmem_team_t",
                                                "shmem_team_split_strided: new_team is NULL"));
  *new_team = SHMEM_TEAM_INVALID;
  if (parent == SHMEM_TEAM_INVALID || team_contexts(config, mask) < 0) return 1;
  CM_C_API("shmem_team_split_strided", {
    in::TeamData* p = team(parent, "shmem_team_split_strided");
    if (!in::valid_triplet(p->size(), start, stride, size)) return 1;
    try {
      *new_team = handle(in::team_split_strided(*p, start, stride, size, team_contexts(config, mask)));
    } catch (const in::NoFreeTeamSlot&) {
      return 1;
    }
    return 0;
  });
}
int shmem_team_split_2d(shmem_team_t parent, int xrange, const shmem_team_config_t* xconfig,
                        long xmask, shmem_team_t* xteam, const shmem_team_config_t* yconfig,
                        long ymask, shmem_team_t* yteam) {
  CM_C_API("shmem_team_split_2d", CM_CHECK(xteam != nullptr && yteam != nullptr, "pass the addresses of two shmem_team_t",
                                           "shmem_team_split_2d: xteam or yteam is NULL"));
  *xteam = *yteam = SHMEM_TEAM_INVALID;
  if (parent == SHMEM_TEAM_INVALID || xrange < 1 || team_contexts(xconfig, xmask) < 0 ||
      team_contexts(yconfig, ymask) < 0)
    return 1;
  CM_C_API("shmem_team_split_2d", {
    in::TeamData *x = nullptr, *y = nullptr;
    try {
      in::team_split_2d(*team(parent, "shmem_team_split_2d"), xrange, team_contexts(xconfig, xmask),
                        team_contexts(yconfig, ymask), &x, &y);
    } catch (const in::NoFreeTeamSlot&) {
      return 1;
    }
    *xteam = handle(x);
    *yteam = handle(y);
    return 0;
  });
}
void shmem_team_destroy(shmem_team_t t) {
  if (t == SHMEM_TEAM_INVALID) return;
  CM_C_API("shmem_team_destroy", {
    in::TeamData* dying = team(t, "shmem_team_destroy");
    coremesh::shmem::capi::orphan_contexts(dying);
    in::team_destroy(dying);
  });
}

}  // extern "C"
