// Streams, events, kernel launch and the scope guards of the RFC.
//
// A Stream is an in-order queue of kernels and event operations. Streams run
// concurrently and share their device's cores. Enqueueing is asynchronous and
// creates no thread; the host blocks only in synchronize().
//
// Stream and Event are handles: copies refer to the same stream/event, and a
// stream's pending work completes even if every handle is gone.
//
// Errors: an exception thrown inside a kernel marks the stream as errored;
// later kernels on it are skipped, events recorded on it carry the error to
// the streams that wait for them, and the next synchronize() or query() on it
// rethrows the error (as KernelError, naming the kernel) and clears it.
//
// Value waits (wait_value, CUDA's cuStreamWaitValue64): the stream parks
// until a 64-bit word in memory that other processes write (SHMEM signals)
// satisfies a comparison. A parked stream holds no worker: the device's
// poller thread re-checks its parked waits, sleeping between checks with a
// short bounded backoff, and the workers keep running other streams.
//
// Watchdog: waits inside kernels (SHMEM signal waits) give up after
// COREMESH_WAIT_TIMEOUT_S seconds (default 300); host waits on a stream or
// event give up when no kernel of the process has made progress for a
// little longer (host_wait_timeout), with a TimeoutError that says what the
// stream or event waits on, so that a kernel's own timeout, which names its
// cause, reaches the host first. A long queue on a starved machine is slow,
// not stuck: it does not time out. Progress is counted in finished kernel
// blocks: one block that runs longer than the timeout does (synchronize()
// again to keep waiting; the stream is unharmed).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "coremesh/runtime/device.hpp"
#include "coremesh/runtime/op_desc.hpp"

namespace coremesh::runtime {

class Event;
struct StreamImpl;
struct EventImpl;

// What a kernel body learns about the block it runs.
struct BlockContext {
  int block_idx;
  int block_dim;
  int core_id;
};
using KernelBody = std::function<void(const BlockContext&)>;

struct LaunchInfo {
  std::string name;
  KernelKind kind = KernelKind::vector;
  int block_dim = 1;
  uint64_t cache_id = 0;  // op cache entry the tiling came from, 0 if none
  // What the kernel computes. The ops library sets it whenever it will be
  // read: while the profiler records or the stream captures (graph capture
  // refuses a kernel without one); a plain eager launch skips making it.
  std::shared_ptr<const OpDesc> op;
};

// wait_value's comparison: `word cmp value`.
enum class WaitCmp { eq, ne, gt, ge, lt, le };
std::string_view wait_cmp_name(WaitCmp cmp);  // "==", ">=", ...
bool wait_cmp_holds(uint64_t word, WaitCmp cmp, uint64_t value);

struct ValueWait {
  const uint64_t* word = nullptr;  // 8-byte aligned; written by others with atomics
  WaitCmp cmp = WaitCmp::ge;
  uint64_t value = 0;
  std::string name = "wait_value";  // the profiler's name for the parked interval
  // Who waits for what, for the watchdog's message ("PE 1 waits for ...").
  std::function<std::string()> describe;
  // Called on each check that finds the word not ready (transport progress,
  // a check that the job is alive); an exception it throws ends the wait
  // with that error.
  std::function<void()> poll;
  // Optional: sleeps at most the given time, returning early when a writer
  // may have changed the word (a futex doorbell the writers ring). Without
  // it the poller sleeps for its backoff.
  std::function<void(std::chrono::nanoseconds)> sleep;
  // The watchdog: 0 uses wait_timeout().
  std::chrono::milliseconds timeout{0};
};

// A kernel ready to launch.
struct Kernel {
  LaunchInfo info;
  KernelBody body;
};

class Stream {
 public:
  // A new stream on `device` (default: the default device). Higher priority
  // streams get their blocks scheduled first.
  explicit Stream(Device& device = Device::default_device(), int priority = 0);

  int id() const;
  int priority() const;
  Device& device() const;

  // Enqueues `body` to run once per block. block_dim must be in
  // [1, max_blocks(effective_limits(), kind)]; the limits in force now are
  // recorded with the kernel.
  void launch(const LaunchInfo& info, KernelBody body);

  // True when all enqueued work is done; rethrows a pending kernel error.
  bool query();
  // Blocks until all enqueued work is done; rethrows a pending kernel error.
  void synchronize();

  // Later work on this stream starts once `wait.word` satisfies the
  // comparison; the wait holds no worker while parked. On timeout the stream
  // errors with a TimeoutError naming what it waits for (wait.describe).
  // Captured as a node (op "wait_value") whose replay waits in a worker.
  void wait_value(ValueWait wait);

  Event record_event();
  void wait_event(const Event& event);
  // Future work on this stream waits for all work enqueued on `other` so far.
  void wait_stream(Stream& other);

  // Stream limit (-1 leaves a kind unset so it falls back to the device).
  void set_limit(int cube_num = -1, int vector_num = -1);
  void reset_limit();
  // Limits in force for kernels launched now: stream > device > spec.
  CoreLimits effective_limits() const;

  bool operator==(const Stream& other) const { return impl_ == other.impl_; }
  const std::shared_ptr<StreamImpl>& impl() const { return impl_; }

 private:
  friend class Event;
  friend Stream current_stream();
  explicit Stream(std::shared_ptr<StreamImpl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<StreamImpl> impl_;
};

class Event {
 public:
  explicit Event(bool enable_timing = false);

  uint64_t id() const;
  // Captures all work enqueued on `stream` so far (default: current stream).
  void record();
  void record(Stream& stream);
  // Work enqueued on `stream` after this call waits for the most recent
  // record() made before it; a never-recorded event does not block.
  void wait();
  void wait(Stream& stream);
  // True when the captured work is done (or nothing was recorded).
  bool query() const;
  void synchronize() const;
  // Milliseconds from this event's completion to `end`'s; both need timing.
  float elapsed_time(const Event& end) const;

 private:
  std::shared_ptr<EventImpl> impl_;
};

// The calling thread's current stream (default: the default device's
// default stream).
Stream current_stream();
void set_current_stream(const Stream& stream);
// Waits for all work of the default device.
void synchronize();

// The watchdog; the default comes from COREMESH_WAIT_TIMEOUT_S.
std::chrono::milliseconds wait_timeout();
// Host waits: wait_timeout() + 10% + 2 s.
std::chrono::milliseconds host_wait_timeout();
void set_wait_timeout(std::chrono::milliseconds timeout);

// A function that host waits (Stream/Event/Device synchronize) call on the
// waiting thread every kHostWaitHookPeriod while they still wait; it may
// throw to abandon the wait. The Python binding raises KeyboardInterrupt
// there on Ctrl-C. nullptr (the default): a wait only sleeps.
using HostWaitHook = void (*)();
inline constexpr std::chrono::milliseconds kHostWaitHookPeriod{20};
void set_host_wait_hook(HostWaitHook hook);

// RAII `with StreamCtx(s)`: makes `stream` current for the scope. Guards
// ended out of order still restore what was current before the oldest.
class StreamGuard {
 public:
  explicit StreamGuard(const Stream& stream);
  ~StreamGuard();
  StreamGuard(const StreamGuard&) = delete;
  StreamGuard& operator=(const StreamGuard&) = delete;

 private:
  uint64_t token_;
};

// RAII `with StreamLimitCtx(s, cube, vector)`: sets the stream's limit and
// makes the stream current for the scope; restores both afterwards (in any
// order: see StreamGuard).
class StreamLimitGuard {
 public:
  StreamLimitGuard(const Stream& stream, int cube_num = -1, int vector_num = -1);
  ~StreamLimitGuard();
  StreamLimitGuard(const StreamLimitGuard&) = delete;
  StreamLimitGuard& operator=(const StreamLimitGuard&) = delete;

 private:
  Stream stream_;
  StreamGuard current_;
  uint64_t token_;
};

// The RFC's names (ms.runtime.set_stream_limit / reset / get).
void set_stream_limit(Stream& stream, int cube_num = -1, int vector_num = -1);
void reset_stream_limit(Stream& stream);
CoreLimits get_stream_limit(const Stream& stream);
// Limits a kernel launched now by this thread would see (its current stream's).
CoreLimits current_limits();

}  // namespace coremesh::runtime
