/* symbols: a program may define any name outside the OpenSHMEM ones
 * (shmem_*, shmemx_*, pshmem_*, the legacy names; OpenSHMEM 1.5, 1.0/2:
 * the library's names all carry those prefixes). These are common names a
 * library's internals might use; each must link (a global `contexts` in
 * the library once made this "multiple definition") and stay the
 * program's own. tests/shmem/exported_symbols.py checks the libraries'
 * export lists themselves. */
#include <shmem.h>
#include "check.h"

int contexts = 1;
long state = 2;
int transport = 3;
int team(void) { return 4; }
int handle(void) { return 5; }
int fail(int x) { return x + 6; }
int init(void) { return 7; }
int finalize(void) { return 8; }
int barrier(void) { return 9; }
int group(void) { return 10; }
long heap[4] = {11, 12, 13, 14};
int cmp(int a, int b) { return a < b; }

int main(void) {
  shmem_init();
  shmem_team_t t;
  shmem_team_config_t config = {2};
  /* the library's team routines run (they once used a helper `contexts`) */
  CHECK(shmem_team_split_strided(SHMEM_TEAM_WORLD, 0, 1, shmem_n_pes(), &config,
                                 SHMEM_TEAM_NUM_CONTEXTS, &t) == 0);
  shmem_team_config_t got = {0};
  CHECK(shmem_team_get_config(t, SHMEM_TEAM_NUM_CONTEXTS, &got) == 0 && got.num_contexts == 2);
  shmem_team_destroy(t);
  CHECK(contexts == 1 && state == 2 && transport == 3 && team() == 4 && handle() == 5);
  CHECK(fail(0) == 6 && init() == 7 && finalize() == 8 && barrier() == 9 && group() == 10);
  CHECK(heap[3] == 14 && cmp(1, 2));
  DONE("symbols");
}
