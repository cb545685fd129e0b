// C API: the deprecated active-set collectives (PE_start, logPE_stride,
// PE_size, pSync). The user's pSync array is the group's SyncArea.
#include "c_api.hpp"
#include "reduce.hpp"

namespace in = coremesh::shmem::internal;
using K = in::ReduceKind;

namespace {
in::Group active_set(int start, int log_stride, int size, long* psync, const char* api) {
  return in::active_set_group(start, log_stride, size, psync, api);
}
template <typename T, K Kind>
void to_all(T* dest, const T* source, int nreduce, int start, int log_stride, int size,
            long* psync, const char* api) {
  CM_C_API(api, {
    CM_CHECK(nreduce >= 0, "nreduce counts elements", "{}: nreduce {} < 0", api, nreduce);
    in::reduce<T, Kind>(active_set(start, log_stride, size, psync, api), dest, source,
                        static_cast<size_t>(nreduce), false, api);
  });
}
}  // namespace

extern "C" {

void shmem_barrier(int start, int log_stride, int size, long* psync) {
  CM_C_API("shmem_barrier", {
    in::quiet();
    in::group_sync(active_set(start, log_stride, size, psync, "shmem_barrier"), "shmem_barrier");
  });
}
void shmem_sync(int start, int log_stride, int size, long* psync) {
  CM_C_API("shmem_sync",
           in::group_sync(active_set(start, log_stride, size, psync, "shmem_sync"), "shmem_sync"));
}

// The root's dest is not written in the active-set broadcast.
#define CM_DEF_ACTIVE_SET(S)                                                                   \
  void shmem_broadcast##S(void* dest, const void* source, size_t nelems, int root, int start,  \
                          int log_stride, int size, long* psync) {                             \
    CM_C_API("shmem_broadcast" #S,                                                             \
             in::broadcast(active_set(start, log_stride, size, psync, "shmem_broadcast" #S),   \
                           dest, source, in::array_bytes(nelems, S / 8), root, false, "shmem_broadcast" #S)); \
  }                                                                                            \
  void shmem_collect##S(void* dest, const void* source, size_t nelems, int start,             \
                        int log_stride, int size, long* psync) {                               \
    CM_C_API("shmem_collect" #S,                                                               \
             in::collect(active_set(start, log_stride, size, psync, "shmem_collect" #S), dest, \
                         source, in::array_bytes(nelems, S / 8), "shmem_collect" #S));                       \
  }                                                                                            \
  void shmem_fcollect##S(void* dest, const void* source, size_t nelems, int start,            \
                         int log_stride, int size, long* psync) {                              \
    CM_C_API("shmem_fcollect" #S,                                                              \
             in::fcollect(active_set(start, log_stride, size, psync, "shmem_fcollect" #S),     \
                          dest, source, in::array_bytes(nelems, S / 8), "shmem_fcollect" #S));               \
  }                                                                                            \
  void shmem_alltoall##S(void* dest, const void* source, size_t nelems, int start,            \
                         int log_stride, int size, long* psync) {                              \
    CM_C_API("shmem_alltoall" #S,                                                              \
             in::alltoall(active_set(start, log_stride, size, psync, "shmem_alltoall" #S),     \
                          dest, source, in::array_bytes(nelems, S / 8), "shmem_alltoall" #S));               \
  }                                                                                            \
  void shmem_alltoalls##S(void* dest, const void* source, ptrdiff_t dst, ptrdiff_t sst,        \
                          size_t nelems, int start, int log_stride, int size, long* psync) {   \
    CM_C_API("shmem_alltoalls" #S,                                                             \
             in::alltoalls(active_set(start, log_stride, size, psync, "shmem_alltoalls" #S),   \
                           dest, source, dst, sst, nelems, S / 8, "shmem_alltoalls" #S));      \
  }
CM_DEF_ACTIVE_SET(32)
CM_DEF_ACTIVE_SET(64)

#define CM_DEF_TO_ALL(T, N, OP, KIND)                                                          \
  void shmem_##N##_##OP##_to_all(T* dest, const T* source, int nreduce, int start,             \
                                 int log_stride, int size, T*, long* psync) {                  \
    to_all<T, K::KIND>(dest, source, nreduce, start, log_stride, size, psync,                  \
                       "shmem_" #N "_" #OP "_to_all");                                         \
  }
#define CM_DEF_TO_ALL_BITWISE(T, N) \
  CM_DEF_TO_ALL(T, N, and, band) CM_DEF_TO_ALL(T, N, or, bor) CM_DEF_TO_ALL(T, N, xor, bxor)
#define CM_DEF_TO_ALL_MINMAX(T, N) CM_DEF_TO_ALL(T, N, max, max) CM_DEF_TO_ALL(T, N, min, min)
#define CM_DEF_TO_ALL_ARITH(T, N) CM_DEF_TO_ALL(T, N, sum, sum) CM_DEF_TO_ALL(T, N, prod, prod)
CM_SHMEM_TOALL_BITWISE_TYPES(CM_DEF_TO_ALL_BITWISE)
CM_SHMEM_TOALL_MINMAX_TYPES(CM_DEF_TO_ALL_MINMAX)
CM_SHMEM_TOALL_MINMAX_TYPES(CM_DEF_TO_ALL_ARITH)
CM_SHMEM_REDUCE_COMPLEX_TYPES(CM_DEF_TO_ALL_ARITH)

}  // extern "C"
