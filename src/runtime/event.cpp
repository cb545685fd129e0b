#include <deque>

#include "coremesh/core/error.hpp"
#include "coremesh/runtime/stream.hpp"
#include "internal.hpp"

namespace coremesh::runtime {

namespace {
std::atomic<uint64_t> g_next_event_id{1};

// Waiters released while this thread already runs waiters: a waiter restarts
// its stream, which may complete the next recording of a chain of streams.
// Run nested, a chain of thousands of streams overflows the stack; queued
// here, the outermost complete() runs them one after another.
thread_local std::deque<std::function<void()>>* t_released = nullptr;
}  // namespace

void Recording::complete(std::exception_ptr stream_error) {
  std::vector<std::function<void(std::exception_ptr)>> to_run;
  {
    std::lock_guard lock(mutex);
    done = true;
    time_ns = profiler_now_ns();
    error = stream_error;
    to_run.swap(waiters);
  }
  done_cv.notify_all();
  if (to_run.empty()) return;
  if (t_released) {
    for (auto& fn : to_run) t_released->push_back([fn = std::move(fn), stream_error] { fn(stream_error); });
    return;
  }
  std::deque<std::function<void()>> released;
  t_released = &released;
  struct Reset {
    ~Reset() { t_released = nullptr; }
  } reset;
  // Every released waiter runs, also after one throws (a stream left parked
  // would never run again): the first exception is rethrown at the end.
  std::exception_ptr first_failure;
  const auto run = [&](auto&& fn) {
    try {
      fn();
    } catch (...) {
      if (!first_failure) first_failure = std::current_exception();
    }
  };
  for (auto& fn : to_run) run([&] { fn(stream_error); });
  while (!released.empty()) {
    auto fn = std::move(released.front());
    released.pop_front();
    run(fn);
  }
  if (first_failure) std::rethrow_exception(first_failure);
}

bool Recording::on_complete(std::function<void(std::exception_ptr)> fn) {
  std::lock_guard lock(mutex);
  if (done) return false;
  waiters.push_back(std::move(fn));
  return true;
}

std::string Recording::describe() const {
  return fmt::format("event {} (recorded on stream {})", event_id, stream_id);
}

Event::Event(bool enable_timing) : impl_(std::make_shared<EventImpl>()) {
  impl_->id = g_next_event_id.fetch_add(1);
  impl_->timing = enable_timing;
}

uint64_t Event::id() const { return impl_->id; }

void Event::record() {
  Stream s = current_stream();
  record(s);
}

void Event::record(Stream& stream) {
  if (capture_record(*stream.impl(), *impl_)) return;
  auto rec = std::make_shared<Recording>();
  rec->event_id = impl_->id;
  rec->stream_id = stream.id();
  rec->timing = impl_->timing;
  {
    std::lock_guard lock(impl_->mutex);
    impl_->latest = rec;
  }
  stream.impl()->enqueue(WorkItem{WorkItem::Type::record, nullptr, std::move(rec)});
}

void Event::wait() {
  Stream s = current_stream();
  wait(s);
}

void Event::wait(Stream& stream) {
  if (capture_wait(*stream.impl(), *impl_)) return;
  auto rec = impl_->snapshot();
  if (!rec) return;  // never recorded: nothing to wait for (CUDA semantics)
  stream.impl()->enqueue(WorkItem{WorkItem::Type::wait, nullptr, std::move(rec)});
}

bool Event::query() const {
  capture_refuse_event_sync(*impl_, "Event::query()");
  auto rec = impl_->snapshot();
  if (!rec) return true;
  std::lock_guard lock(rec->mutex);
  return rec->done;
}

void Event::synchronize() const {
  capture_refuse_event_sync(*impl_, "Event::synchronize()");
  auto rec = impl_->snapshot();
  if (!rec) return;
  std::unique_lock lock(rec->mutex);
  if (!host_wait(rec->done_cv, lock, [&] { return rec->done; })) {
    CM_THROW(TimeoutError,
             "raise COREMESH_WAIT_TIMEOUT_S if the work is just slow; otherwise find what blocks "
             "the recording stream (Stream::synchronize on it names its running item)",
             "{} did not complete: no kernel finished for {} s", rec->describe(),
             host_wait_timeout().count() / 1000.0);
  }
  if (rec->error) std::rethrow_exception(rec->error);
}

float Event::elapsed_time(const Event& end) const {
  CM_CHECK(impl_->timing && end.impl_->timing, "create both events with Event(true)",
           "elapsed_time needs timing on both events ({} and {})", impl_->id, end.impl_->id);
  auto a = impl_->snapshot();
  auto b = end.impl_->snapshot();
  CM_CHECK(a && b, "record both events before asking for the time between them",
           "event {} was never recorded", a ? end.impl_->id : impl_->id);
  // An event timed against itself has one mutex: lock it once.
  std::unique_lock lock_a(a->mutex, std::defer_lock), lock_b(b->mutex, std::defer_lock);
  if (a == b) lock_a.lock();
  else std::lock(lock_a, lock_b);
  CM_CHECK(a->done && b->done, "synchronize the end event first",
           "events {} and {} have not both completed", impl_->id, end.impl_->id);
  return static_cast<float>(static_cast<double>(b->time_ns - a->time_ns) / 1e6);
}

}  // namespace coremesh::runtime
