/* teams: strided splits (negative strides, size 1 with stride 0), invalid
 * triplets (non-zero return and SHMEM_TEAM_INVALID, not an error), 2D
 * splits for every xrange, many create/destroy cycles, back-to-back team
 * collectives, translate, config, shmem_sync(team), team contexts. */
#include <shmem.h>
#include <stdint.h>
#include "check.h"

static void check_team(shmem_team_t team, int start, int stride, int size) {
  const int me = shmem_my_pe();
  int index = -1;
  for (int i = 0; i < size; ++i)
    if (start + i * stride == me) index = i;
  CHECK((team != SHMEM_TEAM_INVALID) == (index >= 0));
  if (team == SHMEM_TEAM_INVALID) {
    CHECK(shmem_team_my_pe(team) == -1);
    CHECK(shmem_team_n_pes(team) == -1);
    return;
  }
  CHECK(shmem_team_my_pe(team) == index);
  CHECK(shmem_team_n_pes(team) == size);
  for (int i = 0; i < size; ++i)
    CHECK(shmem_team_translate_pe(team, i, SHMEM_TEAM_WORLD) == start + i * stride);
  CHECK(shmem_team_translate_pe(SHMEM_TEAM_WORLD, me, team) == index);
}

/* a reduction, a broadcast and an fcollect on `team`, back to back */
static void team_collectives(shmem_team_t team, long* src, long* dst, int round) {
  const int n = shmem_team_n_pes(team), r = shmem_team_my_pe(team);
  long sum = 0;
  for (int i = 0; i < n; ++i) sum += shmem_team_translate_pe(team, i, SHMEM_TEAM_WORLD) + round;
  src[0] = shmem_my_pe() + round;
  CHECK(shmem_long_sum_reduce(team, dst, src, 1) == 0);
  CHECK(dst[0] == sum);
  CHECK(shmem_long_broadcast(team, dst, src, 1, n - 1) == 0);
  CHECK(dst[0] == shmem_team_translate_pe(team, n - 1, SHMEM_TEAM_WORLD) + round);
  CHECK(shmem_long_fcollect(team, dst, src, 1) == 0);
  for (int i = 0; i < n; ++i) CHECK(dst[i] == shmem_team_translate_pe(team, i, SHMEM_TEAM_WORLD) + round);
  CHECK(shmem_team_sync(team) == 0);
  shmem_sync(team); /* the 1.5 generic */
  (void)r;
}

int main(void) {
  shmem_init();
  const int me = shmem_my_pe(), npes = shmem_n_pes();
  long* src = shmem_calloc(npes, sizeof(long));
  long* dst = shmem_calloc(npes, sizeof(long));
  shmem_team_t t;

  /* evens; the last PE backwards to the first; one PE with stride 0 */
  CHECK(shmem_team_split_strided(SHMEM_TEAM_WORLD, 0, 2, (npes + 1) / 2, NULL, 0, &t) == 0);
  check_team(t, 0, 2, (npes + 1) / 2);
  if (t != SHMEM_TEAM_INVALID) team_collectives(t, src, dst, 1);
  shmem_team_destroy(t);
  CHECK(shmem_team_split_strided(SHMEM_TEAM_WORLD, npes - 1, -1, npes, NULL, 0, &t) == 0);
  check_team(t, npes - 1, -1, npes);
  team_collectives(t, src, dst, 2);
  shmem_team_destroy(t);
  CHECK(shmem_team_split_strided(SHMEM_TEAM_WORLD, npes / 2, 0, 1, NULL, 0, &t) == 0);
  check_team(t, npes / 2, 0, 1);
  shmem_team_destroy(t);

  /* invalid triplets: non-zero everywhere, no team, no error */
  CHECK(shmem_team_split_strided(SHMEM_TEAM_WORLD, 0, 1, 0, NULL, 0, &t) != 0);
  CHECK(t == SHMEM_TEAM_INVALID);
  CHECK(shmem_team_split_strided(SHMEM_TEAM_WORLD, 0, 1, npes + 1, NULL, 0, &t) != 0);
  CHECK(t == SHMEM_TEAM_INVALID);
  CHECK(shmem_team_split_strided(SHMEM_TEAM_WORLD, 0, -1, 2, NULL, 0, &t) != 0);
  CHECK(shmem_team_split_strided(SHMEM_TEAM_INVALID, 0, 1, 1, NULL, 0, &t) != 0);
  CHECK(t == SHMEM_TEAM_INVALID);
  CHECK(shmem_team_translate_pe(SHMEM_TEAM_INVALID, 0, SHMEM_TEAM_WORLD) == -1);
  CHECK(shmem_team_translate_pe(SHMEM_TEAM_WORLD, npes, SHMEM_TEAM_WORLD) == -1);

  /* every xrange, including ones larger than the team */
  for (int xrange = 1; xrange <= npes + 1; ++xrange) {
    shmem_team_t x, y;
    shmem_team_config_t cfg = {2};
    CHECK(shmem_team_split_2d(SHMEM_TEAM_WORLD, xrange, &cfg, SHMEM_TEAM_NUM_CONTEXTS, &x, NULL, 0, &y) == 0);
    const int xr = xrange < npes ? xrange : npes;
    check_team(x, me / xr * xr, 1, (me / xr * xr + xr <= npes ? xr : npes - me / xr * xr));
    check_team(y, me % xr, xr, (npes - me % xr + xr - 1) / xr);
    shmem_team_config_t got = {0};
    CHECK(shmem_team_get_config(x, SHMEM_TEAM_NUM_CONTEXTS, &got) == 0 && got.num_contexts == 2);
    team_collectives(x, src, dst, 3);
    team_collectives(y, src, dst, 4);
    shmem_team_destroy(x);
    shmem_team_destroy(y);
  }
  CHECK(shmem_team_split_2d(SHMEM_TEAM_WORLD, 0, NULL, 0, &t, NULL, 0, &t) != 0);

  /* far more create/destroy cycles than team slots */
  for (int i = 0; i < 150; ++i) {
    CHECK(shmem_team_split_strided(SHMEM_TEAM_WORLD, i % npes, 1, 1 + (npes - 1 - i % npes), NULL, 0, &t) == 0);
    if (t != SHMEM_TEAM_INVALID) {
      if (i % 10 == 0) team_collectives(t, src, dst, i);
      else CHECK(shmem_team_sync(t) == 0);
    }
    shmem_team_destroy(t);
  }

  /* a team context: PE numbers are team-relative */
  CHECK(shmem_team_split_strided(SHMEM_TEAM_WORLD, npes - 1, -1, npes, NULL, 0, &t) == 0);
  shmem_ctx_t ctx;
  CHECK(shmem_team_create_ctx(t, 0, &ctx) == 0);
  shmem_team_t back;
  CHECK(shmem_ctx_get_team(ctx, &back) == 0 && back == t);
  long* cell = shmem_calloc(1, sizeof(long));
  shmem_long_p(dst, 0, me);
  shmem_ctx_long_atomic_add(ctx, cell, me + 1, 0); /* team PE 0 is world PE npes - 1 */
  shmem_ctx_quiet(ctx);
  shmem_barrier_all();
  if (me == npes - 1) CHECK(*cell == (long)npes * (npes + 1) / 2);
  shmem_ctx_destroy(ctx);
  shmem_team_destroy(t);
  CHECK(shmem_team_create_ctx(SHMEM_TEAM_INVALID, 0, &ctx) != 0 && ctx == SHMEM_CTX_INVALID);

  /* one pSync array reused by active-set collectives of changing sets (all
   * PEs; the even ones; the first two): back to back within a set, with a
   * barrier_all before the set changes, as the spec requires (the array must
   * not be in use from a prior call on any PE of the set) */
  static long psync[SHMEM_REDUCE_SYNC_SIZE];
  static long pwrk[SHMEM_REDUCE_MIN_WRKDATA_SIZE];
  for (int i = 0; i < SHMEM_REDUCE_SYNC_SIZE; ++i) psync[i] = SHMEM_SYNC_VALUE;
  shmem_barrier_all();
  for (int round = 0; round < 20; ++round) {
    const int log_stride = round % 3 == 1 ? 1 : 0;
    const int size = round % 3 == 0 ? npes : round % 3 == 1 ? (npes + 1) / 2 : (npes < 2 ? 1 : 2);
    const int in_set = log_stride ? me % 2 == 0 : me < size;
    shmem_barrier_all();
    if (!in_set) continue;
    src[0] = me + round;
    shmem_long_sum_to_all(dst, src, 1, 0, log_stride, size, pwrk, psync);
    long want = 0;
    for (int i = 0; i < size; ++i) want += (i << log_stride) + round;
    CHECK(dst[0] == want);
    shmem_barrier(0, log_stride, size, psync);
    shmem_broadcast64(dst, src, 1, 0, 0, log_stride, size, psync);
    if (me != 0) CHECK(dst[0] == round);
  }
  DONE("teams");
}
