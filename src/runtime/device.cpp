#include "coremesh/runtime/device.hpp"

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <mutex>

#include "coremesh/core/allocator.hpp"
#include "coremesh/core/env.hpp"
#include "coremesh/core/error.hpp"
#include "coremesh/core/log.hpp"
#include "internal.hpp"

namespace coremesh::runtime {
namespace {

std::atomic<int> g_next_device_id{0};

// Set while a worker of this device completes a kernel: it claims a block
// right after (see Device::Impl::submit).
thread_local const Device::Impl* t_completing_on = nullptr;
thread_local bool t_runtime_thread = false;
thread_local const KernelRun* t_running_kernel = nullptr;
}  // namespace

const KernelRun* running_kernel() { return t_running_kernel; }

std::atomic<uint64_t>& work_progress() {
  static std::atomic<uint64_t> blocks{0};
  return blocks;
}

namespace {

// Wakes a host thread held for memory (relieve_host_memory) as soon as a block
// finishes: polling added up to a millisecond to each of a step's hundreds of
// holds (a pipeline rank runs at its soft limit).
struct ProgressWake {
  std::mutex mutex;
  std::condition_variable cv;
  std::atomic<int> waiters{0};
};
ProgressWake& progress_wake() {
  static ProgressWake* wake = new ProgressWake;  // never destroyed: workers may note progress at exit
  return *wake;
}

}  // namespace

void note_work_progress() {
  work_progress().fetch_add(1, std::memory_order_seq_cst);
  ProgressWake& w = progress_wake();
  if (w.waiters.load(std::memory_order_seq_cst) == 0) return;
  std::lock_guard lock(w.mutex);
  w.cv.notify_all();
}

std::atomic<int64_t>& queued_items() {
  static std::atomic<int64_t> items{0};
  return items;
}

std::atomic<int64_t>& kernels_in_flight() {
  static std::atomic<int64_t> kernels{0};
  return kernels;
}

std::atomic<int64_t>& waits_parked() {
  static std::atomic<int64_t> waits{0};
  return waits;
}

void mark_runtime_thread() { t_runtime_thread = true; }

// Waits until queued work finishes a kernel block (which may free the
// tensors it held). Gives up when for kIdleWait no kernel has run and no
// wait is parked on a peer (what is queued waits for an event that this
// host thread may have yet to record) or none finished a block for
// kStallWait (a wait on another PE, itself held back); after giving up it
// does not wait again until something progressed. A slow kernel on a busy
// machine, or a peer still computing what this PE waits for, is waited for.
bool relieve_host_memory() {
  constexpr auto kIdleWait = std::chrono::milliseconds(20), kStallWait = std::chrono::milliseconds(1000);
  static std::atomic<uint64_t> stalled_at{UINT64_MAX};
  if (t_runtime_thread || queued_items().load(std::memory_order_relaxed) == 0) return false;
  const uint64_t seen = work_progress().load(std::memory_order_relaxed);
  if (seen == stalled_at.load(std::memory_order_relaxed)) return false;
  const auto start = std::chrono::steady_clock::now();
  // Sleeps until a block finishes (note_work_progress wakes it); wakes every
  // millisecond regardless to check the conditions for giving up.
  ProgressWake& w = progress_wake();
  std::unique_lock lock(w.mutex);
  w.waiters.fetch_add(1, std::memory_order_seq_cst);
  struct Leave {
    ProgressWake& w;
    ~Leave() { w.waiters.fetch_sub(1, std::memory_order_seq_cst); }
  } leave{w};
  for (;;) {
    if (w.cv.wait_for(lock, std::chrono::milliseconds(1),
                      [&] { return work_progress().load(std::memory_order_seq_cst) != seen; }))
      return true;
    // Everything queued is done: what the host holds is its own, nothing to
    // wait for (and no reason not to wait next time, once it has queued more).
    if (queued_items().load(std::memory_order_relaxed) == 0) return false;
    const auto waited = std::chrono::steady_clock::now() - start;
    if (waited > kStallWait || (waited > kIdleWait && kernels_in_flight().load(std::memory_order_relaxed) == 0 &&
                                    waits_parked().load(std::memory_order_relaxed) == 0))
      break;
  }
  stalled_at.store(seen, std::memory_order_relaxed);
  CM_LOG_DEBUG("host memory: stopped waiting for queued work ({} kernels running, {} items queued)",
               kernels_in_flight().load(), queued_items().load());
  return false;
}

namespace {

std::vector<int> affinity_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> cpus;
  if (sched_getaffinity(0, sizeof(set), &set) == 0)
    for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu)
      if (CPU_ISSET(cpu, &set)) cpus.push_back(cpu);
  return cpus;
}

void pin_current_thread(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  pthread_setaffinity_np(pthread_self(), sizeof(set), &set);  // best effort
}

// A short polite spin: the first iterations only pause, later ones yield.
void spin_pause(int iteration) {
  if (iteration < 64) cpu_relax();
  else std::this_thread::yield();
}

}  // namespace

std::string_view kernel_kind_name(KernelKind kind) {
  switch (kind) {
    case KernelKind::cube: return "cube";
    case KernelKind::vector: return "vector";
    case KernelKind::mixed: return "mixed";
    case KernelKind::comm: return "comm";
  }
  return "?";
}

int max_blocks(const CoreLimits& limits, KernelKind kind) {
  switch (kind) {
    case KernelKind::cube: return limits.cube;
    case KernelKind::vector:
    case KernelKind::comm: return limits.vector;
    case KernelKind::mixed: return std::min(limits.cube, limits.vector);
  }
  return 0;
}

void validate_limit_value(int value, int spec, const char* kind, const char* what) {
  CM_CHECK(value == -1 || (value >= 1 && value <= spec),
           fmt::format("pass -1 to leave it unchanged or a count in [1, {}]", spec),
           "invalid {} {} core limit {}: the device spec has {} {} cores", what, kind, value, spec,
           kind);
}

Device::Device(const DeviceOptions& options) : impl_(std::make_unique<Impl>()) {
  Impl& d = *impl_;
  d.owner = this;
  d.id = g_next_device_id.fetch_add(1);
  const std::vector<int> cpus = affinity_cpus();
  int cores = options.cores;
  if (cores == 0) cores = static_cast<int>(env::get_int("COREMESH_CORES", 0));
  if (cores == 0) cores = std::max<int>(1, static_cast<int>(cpus.size()));
  CM_CHECK(cores >= 1 && cores <= 1024, "use between 1 and 1024 cores (COREMESH_CORES)",
           "invalid number of device cores {}", cores);
  CM_CHECK(options.cube_cores >= 0 && options.vector_cores >= 0,
           "use 0 (same as cores) or a positive count", "negative cube/vector core spec");
  d.cores = cores;
  d.spec = {options.cube_cores ? options.cube_cores : cores,
            options.vector_cores ? options.vector_cores : cores};
  d.spin_us = options.spin_us >= 0 ? options.spin_us
                                   : static_cast<int>(env::get_int("COREMESH_SPIN_US", 50));
  // COREMESH_PIN=0 leaves placement to the OS (better on machines shared
  // with other busy processes).
  const bool pin = options.pin && env::get_int("COREMESH_PIN", 1) != 0 &&
                   static_cast<int>(cpus.size()) >= cores;
  for (int core = 0; core < cores; ++core) {
    d.sleeps.push_back(std::make_unique<Impl::Sleep>());
    d.sleeps.back()->cpu = pin ? cpus[core] : -1;
  }
  try {
    for (int core = 0; core < cores; ++core) {
      d.workers.emplace_back([&d, core, pin, cpu = pin ? cpus[core] : -1] {
        if (pin) pin_current_thread(cpu);
        mark_runtime_thread();
        d.worker_loop(core);
      });
    }
    d.default_stream.reset(new Stream(*this));
    set_host_pressure_hook(&relieve_host_memory);
    CM_LOG_INFO("device {}: {} cores (cube {}, vector {}){}", d.id, cores, d.spec.cube,
                d.spec.vector, pin ? ", pinned" : "");
  } catch (...) {  // e.g. a bad COREMESH_LOG_LEVEL: running workers must be joined, not abandoned
    d.default_stream.reset();
    d.shutdown();
    throw;
  }
}

Device::~Device() {
  try {
    synchronize();
  } catch (const std::exception& e) {
    CM_LOG_ERROR("device {} destroyed with a pending error: {}", impl_->id, e.what());
  }
  impl_->default_stream.reset();
  {
    std::lock_guard lock(impl_->streams_mutex);
    for (auto& weak : impl_->streams)
      if (auto s = weak.lock()) s->device_gone.store(true, std::memory_order_release);
  }
  impl_->shutdown();
}

Device& Device::default_device() {
  static Device device;
  return device;
}

int Device::id() const { return impl_->id; }
int Device::num_cores() const { return impl_->cores; }
CoreLimits Device::spec() const { return impl_->spec; }

void Device::set_limit(int cube_num, int vector_num) {
  validate_limit_value(cube_num, impl_->spec.cube, "cube", "device");
  validate_limit_value(vector_num, impl_->spec.vector, "vector", "device");
  if (cube_num != -1) impl_->cube_limit = cube_num;
  if (vector_num != -1) impl_->vector_limit = vector_num;
}

void Device::reset_limit() {
  impl_->cube_limit = 0;
  impl_->vector_limit = 0;
}

CoreLimits Device::limit() const { return impl_->limit(); }

Stream& Device::default_stream() { return *impl_->default_stream; }

void Device::synchronize() {
  if (const KernelRun* k = running_kernel(); k && k->stream && k->stream->device == impl_.get())
    CM_THROW(InvalidArgument, "a kernel cannot wait for its own device: wait from the host, or record an event",
             "Device::synchronize() from inside kernel '{}' of that device", k->info.name);
  if (impl_->capturing_streams.load() > 0) capture_refuse_device_sync(*impl_);
  std::vector<std::shared_ptr<StreamImpl>> streams;
  {
    std::lock_guard lock(impl_->streams_mutex);
    for (auto& weak : impl_->streams)
      if (auto s = weak.lock()) streams.push_back(std::move(s));
  }
  // A kernel error on one stream still waits for the others; anything else
  // (a watchdog timeout, an exception from the host wait hook) ends the wait.
  // Every stream's error is reported (synchronize clears them).
  std::exception_ptr first;
  std::string all;
  int failed = 0;
  for (auto& s : streams) {
    try {
      s->synchronize();
    } catch (const KernelError& e) {
      if (!first) first = std::current_exception();
      all += fmt::format("\n  - {}", e.message());
      ++failed;
    }
  }
  if (failed > 1) CM_THROW(KernelError, "fix the first; the others may follow from it", "{} streams failed:{}", failed, all);
  if (first) std::rethrow_exception(first);
}

void set_device_limit(Device& device, int cube_num, int vector_num) {
  device.set_limit(cube_num, vector_num);
}
CoreLimits get_device_limit(const Device& device) { return device.limit(); }
void reset_device_limit(Device& device) { device.reset_limit(); }

// ---------------------------------------------------------------------------
// Device::Impl: the worker pool.

CoreLimits Device::Impl::limit() const {
  int cube = cube_limit.load();
  int vector = vector_limit.load();
  return {cube ? cube : spec.cube, vector ? vector : spec.vector};
}

std::shared_ptr<StreamImpl> Device::Impl::make_stream(int priority) {
  auto s = std::make_shared<StreamImpl>();
  s->device = this;
  s->id = next_stream_id.fetch_add(1);
  s->priority = priority;
  std::lock_guard lock(streams_mutex);
  std::erase_if(streams, [](const std::weak_ptr<StreamImpl>& w) { return w.expired(); });
  streams.push_back(s);
  return s;
}

// Wakes only the sleepers that will find a block: a worker submitting (from
// its finished kernel's completion) claims a block itself right after, so
// for a kernel limited to 1 core (a 1-core training run) it wakes none.
// Waking one anyway costs the submitter a futex call per kernel and lets the
// woken worker take the kernel to a core whose caches hold none of its inputs.
// Sleepers pinned to the submitter's CPU are woken last: the host thread
// submitting after a synchronize would otherwise often wake the worker that
// must wait for the host itself to leave the core (about 2 ms per
// synchronize at 1 training thread).
void Device::Impl::submit(std::shared_ptr<KernelRun> run) {
  std::vector<Sleep*> wake;
  const CoreLimits allowed = run->limits;  // of the stream it was launched on
  {
    std::lock_guard lock(ready_mutex);
    // Higher priority first; FIFO among equal priorities.
    auto pos = std::find_if(ready.begin(), ready.end(), [&](const auto& r) {
      return r->priority < run->priority;
    });
    ready.insert(pos, std::move(run));
    ready_count.fetch_add(1, std::memory_order_release);
    kernels_in_flight().fetch_add(1, std::memory_order_relaxed);
    if (sleepers == 0) return;
    int unclaimed = 0;
    for (const auto& r : ready) unclaimed += r->info.block_dim - r->next_block;
    int n = unclaimed - (t_completing_on == this ? 1 : 0);
    // Where the kernel's stream may use more than one core, one idle worker
    // is woken anyway, as before this rule: it spins, ready for the next
    // kernel's other blocks (paired runs at 2 training threads could not tell
    // the two apart).
    if (allowed.cube > 1 || allowed.vector > 1) n = std::max(n, 1);
    n = std::min(sleepers, n);
    const int here = sched_getcpu();
    for (const bool on_other_cpu : {true, false})
      for (auto& sl : sleeps)
        if (n > 0 && sl->asleep && (sl->cpu != here) == on_other_cpu) {
          sl->asleep = false;
          --sleepers, --n;
          wake.push_back(sl.get());
        }
  }
  for (Sleep* sl : wake) sl->cv.notify_one();
}

void Device::Impl::worker_loop(int core) {
  Sleep& me = *sleeps[static_cast<size_t>(core)];
  for (;;) {
    // Spin briefly for new work before sleeping: keeps launch latency low
    // without burning a CPU that other processes (PEs) may need.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::microseconds(spin_us);
    for (int i = 0; ready_count.load(std::memory_order_acquire) == 0; ++i) {
      if (std::chrono::steady_clock::now() >= deadline) break;
      spin_pause(i);
    }
    std::shared_ptr<KernelRun> run;
    int block = 0;
    {
      std::unique_lock lock(ready_mutex);
      while (!stopping && ready.empty()) {
        me.asleep = true;
        ++sleepers;
        me.cv.wait(lock);
        if (me.asleep) me.asleep = false, --sleepers;  // not woken by submit (spurious)
      }
      if (ready.empty()) return;  // stopping and drained
      run = ready.front();
      block = run->next_block++;
      if (run->next_block == run->info.block_dim) {
        ready.pop_front();
        ready_count.fetch_sub(1, std::memory_order_release);
      }
    }
    run_block(*run, block, core);
  }
}

void Device::Impl::run_block(KernelRun& run, int block, int core) {
  const int64_t start = profiler_now_ns();
  int64_t expected = run.start_ns.load();
  while (start < expected && !run.start_ns.compare_exchange_weak(expected, start)) {
  }
  t_running_kernel = &run;
  try {
    run.body(BlockContext{block, run.info.block_dim, core});
  } catch (...) {
    std::lock_guard lock(run.error_mutex);
    if (!run.error) run.error = std::current_exception();
  }
  t_running_kernel = nullptr;
  const int64_t end = profiler_now_ns();
  note_work_progress();
  if (run.profiled) run.blocks[static_cast<size_t>(block)] = BlockRecord{block, core, start, end};
  expected = run.end_ns.load();
  while (end > expected && !run.end_ns.compare_exchange_weak(expected, end)) {
  }
  if (run.blocks_left.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
  kernels_in_flight().fetch_sub(1, std::memory_order_relaxed);

  // Last block: the kernel is complete.
  if (run.profiled) {
    profiler_add(KernelRecord{-1, id, run.stream_id, run.info.name, run.info.kind,
                              run.start_ns.load(), run.end_ns.load(), run.info.block_dim,
                              run.limits, run.info.cache_id, std::move(run.blocks),
                              run.info.op ? run.info.op->describe([](const Tensor&) { return std::string(); })
                                          : std::string()});
  }
  std::exception_ptr error;
  {
    std::lock_guard lock(run.error_mutex);
    error = run.error;
  }
  if (error) {
    try {
      std::rethrow_exception(error);
    } catch (const std::exception& e) {
      error = std::make_exception_ptr(KernelError(
          fmt::format("kernel '{}' on stream {} failed: {}", run.info.name, run.stream_id,
                      e.what()),
          "see the kernel's error above", __FILE__, __LINE__));
    } catch (...) {
      error = std::make_exception_ptr(KernelError(
          fmt::format("kernel '{}' on stream {} failed with a non-standard exception",
                      run.info.name, run.stream_id),
          "", __FILE__, __LINE__));
    }
  }
  if (!run.dag) {
    // Drop what the kernel captured (tensors, symmetric ones included) before
    // its stream moves on, so that nothing of it dies later on this worker,
    // after the host's synchronize: a symmetric free is collective, and PEs
    // must free in the same order. (A graph's nodes keep theirs for replays.)
    run.body = nullptr;
    run.info.op.reset();
  }
  t_completing_on = this;
  if (run.dag) {  // a graph replay's node: `run` is reset by the next run
    run.dag->node_done(run.dag_node, error);
  } else {
    auto stream = std::move(run.stream);  // `run` may be freed once the stream moves on
    stream->item_done(error);
  }
  t_completing_on = nullptr;
}

void Device::Impl::shutdown() {
  {
    std::lock_guard lock(parked_mutex);
    poller_stopping = true;
  }
  parked_cv.notify_one();
  if (poller.joinable()) poller.join();
  {
    std::lock_guard lock(ready_mutex);
    stopping = true;
  }
  for (auto& sl : sleeps) sl->cv.notify_one();
  for (auto& t : workers) t.join();
  workers.clear();
}

}  // namespace coremesh::runtime
