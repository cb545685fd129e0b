/* collect: shmem_collect with a different element count on every PE, zero
 * included, on teams and on active sets; the neighbours with uneven or zero
 * counts (fcollect, broadcast, alltoall(s), reductions with nelems 0).
 *
 * OpenSHMEM 1.5, 9.9.8 (shmem_collect, shmem_fcollect): "The collect
 * routines allow nelems to vary from PE to PE"; dest holds the source of
 * team PE 0 first, then of team PE 1, ..., concatenated; an active set's
 * order is PE_start, PE_start + 2^logPE_stride, ... (9.9.8's deprecated
 * shmem_collect32/64). 9.9.1: a pSync array may be reused by a later
 * collective once no PE of the set uses it from a prior call (we put a
 * barrier_all between calls of different sets). dest beyond the
 * concatenation is not written (checked with a sentinel). */
#include <shmem.h>
#include <stdint.h>
#include <string.h>
#include "check.h"

#define MAXN 5       /* a PE contributes count(p) <= MAXN elements */
#define SENTINEL 77  /* dest past the concatenation keeps it */

/* count of world PE p in variant v: zeros at different places */
static int count(int p, int v) {
  switch (v) {
    case 0: return p % 3;                 /* PE 0 gives nothing */
    case 1: return p % 2 ? 0 : MAXN - p % 4; /* every odd PE gives nothing */
    case 2: return p == 0 ? 1 : 0;        /* only PE 0 */
    case 3: return 0;                     /* nobody */
    default: return (p * 7 + 3) % (MAXN + 1);
  }
}
#define NVARIANTS 5
static long value(int p, int i) { return 1000 * (p + 1) + i; }

/* checks dest (of elements of type T, values narrowed) against the
 * concatenation over the members `pes[0..n)` */
#define CHECK_CONCAT(T, dest, pes, n, v)                                  \
  do {                                                                    \
    int at_ = 0;                                                          \
    for (int m_ = 0; m_ < (n); ++m_)                                      \
      for (int i_ = 0; i_ < count((pes)[m_], v); ++i_, ++at_)             \
        CHECK((dest)[at_] == (T)value((pes)[m_], i_));                    \
    CHECK((dest)[at_] == (T)SENTINEL);                                    \
  } while (0)

int main(void) {
  shmem_init();
  const int me = shmem_my_pe(), npes = shmem_n_pes();
  const size_t cap = (size_t)MAXN * npes + 1;
  long* lsrc = shmem_malloc(MAXN * sizeof(long));
  long* ldst = shmem_malloc(cap * sizeof(long));
  int32_t* isrc = shmem_malloc(MAXN * sizeof(int32_t));
  int32_t* idst = shmem_malloc(cap * sizeof(int32_t));
  static long psync[2][SHMEM_COLLECT_SYNC_SIZE];
  for (int k = 0; k < 2; ++k)
    for (int i = 0; i < SHMEM_COLLECT_SYNC_SIZE; ++i) psync[k][i] = SHMEM_SYNC_VALUE;
  int world[1024];
  for (int p = 0; p < npes; ++p) world[p] = p;
  shmem_barrier_all();

  for (int round = 0; round < 3; ++round) {
    for (int v = 0; v < NVARIANTS; ++v) {
      const int n = count(me, v);
      for (int i = 0; i < MAXN; ++i) lsrc[i] = value(me, i), isrc[i] = (int32_t)value(me, i);

      /* typed team collect, world (twice: back to back) */
      for (int rep = 0; rep < 2; ++rep) {
        for (size_t i = 0; i < cap; ++i) ldst[i] = SENTINEL;
        CHECK(shmem_long_collect(SHMEM_TEAM_WORLD, ldst, lsrc, (size_t)n) == 0);
        CHECK_CONCAT(long, ldst, world, npes, v);
      }
      for (size_t i = 0; i < cap; ++i) idst[i] = SENTINEL;
      CHECK(shmem_int32_collect(SHMEM_TEAM_WORLD, idst, isrc, (size_t)n) == 0);
      CHECK_CONCAT(int32_t, idst, world, npes, v);
      for (size_t i = 0; i < cap; ++i) ldst[i] = SENTINEL;
      CHECK(shmem_collectmem(SHMEM_TEAM_WORLD, ldst, lsrc, (size_t)n * sizeof(long)) == 0);
      CHECK_CONCAT(long, ldst, world, npes, v);
      for (size_t i = 0; i < cap; ++i) ldst[i] = SENTINEL;
      CHECK(shmem_collect(SHMEM_TEAM_WORLD, ldst, lsrc, (size_t)n) == 0); /* C11 generic */
      CHECK_CONCAT(long, ldst, world, npes, v);

      /* a strided team: the world backwards, then the odd PEs */
      shmem_team_t back, odd;
      CHECK(shmem_team_split_strided(SHMEM_TEAM_WORLD, npes - 1, -1, npes, NULL, 0, &back) == 0);
      int back_pes[1024];
      for (int i = 0; i < npes; ++i) back_pes[i] = npes - 1 - i;
      for (size_t i = 0; i < cap; ++i) ldst[i] = SENTINEL;
      CHECK(shmem_long_collect(back, ldst, lsrc, (size_t)n) == 0);
      CHECK_CONCAT(long, ldst, back_pes, npes, v);
      shmem_team_destroy(back);
      if (npes > 1) {
        const int nodd = npes / 2;
        int odd_pes[512];
        for (int i = 0; i < nodd; ++i) odd_pes[i] = 2 * i + 1;
        CHECK(shmem_team_split_strided(SHMEM_TEAM_WORLD, 1, 2, nodd, NULL, 0, &odd) == 0);
        if (odd != SHMEM_TEAM_INVALID) {
          for (size_t i = 0; i < cap; ++i) ldst[i] = SENTINEL;
          CHECK(shmem_long_collect(odd, ldst, lsrc, (size_t)n) == 0);
          CHECK_CONCAT(long, ldst, odd_pes, nodd, v);
        }
        shmem_team_destroy(odd);
      }

      /* active sets: the world, the even PEs, PEs 1.. (one pSync array for
       * all of them, so its call count differs between PEs) */
      for (int set = 0; set < 3; ++set) {
        const int start = set == 2 ? (npes > 1 ? 1 : 0) : 0;
        const int log_stride = set == 1 ? 1 : 0;
        const int size = set == 0 ? npes : set == 1 ? (npes + 1) / 2 : npes - start;
        int pes[1024];
        for (int i = 0; i < size; ++i) pes[i] = start + (i << log_stride);
        const int delta = me - start;
        const int in_set = delta >= 0 && delta % (1 << log_stride) == 0 && (delta >> log_stride) < size;
        shmem_barrier_all(); /* psync[0] is no longer in use by the previous set */
        if (!in_set) continue;
        for (size_t i = 0; i < cap; ++i) ldst[i] = SENTINEL, idst[i] = SENTINEL;
        shmem_collect64(ldst, lsrc, (size_t)n, start, log_stride, size, psync[0]);
        CHECK_CONCAT(long, ldst, pes, size, v);
        shmem_collect32(idst, isrc, (size_t)n, start, log_stride, size, psync[0]);
        CHECK_CONCAT(int32_t, idst, pes, size, v);
        /* alternating pSync arrays, no barrier in between */
        for (size_t i = 0; i < cap; ++i) ldst[i] = SENTINEL;
        shmem_collect64(ldst, lsrc, (size_t)n, start, log_stride, size, psync[1]);
        CHECK_CONCAT(long, ldst, pes, size, v);
        for (size_t i = 0; i < cap; ++i) ldst[i] = SENTINEL;
        shmem_collect64(ldst, lsrc, (size_t)n, start, log_stride, size, psync[0]);
        CHECK_CONCAT(long, ldst, pes, size, v);
      }
      shmem_barrier_all();
    }
  }

  /* neighbours with zero counts: nothing written, every PE returns 0 */
  for (size_t i = 0; i < cap; ++i) ldst[i] = SENTINEL;
  CHECK(shmem_long_fcollect(SHMEM_TEAM_WORLD, ldst, lsrc, 0) == 0);
  CHECK(shmem_long_broadcast(SHMEM_TEAM_WORLD, ldst, lsrc, 0, 0) == 0);
  CHECK(shmem_long_alltoall(SHMEM_TEAM_WORLD, ldst, lsrc, 0) == 0);
  CHECK(shmem_long_alltoalls(SHMEM_TEAM_WORLD, ldst, lsrc, 1, 1, 0) == 0);
  CHECK(shmem_long_sum_reduce(SHMEM_TEAM_WORLD, ldst, lsrc, 0) == 0);
  CHECK(shmem_long_max_reduce(SHMEM_TEAM_WORLD, ldst, lsrc, 0) == 0);
  shmem_fcollect64(ldst, lsrc, 0, 0, 0, npes, psync[0]);
  shmem_broadcast64(ldst, lsrc, 0, 0, 0, 0, npes, psync[1]);
  shmem_barrier_all();
  shmem_alltoall64(ldst, lsrc, 0, 0, 0, npes, psync[0]);
  shmem_barrier_all();
  for (size_t i = 0; i < cap; ++i) CHECK(ldst[i] == SENTINEL);

  /* 9.9: on completion an active-set collective leaves pSync as it found it
   * (SHMEM_SYNC_VALUE), also over back-to-back barriers on one pSync with no
   * other synchronisation (shmem_barrier allows that) and on a subset */
  for (int k = 0; k < 2; ++k)
    for (int i = 0; i < SHMEM_COLLECT_SYNC_SIZE; ++i) CHECK(psync[k][i] == SHMEM_SYNC_VALUE);
  static long bsync[SHMEM_BARRIER_SYNC_SIZE], rsync[SHMEM_REDUCE_SYNC_SIZE];
  static long rwrk[SHMEM_REDUCE_MIN_WRKDATA_SIZE];
  const int odd_size = npes / 2;
  if (me % 2 == 1) {
    for (int r = 0; r < 200; ++r) shmem_barrier(1, 1, odd_size, bsync);
    lsrc[0] = me;
    shmem_long_sum_to_all(ldst, lsrc, 1, 1, 1, odd_size, rwrk, rsync);
    CHECK(ldst[0] == (long)odd_size * odd_size);  /* 1 + 3 + ... + (2k - 1) = k^2 */
    shmem_collect64(ldst, lsrc, 1, 1, 1, odd_size, rsync);
    for (int i = 0; i < odd_size; ++i) CHECK(ldst[i] == 2 * i + 1);
  }
  for (int i = 0; i < SHMEM_BARRIER_SYNC_SIZE; ++i) CHECK(bsync[i] == SHMEM_SYNC_VALUE);
  for (int i = 0; i < SHMEM_REDUCE_SYNC_SIZE; ++i) CHECK(rsync[i] == SHMEM_SYNC_VALUE);
  DONE("collect");
}
