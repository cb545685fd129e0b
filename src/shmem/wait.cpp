#include "wait.hpp"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstring>
#include <string>
#include <ctime>

#include "coremesh/core/error.hpp"

namespace coremesh::shmem::internal {

// Shared (not FUTEX_PRIVATE) futexes: the kernel keys them by the physical
// page, so processes mapping the segment at different addresses meet.
void futex_wait(std::atomic<uint32_t>* word, uint32_t expected, int64_t timeout_ns) {
  timespec ts{static_cast<time_t>(timeout_ns / 1'000'000'000),
              static_cast<long>(timeout_ns % 1'000'000'000)};
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

void futex_wake(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

WaitPolicy& wait_policy() {
  static WaitPolicy policy;
  return policy;
}

[[noreturn]] void throw_wait_timeout(const Describe& describe, double timeout_s) {
  CM_THROW(TimeoutError,
           "a peer may have failed or skipped a matching call; raise COREMESH_WAIT_TIMEOUT_S if "
           "the work is legitimately slow",
           "watchdog: {} (still waiting after {:.1f} s)", describe(), timeout_s);
}

namespace {
std::atomic<PollHook> g_poll_hook{nullptr};
}  // namespace
void set_poll_hook(PollHook hook) { g_poll_hook.store(hook); }
PollHook poll_hook() { return g_poll_hook.load(std::memory_order_relaxed); }

namespace {
std::atomic<SleepHook> g_sleep_hook{nullptr};
std::atomic<SpinHook> g_spin_hook{nullptr};
std::atomic<int64_t> g_spin_hook_ns{0};
}  // namespace
void set_sleep_hook(SleepHook hook) { g_sleep_hook.store(hook); }
SleepHook sleep_hook() { return g_sleep_hook.load(std::memory_order_relaxed); }
void set_spin_hook(SpinHook hook, int64_t spin_ns) {
  g_spin_hook_ns.store(spin_ns);
  g_spin_hook.store(hook);
}
SpinHook spin_hook() { return g_spin_hook.load(std::memory_order_relaxed); }
int64_t spin_hook_ns() { return g_spin_hook_ns.load(std::memory_order_relaxed); }
void poll_pause(int64_t us) {
  timespec ts{0, static_cast<long>(us * 1000)};
  nanosleep(&ts, nullptr);
}

namespace {
std::atomic<JobControl*> g_job{nullptr};
std::atomic<int> g_pe{0};
}  // namespace

void set_wait_identity(int pe, JobControl* job) {
  g_pe.store(pe);
  g_job.store(job);
}
int wait_identity_pe() { return g_pe.load(); }

void check_job_alive() {
  JobControl* job = g_job.load(std::memory_order_relaxed);
  if (job == nullptr || job->abort.seq.load(std::memory_order_acquire) == 0) return;
  if (job->global_exit)
    CM_THROW(Error, "see the failing PE's output above",
             "PE {} stops: the job is being stopped because PE {} called shmem_global_exit with status {}", g_pe.load(),
             job->abort_pe, job->abort_status);
  const std::string reason(job->stop_reason, strnlen(job->stop_reason, sizeof job->stop_reason));
  CM_THROW(Error, "see the failing PE's output above", "PE {} stops: the job is being stopped ({})", g_pe.load(),
           reason.empty() ? "by its launcher" : reason);
}

}  // namespace coremesh::shmem::internal
