#define OMPI_SKIP_MPICXX 1  // the C API only (no libmpi_cxx)
#define MPICH_SKIP_MPICXX 1
#include "mpi_boot.hpp"

#include <mpi.h>

#include <string>

#include "coremesh/core/env.hpp"
#include "coremesh/core/error.hpp"

namespace coremesh::shmem::internal {

bool launched_by_mpirun() {
  return env::get("OMPI_COMM_WORLD_SIZE").has_value() || env::get("PMIX_RANK").has_value();
}

void abort_mpi_job(int status) {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized) MPI_Abort(MPI_COMM_WORLD, status);
}

void check_mpi(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  CM_THROW(Error, "check the mpirun command line (transport MCA parameters) and the peers' output",
           "MPI: {} failed: {}", what, std::string(text, static_cast<size_t>(len)));
}

bool start_mpi() {
  int initialized = 0;
  MPI_Initialized(&initialized);
  int provided = 0;
  if (initialized) {
    MPI_Query_thread(&provided);
  } else {
    check_mpi(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided),
              "MPI_Init_thread");
  }
  CM_CHECK(provided >= MPI_THREAD_SERIALIZED,
           "initialise MPI with MPI_Init_thread(MPI_THREAD_SERIALIZED or more), or let shmem_init do it",
           "MPI provides thread level {}, SHMEM needs MPI_THREAD_SERIALIZED", provided);
  return !initialized;
}

void stop_mpi() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

int mpi_rank() {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

int mpi_size() {
  int size = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  return size;
}

void mpi_barrier() { check_mpi(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier"); }

int mpi_machine() {
  MPI_Comm machine;
  check_mpi(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &machine),
            "MPI_Comm_split_type");
  int lowest = mpi_rank();
  check_mpi(MPI_Allreduce(MPI_IN_PLACE, &lowest, 1, MPI_INT, MPI_MIN, machine), "MPI_Allreduce");
  MPI_Comm_free(&machine);
  return lowest;
}

std::vector<std::vector<std::byte>> allgather_bytes(std::span<const std::byte> mine) {
  const int n = mpi_size();
  const int my_len = static_cast<int>(mine.size());
  std::vector<int> lens(static_cast<size_t>(n)), displs(static_cast<size_t>(n));
  check_mpi(MPI_Allgather(&my_len, 1, MPI_INT, lens.data(), 1, MPI_INT, MPI_COMM_WORLD),
            "MPI_Allgather");
  int total = 0;
  for (int i = 0; i < n; ++i) {
    displs[static_cast<size_t>(i)] = total;
    total += lens[static_cast<size_t>(i)];
  }
  std::vector<std::byte> all(static_cast<size_t>(total));
  check_mpi(MPI_Allgatherv(mine.data(), my_len, MPI_BYTE, all.data(), lens.data(), displs.data(),
                           MPI_BYTE, MPI_COMM_WORLD),
            "MPI_Allgatherv");
  std::vector<std::vector<std::byte>> out(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    const auto at = all.begin() + displs[static_cast<size_t>(i)];
    out[static_cast<size_t>(i)].assign(at, at + lens[static_cast<size_t>(i)]);
  }
  return out;
}

}  // namespace coremesh::shmem::internal
