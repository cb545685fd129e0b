/* ep_exchange_mpi.c: the MPI side of the expert-parallel exchange benchmark
 * (coremesh side: ep_exchange.cpp), the same rows (ep_exchange_layout.h):
 *   dispatch: MPI_Alltoall of the per-expert row counts, MPI_Alltoallv of the
 *             rows (they arrive by source), then the rows reordered by local
 *             expert (source order inside one), the layout grouped expert
 *             GEMMs need and ShmemExperts delivers;
 *   combine:  the expert outputs reordered back by source, MPI_Alltoallv
 *             home (identity experts: the rows each PE sent).
 * Timed per iteration after a barrier, the slowest rank's time, medians.
 *   usage: mpirun -np 2 ep_exchange_mpi [iterations]
 * Output: "mpi_<phase>_us <median>" and per rank "checksum <rank> <received> <returned>". */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ep_exchange_layout.h"

static int by_value(const void* a, const void* b) {
  const double x = *(const double*)a, y = *(const double*)b;
  return (x > y) - (x < y);
}

static double median(double* v, int n) {
  qsort(v, (size_t)n, sizeof(double), by_value);
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* Moves the rows of each (source, local expert) between the by-source layout
 * MPI_Alltoallv delivers (rdispl: floats) and the by-expert one, one way or
 * the other; returns the floats of the by-expert rows. */
static long reorder(float* by_expert, float* by_source, const int* got, const int* rdispl, int n, int El,
                    int to_expert) {
  long at = 0;
  for (int e = 0; e < El; ++e)
    for (int s = 0; s < n; ++s) {
      long from = rdispl[s];
      for (int j = 0; j < e; ++j) from += (long)got[s * El + j] * EPX_WIDTH;
      const size_t bytes = sizeof(float) * (size_t)got[s * El + e] * EPX_WIDTH;
      if (to_expert) memcpy(by_expert + at, by_source + from, bytes);
      else memcpy(by_source + from, by_expert + at, bytes);
      at += (long)got[s * El + e] * EPX_WIDTH;
    }
  return at;
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  const int iters = argc > 1 ? atoi(argv[1]) : 300, warmup = 20;
  int me, n;
  MPI_Comm_rank(MPI_COMM_WORLD, &me);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  const int E = EPX_EXPERTS, El = EPX_EXPERTS / n, C = EPX_WIDTH;
  int64_t offsets[EPX_EXPERTS + 1];
  float* xp = malloc(sizeof(float) * EPX_ROWS * C);
  epx_make(me, offsets, xp);
  float* by_source = malloc(sizeof(float) * (size_t)n * EPX_ROWS * C);
  float* by_expert = malloc(sizeof(float) * (size_t)n * EPX_ROWS * C);
  float* back = malloc(sizeof(float) * EPX_ROWS * C);
  int* counts = malloc(sizeof(int) * E);       /* rows per global expert I send */
  int* got = malloc(sizeof(int) * n * El);     /* rows per (source, my local expert) */
  int *scount = malloc(sizeof(int) * n), *sdispl = malloc(sizeof(int) * n);
  int *rcount = malloc(sizeof(int) * n), *rdispl = malloc(sizeof(int) * n);
  double* t = malloc(sizeof(double) * 3 * iters);
  double* worst = malloc(sizeof(double) * 3 * iters);
  for (int e = 0; e < E; ++e) counts[e] = (int)(offsets[e + 1] - offsets[e]);
  double recv_sum = 0, back_sum = 0;
  for (int it = -warmup; it < iters; ++it) {
    MPI_Barrier(MPI_COMM_WORLD);
    const double t0 = MPI_Wtime();
    /* dispatch */
    MPI_Alltoall(counts, El, MPI_INT, got, El, MPI_INT, MPI_COMM_WORLD);
    int sat = 0, rat = 0;
    for (int d = 0; d < n; ++d) {
      int s = 0, r = 0;
      for (int e = 0; e < El; ++e) s += counts[d * El + e], r += got[d * El + e];
      scount[d] = s * C, sdispl[d] = sat, sat += s * C;
      rcount[d] = r * C, rdispl[d] = rat, rat += r * C;
    }
    MPI_Alltoallv(xp, scount, sdispl, MPI_FLOAT, by_source, rcount, rdispl, MPI_FLOAT, MPI_COMM_WORLD);
    const long at = reorder(by_expert, by_source, got, rdispl, n, El, 1);
    const double t1 = MPI_Wtime();
    /* combine: the identity experts' outputs (by_expert) back by source, then home */
    reorder(by_expert, by_source, got, rdispl, n, El, 0);
    MPI_Alltoallv(by_source, rcount, rdispl, MPI_FLOAT, back, scount, sdispl, MPI_FLOAT, MPI_COMM_WORLD);
    const double t2 = MPI_Wtime();
    if (it >= 0) t[3 * it] = t1 - t0, t[3 * it + 1] = t2 - t1, t[3 * it + 2] = t2 - t0;
    if (it == iters - 1) {
      recv_sum = epx_checksum(by_expert, at);
      back_sum = epx_checksum(back, (int64_t)EPX_ROWS * C);
      if (back_sum != epx_checksum(xp, (int64_t)EPX_ROWS * C)) {
        fprintf(stderr, "rank %d: combine did not return the rows it sent\n", me);
        MPI_Abort(MPI_COMM_WORLD, 1);
      }
    }
  }
  MPI_Allreduce(t, worst, 3 * iters, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  printf("checksum %d %.17g %.17g\n", me, recv_sum, back_sum);
  fflush(stdout);
  MPI_Barrier(MPI_COMM_WORLD);
  if (me == 0) {
    const char* names[3] = {"dispatch", "combine", "total"};
    double* v = malloc(sizeof(double) * iters);
    for (int k = 0; k < 3; ++k) {
      for (int it = 0; it < iters; ++it) v[it] = worst[3 * it + k] * 1e6;
      printf("mpi_%s_us %.1f\n", names[k], median(v, iters));
    }
    fflush(stdout);
    free(v);
  }
  free(xp), free(by_source), free(by_expert), free(back), free(counts), free(got);
  free(scount), free(sdispl), free(rcount), free(rdispl), free(t), free(worst);
  MPI_Finalize();
  return 0;
}
