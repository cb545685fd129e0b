// MPI as the bootstrap under mpirun: starting and stopping it, and the
// collective exchanges of the transports' keys. No MPI type appears here,
// so that only the files that call MPI include <mpi.h>.
#pragma once

#include <algorithm>
#include <cstddef>
#include <span>
#include <type_traits>
#include <vector>

namespace coremesh::shmem::internal {

bool launched_by_mpirun();
// MPI_Abort when MPI is up (shmem_global_exit under mpirun).
void abort_mpi_job(int status);

// Throws an Error naming `what` and MPI's message unless `rc` is MPI_SUCCESS.
void check_mpi(int rc, const char* what);
// Initialises MPI (MPI_THREAD_SERIALIZED) unless the program did; returns
// whether this call did it (then stop_mpi finalizes it).
bool start_mpi();
void stop_mpi();
int mpi_rank();
int mpi_size();
void mpi_barrier();
// The world rank of the lowest rank sharing memory with this one
// (MPI_COMM_TYPE_SHARED): equal values mean the same machine.
int mpi_machine();

// Every rank's bytes, in rank order.
std::vector<std::vector<std::byte>> allgather_bytes(std::span<const std::byte> mine);
// Every rank's `mine` (a trivially copyable value), in rank order.
template <typename T>
std::vector<T> allgather(const T& mine) {
  static_assert(std::is_trivially_copyable_v<T>);
  std::vector<T> all;
  for (const auto& bytes : allgather_bytes(std::as_bytes(std::span(&mine, 1)))) {
    T v;
    std::copy(bytes.begin(), bytes.end(), reinterpret_cast<std::byte*>(&v));
    all.push_back(v);
  }
  return all;
}

}  // namespace coremesh::shmem::internal
