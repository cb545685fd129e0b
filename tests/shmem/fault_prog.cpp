// shmem_fault_prog MODE: a PE program that misbehaves on purpose, for the
// launcher tests. Each PE first prints "pe <k> pid <pid> job <id>".
//   ok           barrier and exit 0
//   kill9        PE 1 kills itself with SIGKILL; the others wait in a barrier
//   exit3        PE n-1 exits with status 3; the others wait in a barrier
//   global_exit  PE n-1 calls global_exit(7); the others wait in a barrier
//   mismatch     PE 1 allocates a different size than the others
//   exhaust      every PE asks for more than the heap holds
//   hang         every PE prints "ready" and sleeps in a wait nobody ends
//   graceful     every PE catches SIGINT/SIGTERM, prints "ready", and once
//                signalled meets the others in a barrier (PE 0 late), prints
//                "pe <k> stopped in order" and exits 128 + the signal
//   stubborn     as graceful, but a signalled PE goes on sleeping
//   watchdog     PE 0 skips a barrier: the others' watchdog names it
//   thread_first a thread runs before init: making globals symmetric refuses
//   stalled_peer 2 PEs, network path, one machine: PE 1 stops (SIGSTOP); PE
//                0's get and atomic to it hit the watchdog, then PE 0
//                continues it. The late answers must not write the caller's
//                memory; the engine still works after; prints "stalled peer
//                ok" on PE 0.
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "coremesh/core/error.hpp"
#include "coremesh/shmem/shmem.hpp"

namespace shmem = coremesh::shmem;

namespace {

volatile sig_atomic_t g_signal = 0;

// graceful / stubborn: the launcher passes its first stop signal on.
int stop_on_signal(bool stubborn) {
  struct sigaction sa {};
  sa.sa_handler = [](int sig) { g_signal = sig; };
  for (int sig : {SIGINT, SIGTERM}) sigaction(sig, &sa, nullptr);
  std::printf("ready\n");
  std::fflush(stdout);
  for (int i = 0; i < 3000 && (g_signal == 0 || stubborn); ++i) usleep(10'000);
  if (shmem::my_pe() == 0) usleep(300'000);  // the others wait for it
  shmem::barrier();
  std::printf("pe %d stopped in order\n", shmem::my_pe());
  std::fflush(stdout);
  return 128 + g_signal;
}

// PE 1 stops itself; PE 0, with a 1 s watchdog (COREMESH_WAIT_TIMEOUT_S=1),
// sees it stopped (one machine: /proc), gets and adds until each times
// out, continues it and waits for the late answers.
bool stopped(pid_t pid) {
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/stat", static_cast<int>(pid));
  FILE* f = std::fopen(path, "r");
  if (f == nullptr) return false;
  char state = 0;
  const int got = std::fscanf(f, "%*d (%*[^)]) %c", &state);
  std::fclose(f);
  return got == 1 && state == 'T';
}

int stalled_peer() {
  const int me = shmem::my_pe();
  auto* value = static_cast<int64_t*>(shmem::sym_calloc(2, sizeof(int64_t)));
  auto* go = static_cast<uint64_t*>(shmem::sym_calloc(1, sizeof(uint64_t)));
  auto* pid1 = static_cast<int64_t*>(shmem::sym_calloc(1, sizeof(int64_t)));
  value[0] = 1000 + me;
  if (me == 1) shmem::p(pid1, int64_t{getpid()}, 0);
  shmem::barrier();
  if (me == 1) {
    raise(SIGSTOP);
    shmem::signal_wait_until(go, shmem::Cmp::eq, uint64_t(1), 60.0);
  } else {
    const auto pid = static_cast<pid_t>(*pid1);
    for (int i = 0; i < 3000 && !stopped(pid); ++i) usleep(10'000);
    if (!stopped(pid)) {
      std::printf("FAIL: PE 1 (pid %d) did not stop\n", static_cast<int>(pid));
      return 1;
    }
    int64_t got[2] = {-1, -1};
    const auto times_out = [](const char* what, auto&& op) {
      try {
        op();
      } catch (const coremesh::TimeoutError& e) {
        std::printf("%s timed out: %s\n", what, e.what());
        return true;
      }
      std::printf("FAIL: %s to a stopped PE did not time out\n", what);
      return false;
    };
    const bool timed_out = times_out("get", [&] { shmem::get(got, value, 1, 1); }) &&
                           times_out("atomic", [&] { (void)shmem::atomic_fetch_add(value + 1, int64_t(5), 1); });
    kill(pid, SIGCONT);
    if (!timed_out) return 1;
    usleep(2'000'000);  // PE 1 answers both
    if (got[0] != -1 || got[1] != -1) {
      std::printf("FAIL: a late get reply wrote the caller's buffer: %lld\n", static_cast<long long>(got[0]));
      return 1;
    }
    shmem::get(got, value, 2, 1);  // after the late requests at PE 1
    // The timed-out add was applied late (docs/shmem.md): it reached PE 1.
    if (got[0] != 1001 || got[1] != 5) {
      std::printf("FAIL: after PE 1 came back, get read %lld %lld (1001 5 expected)\n",
                  static_cast<long long>(got[0]), static_cast<long long>(got[1]));
      return 1;
    }
    shmem::atomic_set(go, uint64_t(1), 1);
    std::printf("stalled peer ok\n");
  }
  shmem::barrier();
  return 0;
}

}  // namespace

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
    if (!std::strcmp(mode, "stalled_peer")) return stalled_peer();
    if (!std::strcmp(mode, "graceful") || !std::strcmp(mode, "stubborn")) return stop_on_signal(mode[0] == 's');
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
