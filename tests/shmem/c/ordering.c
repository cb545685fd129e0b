/* ordering: shmem_fence orders puts (blocking and nbi), AMOs and signals
 * to one PE; shmem_quiet completes them. The receiver trusts the flag only:
 * it must then see every byte put before the fence. 4 MiB puts keep the
 * copy engine busy while the flag goes out. */
#include <shmem.h>
#include <stdint.h>
#include <stdlib.h>
#include "check.h"

#define N (512 * 1024) /* longs: 4 MiB */
#define ROUNDS 6

int main(void) {
  shmem_init();
  const int me = shmem_my_pe(), npes = shmem_n_pes();
  const int right = (me + 1) % npes, left = (me + npes - 1) % npes;
  long* data = shmem_malloc(N * sizeof(long));
  int* flag = shmem_calloc(1, sizeof(int));
  long* lflag = shmem_calloc(1, sizeof(long));
  uint64_t* sig = shmem_calloc(1, sizeof(uint64_t));
  long* ack = shmem_calloc(1, sizeof(long));
  long* src = malloc(N * sizeof(long));
  shmem_ctx_t ctx;
  CHECK(shmem_ctx_create(SHMEM_CTX_PRIVATE, &ctx) == 0);
  for (int round = 1; round <= ROUNDS; ++round) {
    for (long i = 0; i < N; ++i) src[i] = round * 1000003L + i + me;
    switch (round % 6) { /* each way of sending the data, then the flag */
      case 0: shmem_long_put_nbi(data, src, N, right); shmem_fence(); shmem_int_atomic_inc(flag, right); break;
      case 1: shmem_long_put_nbi(data, src, N, right); shmem_fence(); shmem_int_p(flag, round, right); break;
      case 2: shmem_putmem_nbi(data, src, N * sizeof(long), right); shmem_quiet(); shmem_int_atomic_set(flag, round, right); break;
      case 3: shmem_ctx_long_put_nbi(ctx, data, src, N, right); shmem_ctx_fence(ctx); shmem_atomic_inc(ctx, flag, right); break;
      case 4: shmem_long_put(data, src, N, right); shmem_fence(); shmem_int_atomic_add(flag, 1, right); break;
      case 5: shmem_long_put_nbi(data, src, N / 2, right);
              shmem_long_put_nbi(data + N / 2, src + N / 2, N - N / 2, right); shmem_fence();
              shmem_long_put_signal_nbi(lflag, &src[0], 1, sig, round, SHMEM_SIGNAL_SET, right);
              shmem_quiet(); shmem_int_atomic_set(flag, round, right); break;
    }
    /* wait for the flag of this round (inc/add count up to `round`) */
    shmem_int_wait_until(flag, SHMEM_CMP_GE, round);
    long bad = 0;
    for (long i = 0; i < N; ++i) bad += data[i] != round * 1000003L + i + left;
    CHECK(bad == 0);
    if (round % 6 == 5) CHECK(shmem_signal_fetch(sig) == (uint64_t)round);
    *flag = round; /* normalise: inc/add rounds leave `round` there too */
    /* the left PE may overwrite data only after we checked it */
    shmem_long_atomic_set(ack, round, left);
    shmem_long_wait_until(ack, SHMEM_CMP_EQ, round);
  }
  /* quiet completes get_nbi and fetching nbi AMOs */
  long got[4];
  long* cnt = shmem_calloc(1, sizeof(long));
  long fetched = -1;
  shmem_long_get_nbi(got, data, 4, right);
  shmem_long_atomic_fetch_add_nbi(&fetched, cnt, 5, right);
  shmem_quiet();
  for (int i = 0; i < 4; ++i) CHECK(got[i] == ROUNDS * 1000003L + i + me);
  CHECK(fetched == 0);
  shmem_ctx_destroy(ctx);
  free(src);
  DONE("ordering");
}
