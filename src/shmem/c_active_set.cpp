// C API: the deprecated active-set collectives (PE_start, logPE_stride,
// PE_size, pSync). The user's pSync array is the group's SyncArea.
#include "c_api.hpp"
#include "reduce.hpp"

namespace in = coremesh::shmem::internal;
using K = in::ReduceKind;

namespace {
// Runs `op` over the active set, then puts this PE's pSync back at
// SHMEM_SYNC_VALUE (9.9: on completion it holds its original contents).
template <typename Op>
void on_active_set(int start, int log_stride, int size, long* psync, const char* api, Op op) {
  const in::Group g = in::active_set_group(start, log_stride, size, psync, api);
  op(g);
  in::restore_sync_area(g);
}
template <typename T, K Kind>
void to_all(T* dest, const T* source, int nreduce, int start, int log_stride, int size,
            long* psync, const char* api) {
  CM_C_API(api, {
    CM_CHECK(nreduce >= 0, "nreduce counts elements", "{}: nreduce {} < 0", api, nreduce);
    on_active_set(start, log_stride, size, psync, api, [&](const in::Group& g) {
      in::reduce<T, Kind>(g, dest, source, static_cast<size_t>(nreduce), false, api);
    });
  });
}
}  // namespace

extern "C" {

void shmem_barrier(int start, int log_stride, int size, long* psync) {
  CM_C_API("shmem_barrier", {
    in::quiet();
    on_active_set(start, log_stride, size, psync, "shmem_barrier",
                  [](const in::Group& g) { in::group_sync(g, "shmem_barrier"); });
  });
}
void shmem_sync(int start, int log_stride, int size, long* psync) {
  CM_C_API("shmem_sync", on_active_set(start, log_stride, size, psync, "shmem_sync",
                                       [](const in::Group& g) { in::group_sync(g, "shmem_sync"); }));
}

// The root's dest is not written in the active-set broadcast.
#define CM_DEF_ACTIVE_SET(S)                                                                   \
  void shmem_broadcast##S(void* dest, const void* source, size_t nelems, int root, int start,  \
                          int log_stride, int size, long* psync) {                             \
    const char* api = "shmem_broadcast" #S;                                                    \
    CM_C_API(api, on_active_set(start, log_stride, size, psync, api, [&](const in::Group& g) { \
               in::broadcast(g, dest, source, in::array_bytes(nelems, S / 8), root, false, api); \
             }));                                                                              \
  }                                                                                            \
  void shmem_collect##S(void* dest, const void* source, size_t nelems, int start,             \
                        int log_stride, int size, long* psync) {                               \
    const char* api = "shmem_collect" #S;                                                      \
    CM_C_API(api, on_active_set(start, log_stride, size, psync, api, [&](const in::Group& g) { \
               in::collect(g, dest, source, in::array_bytes(nelems, S / 8), api);              \
             }));                                                                              \
  }                                                                                            \
  void shmem_fcollect##S(void* dest, const void* source, size_t nelems, int start,            \
                         int log_stride, int size, long* psync) {                              \
    const char* api = "shmem_fcollect" #S;                                                     \
    CM_C_API(api, on_active_set(start, log_stride, size, psync, api, [&](const in::Group& g) { \
               in::fcollect(g, dest, source, in::array_bytes(nelems, S / 8), api);             \
             }));                                                                              \
  }                                                                                            \
  void shmem_alltoall##S(void* dest, const void* source, size_t nelems, int start,            \
                         int log_stride, int size, long* psync) {                              \
    const char* api = "shmem_alltoall" #S;                                                     \
    CM_C_API(api, on_active_set(start, log_stride, size, psync, api, [&](const in::Group& g) { \
               in::alltoall(g, dest, source, in::array_bytes(nelems, S / 8), api);             \
             }));                                                                              \
  }                                                                                            \
  void shmem_alltoalls##S(void* dest, const void* source, ptrdiff_t dst, ptrdiff_t sst,        \
                          size_t nelems, int start, int log_stride, int size, long* psync) {   \
    const char* api = "shmem_alltoalls" #S;                                                    \
    CM_C_API(api, on_active_set(start, log_stride, size, psync, api, [&](const in::Group& g) { \
               in::alltoalls(g, dest, source, dst, sst, nelems, S / 8, api);                   \
             }));                                                                              \
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
