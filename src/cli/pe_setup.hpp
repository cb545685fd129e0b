// How `coremesh train` runs a parallel layout: started as one process, it
// starts its PEs through the launcher (the same as `coremesh run -n N`);
// started by a launcher (coremesh run, or OpenMPI's mpirun), it is one PE and
// takes its share of the host's cores.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "coremesh/shmem/session.hpp"

namespace coremesh::cli {

// Whether this process is a PE of a launched job.
bool under_launcher();
// Joins the launched job as one of its PEs. The executable keeps nothing
// symmetric in global variables, so they are not made symmetric (that needs
// a single-threaded process, and OpenBLAS may have started its threads).
std::unique_ptr<shmem::Session> join_job();
// Starts `n_pes` PEs running this command line again, with a symmetric heap
// of at least `heap_bytes`; returns the job's exit status.
int launch_self(int n_pes, int64_t heap_bytes);
// This PE's CPUs: the host's CPUs split evenly among its PEs (coremesh run:
// every PE of the job; mpirun: OpenMPI's local rank and size), each PE at
// least one (shared round-robin when PEs outnumber CPUs). Restricts the
// process to them, so that a device created afterwards pins its workers there.
std::vector<int> take_core_share();

}  // namespace coremesh::cli
