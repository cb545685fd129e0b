// Runtime internals shared by device.cpp, stream.cpp and event.cpp.
//
// Data flow of one kernel: Stream::launch appends a WorkItem to the stream's
// queue; when it reaches the head, the stream hands a KernelRun to the
// device's ready list; workers claim its blocks one by one; the worker that
// finishes the last block reports completion to the stream, which starts its
// next item. Event records and waits are WorkItems too: a record completes a
// Recording when it reaches the head; a wait parks the stream until its
// Recording completes. No thread other than the device's workers is created.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "coremesh/runtime/device.hpp"
#include "coremesh/runtime/profiler.hpp"
#include "coremesh/runtime/stream.hpp"

namespace coremesh::runtime {

struct StreamImpl;

// One iteration of a polite busy-wait.
inline void cpu_relax() {
#if defined(__x86_64__)
  __builtin_ia32_pause();
#endif
}


// One record() of an Event: completes when the recording stream reaches it.
struct Recording {
  uint64_t event_id = 0;
  int stream_id = 0;
  bool timing = false;

  std::mutex mutex;
  std::condition_variable done_cv;
  bool done = false;
  int64_t time_ns = 0;
  std::exception_ptr error;  // the recording stream's error, carried to waiters
  std::vector<std::function<void(std::exception_ptr)>> waiters;

  // Marks done and runs the waiters (outside the lock).
  void complete(std::exception_ptr stream_error);
  // Runs `fn` when done; returns false (and does not keep fn) if already done.
  bool on_complete(std::function<void(std::exception_ptr)> fn);
  std::string describe() const;
};

// A kernel in flight: its blocks are claimed by workers.
struct KernelRun {
  LaunchInfo info;
  KernelBody body;
  CoreLimits limits;
  std::shared_ptr<StreamImpl> stream;
  int next_block = 0;                 // guarded by the device's ready mutex
  std::atomic<int> blocks_left{0};
  std::atomic<int64_t> start_ns{INT64_MAX};
  std::atomic<int64_t> end_ns{0};
  std::mutex error_mutex;
  std::exception_ptr error;
  bool profiled = false;
  std::vector<BlockRecord> blocks;    // one slot per block when profiled
};

struct WorkItem {
  enum class Type { kernel, record, wait } type;
  std::shared_ptr<KernelRun> kernel;
  std::shared_ptr<Recording> recording;
};

struct StreamImpl : std::enable_shared_from_this<StreamImpl> {
  Device::Impl* device = nullptr;
  int id = 0;
  int priority = 0;

  // Raw stream limit, 0 = unset (falls back to the device).
  std::atomic<int> cube_limit{0};
  std::atomic<int> vector_limit{0};

  std::mutex mutex;
  std::condition_variable idle_cv;
  std::deque<WorkItem> queue;
  bool busy = false;  // the head item is in flight
  std::exception_ptr error;
  // The in-flight item, kept for the watchdog's message (described lazily).
  std::shared_ptr<KernelRun> head_kernel;
  std::shared_ptr<Recording> head_wait;
  // Items enqueued and not yet finished; lets host waits spin without the lock.
  std::atomic<int64_t> pending{0};

  void enqueue(WorkItem item);
  // Called when the in-flight item finished; starts the next ones.
  void item_done(std::exception_ptr error);
  // Blocks until idle; rethrows and clears a pending error.
  void synchronize();
  bool query();
  CoreLimits effective_limits() const;
  std::string describe() const;
  std::string describe_head() const;  // needs `mutex` held

 private:
  void pump();
  // Starts `item`; returns true if it already finished synchronously.
  bool start(WorkItem& item, std::exception_ptr& finished_error);
  void rethrow_pending_error(std::unique_lock<std::mutex>& lock);
};

struct Device::Impl {
  Device* owner = nullptr;
  int id = 0;
  int cores = 0;
  CoreLimits spec;
  std::atomic<int> cube_limit{0};  // 0 = unset
  std::atomic<int> vector_limit{0};
  int spin_us = 50;

  // A worker's sleep: submit() wakes chosen workers, not any of them.
  struct Sleep {
    int cpu = -1;  // pinned CPU, -1 if not pinned
    std::condition_variable cv;
    bool asleep = false;  // guarded by ready_mutex
  };

  std::mutex ready_mutex;
  std::deque<std::shared_ptr<KernelRun>> ready;  // kernels with unclaimed blocks
  std::atomic<int> ready_count{0};
  std::vector<std::unique_ptr<Sleep>> sleeps;  // one per worker, made before they start
  int sleepers = 0;                            // workers asleep; guarded by ready_mutex
  bool stopping = false;
  std::vector<std::thread> workers;

  std::mutex streams_mutex;
  std::vector<std::weak_ptr<StreamImpl>> streams;
  std::atomic<int> next_stream_id{0};
  std::unique_ptr<Stream> default_stream;

  CoreLimits limit() const;
  std::shared_ptr<StreamImpl> make_stream(int priority);
  void submit(std::shared_ptr<KernelRun> run);
  void worker_loop(int core);
  void run_block(KernelRun& run, int block, int core);
  void shutdown();
};

void validate_limit_value(int value, int spec, const char* kind, const char* what);

HostWaitHook host_wait_hook();

// Sleeps on `cv` (with `lock` held) until `ready()` or the host watchdog
// (host_wait_timeout) expires
// (returns false); calls the host wait hook between slices of
// kHostWaitHookPeriod, without the lock.
template <typename Ready>
bool host_wait(std::condition_variable& cv, std::unique_lock<std::mutex>& lock, Ready ready) {
  const auto deadline = std::chrono::steady_clock::now() + host_wait_timeout();
  for (;;) {
    const HostWaitHook hook = host_wait_hook();
    const auto now = std::chrono::steady_clock::now();
    const auto until = hook ? std::min(deadline, now + kHostWaitHookPeriod) : deadline;
    if (cv.wait_until(lock, until, ready)) return true;
    if (until >= deadline) return false;
    lock.unlock();
    hook();
    lock.lock();
  }
}

}  // namespace coremesh::runtime
