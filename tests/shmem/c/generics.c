/* generics: the C11 type-generic AMOs and team reductions accept every type
 * of the specification's tables, and select the routine of that type.
 *
 * OpenSHMEM 1.5, 9.8 (AMOs): the bitwise AMOs shmem_atomic_{and,or,xor},
 * their fetch_ forms and the fetching _nbi forms (9.8.10-9.8.15), with or
 * without a context, take the types of Table 7 (unsigned int, unsigned
 * long, unsigned long long, int32_t, int64_t, uint32_t, uint64_t).
 * 9.9.10 (reductions), Table 10: and/or/xor over unsigned char ... size_t
 * and int8_t ... int64_t; max/min over the integer and real types; sum/prod
 * over those and double _Complex, float _Complex. The generic
 * shmem_OP_reduce(team, dest, source, nreduce) selects on *dest. */
#include <complex.h>
#include <shmem.h>
#include <stdint.h>
#include "check.h"

#define N 3

/* One bitwise AMO type: and/or/xor, fetching, _nbi, with a context. Every
 * PE works on its own word at its right neighbour. */
#define TEST_BITWISE_AMO(T)                                                        \
  {                                                                                \
    static T word, fetched;                                                        \
    const int next = (me + 1) % npes;                                              \
    word = (T)0xF0;                                                                \
    shmem_barrier_all();                                                           \
    shmem_atomic_and(&word, (T)0x3C, next);              /* 0x30 */                \
    shmem_atomic_or(SHMEM_CTX_DEFAULT, &word, (T)0x01, next); /* 0x31 */           \
    shmem_quiet();                                                                 \
    CHECK(shmem_atomic_fetch_xor(&word, (T)0x11, next) == (T)0x31); /* 0x20 */     \
    CHECK(shmem_atomic_fetch_and(&word, (T)0xFF, next) == (T)0x20);                \
    CHECK(shmem_atomic_fetch_or(SHMEM_CTX_DEFAULT, &word, (T)0x02, next) == (T)0x20); \
    shmem_atomic_xor(&word, (T)0x80, next);              /* 0xA2 */                \
    shmem_atomic_fetch_and_nbi(&fetched, &word, (T)0xF3, next); /* 0xA2 */         \
    shmem_quiet();                                                                 \
    CHECK(fetched == (T)0xA2);                                                     \
    shmem_atomic_fetch_or_nbi(&fetched, &word, (T)0x04, next); /* 0xA6 */          \
    shmem_quiet();                                                                 \
    CHECK(fetched == (T)0xA2);                                                     \
    shmem_atomic_fetch_xor_nbi(SHMEM_CTX_DEFAULT, &fetched, &word, (T)0x06, next); \
    shmem_quiet();                                                                 \
    CHECK(fetched == (T)0xA6);                                                     \
    shmem_barrier_all();                                                           \
    CHECK(word == (T)0xA0);                                                        \
  }

/* One bitwise reduction type: PE p contributes bit p % 7 and 0x80. */
#define TEST_BITWISE_REDUCE(T)                                                     \
  {                                                                                \
    static T src[N], dst[N];                                                       \
    T all_or = 0, all_xor = 0;                                                     \
    for (int p = 0; p < npes; ++p) {                                               \
      all_or |= (T)(1 << (p % 7));                                                 \
      all_xor ^= (T)(1 << (p % 7)) | (T)0x80;                                      \
    }                                                                              \
    for (int i = 0; i < N; ++i) src[i] = (T)((1 << (me % 7)) | 0x80);              \
    CHECK(shmem_and_reduce(SHMEM_TEAM_WORLD, dst, src, N) == 0);                   \
    CHECK(dst[N - 1] == (T)(npes == 1 ? src[0] : 0x80));                          \
    CHECK(shmem_or_reduce(SHMEM_TEAM_WORLD, dst, src, N) == 0);                    \
    CHECK(dst[0] == (T)(all_or | 0x80));                                           \
    CHECK(shmem_xor_reduce(SHMEM_TEAM_WORLD, dst, src, N) == 0);                   \
    CHECK(dst[1] == all_xor);                                                      \
  }

/* One arithmetic type: max/min/sum/prod of 1 + p % 3. */
#define TEST_ARITH_REDUCE(T)                                                       \
  {                                                                                \
    static T src[N], dst[N];                                                       \
    double sum = 0, prod = 1;                                                      \
    for (int p = 0; p < npes; ++p) sum += 1 + p % 3, prod *= 1 + p % 3;            \
    for (int i = 0; i < N; ++i) src[i] = (T)(1 + me % 3);                          \
    CHECK(shmem_max_reduce(SHMEM_TEAM_WORLD, dst, src, N) == 0);                   \
    CHECK(dst[0] == (T)(npes >= 3 ? 3 : npes));                                    \
    CHECK(shmem_min_reduce(SHMEM_TEAM_WORLD, dst, src, N) == 0);                   \
    CHECK(dst[1] == (T)1);                                                         \
    CHECK(shmem_sum_reduce(SHMEM_TEAM_WORLD, dst, src, N) == 0);                   \
    CHECK(dst[2] == (T)sum);                                                       \
    CHECK(shmem_prod_reduce(SHMEM_TEAM_WORLD, dst, src, N) == 0);                  \
    if (sizeof(T) > 1 || prod < 100) CHECK(dst[2] == (T)prod);                     \
  }

/* The complex types: sum and prod of (1 + p % 3) + i. */
#define TEST_COMPLEX_REDUCE(T)                                                     \
  {                                                                                \
    static T src[N], dst[N];                                                       \
    T sum = 0, prod = 1;                                                           \
    for (int p = 0; p < npes; ++p) {                                               \
      const T v = (T)(1 + p % 3) + (T)I;                                           \
      sum += v;                                                                    \
      prod *= v;                                                                   \
    }                                                                              \
    for (int i = 0; i < N; ++i) src[i] = (T)(1 + me % 3) + (T)I;                   \
    CHECK(shmem_sum_reduce(SHMEM_TEAM_WORLD, dst, src, N) == 0);                   \
    CHECK(dst[1] == sum);                                                          \
    CHECK(shmem_prod_reduce(SHMEM_TEAM_WORLD, dst, src, N) == 0);                  \
    CHECK(cabs((double complex)(dst[2] - prod)) <= 1e-3 * cabs((double complex)prod)); \
  }

int main(void) {
  shmem_init();
  const int me = shmem_my_pe(), npes = shmem_n_pes();

  /* Table 7 */
  TEST_BITWISE_AMO(unsigned int)
  TEST_BITWISE_AMO(unsigned long)
  TEST_BITWISE_AMO(unsigned long long)
  TEST_BITWISE_AMO(int32_t)
  TEST_BITWISE_AMO(int64_t)
  TEST_BITWISE_AMO(uint32_t)
  TEST_BITWISE_AMO(uint64_t)

  /* Table 10, and/or/xor */
  TEST_BITWISE_REDUCE(unsigned char)
  TEST_BITWISE_REDUCE(unsigned short)
  TEST_BITWISE_REDUCE(unsigned int)
  TEST_BITWISE_REDUCE(unsigned long)
  TEST_BITWISE_REDUCE(unsigned long long)
  TEST_BITWISE_REDUCE(int8_t)
  TEST_BITWISE_REDUCE(int16_t)
  TEST_BITWISE_REDUCE(int32_t)
  TEST_BITWISE_REDUCE(int64_t)
  TEST_BITWISE_REDUCE(uint8_t)
  TEST_BITWISE_REDUCE(uint16_t)
  TEST_BITWISE_REDUCE(uint32_t)
  TEST_BITWISE_REDUCE(uint64_t)
  TEST_BITWISE_REDUCE(size_t)

  /* Table 10, max/min/sum/prod */
  TEST_ARITH_REDUCE(char)
  TEST_ARITH_REDUCE(signed char)
  TEST_ARITH_REDUCE(short)
  TEST_ARITH_REDUCE(int)
  TEST_ARITH_REDUCE(long)
  TEST_ARITH_REDUCE(long long)
  TEST_ARITH_REDUCE(ptrdiff_t)
  TEST_ARITH_REDUCE(unsigned char)
  TEST_ARITH_REDUCE(unsigned short)
  TEST_ARITH_REDUCE(unsigned int)
  TEST_ARITH_REDUCE(unsigned long)
  TEST_ARITH_REDUCE(unsigned long long)
  TEST_ARITH_REDUCE(int8_t)
  TEST_ARITH_REDUCE(int16_t)
  TEST_ARITH_REDUCE(int32_t)
  TEST_ARITH_REDUCE(int64_t)
  TEST_ARITH_REDUCE(uint8_t)
  TEST_ARITH_REDUCE(uint16_t)
  TEST_ARITH_REDUCE(uint32_t)
  TEST_ARITH_REDUCE(uint64_t)
  TEST_ARITH_REDUCE(size_t)
  TEST_ARITH_REDUCE(float)
  TEST_ARITH_REDUCE(double)
  TEST_ARITH_REDUCE(long double)

  /* Table 10, sum/prod of the complex types */
  TEST_COMPLEX_REDUCE(double _Complex)
  TEST_COMPLEX_REDUCE(float _Complex)
  DONE("generics");
}
