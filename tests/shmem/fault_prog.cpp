// shmem_fault_prog MODE: a PE program that misbehaves on purpose, for the
// launcher tests. Each PE first prints "pe <k> pid <pid> job <id>".
//   ok           barrier and exit 0
//   kill9        PE 1 kills itself with SIGKILL; the others wait in a barrier
//   exit3        PE n-1 exits with status 3; the others wait in a barrier
//   global_exit  PE n-1 calls global_exit(7); the others wait in a barrier
//   mismatch     PE 1 allocates a different size than the others
//   exhaust      every PE asks for more than the heap holds
//   hang         every PE prints "ready" and sleeps in a wait nobody ends
//   watchdog     PE 0 skips a barrier: the others' watchdog names it
//   thread_first a thread runs before init: making globals symmetric refuses
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "coremesh/core/error.hpp"
#include "coremesh/shmem/shmem.hpp"

namespace shmem = coremesh::shmem;

int main(int argc, char** argv) {
  const char* mode = argc > 1 ? argv[1] : "ok";
  if (!std::strcmp(mode, "thread_first")) {
    const char* job = std::getenv("COREMESH_JOB");
    std::printf("pe %s pid %d job %s\n", std::getenv("COREMESH_PE"), static_cast<int>(getpid()),
                job ? job : "none");
    std::fflush(stdout);
    std::thread([] { sleep(5); }).detach();
  }
  try {
    shmem::Session session;
    const int me = shmem::my_pe(), n = shmem::n_pes();
    const char* job = std::getenv("COREMESH_JOB");
    std::printf("pe %d pid %d job %s\n", me, static_cast<int>(getpid()), job ? job : "none");
    std::fflush(stdout);
    shmem::barrier();
    if (!std::strcmp(mode, "kill9") && me == 1) raise(SIGKILL);
    if (!std::strcmp(mode, "exit3") && me == n - 1) _exit(3);
    if (!std::strcmp(mode, "global_exit") && me == n - 1) shmem::global_exit(7);
    if (!std::strcmp(mode, "mismatch")) shmem::sym_malloc(me == 1 ? 4096 : 1024);
    if (!std::strcmp(mode, "exhaust")) shmem::sym_malloc(size_t{1} << 40);
    if (!std::strcmp(mode, "hang")) {
      auto* never = static_cast<uint64_t*>(shmem::sym_calloc(1, sizeof(uint64_t)));
      std::printf("ready\n");
      std::fflush(stdout);
      shmem::signal_wait_until(never, shmem::Cmp::eq, uint64_t(1));
    }
    if (!std::strcmp(mode, "watchdog") && me == 0) {
      sleep(30);  // never reaches the barrier in time
      return 0;
    }
    shmem::barrier();
    return 0;
  } catch (const coremesh::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());  // what() carries the hint
    return 1;
  }
}
