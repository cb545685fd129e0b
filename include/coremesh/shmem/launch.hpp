// The launcher behind `coremesh run -n N [--heap SIZE] [--tag-output] prog args...`.
//
// launch() starts N processes (PEs) of `argv`, each with the environment a
// PE needs to join the job (below), and waits for them. It returns the worst
// exit status (128 + signal number for a PE killed by a signal) among the
// PEs it did not stop itself. When a PE fails (non-zero status, a signal, or
// shmem_global_exit) the others are stopped -- SIGTERM, then SIGKILL after
// `kill_grace_s` -- and a message names the PE and its status. The first
// SIGINT, SIGTERM or SIGHUP sent to the launcher is passed on to the PEs,
// which may end in order (`coremesh train` saves a checkpoint); a PE that
// exits 128 + signal or dies of one then does not count as failed, and the
// launcher returns 128 + the signal. A second one stops the job as a failure
// does. On every exit path the launcher removes every shared memory name of
// the job.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace coremesh::shmem {

struct LaunchOptions {
  int n_pes = 1;
  std::optional<size_t> heap_bytes;  // exported as COREMESH_HEAP_SIZE
  bool tag_output = false;           // prefix each output line with "[pe k] "
  std::vector<std::string> argv;     // program and its arguments
  double kill_grace_s = 2.0;         // SIGTERM -> SIGKILL delay when stopping
};

int launch(const LaunchOptions& options);

// Environment of a launched PE.
inline constexpr const char* kJobIdEnv = "COREMESH_JOB";       // 32 hex digits
inline constexpr const char* kJobFdEnv = "COREMESH_JOB_FD";    // job control block fd
inline constexpr const char* kPeEnv = "COREMESH_PE";           // this PE, 0..N-1
inline constexpr const char* kNumPesEnv = "COREMESH_NPES";     // N

}  // namespace coremesh::shmem
