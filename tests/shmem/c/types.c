/* types: every typed routine of the 1.5 type tables, one macro per family
 * over this file's own type lists: RMA (put/get/p/g/iput/iget/nbi, sized
 * and mem forms), AMOs, team reductions and collectives; plus zero-length
 * operations with NULL addresses, which are no-ops. */
#include <shmem.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include "check.h"

#define N 40

#define RMA_TYPES(X)                                                                     \
  X(float, float) X(double, double) X(long double, longdouble) X(char, char)             \
  X(signed char, schar) X(short, short) X(int, int) X(long, long) X(long long, longlong) \
  X(unsigned char, uchar) X(unsigned short, ushort) X(unsigned int, uint)                \
  X(unsigned long, ulong) X(unsigned long long, ulonglong) X(int8_t, int8)               \
  X(int16_t, int16) X(int32_t, int32) X(int64_t, int64) X(uint8_t, uint8)                \
  X(uint16_t, uint16) X(uint32_t, uint32) X(uint64_t, uint64) X(size_t, size)            \
  X(ptrdiff_t, ptrdiff)
#define AMO_TYPES(X)                                                                     \
  X(int, int) X(long, long) X(long long, longlong) X(unsigned int, uint)                 \
  X(unsigned long, ulong) X(unsigned long long, ulonglong) X(int32_t, int32)             \
  X(int64_t, int64) X(uint32_t, uint32) X(uint64_t, uint64) X(size_t, size) X(ptrdiff_t, ptrdiff)
#define BITWISE_TYPES(X)                                                                 \
  X(unsigned int, uint) X(unsigned long, ulong) X(unsigned long long, ulonglong)         \
  X(int32_t, int32) X(int64_t, int64) X(uint32_t, uint32) X(uint64_t, uint64)
#define ARITH_TYPES(X)                                                                   \
  X(short, short) X(int, int) X(long, long) X(long long, longlong) X(unsigned char, uchar) \
  X(unsigned int, uint) X(uint64_t, uint64) X(int8_t, int8) X(size_t, size) X(float, float) \
  X(double, double) X(long double, longdouble)

static void* sym; /* one symmetric scratch area for every type */

#define TEST_RMA(T, NAME)                                                                \
  {                                                                                      \
    T* d = (T*)sym;                                                                      \
    T s[N], back[N];                                                                     \
    for (int i = 0; i < N; ++i) s[i] = (T)((me * 7 + i) % 100);                          \
    shmem_barrier_all();                                                                 \
    shmem_##NAME##_put(d, s, N, right);                                                  \
    shmem_barrier_all();                                                                 \
    for (int i = 0; i < N; ++i) CHECK(d[i] == (T)((left * 7 + i) % 100));                \
    shmem_##NAME##_get(back, d, N, right);                                               \
    for (int i = 0; i < N; ++i) CHECK(back[i] == s[i]);                                  \
    shmem_barrier_all();                                                                 \
    shmem_##NAME##_p(&d[1], (T)(me + 1), right);                                         \
    shmem_##NAME##_put_nbi(&d[2], s, 3, right);                                          \
    shmem_quiet();                                                                       \
    shmem_barrier_all();                                                                 \
    CHECK(d[1] == (T)(left + 1) && d[4] == (T)((left * 7 + 2) % 100));                    \
    CHECK(shmem_##NAME##_g(&d[1], right) == (T)(me + 1));                                \
    shmem_##NAME##_get_nbi(back, d, 2, right);                                           \
    shmem_quiet();                                                                       \
    CHECK(back[1] == (T)(me + 1));                                                       \
    shmem_barrier_all();                                                                 \
    shmem_##NAME##_iput(d, s, 2, 3, N / 3, right); /* every 3rd source to every 2nd */   \
    shmem_barrier_all();                                                                 \
    for (int i = 0; i < N / 3; ++i) CHECK(d[2 * i] == (T)((left * 7 + 3 * i) % 100));     \
    shmem_##NAME##_iget(back, d, 1, 2, N / 3, right);                                    \
    for (int i = 0; i < N / 3; ++i) CHECK(back[i] == s[3 * i]);                          \
    shmem_barrier_all();                                                                 \
    shmem_put(d, s, N, right); /* C11 generic */                                         \
    shmem_barrier_all();                                                                 \
    CHECK(shmem_g(&d[5], right) == s[5]);                                                 \
  }

#define TEST_AMO(T, NAME)                                                                \
  {                                                                                      \
    T* c = (T*)sym;                                                                      \
    shmem_barrier_all();                                                                 \
    if (me == 0) c[0] = c[1] = c[2] = 0;                                                 \
    shmem_barrier_all();                                                                 \
    shmem_##NAME##_atomic_add(&c[0], (T)2, 0);                                           \
    shmem_##NAME##_atomic_inc(&c[0], 0);                                                 \
    (void)shmem_##NAME##_atomic_fetch_inc(&c[1], 0);                                     \
    T fetched;                                                                           \
    shmem_##NAME##_atomic_fetch_add_nbi(&fetched, &c[1], (T)1, 0);                       \
    shmem_quiet();                                                                       \
    CHECK(fetched < (T)(2 * npes));                                                      \
    (void)shmem_##NAME##_atomic_compare_swap(&c[2], (T)0, (T)(me + 1), 0);                \
    shmem_barrier_all();                                                                 \
    CHECK(shmem_##NAME##_atomic_fetch(&c[0], 0) == (T)(3 * npes));                        \
    CHECK(shmem_atomic_fetch(&c[1], 0) == (T)(2 * npes));                                 \
    T winner = shmem_##NAME##_atomic_fetch(&c[2], 0);                                    \
    CHECK(winner >= (T)1 && winner <= (T)npes);                                          \
    shmem_barrier_all();                                                                 \
    if (me == npes - 1) {                                                                \
      CHECK(shmem_##NAME##_atomic_swap(&c[2], (T)77, 0) == winner);                      \
      shmem_##NAME##_atomic_set(&c[1], (T)5, 0);                                         \
      T old;                                                                             \
      shmem_##NAME##_atomic_swap_nbi(&old, &c[1], (T)6, 0);                              \
      shmem_##NAME##_atomic_compare_swap_nbi(&fetched, &c[2], (T)77, (T)78, 0);          \
      shmem_quiet();                                                                     \
      CHECK(old == (T)5 && fetched == (T)77);                                            \
      CHECK(shmem_##NAME##_atomic_fetch(&c[2], 0) == (T)78);                              \
    }                                                                                    \
    shmem_barrier_all();                                                                 \
  }

#define TEST_BITWISE(T, NAME)                                                            \
  {                                                                                      \
    T* c = (T*)sym;                                                                      \
    shmem_barrier_all();                                                                 \
    if (me == 0) { c[0] = 0; c[1] = (T)~(T)0; c[2] = 0; }                                \
    shmem_barrier_all();                                                                 \
    const T bit = (T)((T)1 << (me % 30));                                                \
    shmem_##NAME##_atomic_or(&c[0], bit, 0);                                             \
    (void)shmem_##NAME##_atomic_fetch_and(&c[1], (T)~bit, 0);                            \
    T f;                                                                                 \
    shmem_##NAME##_atomic_fetch_xor_nbi(&f, &c[2], bit, 0);                              \
    shmem_quiet();                                                                       \
    shmem_barrier_all();                                                                 \
    T all = 0, x = 0;                                                                    \
    for (int p = 0; p < npes; ++p) { all |= (T)((T)1 << (p % 30)); x ^= (T)((T)1 << (p % 30)); } \
    CHECK(shmem_##NAME##_atomic_fetch(&c[0], 0) == all);                                  \
    CHECK(shmem_##NAME##_atomic_fetch(&c[1], 0) == (T)~all);                              \
    CHECK(shmem_##NAME##_atomic_fetch(&c[2], 0) == x);                                    \
    shmem_barrier_all();                                                                 \
  }

#define TEST_REDUCE(T, NAME)                                                             \
  {                                                                                      \
    T* s = (T*)sym;                                                                      \
    T* d = s + N;                                                                        \
    shmem_barrier_all();                                                                 \
    for (int i = 0; i < N; ++i) s[i] = (T)(1 + (me + i) % 3);                            \
    CHECK(shmem_##NAME##_sum_reduce(SHMEM_TEAM_WORLD, d, s, N) == 0);                    \
    for (int i = 0; i < N; ++i) {                                                        \
      long want = 0;                                                                     \
      for (int p = 0; p < npes; ++p) want += 1 + (p + i) % 3;                            \
      CHECK(d[i] == (T)want);                                                            \
    }                                                                                    \
    CHECK(shmem_##NAME##_max_reduce(SHMEM_TEAM_WORLD, d, s, N) == 0);                    \
    CHECK(d[0] == (T)(npes >= 3 ? 3 : npes));                                            \
    CHECK(shmem_min_reduce(SHMEM_TEAM_WORLD, d, s, N) == 0);                             \
    CHECK(d[0] == (T)1);                                                                 \
    CHECK(shmem_##NAME##_prod_reduce(SHMEM_TEAM_WORLD, d, s, 1) == 0);                   \
    long prod = 1;                                                                       \
    for (int p = 0; p < npes; ++p) prod *= 1 + p % 3;                                    \
    if (sizeof(T) > 1 || prod < 128) CHECK(d[0] == (T)prod);                             \
    CHECK(shmem_##NAME##_sum_reduce(SHMEM_TEAM_WORLD, s, s, N) == 0); /* in place */     \
  }

#define TEST_COLL(T, NAME)                                                               \
  {                                                                                      \
    T* s = (T*)sym;                                                                      \
    T* d = s + N * npes;                                                                 \
    shmem_barrier_all();                                                                 \
    for (int i = 0; i < N * npes; ++i) s[i] = (T)((me * 13 + i) % 101);                  \
    CHECK(shmem_##NAME##_broadcast(SHMEM_TEAM_WORLD, d, s, N, npes - 1) == 0);           \
    CHECK(d[3] == (T)(((npes - 1) * 13 + 3) % 101));                                     \
    CHECK(shmem_##NAME##_fcollect(SHMEM_TEAM_WORLD, d, s, 2) == 0);                      \
    for (int p = 0; p < npes; ++p) CHECK(d[2 * p + 1] == (T)((p * 13 + 1) % 101));       \
    CHECK(shmem_##NAME##_collect(SHMEM_TEAM_WORLD, d, s, (size_t)(me % 2 + 1)) == 0);    \
    size_t at = 0;                                                                       \
    for (int p = 0; p < npes; ++p) { CHECK(d[at] == (T)((p * 13) % 101)); at += p % 2 + 1; } \
    CHECK(shmem_##NAME##_alltoall(SHMEM_TEAM_WORLD, d, s, 2) == 0);                      \
    for (int p = 0; p < npes; ++p) CHECK(d[2 * p] == (T)((p * 13 + 2 * me) % 101));     \
    CHECK(shmem_##NAME##_alltoalls(SHMEM_TEAM_WORLD, d, s, 1, 2, 1) == 0);               \
    for (int p = 0; p < npes; ++p) CHECK(d[p] == (T)((p * 13 + 2 * me) % 101));         \
  }

#define RUN_RMA(T, NAME) TEST_RMA(T, NAME)
#define RUN_AMO(T, NAME) TEST_AMO(T, NAME)
#define RUN_BITWISE(T, NAME) TEST_BITWISE(T, NAME)
#define RUN_REDUCE(T, NAME) TEST_REDUCE(T, NAME)

int main(void) {
  shmem_init();
  const int me = shmem_my_pe(), npes = shmem_n_pes();
  const int right = (me + 1) % npes, left = (me + npes - 1) % npes;
  sym = shmem_calloc(4 * N * (npes + 1), sizeof(long double));
  RMA_TYPES(RUN_RMA)
  AMO_TYPES(RUN_AMO)
  BITWISE_TYPES(RUN_BITWISE)
  ARITH_TYPES(RUN_REDUCE)
  RMA_TYPES(TEST_COLL)

  /* sized and untyped forms */
  {
    uint64_t s64[4] = {1, 2, 3, 4};
    shmem_barrier_all();
    shmem_put64(sym, s64, 4, right);
    shmem_put32((char*)sym + 64, s64, 2, right);
    shmem_putmem((char*)sym + 96, "hello", 6, right);
    shmem_barrier_all();
    CHECK(((uint64_t*)sym)[3] == 4 && ((uint32_t*)((char*)sym + 64))[0] == 1);
    CHECK(strcmp((char*)sym + 96, "hello") == 0);
    char got[6];
    shmem_getmem(got, (char*)sym + 96, 6, left);
    CHECK(strcmp(got, "hello") == 0);
  }

  /* zero-length operations with NULL addresses are no-ops */
  shmem_barrier_all();
  shmem_putmem(NULL, NULL, 0, right);
  shmem_getmem(NULL, NULL, 0, right);
  shmem_long_put(NULL, NULL, 0, right);
  shmem_long_put_nbi(NULL, NULL, 0, right);
  shmem_double_get_nbi(NULL, NULL, 0, right);
  shmem_int_iput(NULL, NULL, 1, 1, 0, right);
  shmem_int_iget(NULL, NULL, 1, 1, 0, right);
  shmem_quiet();
  CHECK(shmem_long_sum_reduce(SHMEM_TEAM_WORLD, NULL, NULL, 0) == 0);
  CHECK(shmem_long_broadcast(SHMEM_TEAM_WORLD, NULL, NULL, 0, 0) == 0);
  CHECK(shmem_long_fcollect(SHMEM_TEAM_WORLD, NULL, NULL, 0) == 0);
  CHECK(shmem_long_alltoall(SHMEM_TEAM_WORLD, NULL, NULL, 0) == 0);
  CHECK(shmem_malloc(0) == NULL);
  shmem_free(NULL);
  DONE("types");
}
