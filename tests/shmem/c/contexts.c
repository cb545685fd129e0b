/* contexts: shmem_ctx_create with each option, every shmem_ctx_* routine
 * family (typed, sized, mem, signal, AMOs, fence/quiet) and the C11
 * generic forms that take a context first; SHMEM_CTX_DEFAULT works as a
 * context; destroyed contexts complete their operations. Initialized with
 * shmem_init_thread: shmem_query_thread reports the level it provided
 * (9.1.3). */
#include <shmem.h>
#include <stdint.h>
#include <string.h>
#include "check.h"

#define N 64

int main(void) {
  int provided = -1, queried = -2;
  CHECK(shmem_init_thread(SHMEM_THREAD_SERIALIZED, &provided) == 0);
  shmem_query_thread(&queried);
  CHECK(provided == SHMEM_THREAD_SERIALIZED && queried == provided);
  const int me = shmem_my_pe(), npes = shmem_n_pes();
  const int right = (me + 1) % npes, left = (me + npes - 1) % npes;
  long* dst = shmem_calloc(N, sizeof(long));
  long* counter = shmem_calloc(4, sizeof(long));
  uint64_t* sig = shmem_calloc(1, sizeof(uint64_t));
  unsigned int* bits = shmem_calloc(1, sizeof(unsigned int));
  long src[N], back[N];
  for (int i = 0; i < N; ++i) src[i] = me * 1000L + i;
  const long options[] = {0, SHMEM_CTX_PRIVATE, SHMEM_CTX_SERIALIZED,
                          SHMEM_CTX_PRIVATE | SHMEM_CTX_NOSTORE};
  for (int k = 0; k < 5; ++k) {
    shmem_ctx_t ctx = SHMEM_CTX_DEFAULT;
    if (k < 4) CHECK(shmem_ctx_create(options[k], &ctx) == 0);
    shmem_barrier_all();
    shmem_ctx_long_put(ctx, dst, src, N / 2, right);
    shmem_ctx_long_put_nbi(ctx, dst + N / 2, src + N / 2, N / 2, right);
    shmem_ctx_fence(ctx);
    shmem_atomic_inc(ctx, &counter[0], right); /* generic with a context */
    shmem_ctx_quiet(ctx);
    shmem_long_wait_until(&counter[0], SHMEM_CMP_GE, k + 1);
    for (int i = 0; i < N; ++i) CHECK(dst[i] == left * 1000L + i);
    shmem_ctx_long_get(ctx, back, dst, N, right);
    for (int i = 0; i < N; ++i) CHECK(back[i] == src[i]);
    shmem_get(ctx, back, dst, 2, right); /* generic */
    CHECK(back[1] == src[1]);
    shmem_ctx_long_get_nbi(ctx, back, dst + 3, 1, right);
    shmem_ctx_quiet(ctx);
    CHECK(back[0] == src[3]);
    CHECK(shmem_ctx_long_g(ctx, &dst[7], right) == src[7]);
    CHECK(shmem_g(ctx, &dst[8], right) == src[8]);
    shmem_barrier_all();
    shmem_ctx_long_p(ctx, &dst[0], -me, right);
    shmem_p(ctx, &dst[1], -me - 1, right);
    shmem_ctx_long_iput(ctx, dst + 2, src, 2, 1, 4, right);
    shmem_ctx_putmem(ctx, dst + 20, src, 2 * sizeof(long), right);
    shmem_ctx_put64(ctx, dst + 30, src + 5, 1, right);
    shmem_ctx_quiet(ctx);
    shmem_barrier_all();
    CHECK(dst[0] == -left && dst[1] == -left - 1 && dst[4] == left * 1000L + 1);
    CHECK(dst[20] == left * 1000L && dst[30] == left * 1000L + 5);
    shmem_ctx_long_iget(ctx, back, dst + 2, 1, 2, 2, right);
    CHECK(back[1] == src[1]);
    shmem_ctx_getmem(ctx, back, dst + 20, sizeof(long), right);
    CHECK(back[0] == src[0]);
    /* put with signal on the context */
    shmem_barrier_all();
    shmem_ctx_long_put_signal(ctx, dst, src, 4, sig, (uint64_t)(2 * k + 1), SHMEM_SIGNAL_SET, right);
    shmem_signal_wait_until(sig, SHMEM_CMP_EQ, (uint64_t)(2 * k + 1));
    CHECK(dst[3] == left * 1000L + 3);
    shmem_barrier_all();
    shmem_put_signal_nbi(ctx, dst, src, 4, sig, 1, SHMEM_SIGNAL_ADD, right);
    shmem_ctx_quiet(ctx);
    shmem_signal_wait_until(sig, SHMEM_CMP_EQ, (uint64_t)(2 * k + 2));
    /* AMOs on the context: typed, generic, fetching nbi */
    shmem_barrier_all();
    (void)shmem_ctx_long_atomic_fetch_add(ctx, &counter[1], 2, 0);
    shmem_atomic_add(ctx, &counter[1], 1, 0);
    long fetched = -1;
    shmem_ctx_long_atomic_fetch_inc_nbi(ctx, &fetched, &counter[2], 0);
    (void)shmem_atomic_compare_swap(ctx, &counter[3], (long)0, (long)(me + 1), 0);
    shmem_ctx_uint_atomic_or(ctx, bits, 1u << (me % 30), 0);
    shmem_ctx_quiet(ctx);
    CHECK(fetched >= 0 && fetched < npes * (k + 1));
    shmem_barrier_all();
    CHECK(shmem_ctx_long_atomic_fetch(ctx, &counter[1], 0) == 3L * npes * (k + 1));
    CHECK(shmem_atomic_fetch(ctx, &counter[2], 0) == (long)npes * (k + 1));
    const long winner = shmem_ctx_long_atomic_swap(ctx, &counter[3], 0, 0);
    shmem_barrier_all();
    CHECK(winner >= 0 && winner <= npes);
    shmem_barrier_all();
    if (k < 4) shmem_ctx_destroy(ctx);
  }
  unsigned all = 0;
  for (int p = 0; p < npes; ++p) all |= 1u << (p % 30);
  CHECK(shmem_uint_atomic_fetch(bits, 0) == all);
  /* a context on SHMEM_TEAM_SHARED (every PE of this host): its team is the
   * predefined handle, and it works like any other */
  shmem_ctx_t shared;
  CHECK(shmem_team_create_ctx(SHMEM_TEAM_SHARED, 0, &shared) == 0);
  shmem_team_t of_shared;
  CHECK(shmem_ctx_get_team(shared, &of_shared) == 0 && of_shared == SHMEM_TEAM_SHARED);
  const int shared_right = (shmem_team_my_pe(SHMEM_TEAM_SHARED) + 1) % shmem_team_n_pes(SHMEM_TEAM_SHARED);
  shmem_ctx_long_p(shared, &counter[3], 7, shared_right);
  shmem_ctx_quiet(shared);
  shmem_ctx_destroy(shared);
  shmem_barrier_all();
  CHECK(counter[3] == 7);
  /* contexts are reused after destruction; many in turn work */
  for (int i = 0; i < 5000; ++i) {
    shmem_ctx_t c;
    CHECK(shmem_ctx_create(0, &c) == 0);
    shmem_ctx_destroy(c);
  }
  shmem_ctx_fence(SHMEM_CTX_INVALID); /* no-ops */
  shmem_ctx_quiet(SHMEM_CTX_INVALID);
  shmem_ctx_destroy(SHMEM_CTX_INVALID);
  DONE("contexts");
}
