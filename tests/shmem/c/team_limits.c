/* team_limits: running out of teams, the failures a split reports, and
 * the reuse of destroyed teams.
 *
 * OpenSHMEM 1.5, 9.4.6 (shmem_team_split_strided) and 9.4.7
 * (shmem_team_split_2d): "If the new team cannot be created or is invalid,
 * new_team is set to SHMEM_TEAM_INVALID" and the routine returns a
 * nonzero value, on every PE of the parent (the call is collective over
 * it), so that the program can go on; a PE that is not in the new team
 * gets SHMEM_TEAM_INVALID and zero. A parent of SHMEM_TEAM_INVALID is
 * such a failure too. 9.4.4 (shmem_team_get_config): the team's config as
 * created (num_contexts); nonzero for SHMEM_TEAM_INVALID. 9.4.8
 * (shmem_team_destroy): a destroyed team's resources are released. */
#include <shmem.h>
#include <stdint.h>
#include "check.h"

#define MAX_TRY 1000

static shmem_team_t teams[MAX_TRY];

/* the same on every PE: min and max over the world */
static void check_same(int value) {
  static int src, mn, mx;
  src = value;
  shmem_int_min_reduce(SHMEM_TEAM_WORLD, &mn, &src, 1);
  shmem_int_max_reduce(SHMEM_TEAM_WORLD, &mx, &src, 1);
  CHECK(mn == value && mx == value);
}

/* makes copies of the world until a split fails; returns how many it made */
static int fill(int with_contexts) {
  int made = 0;
  for (; made < MAX_TRY; ++made) {
    shmem_team_config_t config = {made % 4};
    shmem_team_t t = (shmem_team_t)&made; /* overwritten either way */
    const int rc = shmem_team_split_strided(SHMEM_TEAM_WORLD, 0, 1, shmem_n_pes(),
                                            with_contexts ? &config : NULL,
                                            with_contexts ? SHMEM_TEAM_NUM_CONTEXTS : 0, &t);
    if (rc != 0) {
      CHECK(t == SHMEM_TEAM_INVALID);
      break;
    }
    CHECK(t != SHMEM_TEAM_INVALID);
    teams[made] = t;
  }
  return made;
}

int main(void) {
  shmem_init();
  const int me = shmem_my_pe(), npes = shmem_n_pes();
  long* buf = shmem_calloc(2 * npes, sizeof(long));

  /* 1: run out of teams; every PE makes as many and fails at the same call */
  const int made = fill(1);
  CHECK(made >= 16 && made < MAX_TRY);
  check_same(made);
  /* the config reports what each team was made with */
  for (int i = 0; i < made; ++i) {
    shmem_team_config_t config = {-1};
    CHECK(shmem_team_get_config(teams[i], SHMEM_TEAM_NUM_CONTEXTS, &config) == 0);
    CHECK(config.num_contexts == i % 4);
  }
  shmem_team_config_t config = {-1};
  CHECK(shmem_team_get_config(SHMEM_TEAM_INVALID, SHMEM_TEAM_NUM_CONTEXTS, &config) != 0);
  CHECK(shmem_team_get_config(SHMEM_TEAM_WORLD, SHMEM_TEAM_NUM_CONTEXTS, &config) == 0);
  CHECK(config.num_contexts >= 0);
  /* the failed split did not break anything: collectives on the last team */
  buf[0] = me;
  CHECK(shmem_long_sum_reduce(teams[made - 1], buf + 1, buf, 1) == 0);
  CHECK(buf[1] == (long)npes * (npes - 1) / 2);
  /* a 2D split (two teams) fails as a whole, also with one team left */
  shmem_team_t x = SHMEM_TEAM_WORLD, y = SHMEM_TEAM_WORLD;
  CHECK(shmem_team_split_2d(SHMEM_TEAM_WORLD, 1, NULL, 0, &x, NULL, 0, &y) != 0);
  CHECK(x == SHMEM_TEAM_INVALID && y == SHMEM_TEAM_INVALID);
  shmem_team_destroy(teams[made - 1]);
  CHECK(shmem_team_split_2d(SHMEM_TEAM_WORLD, 1, NULL, 0, &x, NULL, 0, &y) != 0);
  CHECK(x == SHMEM_TEAM_INVALID && y == SHMEM_TEAM_INVALID);
  /* a split of one PE needs a team only on that PE: it still fails on all
   * (every PE of the parent returns the same) */
  shmem_team_t one = SHMEM_TEAM_WORLD;
  const int rc_one = shmem_team_split_strided(SHMEM_TEAM_WORLD, 0, 0, 1, NULL, 0, &one);
  check_same(rc_one != 0);
  if (rc_one != 0 || me != 0) CHECK(one == SHMEM_TEAM_INVALID);
  if (rc_one == 0 && me == 0) shmem_team_destroy(one);

  /* 2: destroy them all: as many can be made again */
  for (int i = 0; i < made - 1; ++i) shmem_team_destroy(teams[i]);
  CHECK(fill(0) == made);
  for (int i = 0; i < made; ++i) shmem_team_destroy(teams[i]);

  /* 3: the other failures of a split: nonzero, SHMEM_TEAM_INVALID, go on */
  shmem_team_t t = SHMEM_TEAM_WORLD;
  CHECK(shmem_team_split_strided(SHMEM_TEAM_INVALID, 0, 1, 1, NULL, 0, &t) != 0);
  CHECK(t == SHMEM_TEAM_INVALID);
  t = SHMEM_TEAM_WORLD;
  CHECK(shmem_team_split_strided(SHMEM_TEAM_WORLD, 0, 1, npes + 1, NULL, 0, &t) != 0);
  CHECK(t == SHMEM_TEAM_INVALID);
  t = SHMEM_TEAM_WORLD;
  CHECK(shmem_team_split_strided(SHMEM_TEAM_WORLD, -1, 1, 1, NULL, 0, &t) != 0);
  CHECK(t == SHMEM_TEAM_INVALID);
  t = SHMEM_TEAM_WORLD;
  CHECK(shmem_team_split_strided(SHMEM_TEAM_WORLD, 0, 1, 0, NULL, 0, &t) != 0);
  CHECK(t == SHMEM_TEAM_INVALID);
  shmem_team_config_t bad = {-1};
  t = SHMEM_TEAM_WORLD;
  CHECK(shmem_team_split_strided(SHMEM_TEAM_WORLD, 0, 1, npes, &bad, SHMEM_TEAM_NUM_CONTEXTS, &t) != 0);
  CHECK(t == SHMEM_TEAM_INVALID);
  x = y = SHMEM_TEAM_WORLD;
  CHECK(shmem_team_split_2d(SHMEM_TEAM_INVALID, 1, NULL, 0, &x, NULL, 0, &y) != 0);
  CHECK(x == SHMEM_TEAM_INVALID && y == SHMEM_TEAM_INVALID);
  x = y = SHMEM_TEAM_WORLD;
  CHECK(shmem_team_split_2d(SHMEM_TEAM_WORLD, 0, NULL, 0, &x, NULL, 0, &y) != 0);
  CHECK(x == SHMEM_TEAM_INVALID && y == SHMEM_TEAM_INVALID);

  /* 4: not a member: zero and SHMEM_TEAM_INVALID; a split of that parent
   * on the non-member is a failure (its parent handle is invalid) */
  t = SHMEM_TEAM_WORLD;
  CHECK(shmem_team_split_strided(SHMEM_TEAM_WORLD, npes - 1, 1, 1, NULL, 0, &t) == 0);
  CHECK((t != SHMEM_TEAM_INVALID) == (me == npes - 1));
  shmem_team_t sub = SHMEM_TEAM_WORLD;
  if (t == SHMEM_TEAM_INVALID) {
    CHECK(shmem_team_split_strided(t, 0, 1, 1, NULL, 0, &sub) != 0);
  } else {
    CHECK(shmem_team_split_strided(t, 0, 1, 1, NULL, 0, &sub) == 0);
    CHECK(sub != SHMEM_TEAM_INVALID && shmem_team_n_pes(sub) == 1);
    shmem_team_destroy(sub);
    sub = SHMEM_TEAM_INVALID;
  }
  CHECK(sub == SHMEM_TEAM_INVALID);
  shmem_team_destroy(t);
  /* disjoint teams on different PEs fill different slots: still as many */
  CHECK(fill(0) == made);
  for (int i = 0; i < made; ++i) shmem_team_destroy(teams[i]);
  DONE("team_limits");
}
