// C API: names deprecated by OpenSHMEM 1.2-1.4 that programs and test
// suites still call, each a thin alias of its current form (cache
// management has nothing to do on a cache-coherent machine).
#include "c_api.hpp"

extern "C" {

void start_pes(int) { shmem_init(); }
void* shmalloc(size_t size) { return shmem_malloc(size); }
void shfree(void* ptr) { shmem_free(ptr); }
void* shrealloc(void* ptr, size_t size) { return shmem_realloc(ptr, size); }
void* shmemalign(size_t alignment, size_t size) { return shmem_align(alignment, size); }
void shmem_clear_cache_inv(void) {}
void shmem_set_cache_inv(void) {}
void shmem_clear_cache_line_inv(void*) {}
void shmem_set_cache_line_inv(void*) {}
void shmem_udcflush(void) {}
void shmem_udcflush_line(void*) {}

#define CM_DEF_OLD_AMO_EXT(T, N)                                                               \
  T shmem_##N##_swap(T* d, T v, int pe) { return shmem_##N##_atomic_swap(d, v, pe); }           \
  T shmem_##N##_fetch(const T* s, int pe) { return shmem_##N##_atomic_fetch(s, pe); }           \
  void shmem_##N##_set(T* d, T v, int pe) { shmem_##N##_atomic_set(d, v, pe); }
#define CM_DEF_OLD_AMO(T, N)                                                                   \
  CM_DEF_OLD_AMO_EXT(T, N)                                                                     \
  T shmem_##N##_cswap(T* d, T c, T v, int pe) { return shmem_##N##_atomic_compare_swap(d, c, v, pe); } \
  T shmem_##N##_finc(T* d, int pe) { return shmem_##N##_atomic_fetch_inc(d, pe); }              \
  void shmem_##N##_inc(T* d, int pe) { shmem_##N##_atomic_inc(d, pe); }                        \
  T shmem_##N##_fadd(T* d, T v, int pe) { return shmem_##N##_atomic_fetch_add(d, v, pe); }      \
  void shmem_##N##_add(T* d, T v, int pe) { shmem_##N##_atomic_add(d, v, pe); }
CM_SHMEM_OLD_AMO_TYPES(CM_DEF_OLD_AMO)
CM_SHMEM_AMO_EXT_ONLY_TYPES(CM_DEF_OLD_AMO_EXT)

#define CM_DEF_OLD_WAIT(T, N) \
  void shmem_##N##_wait(T* ivar, T v) { shmem_##N##_wait_until(ivar, SHMEM_CMP_NE, v); }
CM_SHMEM_OLD_WAIT_TYPES(CM_DEF_OLD_WAIT)
void shmem_wait(long* ivar, long v) { shmem_long_wait_until(ivar, SHMEM_CMP_NE, v); }

}  // extern "C"
