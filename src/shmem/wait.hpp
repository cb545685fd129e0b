// Sleeping waits with a watchdog.
//
// A wait spins for a short, bounded time (COREMESH_SPIN_US, default 20 us;
// 0 when there are more PEs than CPUs), then sleeps on the futex of a Bell
// in shared memory. Writers ring the bell after they write. Every wait wakes
// at least every 100 ms to check whether the job is being stopped, and gives
// up after the watchdog timeout (COREMESH_WAIT_TIMEOUT_S, default 300) with a
// TimeoutError whose message comes from `describe` (who waits for what).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <string>

#include "coremesh/core/env.hpp"
#include "layout.hpp"

namespace coremesh::shmem::internal {

void futex_wait(std::atomic<uint32_t>* word, uint32_t expected, int64_t timeout_ns);
void futex_wake(std::atomic<uint32_t>* word);

// Marks an event on `bell` and wakes its sleepers.
inline void ring(Bell& bell) {
  bell.seq.fetch_add(1, std::memory_order_seq_cst);
  if (bell.sleepers.load(std::memory_order_seq_cst) != 0) futex_wake(&bell.seq);
}

struct WaitPolicy {
  int64_t spin_ns = 20'000;
  double timeout_s = 300.0;
};
WaitPolicy& wait_policy();

// Who this process is, for watchdog messages and job checks (set at init).
void set_wait_identity(int pe, JobControl* job);
int wait_identity_pe();

// Throws when the job is being stopped (another PE died or called
// shmem_global_exit); no-op outside a launched job.
void check_job_alive();

using Describe = std::function<std::string()>;

// Transports whose peers write this PE's memory without ringing its bells
// (mpi) set a poll hook: waits then poll, calling the hook, which lets
// incoming RMA land (over TCP, a PE's library applies its peers' RMA only
// while it is called). Between polls a wait yields the CPU when every PE
// has one (the spin policy is on), else sleeps 20-200 us.
using PollHook = void (*)();
void set_poll_hook(PollHook hook);
PollHook poll_hook();

// A transport whose peers' requests are served by a progress thread that
// stands aside while this PE's threads progress it themselves (ucx) sets a
// sleep hook: a wait calls it before it first sleeps, so that the thread
// serves at once (the wait needs a peer's data that it applies).
using SleepHook = void (*)();
void set_sleep_hook(SleepHook hook);
SleepHook sleep_hook();

// Such a transport also sets a spin hook: a wait's spin phase calls it to
// progress the network itself, as OSHMEM's waits do, so that what a peer
// sends (a barrier's atomic, a signal) lands and requests are served
// without a hand-over to the progress thread; the spin then lasts at least
// `spin_ns` (a network round trip), when the wait policy spins at all.
using SpinHook = void (*)();
void set_spin_hook(SpinHook hook, int64_t spin_ns);
SpinHook spin_hook();
int64_t spin_hook_ns();

// Blocks until `ready()` is true; `bell` must be rung after every change
// that can make it true. ready() is not called again after it returned true. `timeout_s` < 0 uses the policy's watchdog.
template <typename Ready>
void wait_until_ready(Bell& bell, Ready&& ready, const Describe& describe,
                      double timeout_s = -1.0);

[[noreturn]] void throw_wait_timeout(const Describe& describe, double timeout_s);
void poll_pause(int64_t us);

template <typename Ready>
void wait_until_ready(Bell& bell, Ready&& ready, const Describe& describe, double timeout_s) {
  if (ready()) return;
  const auto& policy = wait_policy();
  using clock = std::chrono::steady_clock;
  const auto start = clock::now();
  if (policy.spin_ns > 0) {
    const SpinHook progress = spin_hook();
    const int64_t spin_ns = progress ? std::max(policy.spin_ns, spin_hook_ns()) : policy.spin_ns;
    const auto spin_end = start + std::chrono::nanoseconds(spin_ns);
    do {
      for (int i = 0; i < 64; ++i) {
        if (ready()) return;
        __builtin_ia32_pause();
      }
      if (progress) progress();
    } while (clock::now() < spin_end);
  }
  const double limit = std::min(timeout_s < 0 ? policy.timeout_s : timeout_s, env::kNoWatchdogS);
  const auto deadline = start + std::chrono::duration_cast<clock::duration>(
                                    std::chrono::duration<double>(limit));
  if (PollHook hook = poll_hook()) {
    for (int64_t pause_us = 20;; pause_us = std::min<int64_t>(pause_us * 2, 200)) {
      hook();
      if (ready()) return;
      check_job_alive();
      if (clock::now() >= deadline) throw_wait_timeout(describe, limit);
      if (policy.spin_ns == 0) poll_pause(pause_us);
    }
  }
  if (SleepHook hook = sleep_hook()) hook();
  for (;;) {
    const uint32_t seq = bell.seq.load(std::memory_order_seq_cst);
    if (ready()) return;
    check_job_alive();
    const auto now = clock::now();
    if (now >= deadline) throw_wait_timeout(describe, limit);
    const int64_t slice_ns = std::min<int64_t>(
        100'000'000, std::chrono::duration_cast<std::chrono::nanoseconds>(deadline - now).count());
    bell.sleepers.fetch_add(1, std::memory_order_seq_cst);
    // ready() may have side effects (a lock's compare-and-swap): once it
    // returns true we must return, never call it again.
    const bool done = ready();
    if (!done) futex_wait(&bell.seq, seq, slice_ns);
    bell.sleepers.fetch_sub(1, std::memory_order_seq_cst);
    if (done) return;
  }
}

}  // namespace coremesh::shmem::internal
