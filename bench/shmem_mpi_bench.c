/* shmem_mpi_bench.c: the OpenMPI side of the SHMEM comparison.
 *   MPI_Put latency (8 B) and bandwidth from rank 0 to rank 1 (passive
 *   target, MPI_Win_flush after each put; run with --mca osc sm), and
 *   MPI_Allreduce (f32 sum), MPI_Alltoall and MPI_Alltoallv (equal counts)
 *   at 1 MiB and 64 MiB per rank (the median call of 5 or 50; COLL_BENCH_KIB
 *   and COLL_BENCH_ALLREDUCE_ONLY as in bench/shmem_collectives.cpp). Output lines: "<metric> <bytes> <value>"
 *   (latency ns, bandwidth GB/s, collectives ms). */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_BYTES (64L << 20)

static int by_value(const void* a, const void* b) {
  const double x = *(const double*)a, y = *(const double*)b;
  return (x > y) - (x < y);
}

static double coll_ms(int which, long bytes, int rank, int size) {
  const int reps = bytes > (8L << 20) ? 5 : 50;
  char* a = malloc(bytes);
  char* b = malloc(bytes);
  memset(a, 1, bytes);
  memset(b, 0, bytes);
  int* counts = malloc(sizeof(int) * size);
  int* displs = malloc(sizeof(int) * size);
  const long per = bytes / size;
  for (int i = 0; i < size; ++i) counts[i] = (int)per, displs[i] = (int)(i * per);
  double times[50];
  for (int r = -1; r < reps; ++r) {
    MPI_Barrier(MPI_COMM_WORLD);
    const double t = MPI_Wtime();
    if (which == 0) MPI_Allreduce(a, b, (int)(bytes / 4), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    if (which == 1) MPI_Alltoall(a, (int)per, MPI_BYTE, b, (int)per, MPI_BYTE, MPI_COMM_WORLD);
    if (which == 2) MPI_Alltoallv(a, counts, displs, MPI_BYTE, b, counts, displs, MPI_BYTE, MPI_COMM_WORLD);
    double dt = MPI_Wtime() - t, worst;
    MPI_Allreduce(&dt, &worst, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    if (r >= 0) times[r] = worst;
  }
  (void)rank;
  free(a), free(b), free(counts), free(displs);
  qsort(times, (size_t)reps, sizeof *times, by_value);
  return times[reps / 2] * 1e3; /* the median call */
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank, size;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const int do_rma = argc > 1 && !strcmp(argv[1], "rma");
  if (do_rma) {
    char* base;
    MPI_Win win;
    MPI_Win_allocate(MAX_BYTES, 1, MPI_INFO_NULL, MPI_COMM_WORLD, &base, &win);
    memset(base, 1, MAX_BYTES);
    char* local = malloc(MAX_BYTES);
    memset(local, 2, MAX_BYTES);
    MPI_Win_lock_all(0, win);
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 0) {
      const int iters = 200000;
      for (int round = 0; round < 2; ++round) {
        double t = MPI_Wtime();
        for (int i = 0; i < iters; ++i) {
          MPI_Put(local, 8, MPI_BYTE, 1, 0, 8, MPI_BYTE, win);
          MPI_Win_flush(1, win);
        }
        if (round) printf("mpi_put_lat 8 %.1f\n", (MPI_Wtime() - t) / iters * 1e9);
      }
      for (long bytes = 4096; bytes <= MAX_BYTES; bytes *= 4) {
        int reps = (int)((512L << 20) / bytes);
        if (reps < 8) reps = 8;
        if (reps > 20000) reps = 20000;
        double best = 0; /* best of 3 trials, like the SHMEM side */
        for (int trial = 0; trial < 3; ++trial) {
          MPI_Put(local, (int)bytes, MPI_BYTE, 1, 0, (int)bytes, MPI_BYTE, win);
          MPI_Win_flush(1, win);
          double t = MPI_Wtime();
          for (int i = 0; i < reps; ++i) {
            MPI_Put(local, (int)bytes, MPI_BYTE, 1, 0, (int)bytes, MPI_BYTE, win);
            MPI_Win_flush(1, win);
          }
          const double bw = bytes * (double)reps / (MPI_Wtime() - t) / 1e9;
          if (bw > best) best = bw;
        }
        printf("mpi_put_bw %ld %.2f\n", bytes, best);
      }
      fflush(stdout);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    MPI_Win_unlock_all(win);
    MPI_Win_free(&win);
    free(local);
  } else {
    const char* kib_env = getenv("COLL_BENCH_KIB");
    const char* kib = kib_env ? kib_env : "1024 65536";
    const int collectives = getenv("COLL_BENCH_ALLREDUCE_ONLY") && atoi(getenv("COLL_BENCH_ALLREDUCE_ONLY")) == 1 ? 1 : 3;
    const char* names[3] = {"mpi_allreduce", "mpi_alltoall", "mpi_alltoallv"};
    for (char* end; *kib != '\0'; kib = end) {
      const long bytes = strtol(kib, &end, 10) << 10;
      if (end == kib) break;
      for (int w = 0; w < collectives; ++w) {
        const double ms = coll_ms(w, bytes, rank, size);
        if (rank == 0) printf("%s_np%d %ld %.3f\n", names[w], size, bytes, ms);
      }
    }
  }
  MPI_Finalize();
  return 0;
}
