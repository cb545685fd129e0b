#include "pe_setup.hpp"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>

#include "commands.hpp"
#include "coremesh/core/env.hpp"
#include "coremesh/shmem/launch.hpp"

namespace coremesh::cli {
namespace {

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::atoi(v) : fallback;
}

}  // namespace

bool under_launcher() {
  return std::getenv(shmem::kPeEnv) != nullptr || std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr ||
         std::getenv("PMI_SIZE") != nullptr;
}

std::unique_ptr<shmem::Session> join_job() {
  ::setenv("COREMESH_SYMMETRIC_DATA", "0", 0);
  return std::make_unique<shmem::Session>();
}

int launch_self(int n_pes, int64_t heap_bytes) {
  shmem::LaunchOptions o;
  o.n_pes = n_pes;
  int64_t heap = 512LL << 20;  // the launcher's default unless the run needs more
  if (const char* h = std::getenv("COREMESH_HEAP_SIZE")) heap = std::max<int64_t>(heap, env::parse_size(h));
  o.heap_bytes = size_t(std::max(heap, heap_bytes + heap_bytes / 4));
  o.argv = command_line();
  o.argv[0] = std::filesystem::read_symlink("/proc/self/exe").string();
  return shmem::launch(o);
}

std::vector<int> take_core_share() {
  cpu_set_t mask;
  CPU_ZERO(&mask);
  std::vector<int> cpus;
  if (sched_getaffinity(0, sizeof(mask), &mask) == 0)
    for (int c = 0; c < CPU_SETSIZE; ++c)
      if (CPU_ISSET(c, &mask)) cpus.push_back(c);
  if (cpus.empty()) cpus.push_back(0);
  // this PE among the PEs of this host
  int local = shmem::my_pe(), locals = shmem::n_pes();
  if (std::getenv("OMPI_COMM_WORLD_LOCAL_RANK")) {
    local = env_int("OMPI_COMM_WORLD_LOCAL_RANK", 0);
    locals = env_int("OMPI_COMM_WORLD_LOCAL_SIZE", 1);
  }
  std::vector<int> mine;
  const int n = int(cpus.size());
  if (locals >= n) {
    mine.push_back(cpus[size_t(local % n)]);
  } else {
    for (int i = n * local / locals; i < n * (local + 1) / locals; ++i) mine.push_back(cpus[size_t(i)]);
  }
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int c : mine) CPU_SET(c, &set);
  sched_setaffinity(0, sizeof(set), &set);  // best effort: a container may refuse
  return mine;
}

}  // namespace coremesh::cli
