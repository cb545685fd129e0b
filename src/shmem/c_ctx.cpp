// C API: communication contexts. A context is a handle that names the team
// its PE numbers belong to (the world for shmem_ctx_create). Every
// context's operations go through the one transport, so quiet and fence on
// any context complete / order at least that context's operations (they
// do this PE's all, which OpenSHMEM allows). SHMEM_CTX_PRIVATE and
// SHMEM_CTX_SERIALIZED are accepted: the library is thread safe anyway.
// Handles are checked to name a live slot of the context table before use.
//
// The typed shmem_ctx_* routines come from the same type tables as the
// default-context ones and call them with the PE translated to the world.
#include <cstdio>
#include <atomic>
#include <cstdint>
#include <mutex>

#include "c_api.hpp"
#include "coremesh/core/error.hpp"

namespace in = coremesh::shmem::internal;

// A context slot: free, live, or orphaned (its team was destroyed first).
enum class Slot : uint8_t { free, live, orphan };

struct cm_shmem_ctx {
  std::atomic<Slot> state{Slot::free};
  in::TeamData* team = nullptr;  // nullptr: the world; written before state turns live
  long options = 0;
};

namespace {
// Contexts live in a fixed table, so that checking a handle on every
// shmem_ctx_* call costs no lock and no search: it must point at a slot, and
// the slot must be live. A destroyed, orphaned or made-up handle is refused
// with a message instead of being read. Slots are reused round robin, so a
// stale handle rarely names a newer context.
constexpr size_t kMaxContexts = 4096;
cm_shmem_ctx g_slots[kMaxContexts];
std::mutex g_slots_mutex;  // creation, destruction, orphaning
size_t g_next_slot = 0;

bool is_slot(shmem_ctx_t ctx) {
  const auto p = reinterpret_cast<uintptr_t>(ctx), lo = reinterpret_cast<uintptr_t>(&g_slots[0]);
  return p >= lo && p < lo + sizeof(g_slots) && (p - lo) % sizeof(cm_shmem_ctx) == 0;
}

// The live context `ctx` (not SHMEM_CTX_DEFAULT).
const cm_shmem_ctx& live_context(shmem_ctx_t ctx, const char* api) {
  CM_CHECK(ctx != SHMEM_CTX_INVALID, "create the context first (and check its return code)",
           "{}: SHMEM_CTX_INVALID passed", api);
  const Slot state = is_slot(ctx) ? ctx->state.load(std::memory_order_acquire) : Slot::free;
  CM_CHECK(state != Slot::orphan, "destroy a team's contexts before the team (shmem_ctx_destroy)",
           "{}: the team of context {} was destroyed", api, static_cast<const void*>(ctx));
  CM_CHECK(state == Slot::live, "pass SHMEM_CTX_DEFAULT or a context created and not yet destroyed",
           "{}: context handle {} is not a live context (destroyed, or not made by shmem_ctx_create)", api,
           static_cast<const void*>(ctx));
  return *ctx;
}


int create_context(in::TeamData* team, long options, shmem_ctx_t* ctx, const char* api) {
  CM_CHECK(ctx != nullptr, "pass the address of a shmem_ctx_t", "{}: ctx is NULL", api);
  *ctx = SHMEM_CTX_INVALID;
  in::state(api);
  constexpr long known = SHMEM_CTX_SERIALIZED | SHMEM_CTX_PRIVATE | SHMEM_CTX_NOSTORE;
  if ((options & ~known) != 0) {  // a failed creation: nonzero, which the program checks
    std::fprintf(stderr, "%s: unknown option bits %#lx (returning nonzero); pass options made of "
                 "SHMEM_CTX_SERIALIZED, SHMEM_CTX_PRIVATE and SHMEM_CTX_NOSTORE\n", api, options & ~known);
    return 1;
  }
  std::lock_guard lock(g_slots_mutex);
  for (size_t tried = 0; tried < kMaxContexts; ++tried) {
    cm_shmem_ctx& slot = g_slots[g_next_slot];
    g_next_slot = (g_next_slot + 1) % kMaxContexts;
    if (slot.state.load(std::memory_order_relaxed) != Slot::free) continue;
    slot.team = team, slot.options = options;
    slot.state.store(Slot::live, std::memory_order_release);
    *ctx = &slot;
    return 0;
  }
  std::fprintf(stderr, "%s: all %zu contexts are in use (returning nonzero); destroy contexts no longer needed\n",
               api, kMaxContexts);
  return 1;
}

// The world PE of `pe` on `ctx`.
int world_pe(shmem_ctx_t ctx, int pe, const char* api) {
  if (ctx == SHMEM_CTX_DEFAULT) return pe;
  CM_C_API(api, {
    const in::TeamData* team = live_context(ctx, api).team;
    if (team == nullptr) return pe;
    CM_CHECK(pe >= 0 && pe < team->size(), "a team context's PE numbers are team-relative",
             "{}: PE {} is not in {} ({} PEs)", api, pe, team->label, team->size());
    return team->world_pe(pe);
  });
}
}  // namespace

namespace coremesh::shmem::capi {
void orphan_contexts(const internal::TeamData* team) {
  std::lock_guard lock(g_slots_mutex);
  for (cm_shmem_ctx& slot : g_slots) {
    if (team == nullptr) slot.state.store(Slot::free, std::memory_order_release);
    else if (slot.team == team && slot.state.load(std::memory_order_relaxed) == Slot::live)
      slot.state.store(Slot::orphan, std::memory_order_release);
  }
}
}  // namespace coremesh::shmem::capi

extern "C" {

int shmem_ctx_create(long options, shmem_ctx_t* ctx) {
  CM_C_API("shmem_ctx_create", return create_context(nullptr, options, ctx, "shmem_ctx_create"));
}
int shmem_team_create_ctx(shmem_team_t team, long options, shmem_ctx_t* ctx) {
  if (team == SHMEM_TEAM_INVALID) {
    if (ctx) *ctx = SHMEM_CTX_INVALID;
    return 1;
  }
  CM_C_API("shmem_team_create_ctx", {
    in::TeamData* t = coremesh::shmem::capi::team(team, "shmem_team_create_ctx");
    return create_context(t == &in::state().world ? nullptr : t, options, ctx, "shmem_team_create_ctx");
  });
}
int shmem_ctx_get_team(shmem_ctx_t ctx, shmem_team_t* team) {
  if (ctx == SHMEM_CTX_INVALID) {
    *team = SHMEM_TEAM_INVALID;
    return 1;
  }
  CM_C_API("shmem_ctx_get_team", {
    const in::TeamData* t = ctx == SHMEM_CTX_DEFAULT ? nullptr : live_context(ctx, "shmem_ctx_get_team").team;
    *team = t == nullptr ? SHMEM_TEAM_WORLD : coremesh::shmem::capi::handle(const_cast<in::TeamData*>(t));
    return 0;
  });
}
void shmem_ctx_destroy(shmem_ctx_t ctx) {
  if (ctx == SHMEM_CTX_INVALID || ctx == SHMEM_CTX_DEFAULT) return;
  CM_C_API("shmem_ctx_destroy", {
    in::quiet();  // destroying a context completes its operations
    std::lock_guard lock(g_slots_mutex);
    Slot state = is_slot(ctx) ? ctx->state.load(std::memory_order_relaxed) : Slot::free;
    CM_CHECK(state != Slot::free, "destroy each context once, and only contexts made by shmem_ctx_create",
             "shmem_ctx_destroy: context handle {} is not a live context (destroyed, or not made by "
             "shmem_ctx_create)", static_cast<const void*>(ctx));
    ctx->state.store(Slot::free, std::memory_order_release);
  });
}
void shmem_ctx_fence(shmem_ctx_t ctx) {
  if (ctx == SHMEM_CTX_INVALID) return;
  CM_C_API("shmem_ctx_fence", {
    if (ctx != SHMEM_CTX_DEFAULT) live_context(ctx, "shmem_ctx_fence");
    in::fence();
  });
}
void shmem_ctx_quiet(shmem_ctx_t ctx) {
  if (ctx == SHMEM_CTX_INVALID) return;
  CM_C_API("shmem_ctx_quiet", {
    if (ctx != SHMEM_CTX_DEFAULT) live_context(ctx, "shmem_ctx_quiet");
    in::quiet();
  });
}

#define CM_CTX_PE(NAME) world_pe(ctx, pe, "shmem_ctx_" NAME)
#define CM_DEF_CTX_RMA(T, N)                                                                   \
  void shmem_ctx_##N##_put(shmem_ctx_t ctx, T* d, const T* s, size_t n, int pe) {              \
    shmem_##N##_put(d, s, n, CM_CTX_PE(#N "_put"));                                            \
  }                                                                                            \
  void shmem_ctx_##N##_get(shmem_ctx_t ctx, T* d, const T* s, size_t n, int pe) {              \
    shmem_##N##_get(d, s, n, CM_CTX_PE(#N "_get"));                                            \
  }                                                                                            \
  void shmem_ctx_##N##_put_nbi(shmem_ctx_t ctx, T* d, const T* s, size_t n, int pe) {          \
    shmem_##N##_put_nbi(d, s, n, CM_CTX_PE(#N "_put_nbi"));                                    \
  }                                                                                            \
  void shmem_ctx_##N##_get_nbi(shmem_ctx_t ctx, T* d, const T* s, size_t n, int pe) {          \
    shmem_##N##_get_nbi(d, s, n, CM_CTX_PE(#N "_get_nbi"));                                    \
  }                                                                                            \
  void shmem_ctx_##N##_p(shmem_ctx_t ctx, T* d, T v, int pe) {                                 \
    shmem_##N##_p(d, v, CM_CTX_PE(#N "_p"));                                                   \
  }                                                                                            \
  T shmem_ctx_##N##_g(shmem_ctx_t ctx, const T* s, int pe) {                                   \
    return shmem_##N##_g(s, CM_CTX_PE(#N "_g"));                                              \
  }                                                                                            \
  void shmem_ctx_##N##_iput(shmem_ctx_t ctx, T* d, const T* s, ptrdiff_t dst, ptrdiff_t sst,   \
                            size_t n, int pe) {                                                \
    shmem_##N##_iput(d, s, dst, sst, n, CM_CTX_PE(#N "_iput"));                                \
  }                                                                                            \
  void shmem_ctx_##N##_iget(shmem_ctx_t ctx, T* d, const T* s, ptrdiff_t dst, ptrdiff_t sst,   \
                            size_t n, int pe) {                                                \
    shmem_##N##_iget(d, s, dst, sst, n, CM_CTX_PE(#N "_iget"));                                \
  }                                                                                            \
  void shmem_ctx_##N##_put_signal(shmem_ctx_t ctx, T* d, const T* s, size_t n, uint64_t* sig,  \
                                  uint64_t v, int op, int pe) {                                \
    shmem_##N##_put_signal(d, s, n, sig, v, op, CM_CTX_PE(#N "_put_signal"));                  \
  }                                                                                            \
  void shmem_ctx_##N##_put_signal_nbi(shmem_ctx_t ctx, T* d, const T* s, size_t n,             \
                                      uint64_t* sig, uint64_t v, int op, int pe) {             \
    shmem_##N##_put_signal_nbi(d, s, n, sig, v, op, CM_CTX_PE(#N "_put_signal_nbi"));          \
  }
CM_SHMEM_RMA_TYPES(CM_DEF_CTX_RMA)

#define CM_DEF_CTX_SIZED(S)                                                                    \
  void shmem_ctx_put##S(shmem_ctx_t ctx, void* d, const void* s, size_t n, int pe) {           \
    shmem_put##S(d, s, n, CM_CTX_PE("put" #S));                                                \
  }                                                                                            \
  void shmem_ctx_get##S(shmem_ctx_t ctx, void* d, const void* s, size_t n, int pe) {           \
    shmem_get##S(d, s, n, CM_CTX_PE("get" #S));                                                \
  }                                                                                            \
  void shmem_ctx_put##S##_nbi(shmem_ctx_t ctx, void* d, const void* s, size_t n, int pe) {     \
    shmem_put##S##_nbi(d, s, n, CM_CTX_PE("put" #S "_nbi"));                                   \
  }                                                                                            \
  void shmem_ctx_get##S##_nbi(shmem_ctx_t ctx, void* d, const void* s, size_t n, int pe) {     \
    shmem_get##S##_nbi(d, s, n, CM_CTX_PE("get" #S "_nbi"));                                   \
  }                                                                                            \
  void shmem_ctx_iput##S(shmem_ctx_t ctx, void* d, const void* s, ptrdiff_t dst,               \
                         ptrdiff_t sst, size_t n, int pe) {                                    \
    shmem_iput##S(d, s, dst, sst, n, CM_CTX_PE("iput" #S));                                    \
  }                                                                                            \
  void shmem_ctx_iget##S(shmem_ctx_t ctx, void* d, const void* s, ptrdiff_t dst,               \
                         ptrdiff_t sst, size_t n, int pe) {                                    \
    shmem_iget##S(d, s, dst, sst, n, CM_CTX_PE("iget" #S));                                    \
  }                                                                                            \
  void shmem_ctx_put##S##_signal(shmem_ctx_t ctx, void* d, const void* s, size_t n,            \
                                 uint64_t* sig, uint64_t v, int op, int pe) {                  \
    shmem_put##S##_signal(d, s, n, sig, v, op, CM_CTX_PE("put" #S "_signal"));                 \
  }                                                                                            \
  void shmem_ctx_put##S##_signal_nbi(shmem_ctx_t ctx, void* d, const void* s, size_t n,        \
                                     uint64_t* sig, uint64_t v, int op, int pe) {              \
    shmem_put##S##_signal_nbi(d, s, n, sig, v, op, CM_CTX_PE("put" #S "_signal_nbi"));         \
  }
CM_SHMEM_SIZES(CM_DEF_CTX_SIZED)

void shmem_ctx_putmem(shmem_ctx_t ctx, void* d, const void* s, size_t n, int pe) {
  shmem_putmem(d, s, n, CM_CTX_PE("putmem"));
}
void shmem_ctx_getmem(shmem_ctx_t ctx, void* d, const void* s, size_t n, int pe) {
  shmem_getmem(d, s, n, CM_CTX_PE("getmem"));
}
void shmem_ctx_putmem_nbi(shmem_ctx_t ctx, void* d, const void* s, size_t n, int pe) {
  shmem_putmem_nbi(d, s, n, CM_CTX_PE("putmem_nbi"));
}
void shmem_ctx_getmem_nbi(shmem_ctx_t ctx, void* d, const void* s, size_t n, int pe) {
  shmem_getmem_nbi(d, s, n, CM_CTX_PE("getmem_nbi"));
}
void shmem_ctx_putmem_signal(shmem_ctx_t ctx, void* d, const void* s, size_t n, uint64_t* sig,
                             uint64_t v, int op, int pe) {
  shmem_putmem_signal(d, s, n, sig, v, op, CM_CTX_PE("putmem_signal"));
}
void shmem_ctx_putmem_signal_nbi(shmem_ctx_t ctx, void* d, const void* s, size_t n,
                                 uint64_t* sig, uint64_t v, int op, int pe) {
  shmem_putmem_signal_nbi(d, s, n, sig, v, op, CM_CTX_PE("putmem_signal_nbi"));
}

#define CM_DEF_CTX_AMO_EXT(T, N)                                                               \
  T shmem_ctx_##N##_atomic_fetch(shmem_ctx_t ctx, const T* s, int pe) {                        \
    return shmem_##N##_atomic_fetch(s, CM_CTX_PE(#N "_atomic_fetch"));                         \
  }                                                                                            \
  void shmem_ctx_##N##_atomic_fetch_nbi(shmem_ctx_t ctx, T* f, const T* s, int pe) {           \
    shmem_##N##_atomic_fetch_nbi(f, s, CM_CTX_PE(#N "_atomic_fetch_nbi"));                     \
  }                                                                                            \
  void shmem_ctx_##N##_atomic_set(shmem_ctx_t ctx, T* d, T v, int pe) {                        \
    shmem_##N##_atomic_set(d, v, CM_CTX_PE(#N "_atomic_set"));                                 \
  }                                                                                            \
  T shmem_ctx_##N##_atomic_swap(shmem_ctx_t ctx, T* d, T v, int pe) {                          \
    return shmem_##N##_atomic_swap(d, v, CM_CTX_PE(#N "_atomic_swap"));                        \
  }                                                                                            \
  void shmem_ctx_##N##_atomic_swap_nbi(shmem_ctx_t ctx, T* f, T* d, T v, int pe) {             \
    shmem_##N##_atomic_swap_nbi(f, d, v, CM_CTX_PE(#N "_atomic_swap_nbi"));                    \
  }
#define CM_DEF_CTX_AMO_STD(T, N)                                                               \
  CM_DEF_CTX_AMO_EXT(T, N)                                                                     \
  T shmem_ctx_##N##_atomic_compare_swap(shmem_ctx_t ctx, T* d, T c, T v, int pe) {             \
    return shmem_##N##_atomic_compare_swap(d, c, v, CM_CTX_PE(#N "_atomic_compare_swap"));     \
  }                                                                                            \
  void shmem_ctx_##N##_atomic_compare_swap_nbi(shmem_ctx_t ctx, T* f, T* d, T c, T v, int pe) { \
    shmem_##N##_atomic_compare_swap_nbi(f, d, c, v, CM_CTX_PE(#N "_atomic_compare_swap_nbi")); \
  }                                                                                            \
  T shmem_ctx_##N##_atomic_fetch_inc(shmem_ctx_t ctx, T* d, int pe) {                          \
    return shmem_##N##_atomic_fetch_inc(d, CM_CTX_PE(#N "_atomic_fetch_inc"));                 \
  }                                                                                            \
  void shmem_ctx_##N##_atomic_fetch_inc_nbi(shmem_ctx_t ctx, T* f, T* d, int pe) {             \
    shmem_##N##_atomic_fetch_inc_nbi(f, d, CM_CTX_PE(#N "_atomic_fetch_inc_nbi"));             \
  }                                                                                            \
  void shmem_ctx_##N##_atomic_inc(shmem_ctx_t ctx, T* d, int pe) {                             \
    shmem_##N##_atomic_inc(d, CM_CTX_PE(#N "_atomic_inc"));                                    \
  }                                                                                            \
  T shmem_ctx_##N##_atomic_fetch_add(shmem_ctx_t ctx, T* d, T v, int pe) {                     \
    return shmem_##N##_atomic_fetch_add(d, v, CM_CTX_PE(#N "_atomic_fetch_add"));             \
  }                                                                                            \
  void shmem_ctx_##N##_atomic_fetch_add_nbi(shmem_ctx_t ctx, T* f, T* d, T v, int pe) {        \
    shmem_##N##_atomic_fetch_add_nbi(f, d, v, CM_CTX_PE(#N "_atomic_fetch_add_nbi"));          \
  }                                                                                            \
  void shmem_ctx_##N##_atomic_add(shmem_ctx_t ctx, T* d, T v, int pe) {                        \
    shmem_##N##_atomic_add(d, v, CM_CTX_PE(#N "_atomic_add"));                                 \
  }
#define CM_DEF_CTX_AMO_BITWISE_OP(T, N, OP)                                                    \
  T shmem_ctx_##N##_atomic_fetch_##OP(shmem_ctx_t ctx, T* d, T v, int pe) {                    \
    return shmem_##N##_atomic_fetch_##OP(d, v, CM_CTX_PE(#N "_atomic_fetch_" #OP));           \
  }                                                                                            \
  void shmem_ctx_##N##_atomic_fetch_##OP##_nbi(shmem_ctx_t ctx, T* f, T* d, T v, int pe) {     \
    shmem_##N##_atomic_fetch_##OP##_nbi(f, d, v, CM_CTX_PE(#N "_atomic_fetch_" #OP "_nbi"));   \
  }                                                                                            \
  void shmem_ctx_##N##_atomic_##OP(shmem_ctx_t ctx, T* d, T v, int pe) {                       \
    shmem_##N##_atomic_##OP(d, v, CM_CTX_PE(#N "_atomic_" #OP));                               \
  }
#define CM_DEF_CTX_AMO_BITWISE(T, N)                                                           \
  CM_DEF_CTX_AMO_BITWISE_OP(T, N, and)                                                         \
  CM_DEF_CTX_AMO_BITWISE_OP(T, N, or) CM_DEF_CTX_AMO_BITWISE_OP(T, N, xor)
CM_SHMEM_AMO_STD_TYPES(CM_DEF_CTX_AMO_STD)
CM_SHMEM_AMO_EXT_ONLY_TYPES(CM_DEF_CTX_AMO_EXT)
CM_SHMEM_AMO_BITWISE_TYPES(CM_DEF_CTX_AMO_BITWISE)

}  // extern "C"
