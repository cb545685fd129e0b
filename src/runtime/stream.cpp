#include "coremesh/runtime/stream.hpp"

#include "coremesh/core/env.hpp"
#include "coremesh/core/error.hpp"
#include "coremesh/core/log.hpp"
#include "internal.hpp"

namespace coremesh::runtime {

namespace {

std::atomic<int64_t>& timeout_ms() {
  static std::atomic<int64_t> ms{static_cast<int64_t>(env::wait_timeout_s() * 1000.0)};
  return ms;
}

thread_local std::shared_ptr<StreamImpl> t_current_stream;
std::atomic<HostWaitHook> g_host_wait_hook{nullptr};
}  // namespace

void set_host_wait_hook(HostWaitHook hook) { g_host_wait_hook = hook; }
HostWaitHook host_wait_hook() { return g_host_wait_hook.load(); }

std::chrono::milliseconds wait_timeout() { return std::chrono::milliseconds(timeout_ms().load()); }
std::chrono::milliseconds host_wait_timeout() {
  const int64_t ms = timeout_ms().load();
  return std::chrono::milliseconds(ms + ms / 10 + 2000);
}

void set_wait_timeout(std::chrono::milliseconds timeout) {
  CM_CHECK(timeout.count() > 0, "use a positive timeout", "wait timeout must be positive");
  timeout_ms() = timeout.count();
}

// ---------------------------------------------------------------------------
// StreamImpl

void StreamImpl::check_device() const {
  CM_CHECK(!device_gone.load(std::memory_order_acquire),
           "keep a Device alive while its streams are used (a Stream handle outlived it)",
           "stream {} is used after its device was destroyed", id);
}

CoreLimits StreamImpl::effective_limits() const {
  check_device();
  const CoreLimits device_limit = device->limit();
  const int cube = cube_limit.load();
  const int vector = vector_limit.load();
  return {cube ? cube : device_limit.cube, vector ? vector : device_limit.vector};
}

std::string StreamImpl::describe() const { return fmt::format("stream {}", id); }

std::string StreamImpl::describe_head() const {
  if (head_wait) return "a wait for " + head_wait->describe();
  if (head_value_wait) return "a parked wait: " + head_value_wait->describe();
  if (head_dag) return head_dag->describe();
  if (head_kernel)
    return fmt::format("kernel '{}' ({} blocks)", head_kernel->info.name, head_kernel->info.block_dim);
  return "nothing";
}

void StreamImpl::enqueue(WorkItem item) {
  check_device();
  {
    std::lock_guard lock(mutex);
    item.seq = enqueued++;
    queue.push_back(std::move(item));
    pending.fetch_add(1, std::memory_order_relaxed);
    queued_items().fetch_add(1, std::memory_order_relaxed);
    if (busy) return;
  }
  pump();
}

void StreamImpl::set_error(std::exception_ptr e) {
  if (e && !error) error = e;
}

void StreamImpl::item_done(std::exception_ptr item_error) {
  {
    std::lock_guard lock(mutex);
    busy = false;
    head_kernel.reset();
    head_wait.reset();
    head_dag.reset();
    head_value_wait.reset();
    set_error(item_error);
    pending.fetch_sub(1, std::memory_order_release);
    queued_items().fetch_sub(1, std::memory_order_relaxed);
  }
  pump();
}

// Starts queued items until one is in flight or the queue is empty. Items
// that finish synchronously (records, satisfied waits, skipped kernels) are
// handled in this loop, not by recursion.
void StreamImpl::pump() {
  auto self = shared_from_this();  // keep alive while items complete
  for (;;) {
    WorkItem item;
    {
      std::lock_guard lock(mutex);
      if (busy || queue.empty()) {
        if (!busy) idle_cv.notify_all();
        return;
      }
      item = std::move(queue.front());
      queue.pop_front();
      busy = true;
    }
    std::exception_ptr finished_error;
    if (!start(item, finished_error)) return;  // completes asynchronously
    std::lock_guard lock(mutex);
    busy = false;
    set_error(finished_error);
    pending.fetch_sub(1, std::memory_order_release);
    queued_items().fetch_sub(1, std::memory_order_relaxed);
  }
}

bool StreamImpl::start(WorkItem& item, std::exception_ptr& finished_error) {
  std::exception_ptr current_error;
  {
    std::lock_guard lock(mutex);
    current_error = error ? error : item.seq < poisoned_below ? poison : nullptr;
  }
  switch (item.type) {
    case WorkItem::Type::kernel: {
      if (current_error) {  // an errored stream skips kernels until the error is reported
        CM_LOG_DEBUG("stream {}: skipping kernel '{}' after an earlier error", id,
                     item.kernel->info.name);
        return true;
      }
      {
        std::lock_guard lock(mutex);
        head_kernel = item.kernel;
      }
      device->submit(std::move(item.kernel));
      return false;
    }
    case WorkItem::Type::record:
      item.recording->complete(current_error);
      return true;
    case WorkItem::Type::wait: {
      {
        std::lock_guard lock(mutex);
        head_wait = item.recording;
      }
      // The parked wait holds its stream, as a running kernel or graph does:
      // work queued behind it runs even when the last handle is gone (a
      // dropped stream lost its queue, and what waited on it hung).
      bool parked = item.recording->on_complete(
          [self = shared_from_this()](std::exception_ptr recorded_error) { self->item_done(recorded_error); });
      if (parked) return false;
      std::lock_guard lock(item.recording->mutex);
      finished_error = item.recording->error;
      return true;
    }
    case WorkItem::Type::value_wait: {
      if (current_error) return true;  // skipped like a kernel
      if (item.value_wait->ready()) return true;
      item.value_wait->stream = shared_from_this();
      {
        std::lock_guard lock(mutex);
        head_value_wait = item.value_wait;
      }
      device->park(std::move(item.value_wait));
      return false;
    }
    case WorkItem::Type::dag: {
      if (current_error) return true;  // skipped like a kernel
      if (item.dag->runs.empty()) return true;
      {
        std::lock_guard lock(mutex);
        head_dag = item.dag;
      }
      return item.dag->start(shared_from_this());
    }
  }
  return true;
}

void StreamImpl::rethrow_pending_error(std::unique_lock<std::mutex>& lock) {
  if (!error) return;
  std::exception_ptr e = error;
  poison = error, poisoned_below = enqueued;  // what is still queued was launched to follow the failure
  error = nullptr;
  lock.unlock();
  std::rethrow_exception(e);
}

void StreamImpl::synchronize() {
  check_device();
  if (const KernelRun* k = running_kernel(); k && k->stream.get() == this)
    CM_THROW(InvalidArgument, "a kernel cannot wait for its own stream: wait from the host or another stream",
             "Stream::synchronize() of stream {} from inside its kernel '{}'", id, k->info.name);
  std::unique_lock lock(mutex);
  const auto idle = [&] { return !busy && queue.empty(); };
  if (!idle()) {
    // Short spin (without the lock) for work that finishes quickly.
    lock.unlock();
    const auto spin_end =
        std::chrono::steady_clock::now() + std::chrono::microseconds(device->spin_us);
    for (int i = 0; pending.load(std::memory_order_acquire) != 0; ++i) {
      cpu_relax();
      if ((i & 63) == 63) {
        if (std::chrono::steady_clock::now() >= spin_end) break;
        std::this_thread::yield();
      }
    }
    lock.lock();
  }
  if (!host_wait(idle_cv, lock, idle)) {
    CM_THROW(TimeoutError,
             "raise COREMESH_WAIT_TIMEOUT_S if the work is just slow; otherwise look for a "
             "kernel that never returns or an event recorded on a stream that is stuck",
             "{} made no progress for {} s: it is running {} with {} more item(s) queued",
             describe(), host_wait_timeout().count() / 1000.0, describe_head(), queue.size());
  }
  rethrow_pending_error(lock);
}

bool StreamImpl::query() {
  check_device();
  std::unique_lock lock(mutex);
  rethrow_pending_error(lock);
  return !busy && queue.empty();
}

// ---------------------------------------------------------------------------
// Stream

Stream::Stream(Device& device, int priority) : impl_(device.impl().make_stream(priority)) {}

int Stream::id() const { return impl_->id; }
int Stream::priority() const { return impl_->priority; }
Device& Stream::device() const {
  impl_->check_device();
  return *impl_->device->owner;
}

void Stream::launch(const LaunchInfo& info, KernelBody body) {
  const CoreLimits limits = impl_->effective_limits();
  const int allowed = max_blocks(limits, info.kind);
  CM_CHECK(info.block_dim >= 1 && info.block_dim <= allowed,
           fmt::format("tile the kernel into 1..{} blocks (raise the {} core limit for more)",
                       allowed, kernel_kind_name(info.kind)),
           "kernel '{}' ({}) launched with block_dim {} but stream {} allows {} {} cores "
           "(cube {}, vector {})",
           info.name, kernel_kind_name(info.kind), info.block_dim, impl_->id, allowed,
           kernel_kind_name(info.kind), limits.cube, limits.vector);
  CM_CHECK(body != nullptr, "pass a kernel body", "kernel '{}' has no body", info.name);
  if (impl_->capturing.load(std::memory_order_acquire)) {
    capture_launch(*impl_, info, std::move(body), limits);
    return;
  }
  auto run = std::make_shared<KernelRun>();
  run->info = info;
  run->body = std::move(body);
  run->limits = limits;
  run->stream = impl_;
  run->stream_id = impl_->id;
  run->priority = impl_->priority;
  run->blocks_left.store(info.block_dim);
  run->profiled = profiler_enabled();
  if (run->profiled) run->blocks.resize(static_cast<size_t>(info.block_dim));
  impl_->enqueue(WorkItem{WorkItem::Type::kernel, std::move(run), nullptr});
}

bool Stream::query() {
  if (impl_->capturing.load(std::memory_order_acquire)) capture_refuse_sync(*impl_, "Stream::query()");
  return impl_->query();
}
void Stream::synchronize() {
  if (impl_->capturing.load(std::memory_order_acquire)) capture_refuse_sync(*impl_, "Stream::synchronize()");
  impl_->synchronize();
}

Event Stream::record_event() {
  Event e;
  e.record(*this);
  return e;
}

void Stream::wait_event(const Event& event) {
  Event copy = event;
  copy.wait(*this);
}

void Stream::wait_stream(Stream& other) {
  Event e;
  e.record(other);
  e.wait(*this);
}

void Stream::set_limit(int cube_num, int vector_num) {
  impl_->check_device();
  const CoreLimits spec = impl_->device->spec;
  validate_limit_value(cube_num, spec.cube, "cube", "stream");
  validate_limit_value(vector_num, spec.vector, "vector", "stream");
  if (cube_num != -1) impl_->cube_limit = cube_num;
  if (vector_num != -1) impl_->vector_limit = vector_num;
}

void Stream::reset_limit() {
  impl_->cube_limit = 0;
  impl_->vector_limit = 0;
}

CoreLimits Stream::effective_limits() const { return impl_->effective_limits(); }

// ---------------------------------------------------------------------------
// Current stream, guards and the RFC's free functions.

Stream current_stream() {
  if (t_current_stream) return Stream(t_current_stream);
  return Device::default_device().default_stream();
}

void set_current_stream(const Stream& stream) { t_current_stream = stream.impl(); }

void synchronize() { Device::default_device().synchronize(); }

namespace {
thread_local ScopedOverrides<std::shared_ptr<StreamImpl>> t_stream_guards;
}  // namespace

StreamGuard::StreamGuard(const Stream& stream) : token_(t_stream_guards.push(t_current_stream)) {
  set_current_stream(stream);
}
StreamGuard::~StreamGuard() {
  if (auto previous = t_stream_guards.pop(token_)) t_current_stream = std::move(*previous);
}

// The limit is set before the guard is pushed: a refused value leaves nothing to restore.
StreamLimitGuard::StreamLimitGuard(const Stream& stream, int cube_num, int vector_num)
    : stream_(stream), current_(stream), token_([&] {
        StreamImpl& s = *stream.impl();
        std::lock_guard lock(s.mutex);
        const CoreLimits saved{s.cube_limit.load(), s.vector_limit.load()};
        stream_.set_limit(cube_num, vector_num);
        return s.limit_guards.push(saved);
      }()) {}

StreamLimitGuard::~StreamLimitGuard() {
  StreamImpl& s = *stream_.impl();
  std::lock_guard lock(s.mutex);
  if (auto saved = s.limit_guards.pop(token_)) {
    s.cube_limit = saved->cube;
    s.vector_limit = saved->vector;
  }
}

void set_stream_limit(Stream& stream, int cube_num, int vector_num) {
  stream.set_limit(cube_num, vector_num);
}
void reset_stream_limit(Stream& stream) { stream.reset_limit(); }
CoreLimits get_stream_limit(const Stream& stream) { return stream.effective_limits(); }
CoreLimits current_limits() { return current_stream().effective_limits(); }

}  // namespace coremesh::runtime
