// Value waits (Stream::wait_value): a stream parks until a word that other
// processes write satisfies a comparison, holding no worker meanwhile.
//
// Nobody notifies the process when a peer writes its memory, so the device
// polls: a poller thread, started with the first parked wait, re-checks
// every parked wait, sleeping between rounds with a backoff from kMinPause
// to kMaxPause (reset whenever a wait is parked or finishes), on the
// doorbell of a wait that has one (ValueWait::sleep: woken when a writer
// rings it) or else on a condition variable, as when nothing is parked. The
// workers never see a parked wait; they run the other streams' kernels.
#include <algorithm>

#include "coremesh/core/error.hpp"
#include "internal.hpp"

namespace coremesh::runtime {
namespace {

constexpr std::chrono::microseconds kMinPause{10};
constexpr std::chrono::microseconds kMaxPause{500};

uint64_t load_word(const uint64_t* word) {
  return std::atomic_ref<uint64_t>(*const_cast<uint64_t*>(word)).load(std::memory_order_acquire);
}

std::chrono::milliseconds timeout_of(const ValueWait& w) {
  return w.timeout.count() > 0 ? w.timeout : wait_timeout();
}

[[noreturn]] void throw_timeout(const ParkedWait& w) {
  CM_THROW(TimeoutError,
           "a peer may have failed or skipped a matching call; raise COREMESH_WAIT_TIMEOUT_S if the "
           "work is legitimately slow",
           "watchdog: {} (still waiting after {:.1f} s)", w.describe(),
           static_cast<double>(timeout_of(w.wait).count()) / 1000.0);
}

// One check of a wait that is not parked in the poller: ready, else poll,
// else time out. Returns true when the word is ready.
bool check(const ParkedWait& w, std::chrono::steady_clock::time_point now) {
  if (w.ready()) return true;
  if (w.wait.poll) {
    w.wait.poll();
    if (w.ready()) return true;
  }
  if (now >= w.deadline) throw_timeout(w);
  return false;
}

// The stream's error for a wait that failed: a KernelError naming the wait,
// as run_block names a failed kernel.
std::exception_ptr stream_error(const ParkedWait& w, std::exception_ptr error) {
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    return std::make_exception_ptr(KernelError(
        fmt::format("wait '{}' on stream {} failed: {}", w.wait.name, w.stream_id, e.what()),
        "see the wait's error above", __FILE__, __LINE__));
  } catch (...) {
    return std::make_exception_ptr(KernelError(
        fmt::format("wait '{}' on stream {} failed with a non-standard exception", w.wait.name,
                    w.stream_id),
        "", __FILE__, __LINE__));
  }
}

// Reports the parked interval and moves its stream on.
void finish(ParkedWait& w, int device_id, std::exception_ptr error) {
  if (w.profiled)
    profiler_add(KernelRecord{-1, device_id, w.stream_id, w.wait.name, KernelKind::comm,
                              w.start_ns, profiler_now_ns(), 0, CoreLimits{0, 0}, 0, {},
                              fmt::format("wait_value(word {} {})", wait_cmp_name(w.wait.cmp),
                                          w.wait.value)});
  note_work_progress();
  waits_parked().fetch_sub(1, std::memory_order_relaxed);
  auto stream = std::move(w.stream);
  stream->item_done(error ? stream_error(w, error) : nullptr);
}

}  // namespace

std::string_view wait_cmp_name(WaitCmp cmp) {
  switch (cmp) {
    case WaitCmp::eq: return "==";
    case WaitCmp::ne: return "!=";
    case WaitCmp::gt: return ">";
    case WaitCmp::ge: return ">=";
    case WaitCmp::lt: return "<";
    case WaitCmp::le: return "<=";
  }
  return "?";
}

bool wait_cmp_holds(uint64_t word, WaitCmp cmp, uint64_t value) {
  switch (cmp) {
    case WaitCmp::eq: return word == value;
    case WaitCmp::ne: return word != value;
    case WaitCmp::gt: return word > value;
    case WaitCmp::ge: return word >= value;
    case WaitCmp::lt: return word < value;
    case WaitCmp::le: return word <= value;
  }
  return false;
}

bool ParkedWait::ready() const { return wait_cmp_holds(load_word(wait.word), wait.cmp, wait.value); }

std::string ParkedWait::describe() const {
  return fmt::format("{} (the word is {}, waiting for {} {})",
                     wait.describe ? wait.describe() : fmt::format("stream {} waits on the word at {}", stream_id,
                                                                  static_cast<const void*>(wait.word)),
                     load_word(wait.word), wait_cmp_name(wait.cmp), wait.value);
}

void Stream::wait_value(ValueWait wait) {
  CM_CHECK(wait.word != nullptr && reinterpret_cast<uintptr_t>(wait.word) % alignof(uint64_t) == 0,
           "pass the address of an 8-byte aligned uint64_t", "wait_value on stream {} got the address {}",
           impl_->id, static_cast<const void*>(wait.word));
  if (impl_->capturing.load(std::memory_order_acquire)) {
    capture_value_wait(*impl_, std::move(wait));
    return;
  }
  auto w = std::make_shared<ParkedWait>();
  w->wait = std::move(wait);
  w->stream_id = impl_->id;
  WorkItem item{WorkItem::Type::value_wait, nullptr, nullptr, nullptr, std::move(w)};
  impl_->enqueue(std::move(item));
}

// Called by StreamImpl::start when the wait reaches the head of its stream
// and is not ready yet: from here the watchdog runs.
void Device::Impl::park(std::shared_ptr<ParkedWait> w) {
  w->deadline = std::chrono::steady_clock::now() + timeout_of(w->wait);
  w->profiled = profiler_enabled();
  w->start_ns = profiler_now_ns();
  waits_parked().fetch_add(1, std::memory_order_relaxed);
  {
    std::lock_guard lock(parked_mutex);
    parked.push_back(std::move(w));
    parked_added = true;
    if (!poller.joinable()) poller = std::thread([this] {
      mark_runtime_thread();
      poller_loop();
    });
  }
  parked_cv.notify_one();
}

void Device::Impl::poller_loop() {
  auto pause = kMinPause;
  std::unique_lock lock(parked_mutex);
  for (;;) {
    parked_cv.wait(lock, [&] { return poller_stopping || !parked.empty(); });
    if (poller_stopping) break;
    parked_added = false;
    const std::vector<std::shared_ptr<ParkedWait>> round = parked;
    lock.unlock();
    std::vector<std::pair<std::shared_ptr<ParkedWait>, std::exception_ptr>> finished;
    const auto now = std::chrono::steady_clock::now();
    for (const auto& w : round) {
      try {
        if (check(*w, now)) finished.emplace_back(w, nullptr);
      } catch (...) {
        finished.emplace_back(w, std::current_exception());
      }
    }
    // Outside the lock: a stream moving on may park its next wait.
    for (auto& [w, error] : finished) finish(*w, id, error);
    lock.lock();
    std::erase_if(parked, [&](const auto& w) {
      return std::any_of(finished.begin(), finished.end(), [&](const auto& f) { return f.first == w; });
    });
    if (!finished.empty() || parked_added) {
      pause = kMinPause;
      continue;
    }
    // Sleep on a doorbell the writers ring where a wait has one, else plainly.
    const auto with_bell =
        std::find_if(parked.begin(), parked.end(), [](const auto& w) { return w->wait.sleep != nullptr; });
    if (with_bell != parked.end()) {
      const auto sleeper = *with_bell;
      lock.unlock();
      sleeper->wait.sleep(pause);
      lock.lock();
    } else {
      parked_cv.wait_for(lock, pause, [&] { return poller_stopping || parked_added; });
    }
    pause = parked_added ? kMinPause : std::min(pause * 2, kMaxPause);
  }
  // The device is going away with streams still parked: fail them, so that
  // their later kernels are skipped rather than left queued.
  const auto left = std::move(parked);
  lock.unlock();
  for (const auto& w : left)
    finish(*w, id,
           std::make_exception_ptr(Error(fmt::format("device {} was destroyed while {}", id, w->describe()),
                                         "synchronize the stream before the device goes away", __FILE__,
                                         __LINE__)));
}

void capture_value_wait(StreamImpl& s, ValueWait wait) {
  LaunchInfo info;
  info.name = wait.name;
  info.kind = KernelKind::comm;
  auto op = std::make_shared<OpDesc>();
  op->key.op = "wait_value";
  op->key.attrs = fmt::format("cmp={};value={}", wait_cmp_name(wait.cmp), wait.value);
  info.op = std::move(op);
  auto w = std::make_shared<const ParkedWait>(ParkedWait{std::move(wait), s.id, nullptr, {}, 0, false});
  // A graph replays its nodes in workers: the wait sleeps there, with the
  // poller's backoff and watchdog.
  KernelBody body = [w](const BlockContext&) {
    ParkedWait replay = *w;
    replay.deadline = std::chrono::steady_clock::now() + timeout_of(w->wait);
    for (auto pause = kMinPause; !check(replay, std::chrono::steady_clock::now());
         pause = std::min(pause * 2, kMaxPause)) {
      if (replay.wait.sleep) replay.wait.sleep(pause);
      else std::this_thread::sleep_for(pause);
    }
  };
  capture_launch(s, info, std::move(body), s.effective_limits());
}

}  // namespace coremesh::runtime
