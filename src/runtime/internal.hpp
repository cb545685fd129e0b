// Runtime internals shared by device.cpp, stream.cpp and event.cpp.
//
// Data flow of one kernel: Stream::launch appends a WorkItem to the stream's
// queue; when it reaches the head, the stream hands a KernelRun to the
// device's ready list; workers claim its blocks one by one; the worker that
// finishes the last block reports completion to the stream, which starts its
// next item. Event records and waits are WorkItems too: a record completes a
// Recording when it reaches the head; a wait parks the stream until its
// Recording completes. A value wait (value_wait.cpp) parks the stream until
// a word in memory satisfies a comparison; the device's poller thread,
// started with the first one, re-checks parked waits. No other thread than
// the workers and the poller is created.
// A graph replay (dag.cpp) is one WorkItem whose kernels go to the ready
// list as their dependencies finish; while a stream captures (capture.cpp),
// launches, records and waits are recorded instead of enqueued.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "coremesh/runtime/capture.hpp"
#include "coremesh/runtime/device.hpp"
#include "coremesh/runtime/profiler.hpp"
#include "coremesh/runtime/stream.hpp"

namespace coremesh::runtime {

struct StreamImpl;
struct DagRun;

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

// A kernel in flight: its blocks are claimed by workers. When its last block
// is done it tells its stream, or, in a graph replay, its DagRun.
struct KernelRun {
  LaunchInfo info;
  KernelBody body;
  CoreLimits limits;
  std::shared_ptr<StreamImpl> stream;
  DagRun* dag = nullptr;  // owns this run; outlives it while it runs
  int dag_node = -1;
  int stream_id = 0;  // for the profiler and error messages
  int priority = 0;
  int next_block = 0;                 // guarded by the device's ready mutex
  std::atomic<int> blocks_left{0};
  std::atomic<int64_t> start_ns{INT64_MAX};
  std::atomic<int64_t> end_ns{0};
  std::mutex error_mutex;
  std::exception_ptr error;
  bool profiled = false;
  std::vector<BlockRecord> blocks;    // one slot per block when profiled
};

// A stream parked on a value wait (value_wait.cpp).
struct ParkedWait {
  ValueWait wait;
  int stream_id = 0;
  std::shared_ptr<StreamImpl> stream;  // set while parked
  std::chrono::steady_clock::time_point deadline;
  int64_t start_ns = 0;  // for the profiler
  bool profiled = false;

  bool ready() const;
  std::string describe() const;
};

struct WorkItem {
  enum class Type { kernel, record, wait, dag, value_wait } type;
  std::shared_ptr<KernelRun> kernel;
  std::shared_ptr<Recording> recording;
  std::shared_ptr<DagRun> dag;
  std::shared_ptr<ParkedWait> value_wait;
  uint64_t seq = 0;  // its stream's enqueue count before it
};

// One KernelDag's nodes and the state of its current run (dag.cpp).
struct DagRun {
  Device::Impl* device = nullptr;
  std::vector<std::shared_ptr<KernelRun>> runs;  // one per node, reset by each run
  std::vector<std::vector<int>> successors;
  std::vector<size_t> deps_of;
  std::vector<int> stream_ids;  // -1: the stream the run is on
  std::unique_ptr<std::atomic<int>[]> waiting;  // dependencies not yet done
  std::atomic<int> left{0};                     // nodes not yet done
  std::mutex mutex;
  std::exception_ptr error;             // first node error of the run
  std::shared_ptr<StreamImpl> stream;   // the stream running it, while it runs
  // Serializes runs: the completion of the latest launch and its stream.
  std::mutex launch_mutex;
  std::shared_ptr<Recording> last_done;
  std::weak_ptr<StreamImpl> last_stream;

  // Starts a run on `s`; returns true if there was nothing to run.
  bool start(std::shared_ptr<StreamImpl> s);
  // A node finished (or was skipped): starts the successors it releases.
  void node_done(int node, std::exception_ptr error);
  std::string describe() const;
};

// A capture in progress (capture.cpp). Guards the capture state of its
// streams (StreamImpl::capture_deps) and of the events recorded in it.
struct CaptureSession : std::enable_shared_from_this<CaptureSession> {
  std::mutex mutex;
  Device::Impl* device = nullptr;
  std::shared_ptr<StreamImpl> origin;
  std::vector<std::shared_ptr<StreamImpl>> streams;  // origin first, then joined ones
  std::vector<CapturedKernel> kernels;
  std::string error;  // the first refusal; set: the capture is invalid
  bool ended = false;

  // Records `message` as the capture's error and throws CaptureError.
  [[noreturn]] void refuse(std::string message, std::string hint);
};

struct EventImpl {
  uint64_t id = 0;
  bool timing = false;
  mutable std::mutex mutex;
  std::shared_ptr<Recording> latest;  // most recent real record(), null if never recorded
  // The most recent record() made on a capturing stream (reset by a real one).
  std::shared_ptr<CaptureSession> captured_in;
  std::vector<int> captured_deps;

  std::shared_ptr<Recording> snapshot() const {
    std::lock_guard lock(mutex);
    return latest;
  }
};

// The kernel whose block this thread runs (nullptr outside kernel bodies): a
// body that waits for its own stream or device would wait for itself.
const KernelRun* running_kernel();

// Scopes that override one value and restore it when they end, also when
// they end out of order (a heap-held guard, interleaved Python generators): a
// scope that ends under a younger one hands its saved value to that one, which
// restores it in turn. Not thread-safe: the owner locks.
template <typename T>
class ScopedOverrides {
 public:
  // Tokens are unique across every instance: a guard ended on another thread
  // than its own finds nothing there (and leaves that thread's scopes alone).
  uint64_t push(T saved) {
    static std::atomic<uint64_t> last_token{0};
    const uint64_t token = ++last_token;
    entries_.push_back({token, std::move(saved)});
    return token;
  }
  // The value to restore, or nothing while a younger scope is still open (or
  // the token is unknown).
  std::optional<T> pop(uint64_t token) {
    for (size_t i = 0; i < entries_.size(); ++i) {
      if (entries_[i].token != token) continue;
      T saved = std::move(entries_[i].saved);
      entries_.erase(entries_.begin() + static_cast<std::ptrdiff_t>(i));
      if (i == entries_.size()) return saved;
      entries_[i].saved = std::move(saved);
      return std::nullopt;
    }
    return std::nullopt;
  }

 private:
  struct Entry {
    uint64_t token;
    T saved;
  };
  std::vector<Entry> entries_;
};

struct StreamImpl : std::enable_shared_from_this<StreamImpl> {
  Device::Impl* device = nullptr;
  std::atomic<bool> device_gone{false};  // set by ~Device: `device` dangles
  void check_device() const;
  int id = 0;
  int priority = 0;

  // Raw stream limit, 0 = unset (falls back to the device).
  std::atomic<int> cube_limit{0};
  std::atomic<int> vector_limit{0};
  ScopedOverrides<CoreLimits> limit_guards;  // StreamLimitGuards, under `mutex`

  std::mutex mutex;
  std::condition_variable idle_cv;
  std::deque<WorkItem> queue;
  bool busy = false;  // the head item is in flight
  std::exception_ptr error;  // the first error since the last one was reported
  // Items queued when an error is reported are skipped (kernels) or carry it
  // (records) all the same: they were launched to run after the failed one.
  uint64_t enqueued = 0, poisoned_below = 0;
  std::exception_ptr poison;
  void set_error(std::exception_ptr e);  // under mutex
  // The in-flight item, kept for the watchdog's message (described lazily).
  std::shared_ptr<KernelRun> head_kernel;
  std::shared_ptr<Recording> head_wait;
  std::shared_ptr<DagRun> head_dag;
  std::shared_ptr<ParkedWait> head_value_wait;
  // Items enqueued and not yet finished; lets host waits spin without the lock.
  std::atomic<int64_t> pending{0};

  // Graph capture: set while launches are recorded into `capture` (guarded
  // by `mutex`); capture_deps (guarded by the session's mutex) are the
  // captured kernels the next launch depends on.
  std::atomic<bool> capturing{false};
  std::shared_ptr<CaptureSession> capture;
  std::vector<int> capture_deps;

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

  // Parked value waits and the thread that re-checks them (value_wait.cpp).
  std::mutex parked_mutex;
  std::condition_variable parked_cv;
  std::vector<std::shared_ptr<ParkedWait>> parked;
  bool parked_added = false;  // a wait was parked since the poller last looked
  std::thread poller;
  bool poller_stopping = false;
  std::atomic<int> capturing_streams{0};  // a host synchronize is refused while > 0

  CoreLimits limit() const;
  std::shared_ptr<StreamImpl> make_stream(int priority);
  void submit(std::shared_ptr<KernelRun> run);
  void worker_loop(int core);
  void run_block(KernelRun& run, int block, int core);
  // Parks `w` (its stream's head item) until it is ready, fails or times out.
  void park(std::shared_ptr<ParkedWait> w);
  void poller_loop();
  void shutdown();
};

void validate_limit_value(int value, int spec, const char* kind, const char* what);

HostWaitHook host_wait_hook();

// Kernel blocks finished in this process so far: a host wait's watchdog
// measures time without progress, so a slow queue on a starved machine is
// not taken for a stuck one.
std::atomic<uint64_t>& work_progress();
// Counts a finished block (or wait) and wakes a host thread held for memory.
void note_work_progress();

// Stream items enqueued and not yet finished, over every stream of the process.
std::atomic<int64_t>& queued_items();

// Kernels handed to the workers and not yet finished, over every device of the process.
std::atomic<int64_t>& kernels_in_flight();

// Value waits parked until a word another process writes changes, over every
// device of the process: work in flight that a peer's progress releases.
std::atomic<int64_t>& waits_parked();

// Marks the calling thread as one of the runtime's own (a worker, the
// poller): it never waits for memory, since the work it would wait for may be its own.
void mark_runtime_thread();

// The host allocator's pressure hook (coremesh/core/allocator.hpp).
bool relieve_host_memory();

// Sleeps on `cv` (with `lock` held) until `ready()`, or until no kernel block
// of this process has finished for host_wait_timeout() (returns false);
// calls the host wait hook between slices of kHostWaitHookPeriod, without
// the lock.
template <typename Ready>
bool host_wait(std::condition_variable& cv, std::unique_lock<std::mutex>& lock, Ready ready) {
  using clock = std::chrono::steady_clock;
  auto deadline = clock::now() + host_wait_timeout();
  uint64_t seen = work_progress().load(std::memory_order_relaxed);
  for (;;) {
    const HostWaitHook hook = host_wait_hook();
    const auto slice = hook ? kHostWaitHookPeriod : std::chrono::milliseconds(500);
    if (cv.wait_until(lock, std::min(deadline, clock::now() + slice), ready)) return true;
    const uint64_t now_seen = work_progress().load(std::memory_order_relaxed);
    if (now_seen != seen) {
      seen = now_seen;
      deadline = clock::now() + host_wait_timeout();
    } else if (clock::now() >= deadline) {
      return false;
    }
    if (hook) {
      lock.unlock();
      hook();
      lock.lock();
    }
  }
}

// Capture hooks (capture.cpp). The *_record/*_wait ones return true when
// the capture took the call (the eager path must not run it).
void capture_launch(StreamImpl& s, const LaunchInfo& info, KernelBody body, CoreLimits limits);
// A value wait inside a capture: a node whose replay waits in a worker.
void capture_value_wait(StreamImpl& s, ValueWait wait);
bool capture_record(StreamImpl& s, EventImpl& e);
bool capture_wait(StreamImpl& s, EventImpl& e);
// Throw CaptureError if the host would synchronize with captured work.
void capture_refuse_sync(StreamImpl& s, const char* what);
void capture_refuse_event_sync(EventImpl& e, const char* what);
void capture_refuse_device_sync(Device::Impl& device);

}  // namespace coremesh::runtime
