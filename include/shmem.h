/* shmem.h -- the OpenSHMEM 1.5 C API of coremesh.
 *
 * Existing OpenSHMEM C programs compile against this header and run under
 * the coremesh launcher:
 *
 *   coremesh-cc prog.c -o prog        (see docs/shmem.md)
 *   coremesh run -n 4 ./prog
 *
 * Symmetric objects are the ones allocated with shmem_malloc & co. and the
 * program's global and static variables (an RMA on anything else is an
 * error that names the address). Errors in the C API print a message with
 * file:line and a hint and end the PE with status 1 (the launcher then stops
 * the job and names the PE).
 *
 * Every typed routine is declared from the type tables in
 * coremesh/shmem/c_type_tables.h; nothing is written out type by type.
 * Contexts (shmem_ctx_create, shmem_team_create_ctx) order and complete
 * their own operations as the default context does; a team context's PE
 * numbers are team-relative. shmem_pcontrol accepts every level and does
 * nothing (no profiling interface is attached). */
#ifndef COREMESH_SHMEM_H
#define COREMESH_SHMEM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
#include <complex>
typedef std::complex<double> cm_shmem_complexd;
typedef std::complex<float> cm_shmem_complexf;
extern "C" {
#else
typedef double _Complex cm_shmem_complexd;
typedef float _Complex cm_shmem_complexf;
#endif

#include "coremesh/shmem/c_type_tables.h"

/* ---- library constants ------------------------------------------------ */
#define SHMEM_MAJOR_VERSION 1
#define SHMEM_MINOR_VERSION 5
#define _SHMEM_MAJOR_VERSION SHMEM_MAJOR_VERSION
#define _SHMEM_MINOR_VERSION SHMEM_MINOR_VERSION
#define SHMEM_MAX_NAME_LEN 256
#define _SHMEM_MAX_NAME_LEN SHMEM_MAX_NAME_LEN
#define SHMEM_VENDOR_STRING "coremesh 0.1"
#define _SHMEM_VENDOR_STRING SHMEM_VENDOR_STRING

#define SHMEM_THREAD_SINGLE 0
#define SHMEM_THREAD_FUNNELED 1
#define SHMEM_THREAD_SERIALIZED 2
#define SHMEM_THREAD_MULTIPLE 3

#define SHMEM_CMP_EQ 0
#define SHMEM_CMP_NE 1
#define SHMEM_CMP_GT 2
#define SHMEM_CMP_GE 3
#define SHMEM_CMP_LT 4
#define SHMEM_CMP_LE 5
#define _SHMEM_CMP_EQ SHMEM_CMP_EQ
#define _SHMEM_CMP_NE SHMEM_CMP_NE
#define _SHMEM_CMP_GT SHMEM_CMP_GT
#define _SHMEM_CMP_GE SHMEM_CMP_GE
#define _SHMEM_CMP_LT SHMEM_CMP_LT
#define _SHMEM_CMP_LE SHMEM_CMP_LE

#define SHMEM_SIGNAL_SET 0
#define SHMEM_SIGNAL_ADD 1

#define SHMEM_MALLOC_ATOMICS_REMOTE (1L << 0)
#define SHMEM_MALLOC_SIGNAL_REMOTE (1L << 1)

/* pSync / pWrk sizes of the deprecated active-set routines (in longs /
 * elements). One synchronisation area is 32 longs. */
#define SHMEM_SYNC_VALUE 0L
#define SHMEM_SYNC_SIZE 32
#define SHMEM_BARRIER_SYNC_SIZE SHMEM_SYNC_SIZE
#define SHMEM_BCAST_SYNC_SIZE SHMEM_SYNC_SIZE
#define SHMEM_COLLECT_SYNC_SIZE SHMEM_SYNC_SIZE
#define SHMEM_REDUCE_SYNC_SIZE SHMEM_SYNC_SIZE
#define SHMEM_ALLTOALL_SYNC_SIZE SHMEM_SYNC_SIZE
#define SHMEM_ALLTOALLS_SYNC_SIZE SHMEM_SYNC_SIZE
#define SHMEM_REDUCE_MIN_WRKDATA_SIZE 1
#define _SHMEM_SYNC_VALUE SHMEM_SYNC_VALUE
#define _SHMEM_BARRIER_SYNC_SIZE SHMEM_BARRIER_SYNC_SIZE
#define _SHMEM_BCAST_SYNC_SIZE SHMEM_BCAST_SYNC_SIZE
#define _SHMEM_COLLECT_SYNC_SIZE SHMEM_COLLECT_SYNC_SIZE
#define _SHMEM_REDUCE_SYNC_SIZE SHMEM_REDUCE_SYNC_SIZE
#define _SHMEM_REDUCE_MIN_WRKDATA_SIZE SHMEM_REDUCE_MIN_WRKDATA_SIZE

/* ---- teams and contexts ----------------------------------------------- */
typedef struct cm_shmem_team* shmem_team_t;
#define SHMEM_TEAM_INVALID ((shmem_team_t)0)
#define SHMEM_TEAM_WORLD ((shmem_team_t)1)
#define SHMEM_TEAM_SHARED ((shmem_team_t)2)
#define SHMEM_TEAM_NUM_CONTEXTS (1L << 0)
typedef struct {
  int num_contexts;
} shmem_team_config_t;

typedef struct cm_shmem_ctx* shmem_ctx_t;
#define SHMEM_CTX_INVALID ((shmem_ctx_t)0)
#define SHMEM_CTX_DEFAULT ((shmem_ctx_t)1)
#define SHMEM_CTX_SERIALIZED (1L << 0)
#define SHMEM_CTX_PRIVATE (1L << 1)
#define SHMEM_CTX_NOSTORE (1L << 2)

/* ---- setup, query, memory, ordering, locks ---------------------------- */
void shmem_init(void);
int shmem_init_thread(int requested, int* provided);
void shmem_query_thread(int* provided);
void shmem_finalize(void);
void shmem_global_exit(int status);
int shmem_my_pe(void);
int shmem_n_pes(void);
int _my_pe(void);
int _num_pes(void);
void shmem_info_get_version(int* major, int* minor);
void shmem_info_get_name(char* name);
int shmem_pe_accessible(int pe);
int shmem_addr_accessible(const void* addr, int pe);
void* shmem_ptr(const void* dest, int pe);
void* shmem_team_ptr(shmem_team_t team, const void* dest, int pe);
void shmem_pcontrol(const int level, ...);

void* shmem_malloc(size_t size);
void* shmem_calloc(size_t count, size_t size);
void* shmem_align(size_t alignment, size_t size);
void* shmem_realloc(void* ptr, size_t size);
void* shmem_malloc_with_hints(size_t size, long hints);
void shmem_free(void* ptr);

void shmem_fence(void);
void shmem_quiet(void);
int shmem_ctx_create(long options, shmem_ctx_t* ctx);
void shmem_ctx_destroy(shmem_ctx_t ctx);
void shmem_ctx_fence(shmem_ctx_t ctx);
void shmem_ctx_quiet(shmem_ctx_t ctx);
int shmem_team_create_ctx(shmem_team_t team, long options, shmem_ctx_t* ctx);
int shmem_ctx_get_team(shmem_ctx_t ctx, shmem_team_t* team);

void shmem_set_lock(long* lock);
void shmem_clear_lock(long* lock);
int shmem_test_lock(long* lock);

int shmem_team_my_pe(shmem_team_t team);
int shmem_team_n_pes(shmem_team_t team);
int shmem_team_get_config(shmem_team_t team, long config_mask, shmem_team_config_t* config);
int shmem_team_translate_pe(shmem_team_t src_team, int src_pe, shmem_team_t dest_team);
int shmem_team_split_strided(shmem_team_t parent_team, int start, int stride, int size,
                             const shmem_team_config_t* config, long config_mask,
                             shmem_team_t* new_team);
int shmem_team_split_2d(shmem_team_t parent_team, int xrange,
                        const shmem_team_config_t* xaxis_config, long xaxis_mask,
                        shmem_team_t* xaxis_team, const shmem_team_config_t* yaxis_config,
                        long yaxis_mask, shmem_team_t* yaxis_team);
void shmem_team_destroy(shmem_team_t team);

/* ---- RMA --------------------------------------------------------------- */
#define CM_SHMEM_DECL_RMA(T, N)                                                              \
  void shmem_##N##_put(T* dest, const T* source, size_t nelems, int pe);                     \
  void shmem_##N##_get(T* dest, const T* source, size_t nelems, int pe);                     \
  void shmem_##N##_put_nbi(T* dest, const T* source, size_t nelems, int pe);                 \
  void shmem_##N##_get_nbi(T* dest, const T* source, size_t nelems, int pe);                 \
  void shmem_##N##_p(T* dest, T value, int pe);                                              \
  T shmem_##N##_g(const T* source, int pe);                                                  \
  void shmem_##N##_iput(T* dest, const T* source, ptrdiff_t dst, ptrdiff_t sst,              \
                        size_t nelems, int pe);                                              \
  void shmem_##N##_iget(T* dest, const T* source, ptrdiff_t dst, ptrdiff_t sst,              \
                        size_t nelems, int pe);                                              \
  void shmem_##N##_put_signal(T* dest, const T* source, size_t nelems, uint64_t* sig_addr,   \
                              uint64_t signal, int sig_op, int pe);                          \
  void shmem_##N##_put_signal_nbi(T* dest, const T* source, size_t nelems,                   \
                                  uint64_t* sig_addr, uint64_t signal, int sig_op, int pe);
CM_SHMEM_RMA_TYPES(CM_SHMEM_DECL_RMA)

#define CM_SHMEM_DECL_SIZED(S)                                                               \
  void shmem_put##S(void* dest, const void* source, size_t nelems, int pe);                  \
  void shmem_get##S(void* dest, const void* source, size_t nelems, int pe);                  \
  void shmem_put##S##_nbi(void* dest, const void* source, size_t nelems, int pe);            \
  void shmem_get##S##_nbi(void* dest, const void* source, size_t nelems, int pe);            \
  void shmem_iput##S(void* dest, const void* source, ptrdiff_t dst, ptrdiff_t sst,           \
                     size_t nelems, int pe);                                                 \
  void shmem_iget##S(void* dest, const void* source, ptrdiff_t dst, ptrdiff_t sst,           \
                     size_t nelems, int pe);                                                 \
  void shmem_put##S##_signal(void* dest, const void* source, size_t nelems,                  \
                             uint64_t* sig_addr, uint64_t signal, int sig_op, int pe);       \
  void shmem_put##S##_signal_nbi(void* dest, const void* source, size_t nelems,              \
                                 uint64_t* sig_addr, uint64_t signal, int sig_op, int pe);
CM_SHMEM_SIZES(CM_SHMEM_DECL_SIZED)

void shmem_putmem(void* dest, const void* source, size_t nelems, int pe);
void shmem_getmem(void* dest, const void* source, size_t nelems, int pe);
void shmem_putmem_nbi(void* dest, const void* source, size_t nelems, int pe);
void shmem_getmem_nbi(void* dest, const void* source, size_t nelems, int pe);
void shmem_putmem_signal(void* dest, const void* source, size_t nelems, uint64_t* sig_addr,
                         uint64_t signal, int sig_op, int pe);
void shmem_putmem_signal_nbi(void* dest, const void* source, size_t nelems, uint64_t* sig_addr,
                             uint64_t signal, int sig_op, int pe);
uint64_t shmem_signal_fetch(const uint64_t* sig_addr);
uint64_t shmem_signal_wait_until(uint64_t* sig_addr, int cmp, uint64_t cmp_value);

/* ---- atomics ----------------------------------------------------------- */
#define CM_SHMEM_DECL_AMO_EXT(T, N)                                                          \
  T shmem_##N##_atomic_fetch(const T* source, int pe);                                       \
  void shmem_##N##_atomic_fetch_nbi(T* fetch, const T* source, int pe);                      \
  void shmem_##N##_atomic_set(T* dest, T value, int pe);                                     \
  T shmem_##N##_atomic_swap(T* dest, T value, int pe);                                       \
  void shmem_##N##_atomic_swap_nbi(T* fetch, T* dest, T value, int pe);
#define CM_SHMEM_DECL_AMO_STD(T, N)                                                          \
  CM_SHMEM_DECL_AMO_EXT(T, N)                                                                \
  T shmem_##N##_atomic_compare_swap(T* dest, T cond, T value, int pe);                       \
  void shmem_##N##_atomic_compare_swap_nbi(T* fetch, T* dest, T cond, T value, int pe);      \
  T shmem_##N##_atomic_fetch_inc(T* dest, int pe);                                           \
  void shmem_##N##_atomic_fetch_inc_nbi(T* fetch, T* dest, int pe);                          \
  void shmem_##N##_atomic_inc(T* dest, int pe);                                              \
  T shmem_##N##_atomic_fetch_add(T* dest, T value, int pe);                                  \
  void shmem_##N##_atomic_fetch_add_nbi(T* fetch, T* dest, T value, int pe);                 \
  void shmem_##N##_atomic_add(T* dest, T value, int pe);
#define CM_SHMEM_DECL_AMO_BITWISE_OP(T, N, OP)                                               \
  T shmem_##N##_atomic_fetch_##OP(T* dest, T value, int pe);                                 \
  void shmem_##N##_atomic_fetch_##OP##_nbi(T* fetch, T* dest, T value, int pe);              \
  void shmem_##N##_atomic_##OP(T* dest, T value, int pe);
#define CM_SHMEM_DECL_AMO_BITWISE(T, N)                                                      \
  CM_SHMEM_DECL_AMO_BITWISE_OP(T, N, and)                                                    \
  CM_SHMEM_DECL_AMO_BITWISE_OP(T, N, or) CM_SHMEM_DECL_AMO_BITWISE_OP(T, N, xor)
CM_SHMEM_AMO_STD_TYPES(CM_SHMEM_DECL_AMO_STD)
CM_SHMEM_AMO_EXT_ONLY_TYPES(CM_SHMEM_DECL_AMO_EXT)
CM_SHMEM_AMO_BITWISE_TYPES(CM_SHMEM_DECL_AMO_BITWISE)

/* ---- the same RMA, signal and AMO routines on a context --------------- */
#define CM_SHMEM_DECL_CTX_RMA(T, N)                                                          \
  void shmem_ctx_##N##_put(shmem_ctx_t ctx, T* dest, const T* source, size_t nelems, int pe); \
  void shmem_ctx_##N##_get(shmem_ctx_t ctx, T* dest, const T* source, size_t nelems, int pe); \
  void shmem_ctx_##N##_put_nbi(shmem_ctx_t ctx, T* dest, const T* source, size_t nelems,     \
                               int pe);                                                      \
  void shmem_ctx_##N##_get_nbi(shmem_ctx_t ctx, T* dest, const T* source, size_t nelems,     \
                               int pe);                                                      \
  void shmem_ctx_##N##_p(shmem_ctx_t ctx, T* dest, T value, int pe);                         \
  T shmem_ctx_##N##_g(shmem_ctx_t ctx, const T* source, int pe);                             \
  void shmem_ctx_##N##_iput(shmem_ctx_t ctx, T* dest, const T* source, ptrdiff_t dst,        \
                            ptrdiff_t sst, size_t nelems, int pe);                           \
  void shmem_ctx_##N##_iget(shmem_ctx_t ctx, T* dest, const T* source, ptrdiff_t dst,        \
                            ptrdiff_t sst, size_t nelems, int pe);                           \
  void shmem_ctx_##N##_put_signal(shmem_ctx_t ctx, T* dest, const T* source, size_t nelems,  \
                                  uint64_t* sig_addr, uint64_t signal, int sig_op, int pe);  \
  void shmem_ctx_##N##_put_signal_nbi(shmem_ctx_t ctx, T* dest, const T* source,             \
                                      size_t nelems, uint64_t* sig_addr, uint64_t signal,    \
                                      int sig_op, int pe);
CM_SHMEM_RMA_TYPES(CM_SHMEM_DECL_CTX_RMA)
#define CM_SHMEM_DECL_CTX_SIZED(S)                                                           \
  void shmem_ctx_put##S(shmem_ctx_t ctx, void* dest, const void* source, size_t nelems,      \
                        int pe);                                                             \
  void shmem_ctx_get##S(shmem_ctx_t ctx, void* dest, const void* source, size_t nelems,      \
                        int pe);                                                             \
  void shmem_ctx_put##S##_nbi(shmem_ctx_t ctx, void* dest, const void* source,               \
                              size_t nelems, int pe);                                        \
  void shmem_ctx_get##S##_nbi(shmem_ctx_t ctx, void* dest, const void* source,               \
                              size_t nelems, int pe);                                        \
  void shmem_ctx_iput##S(shmem_ctx_t ctx, void* dest, const void* source, ptrdiff_t dst,     \
                         ptrdiff_t sst, size_t nelems, int pe);                              \
  void shmem_ctx_iget##S(shmem_ctx_t ctx, void* dest, const void* source, ptrdiff_t dst,     \
                         ptrdiff_t sst, size_t nelems, int pe);                              \
  void shmem_ctx_put##S##_signal(shmem_ctx_t ctx, void* dest, const void* source,            \
                                 size_t nelems, uint64_t* sig_addr, uint64_t signal,         \
                                 int sig_op, int pe);                                        \
  void shmem_ctx_put##S##_signal_nbi(shmem_ctx_t ctx, void* dest, const void* source,        \
                                     size_t nelems, uint64_t* sig_addr, uint64_t signal,     \
                                     int sig_op, int pe);
CM_SHMEM_SIZES(CM_SHMEM_DECL_CTX_SIZED)
void shmem_ctx_putmem(shmem_ctx_t ctx, void* dest, const void* source, size_t nelems, int pe);
void shmem_ctx_getmem(shmem_ctx_t ctx, void* dest, const void* source, size_t nelems, int pe);
void shmem_ctx_putmem_nbi(shmem_ctx_t ctx, void* dest, const void* source, size_t nelems,
                          int pe);
void shmem_ctx_getmem_nbi(shmem_ctx_t ctx, void* dest, const void* source, size_t nelems,
                          int pe);
void shmem_ctx_putmem_signal(shmem_ctx_t ctx, void* dest, const void* source, size_t nelems,
                             uint64_t* sig_addr, uint64_t signal, int sig_op, int pe);
void shmem_ctx_putmem_signal_nbi(shmem_ctx_t ctx, void* dest, const void* source,
                                 size_t nelems, uint64_t* sig_addr, uint64_t signal,
                                 int sig_op, int pe);

#define CM_SHMEM_DECL_CTX_AMO_EXT(T, N)                                                      \
  T shmem_ctx_##N##_atomic_fetch(shmem_ctx_t ctx, const T* source, int pe);                  \
  void shmem_ctx_##N##_atomic_fetch_nbi(shmem_ctx_t ctx, T* fetch, const T* source, int pe); \
  void shmem_ctx_##N##_atomic_set(shmem_ctx_t ctx, T* dest, T value, int pe);                \
  T shmem_ctx_##N##_atomic_swap(shmem_ctx_t ctx, T* dest, T value, int pe);                  \
  void shmem_ctx_##N##_atomic_swap_nbi(shmem_ctx_t ctx, T* fetch, T* dest, T value, int pe);
#define CM_SHMEM_DECL_CTX_AMO_STD(T, N)                                                      \
  CM_SHMEM_DECL_CTX_AMO_EXT(T, N)                                                            \
  T shmem_ctx_##N##_atomic_compare_swap(shmem_ctx_t ctx, T* dest, T cond, T value, int pe);  \
  void shmem_ctx_##N##_atomic_compare_swap_nbi(shmem_ctx_t ctx, T* fetch, T* dest, T cond,   \
                                               T value, int pe);                             \
  T shmem_ctx_##N##_atomic_fetch_inc(shmem_ctx_t ctx, T* dest, int pe);                      \
  void shmem_ctx_##N##_atomic_fetch_inc_nbi(shmem_ctx_t ctx, T* fetch, T* dest, int pe);     \
  void shmem_ctx_##N##_atomic_inc(shmem_ctx_t ctx, T* dest, int pe);                         \
  T shmem_ctx_##N##_atomic_fetch_add(shmem_ctx_t ctx, T* dest, T value, int pe);             \
  void shmem_ctx_##N##_atomic_fetch_add_nbi(shmem_ctx_t ctx, T* fetch, T* dest, T value,     \
                                            int pe);                                         \
  void shmem_ctx_##N##_atomic_add(shmem_ctx_t ctx, T* dest, T value, int pe);
#define CM_SHMEM_DECL_CTX_AMO_BITWISE_OP(T, N, OP)                                           \
  T shmem_ctx_##N##_atomic_fetch_##OP(shmem_ctx_t ctx, T* dest, T value, int pe);            \
  void shmem_ctx_##N##_atomic_fetch_##OP##_nbi(shmem_ctx_t ctx, T* fetch, T* dest, T value,  \
                                               int pe);                                      \
  void shmem_ctx_##N##_atomic_##OP(shmem_ctx_t ctx, T* dest, T value, int pe);
#define CM_SHMEM_DECL_CTX_AMO_BITWISE(T, N)                                                  \
  CM_SHMEM_DECL_CTX_AMO_BITWISE_OP(T, N, and)                                                \
  CM_SHMEM_DECL_CTX_AMO_BITWISE_OP(T, N, or) CM_SHMEM_DECL_CTX_AMO_BITWISE_OP(T, N, xor)
CM_SHMEM_AMO_STD_TYPES(CM_SHMEM_DECL_CTX_AMO_STD)
CM_SHMEM_AMO_EXT_ONLY_TYPES(CM_SHMEM_DECL_CTX_AMO_EXT)
CM_SHMEM_AMO_BITWISE_TYPES(CM_SHMEM_DECL_CTX_AMO_BITWISE)

/* ---- point-to-point synchronization ------------------------------------ */
#define CM_SHMEM_DECL_P2P(T, N)                                                              \
  void shmem_##N##_wait_until(T* ivar, int cmp, T cmp_value);                                \
  void shmem_##N##_wait_until_all(T* ivars, size_t nelems, const int* status, int cmp,       \
                                  T cmp_value);                                              \
  size_t shmem_##N##_wait_until_any(T* ivars, size_t nelems, const int* status, int cmp,     \
                                    T cmp_value);                                            \
  size_t shmem_##N##_wait_until_some(T* ivars, size_t nelems, size_t* indices,               \
                                     const int* status, int cmp, T cmp_value);               \
  void shmem_##N##_wait_until_all_vector(T* ivars, size_t nelems, const int* status,         \
                                         int cmp, T* cmp_values);                            \
  size_t shmem_##N##_wait_until_any_vector(T* ivars, size_t nelems, const int* status,       \
                                           int cmp, T* cmp_values);                          \
  size_t shmem_##N##_wait_until_some_vector(T* ivars, size_t nelems, size_t* indices,        \
                                            const int* status, int cmp, T* cmp_values);      \
  int shmem_##N##_test(T* ivar, int cmp, T cmp_value);                                       \
  int shmem_##N##_test_all(T* ivars, size_t nelems, const int* status, int cmp, T cmp_value); \
  size_t shmem_##N##_test_any(T* ivars, size_t nelems, const int* status, int cmp,           \
                              T cmp_value);                                                  \
  size_t shmem_##N##_test_some(T* ivars, size_t nelems, size_t* indices, const int* status,  \
                               int cmp, T cmp_value);                                        \
  int shmem_##N##_test_all_vector(T* ivars, size_t nelems, const int* status, int cmp,       \
                                  T* cmp_values);                                            \
  size_t shmem_##N##_test_any_vector(T* ivars, size_t nelems, const int* status, int cmp,    \
                                     T* cmp_values);                                         \
  size_t shmem_##N##_test_some_vector(T* ivars, size_t nelems, size_t* indices,              \
                                      const int* status, int cmp, T* cmp_values);
CM_SHMEM_P2P_TYPES(CM_SHMEM_DECL_P2P)

/* ---- collectives on teams ---------------------------------------------- */
void shmem_barrier_all(void);
void shmem_sync_all(void);
int shmem_team_sync(shmem_team_t team);
int shmem_broadcastmem(shmem_team_t team, void* dest, const void* source, size_t nelems,
                       int PE_root);
int shmem_collectmem(shmem_team_t team, void* dest, const void* source, size_t nelems);
int shmem_fcollectmem(shmem_team_t team, void* dest, const void* source, size_t nelems);
int shmem_alltoallmem(shmem_team_t team, void* dest, const void* source, size_t nelems);
int shmem_alltoallsmem(shmem_team_t team, void* dest, const void* source, ptrdiff_t dst,
                       ptrdiff_t sst, size_t nelems);
#define CM_SHMEM_DECL_COLL(T, N)                                                             \
  int shmem_##N##_broadcast(shmem_team_t team, T* dest, const T* source, size_t nelems,      \
                            int PE_root);                                                    \
  int shmem_##N##_collect(shmem_team_t team, T* dest, const T* source, size_t nelems);       \
  int shmem_##N##_fcollect(shmem_team_t team, T* dest, const T* source, size_t nelems);      \
  int shmem_##N##_alltoall(shmem_team_t team, T* dest, const T* source, size_t nelems);      \
  int shmem_##N##_alltoalls(shmem_team_t team, T* dest, const T* source, ptrdiff_t dst,      \
                            ptrdiff_t sst, size_t nelems);
CM_SHMEM_RMA_TYPES(CM_SHMEM_DECL_COLL)

#define CM_SHMEM_DECL_REDUCE(T, N, OP) \
  int shmem_##N##_##OP##_reduce(shmem_team_t team, T* dest, const T* source, size_t nreduce);
#define CM_SHMEM_DECL_REDUCE_BITWISE(T, N) \
  CM_SHMEM_DECL_REDUCE(T, N, and) CM_SHMEM_DECL_REDUCE(T, N, or) CM_SHMEM_DECL_REDUCE(T, N, xor)
#define CM_SHMEM_DECL_REDUCE_MINMAX(T, N) \
  CM_SHMEM_DECL_REDUCE(T, N, max) CM_SHMEM_DECL_REDUCE(T, N, min)
#define CM_SHMEM_DECL_REDUCE_ARITH(T, N) \
  CM_SHMEM_DECL_REDUCE(T, N, sum) CM_SHMEM_DECL_REDUCE(T, N, prod)
CM_SHMEM_REDUCE_BITWISE_TYPES(CM_SHMEM_DECL_REDUCE_BITWISE)
CM_SHMEM_REDUCE_MINMAX_TYPES(CM_SHMEM_DECL_REDUCE_MINMAX)
CM_SHMEM_REDUCE_MINMAX_TYPES(CM_SHMEM_DECL_REDUCE_ARITH)
CM_SHMEM_REDUCE_COMPLEX_TYPES(CM_SHMEM_DECL_REDUCE_ARITH)

/* ---- deprecated active-set collectives (still widely used) -------------- */
void shmem_barrier(int PE_start, int logPE_stride, int PE_size, long* pSync);
void shmem_sync(int PE_start, int logPE_stride, int PE_size, long* pSync);
/* shmem_sync(team) (1.5) and the deprecated shmem_sync(start, log_stride,
 * size, pSync) share a name: pick by the number of arguments. */
#define CM_SHMEM_SYNC_PICK(_1, _2, _3, _4, NAME, ...) NAME
#ifndef CM_SHMEM_SYNC_ACTIVE_SET /* the library's own definition is pshmem_sync (pshmem.h) */
#define CM_SHMEM_SYNC_ACTIVE_SET shmem_sync
#endif
#define shmem_sync(...) \
  CM_SHMEM_SYNC_PICK(__VA_ARGS__, CM_SHMEM_SYNC_ACTIVE_SET, _3, _2, shmem_team_sync, _0)(__VA_ARGS__)
#define CM_SHMEM_DECL_ACTIVE_SET(S)                                                          \
  void shmem_broadcast##S(void* dest, const void* source, size_t nelems, int PE_root,        \
                          int PE_start, int logPE_stride, int PE_size, long* pSync);         \
  void shmem_collect##S(void* dest, const void* source, size_t nelems, int PE_start,         \
                        int logPE_stride, int PE_size, long* pSync);                         \
  void shmem_fcollect##S(void* dest, const void* source, size_t nelems, int PE_start,        \
                         int logPE_stride, int PE_size, long* pSync);                        \
  void shmem_alltoall##S(void* dest, const void* source, size_t nelems, int PE_start,        \
                         int logPE_stride, int PE_size, long* pSync);                        \
  void shmem_alltoalls##S(void* dest, const void* source, ptrdiff_t dst, ptrdiff_t sst,      \
                          size_t nelems, int PE_start, int logPE_stride, int PE_size,        \
                          long* pSync);
CM_SHMEM_DECL_ACTIVE_SET(32)
CM_SHMEM_DECL_ACTIVE_SET(64)
#define CM_SHMEM_DECL_TO_ALL(T, N, OP)                                                       \
  void shmem_##N##_##OP##_to_all(T* dest, const T* source, int nreduce, int PE_start,        \
                                 int logPE_stride, int PE_size, T* pWrk, long* pSync);
#define CM_SHMEM_DECL_TO_ALL_BITWISE(T, N) \
  CM_SHMEM_DECL_TO_ALL(T, N, and) CM_SHMEM_DECL_TO_ALL(T, N, or) CM_SHMEM_DECL_TO_ALL(T, N, xor)
#define CM_SHMEM_DECL_TO_ALL_MINMAX(T, N) \
  CM_SHMEM_DECL_TO_ALL(T, N, max) CM_SHMEM_DECL_TO_ALL(T, N, min)
#define CM_SHMEM_DECL_TO_ALL_ARITH(T, N) \
  CM_SHMEM_DECL_TO_ALL(T, N, sum) CM_SHMEM_DECL_TO_ALL(T, N, prod)
CM_SHMEM_TOALL_BITWISE_TYPES(CM_SHMEM_DECL_TO_ALL_BITWISE)
CM_SHMEM_TOALL_MINMAX_TYPES(CM_SHMEM_DECL_TO_ALL_MINMAX)
CM_SHMEM_TOALL_MINMAX_TYPES(CM_SHMEM_DECL_TO_ALL_ARITH)
CM_SHMEM_REDUCE_COMPLEX_TYPES(CM_SHMEM_DECL_TO_ALL_ARITH)

/* ---- deprecated names still found in OpenSHMEM programs --------------- */
void start_pes(int npes);
void* shmalloc(size_t size);
void shfree(void* ptr);
void* shrealloc(void* ptr, size_t size);
void* shmemalign(size_t alignment, size_t size);
void shmem_clear_cache_inv(void);
void shmem_set_cache_inv(void);
void shmem_clear_cache_line_inv(void* dest);
void shmem_set_cache_line_inv(void* dest);
void shmem_udcflush(void);
void shmem_udcflush_line(void* dest);
/* Pre-1.4 atomics (shmem_TYPENAME_{cswap,swap,finc,inc,fadd,add,fetch,set}). */
#define CM_SHMEM_DECL_OLD_AMO_EXT(T, N)                                                      \
  T shmem_##N##_swap(T* dest, T value, int pe);                                              \
  T shmem_##N##_fetch(const T* source, int pe);                                              \
  void shmem_##N##_set(T* dest, T value, int pe);
#define CM_SHMEM_DECL_OLD_AMO(T, N)                                                          \
  CM_SHMEM_DECL_OLD_AMO_EXT(T, N)                                                            \
  T shmem_##N##_cswap(T* dest, T cond, T value, int pe);                                     \
  T shmem_##N##_finc(T* dest, int pe);                                                       \
  void shmem_##N##_inc(T* dest, int pe);                                                     \
  T shmem_##N##_fadd(T* dest, T value, int pe);                                              \
  void shmem_##N##_add(T* dest, T value, int pe);
CM_SHMEM_OLD_AMO_TYPES(CM_SHMEM_DECL_OLD_AMO)
CM_SHMEM_AMO_EXT_ONLY_TYPES(CM_SHMEM_DECL_OLD_AMO_EXT)
/* shmem_TYPENAME_wait(ivar, value): waits until *ivar != value. */
#define CM_SHMEM_DECL_OLD_WAIT(T, N) void shmem_##N##_wait(T* ivar, T cmp_value);
CM_SHMEM_OLD_WAIT_TYPES(CM_SHMEM_DECL_OLD_WAIT)
void shmem_wait(long* ivar, long cmp_value);

#ifdef __cplusplus
}
/* C++: the complex reductions take std::complex (cm_shmem_complexd/f) and
 * also GCC's complex types (double _Complex, float _Complex), which have
 * the same layout: overloads that forward to the C routines. */
__extension__ typedef __complex__ double cm_shmem_gnu_complexd;
__extension__ typedef __complex__ float cm_shmem_gnu_complexf;
#define CM_SHMEM_CXX_GNU_COMPLEX_OP(T, STD, N, OP)                                           \
  inline int shmem_##N##_##OP##_reduce(shmem_team_t team, T* dest, const T* source,         \
                                       size_t nreduce) {                                     \
    return shmem_##N##_##OP##_reduce(team, reinterpret_cast<STD*>(dest),                    \
                                     reinterpret_cast<const STD*>(source), nreduce);         \
  }                                                                                          \
  inline void shmem_##N##_##OP##_to_all(T* dest, const T* source, int nreduce, int PE_start, \
                                        int logPE_stride, int PE_size, T* pWrk,              \
                                        long* pSync) {                                       \
    shmem_##N##_##OP##_to_all(reinterpret_cast<STD*>(dest), reinterpret_cast<const STD*>(source), \
                              nreduce, PE_start, logPE_stride, PE_size,                      \
                              reinterpret_cast<STD*>(pWrk), pSync);                          \
  }
#define CM_SHMEM_CXX_GNU_COMPLEX(T, STD, N) \
  CM_SHMEM_CXX_GNU_COMPLEX_OP(T, STD, N, sum) CM_SHMEM_CXX_GNU_COMPLEX_OP(T, STD, N, prod)
CM_SHMEM_CXX_GNU_COMPLEX(cm_shmem_gnu_complexd, cm_shmem_complexd, complexd)
CM_SHMEM_CXX_GNU_COMPLEX(cm_shmem_gnu_complexf, cm_shmem_complexf, complexf)
#endif

/* ---- C11 type-generic interfaces ---------------------------------------- */
#if defined(__STDC_VERSION__) && __STDC_VERSION__ >= 201112L && !defined(__cplusplus)
void cm_shmem_generic_type_not_supported(void); /* never defined: a link error names it */
#define CM_SHMEM_FIRST(a, ...) a
#define CM_SHMEM_SECOND(a, b, ...) b
/* Point-to-point routines select on a pointer argument: shmem_put(dest, ...)
 * or, with a context first, shmem_put(ctx, dest, ...). */
#define CM_SHMEM_PTR(T, N, NAME) T*: shmem_##N##_##NAME, const T*: shmem_##N##_##NAME,
#define CM_SHMEM_CTX_PTR(T, N, NAME) T*: shmem_ctx_##N##_##NAME, const T*: shmem_ctx_##N##_##NAME,
#define CM_SHMEM_P2P_SELECT(TABLE, NAME, ...)                                                \
  _Generic(CM_SHMEM_FIRST(__VA_ARGS__, 0),                                                   \
      shmem_ctx_t: _Generic(CM_SHMEM_SECOND(__VA_ARGS__, 0, 0),                              \
          TABLE(CM_SHMEM_CTX_PTR, NAME) default: cm_shmem_generic_type_not_supported),       \
      default: _Generic(CM_SHMEM_FIRST(__VA_ARGS__, 0),                                      \
          TABLE(CM_SHMEM_PTR, NAME) default: cm_shmem_generic_type_not_supported))(__VA_ARGS__)
/* Waits and collectives select on the element type of a pointer argument. */
#define CM_SHMEM_VAL(T, N, NAME) T: shmem_##N##_##NAME,
#define CM_SHMEM_VAL_SELECT(TABLE, NAME, X) \
  _Generic((X), TABLE(CM_SHMEM_VAL, NAME) default: cm_shmem_generic_type_not_supported)

#define shmem_put(...) CM_SHMEM_P2P_SELECT(CM_SHMEM_GENERIC_RMA_TYPES, put, __VA_ARGS__)
#define shmem_get(...) CM_SHMEM_P2P_SELECT(CM_SHMEM_GENERIC_RMA_TYPES, get, __VA_ARGS__)
#define shmem_put_nbi(...) CM_SHMEM_P2P_SELECT(CM_SHMEM_GENERIC_RMA_TYPES, put_nbi, __VA_ARGS__)
#define shmem_get_nbi(...) CM_SHMEM_P2P_SELECT(CM_SHMEM_GENERIC_RMA_TYPES, get_nbi, __VA_ARGS__)
#define shmem_p(...) CM_SHMEM_P2P_SELECT(CM_SHMEM_GENERIC_RMA_TYPES, p, __VA_ARGS__)
#define shmem_g(...) CM_SHMEM_P2P_SELECT(CM_SHMEM_GENERIC_RMA_TYPES, g, __VA_ARGS__)
#define shmem_iput(...) CM_SHMEM_P2P_SELECT(CM_SHMEM_GENERIC_RMA_TYPES, iput, __VA_ARGS__)
#define shmem_iget(...) CM_SHMEM_P2P_SELECT(CM_SHMEM_GENERIC_RMA_TYPES, iget, __VA_ARGS__)
#define shmem_put_signal(...) CM_SHMEM_P2P_SELECT(CM_SHMEM_GENERIC_RMA_TYPES, put_signal, __VA_ARGS__)
#define shmem_put_signal_nbi(...) CM_SHMEM_P2P_SELECT(CM_SHMEM_GENERIC_RMA_TYPES, put_signal_nbi, __VA_ARGS__)

#define CM_SHMEM_AMO_EXT(NAME, ...) CM_SHMEM_P2P_SELECT(CM_SHMEM_GENERIC_AMO_EXT_TYPES, NAME, __VA_ARGS__)
#define CM_SHMEM_AMO_STD(NAME, ...) CM_SHMEM_P2P_SELECT(CM_SHMEM_GENERIC_AMO_STD_TYPES, NAME, __VA_ARGS__)
#define CM_SHMEM_AMO_BIT(NAME, ...) CM_SHMEM_P2P_SELECT(CM_SHMEM_GENERIC_AMO_BITWISE_TYPES, NAME, __VA_ARGS__)
#define shmem_atomic_fetch(...) CM_SHMEM_AMO_EXT(atomic_fetch, __VA_ARGS__)
#define shmem_atomic_fetch_nbi(...) CM_SHMEM_AMO_EXT(atomic_fetch_nbi, __VA_ARGS__)
#define shmem_atomic_set(...) CM_SHMEM_AMO_EXT(atomic_set, __VA_ARGS__)
#define shmem_atomic_swap(...) CM_SHMEM_AMO_EXT(atomic_swap, __VA_ARGS__)
#define shmem_atomic_swap_nbi(...) CM_SHMEM_AMO_EXT(atomic_swap_nbi, __VA_ARGS__)
#define shmem_atomic_compare_swap(...) CM_SHMEM_AMO_STD(atomic_compare_swap, __VA_ARGS__)
#define shmem_atomic_compare_swap_nbi(...) CM_SHMEM_AMO_STD(atomic_compare_swap_nbi, __VA_ARGS__)
#define shmem_atomic_fetch_inc(...) CM_SHMEM_AMO_STD(atomic_fetch_inc, __VA_ARGS__)
#define shmem_atomic_fetch_inc_nbi(...) CM_SHMEM_AMO_STD(atomic_fetch_inc_nbi, __VA_ARGS__)
#define shmem_atomic_inc(...) CM_SHMEM_AMO_STD(atomic_inc, __VA_ARGS__)
#define shmem_atomic_fetch_add(...) CM_SHMEM_AMO_STD(atomic_fetch_add, __VA_ARGS__)
#define shmem_atomic_fetch_add_nbi(...) CM_SHMEM_AMO_STD(atomic_fetch_add_nbi, __VA_ARGS__)
#define shmem_atomic_add(...) CM_SHMEM_AMO_STD(atomic_add, __VA_ARGS__)
#define shmem_atomic_fetch_and(...) CM_SHMEM_AMO_BIT(atomic_fetch_and, __VA_ARGS__)
#define shmem_atomic_fetch_or(...) CM_SHMEM_AMO_BIT(atomic_fetch_or, __VA_ARGS__)
#define shmem_atomic_fetch_xor(...) CM_SHMEM_AMO_BIT(atomic_fetch_xor, __VA_ARGS__)
#define shmem_atomic_fetch_and_nbi(...) CM_SHMEM_AMO_BIT(atomic_fetch_and_nbi, __VA_ARGS__)
#define shmem_atomic_fetch_or_nbi(...) CM_SHMEM_AMO_BIT(atomic_fetch_or_nbi, __VA_ARGS__)
#define shmem_atomic_fetch_xor_nbi(...) CM_SHMEM_AMO_BIT(atomic_fetch_xor_nbi, __VA_ARGS__)
#define shmem_atomic_and(...) CM_SHMEM_AMO_BIT(atomic_and, __VA_ARGS__)
#define shmem_atomic_or(...) CM_SHMEM_AMO_BIT(atomic_or, __VA_ARGS__)
#define shmem_atomic_xor(...) CM_SHMEM_AMO_BIT(atomic_xor, __VA_ARGS__)

#define CM_SHMEM_WAIT(NAME, ivar, ...) \
  CM_SHMEM_VAL_SELECT(CM_SHMEM_GENERIC_P2P_TYPES, NAME, *(ivar))(ivar, __VA_ARGS__)
#define shmem_wait_until(ivar, ...) CM_SHMEM_WAIT(wait_until, ivar, __VA_ARGS__)
#define shmem_wait_until_all(ivars, ...) CM_SHMEM_WAIT(wait_until_all, ivars, __VA_ARGS__)
#define shmem_wait_until_any(ivars, ...) CM_SHMEM_WAIT(wait_until_any, ivars, __VA_ARGS__)
#define shmem_wait_until_some(ivars, ...) CM_SHMEM_WAIT(wait_until_some, ivars, __VA_ARGS__)
#define shmem_wait_until_all_vector(ivars, ...) CM_SHMEM_WAIT(wait_until_all_vector, ivars, __VA_ARGS__)
#define shmem_wait_until_any_vector(ivars, ...) CM_SHMEM_WAIT(wait_until_any_vector, ivars, __VA_ARGS__)
#define shmem_wait_until_some_vector(ivars, ...) CM_SHMEM_WAIT(wait_until_some_vector, ivars, __VA_ARGS__)
#define shmem_test(ivar, ...) CM_SHMEM_WAIT(test, ivar, __VA_ARGS__)
#define shmem_test_all(ivars, ...) CM_SHMEM_WAIT(test_all, ivars, __VA_ARGS__)
#define shmem_test_any(ivars, ...) CM_SHMEM_WAIT(test_any, ivars, __VA_ARGS__)
#define shmem_test_some(ivars, ...) CM_SHMEM_WAIT(test_some, ivars, __VA_ARGS__)
#define shmem_test_all_vector(ivars, ...) CM_SHMEM_WAIT(test_all_vector, ivars, __VA_ARGS__)
#define shmem_test_any_vector(ivars, ...) CM_SHMEM_WAIT(test_any_vector, ivars, __VA_ARGS__)
#define shmem_test_some_vector(ivars, ...) CM_SHMEM_WAIT(test_some_vector, ivars, __VA_ARGS__)

#define CM_SHMEM_COLL(TABLE, NAME, team, dest, ...) \
  CM_SHMEM_VAL_SELECT(TABLE, NAME, *(dest))(team, dest, __VA_ARGS__)
#define shmem_broadcast(team, dest, ...) CM_SHMEM_COLL(CM_SHMEM_GENERIC_RMA_TYPES, broadcast, team, dest, __VA_ARGS__)
#define shmem_collect(team, dest, ...) CM_SHMEM_COLL(CM_SHMEM_GENERIC_RMA_TYPES, collect, team, dest, __VA_ARGS__)
#define shmem_fcollect(team, dest, ...) CM_SHMEM_COLL(CM_SHMEM_GENERIC_RMA_TYPES, fcollect, team, dest, __VA_ARGS__)
#define shmem_alltoall(team, dest, ...) CM_SHMEM_COLL(CM_SHMEM_GENERIC_RMA_TYPES, alltoall, team, dest, __VA_ARGS__)
#define shmem_alltoalls(team, dest, ...) CM_SHMEM_COLL(CM_SHMEM_GENERIC_RMA_TYPES, alltoalls, team, dest, __VA_ARGS__)
#define shmem_sum_reduce(team, dest, ...) CM_SHMEM_COLL(CM_SHMEM_GENERIC_REDUCE_ARITH_TYPES, sum_reduce, team, dest, __VA_ARGS__)
#define shmem_prod_reduce(team, dest, ...) CM_SHMEM_COLL(CM_SHMEM_GENERIC_REDUCE_ARITH_TYPES, prod_reduce, team, dest, __VA_ARGS__)
#define shmem_max_reduce(team, dest, ...) CM_SHMEM_COLL(CM_SHMEM_GENERIC_REDUCE_MINMAX_TYPES, max_reduce, team, dest, __VA_ARGS__)
#define shmem_min_reduce(team, dest, ...) CM_SHMEM_COLL(CM_SHMEM_GENERIC_REDUCE_MINMAX_TYPES, min_reduce, team, dest, __VA_ARGS__)
#define shmem_and_reduce(team, dest, ...) CM_SHMEM_COLL(CM_SHMEM_GENERIC_REDUCE_BITWISE_TYPES, and_reduce, team, dest, __VA_ARGS__)
#define shmem_or_reduce(team, dest, ...) CM_SHMEM_COLL(CM_SHMEM_GENERIC_REDUCE_BITWISE_TYPES, or_reduce, team, dest, __VA_ARGS__)
#define shmem_xor_reduce(team, dest, ...) CM_SHMEM_COLL(CM_SHMEM_GENERIC_REDUCE_BITWISE_TYPES, xor_reduce, team, dest, __VA_ARGS__)
#endif /* C11 */

#endif /* COREMESH_SHMEM_H */
