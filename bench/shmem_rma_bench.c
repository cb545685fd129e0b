/* shmem_rma_bench.c: put/get latency (8 B) and bandwidth (4 KiB - 64 MiB)
 * from PE 0 to PE 1, and local memcpy for reference, medians of
 * RMA_BENCH_TRIALS runs. Plain OpenSHMEM C: the
 * same source is built with coremesh-cc and with OpenMPI's oshcc, so both
 * libraries run exactly the same loops. Output lines: "<metric> <bytes> <value>". */
#include <shmem.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

#define MAX_BYTES (64L << 20)
#define MAX_TRIALS 9 /* RMA_BENCH_TRIALS: 1 to 9 (default 3) */

static int by_value(const void* a, const void* b) {
  const double x = *(const double*)a, y = *(const double*)b;
  return (x > y) - (x < y);
}
/* The median of v[0..n) (sorts v). */
static double median(double* v, int n) {
  qsort(v, (size_t)n, sizeof *v, by_value);
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

int main(void) {
  shmem_init();
  const int me = shmem_my_pe();
  char* remote = shmem_malloc(MAX_BYTES);
  char* local = malloc(MAX_BYTES);
  char* local2 = malloc(MAX_BYTES);
  memset(remote, 1, MAX_BYTES);
  memset(local, 2, MAX_BYTES);
  memset(local2, 3, MAX_BYTES);
  shmem_barrier_all();
  if (me == 0 && shmem_n_pes() > 1) {
    /* RMA_BENCH_LAT_ITERS: fewer for a network path (default 200000) */
    const int iters = getenv("RMA_BENCH_LAT_ITERS") ? atoi(getenv("RMA_BENCH_LAT_ITERS")) : 200000;
    int trials = getenv("RMA_BENCH_TRIALS") ? atoi(getenv("RMA_BENCH_TRIALS")) : 3;
    trials = trials < 1 ? 1 : trials > MAX_TRIALS ? MAX_TRIALS : trials;
    double put_ns[MAX_TRIALS], get_ns[MAX_TRIALS];
    for (int round = -1; round < trials; ++round) { /* round -1 warms up */
      double t = now();
      for (int i = 0; i < iters; ++i) {
        shmem_putmem(remote, local, 8, 1);
        shmem_quiet();
      }
      const double put = (now() - t) / iters * 1e9;
      t = now();
      for (int i = 0; i < iters; ++i) shmem_getmem(local2, remote, 8, 1);
      const double get = (now() - t) / iters * 1e9;
      if (round >= 0) put_ns[round] = put, get_ns[round] = get;
    }
    printf("put_lat 8 %.1f\nget_lat 8 %.1f\n", median(put_ns, trials), median(get_ns, trials));
    for (long bytes = 4096; bytes <= MAX_BYTES; bytes *= 4) {
      /* RMA_BENCH_MIB: bytes moved per size and trial (default 512 MiB) */
      const long budget = (getenv("RMA_BENCH_MIB") ? atol(getenv("RMA_BENCH_MIB")) : 512L) << 20;
      int reps = (int)(budget / bytes);
      if (reps < 3) reps = 3;
      if (reps > 20000) reps = 20000;
      double put[MAX_TRIALS], get[MAX_TRIALS], copy[MAX_TRIALS]; /* medians: the machine is shared */
      for (int trial = 0; trial < trials; ++trial) {
        shmem_putmem(remote, local, bytes, 1); /* warm up */
        shmem_quiet();
        double t = now();
        for (int i = 0; i < reps; ++i) {
          shmem_putmem(remote, local, bytes, 1);
          shmem_quiet();
        }
        put[trial] = bytes * (double)reps / (now() - t) / 1e9;
        shmem_getmem(local2, remote, bytes, 1);
        t = now();
        for (int i = 0; i < reps; ++i) shmem_getmem(local2, remote, bytes, 1);
        get[trial] = bytes * (double)reps / (now() - t) / 1e9;
        memcpy(local2, local, bytes);
        t = now();
        for (int i = 0; i < reps; ++i) {
          memcpy(local2, local, bytes);
          __asm__ volatile("" ::: "memory"); /* keep every copy */
        }
        copy[trial] = bytes * (double)reps / (now() - t) / 1e9;
      }
      printf("put_bw %ld %.3f\nget_bw %ld %.3f\nmemcpy_bw %ld %.3f\n", bytes, median(put, trials),
             bytes, median(get, trials), bytes, median(copy, trials));
    }
    fflush(stdout);
  }
  shmem_barrier_all();
  shmem_free(remote);
  free(local);
  free(local2);
  shmem_finalize();
  return 0;
}
