// C API: team collectives and reductions (from the type tables).
#include "c_api.hpp"
#include "reduce.hpp"

namespace in = coremesh::shmem::internal;
using coremesh::shmem::capi::team;
using K = in::ReduceKind;

namespace {
in::Group group(shmem_team_t t, const char* api) { return in::team_group(*team(t, api), api); }

template <typename T, K Kind>
int team_reduce(shmem_team_t t, T* dest, const T* source, size_t n, const char* api) {
  CM_C_API(api, {
    in::reduce<T, Kind>(group(t, api), dest, source, n, false, api);
    return 0;
  });
}
}  // namespace

extern "C" {

void shmem_barrier_all(void) {
  CM_C_API("shmem_barrier_all", {
    in::quiet();
    in::group_sync(group(SHMEM_TEAM_WORLD, "shmem_barrier_all"), "shmem_barrier_all");
  });
}
void shmem_sync_all(void) {
  CM_C_API("shmem_sync_all",
           in::group_sync(group(SHMEM_TEAM_WORLD, "shmem_sync_all"), "shmem_sync_all"));
}
int shmem_team_sync(shmem_team_t t) {
  CM_C_API("shmem_team_sync", {
    in::group_sync(group(t, "shmem_team_sync"), "shmem_team_sync");
    return 0;
  });
}

int shmem_broadcastmem(shmem_team_t t, void* dest, const void* source, size_t nelems, int root) {
  CM_C_API("shmem_broadcastmem", {
    in::broadcast(group(t, "shmem_broadcastmem"), dest, source, nelems, root, true, "shmem_broadcastmem");
    return 0;
  });
}
int shmem_collectmem(shmem_team_t t, void* dest, const void* source, size_t nelems) {
  CM_C_API("shmem_collectmem", {
    in::collect(group(t, "shmem_collectmem"), dest, source, nelems, "shmem_collectmem");
    return 0;
  });
}
int shmem_fcollectmem(shmem_team_t t, void* dest, const void* source, size_t nelems) {
  CM_C_API("shmem_fcollectmem", {
    in::fcollect(group(t, "shmem_fcollectmem"), dest, source, nelems, "shmem_fcollectmem");
    return 0;
  });
}
int shmem_alltoallmem(shmem_team_t t, void* dest, const void* source, size_t nelems) {
  CM_C_API("shmem_alltoallmem", {
    in::alltoall(group(t, "shmem_alltoallmem"), dest, source, nelems, "shmem_alltoallmem");
    return 0;
  });
}
int shmem_alltoallsmem(shmem_team_t t, void* dest, const void* source, ptrdiff_t dst,
                       ptrdiff_t sst, size_t nelems) {
  CM_C_API("shmem_alltoallsmem", {
    in::alltoalls(group(t, "shmem_alltoallsmem"), dest, source, dst, sst, nelems, 1, "shmem_alltoallsmem");
    return 0;
  });
}

#define CM_DEF_COLL(T, N)                                                                      \
  int shmem_##N##_broadcast(shmem_team_t t, T* dest, const T* source, size_t nelems, int root) { \
    CM_C_API("shmem_" #N "_broadcast", {                                                       \
      in::broadcast(group(t, "shmem_broadcast"), dest, source, in::array_bytes(nelems, sizeof(T)), root, true, \
                    "shmem_" #N "_broadcast");                                                 \
      return 0;                                                                                \
    });                                                                                        \
  }                                                                                            \
  int shmem_##N##_collect(shmem_team_t t, T* dest, const T* source, size_t nelems) {           \
    CM_C_API("shmem_" #N "_collect", {                                                         \
      in::collect(group(t, "shmem_collect"), dest, source, in::array_bytes(nelems, sizeof(T)), "shmem_" #N "_collect"); \
      return 0;                                                                                \
    });                                                                                        \
  }                                                                                            \
  int shmem_##N##_fcollect(shmem_team_t t, T* dest, const T* source, size_t nelems) {          \
    CM_C_API("shmem_" #N "_fcollect", {                                                        \
      in::fcollect(group(t, "shmem_fcollect"), dest, source, in::array_bytes(nelems, sizeof(T)), "shmem_" #N "_fcollect"); \
      return 0;                                                                                \
    });                                                                                        \
  }                                                                                            \
  int shmem_##N##_alltoall(shmem_team_t t, T* dest, const T* source, size_t nelems) {          \
    CM_C_API("shmem_" #N "_alltoall", {                                                        \
      in::alltoall(group(t, "shmem_alltoall"), dest, source, in::array_bytes(nelems, sizeof(T)), "shmem_" #N "_alltoall"); \
      return 0;                                                                                \
    });                                                                                        \
  }                                                                                            \
  int shmem_##N##_alltoalls(shmem_team_t t, T* dest, const T* source, ptrdiff_t dst,          \
                            ptrdiff_t sst, size_t nelems) {                                    \
    CM_C_API("shmem_" #N "_alltoalls", {                                                       \
      in::alltoalls(group(t, "shmem_alltoalls"), dest, source, dst, sst, nelems, sizeof(T),    \
                    "shmem_" #N "_alltoalls");                                                 \
      return 0;                                                                                \
    });                                                                                        \
  }
CM_SHMEM_RMA_TYPES(CM_DEF_COLL)

#define CM_DEF_REDUCE(T, N, OP, KIND)                                                          \
  int shmem_##N##_##OP##_reduce(shmem_team_t t, T* dest, const T* source, size_t nreduce) {    \
    return team_reduce<T, K::KIND>(t, dest, source, nreduce, "shmem_" #N "_" #OP "_reduce");   \
  }
#define CM_DEF_REDUCE_BITWISE(T, N) \
  CM_DEF_REDUCE(T, N, and, band) CM_DEF_REDUCE(T, N, or, bor) CM_DEF_REDUCE(T, N, xor, bxor)
#define CM_DEF_REDUCE_MINMAX(T, N) CM_DEF_REDUCE(T, N, max, max) CM_DEF_REDUCE(T, N, min, min)
#define CM_DEF_REDUCE_ARITH(T, N) CM_DEF_REDUCE(T, N, sum, sum) CM_DEF_REDUCE(T, N, prod, prod)
CM_SHMEM_REDUCE_BITWISE_TYPES(CM_DEF_REDUCE_BITWISE)
CM_SHMEM_REDUCE_MINMAX_TYPES(CM_DEF_REDUCE_MINMAX)
CM_SHMEM_REDUCE_MINMAX_TYPES(CM_DEF_REDUCE_ARITH)
CM_SHMEM_REDUCE_COMPLEX_TYPES(CM_DEF_REDUCE_ARITH)

}  // extern "C"
