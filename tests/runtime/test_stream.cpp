// Streams: ordering, asynchrony, errors, watchdog.
#include <atomic>
#include <functional>
#include <vector>
#include <memory>
#include <chrono>
#include <cstdlib>
#include <latch>
#include <mutex>
#include <string>
#include <thread>

#include <sched.h>

#include "../../src/runtime/internal.hpp"  // Device::Impl::sleepers
#include "coremesh/core/allocator.hpp"
#include "coremesh/core/error.hpp"
#include "coremesh/core/tensor.hpp"
#include "helpers.hpp"

namespace coremesh::runtime {
namespace {

using namespace testing;

DeviceOptions two_cores() { return {.cores = 2, .cube_cores = 4, .vector_cores = 4}; }

// Polls query() until it reports the stream's kernel error (or 1 s passes).
bool query_reports_an_error(Stream& s) {
  for (int i = 0; i < 10000; ++i) {
    try {
      s.query();
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    } catch (const KernelError&) {
      return true;
    }
  }
  return false;
}

TEST(Stream, RunsItsWorkInOrder) {
  Device device(two_cores());
  Stream s(device);
  std::vector<int> order;
  std::mutex m;
  for (int i = 0; i < 50; ++i) {
    s.launch({"step", KernelKind::vector, 1, 0}, [&, i](const BlockContext&) {
      std::lock_guard lock(m);
      order.push_back(i);
    });
  }
  s.synchronize();
  ASSERT_EQ(order.size(), 50u);
  for (int i = 0; i < 50; ++i) EXPECT_EQ(order[i], i);
}

TEST(Stream, EveryBlockRunsOnceWithItsIndex) {
  Device device(two_cores());
  Stream s(device);
  std::vector<std::atomic<int>> seen(4);
  std::atomic<int> bad_core{0};
  s.launch({"blocks", KernelKind::cube, 4, 0}, [&](const BlockContext& ctx) {
    EXPECT_EQ(ctx.block_dim, 4);
    if (ctx.core_id < 0 || ctx.core_id >= 2) bad_core++;
    seen[ctx.block_idx]++;
  });
  s.synchronize();
  for (auto& count : seen) EXPECT_EQ(count.load(), 1);
  EXPECT_EQ(bad_core.load(), 0);
}

TEST(Stream, LaunchIsAsynchronousAndQueryTellsProgress) {
  Device device(two_cores());
  Stream s(device);
  std::latch release(1);
  s.launch({"blocked", KernelKind::vector, 1, 0}, [&](const BlockContext&) { release.wait(); });
  // launch returned while the kernel cannot finish: it did not block the host.
  EXPECT_FALSE(s.query());
  release.count_down();
  s.synchronize();
  EXPECT_TRUE(s.query());
}

TEST(Stream, KernelErrorIsReportedOnceBySynchronize) {
  Device device(two_cores());
  Stream s(device);
  std::atomic<int> ran_after{0};
  s.launch({"explodes", KernelKind::vector, 2, 0},
           [](const BlockContext&) { throw std::runtime_error("boom"); });
  s.launch({"after", KernelKind::vector, 1, 0}, [&](const BlockContext&) { ran_after++; });
  try {
    s.synchronize();
    FAIL() << "the kernel error was lost";
  } catch (const KernelError& e) {
    EXPECT_NE(std::string(e.what()).find("explodes"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("boom"), std::string::npos) << e.what();
  }
  EXPECT_EQ(ran_after.load(), 0) << "kernels after an error must be skipped";
  // Reported once: the stream is usable again.
  s.launch({"again", KernelKind::vector, 1, 0}, [&](const BlockContext&) { ran_after++; });
  s.synchronize();
  EXPECT_EQ(ran_after.load(), 1);
}

TEST(Stream, KernelErrorIsReportedByQuery) {
  Device device(two_cores());
  Stream s(device);
  s.launch({"explodes", KernelKind::vector, 1, 0},
           [](const BlockContext&) { throw std::runtime_error("bad"); });
  EXPECT_TRUE(query_reports_an_error(s));
  EXPECT_TRUE(s.query());
}

// query() may report an error while work launched after the failed kernel
// still waits in the queue (here behind an event of a slow stream): that work
// is skipped all the same, and an event recorded after it carries the error.
TEST(Stream, WorkQueuedBeforeAQueryReportsAnErrorIsSkipped) {
  Device device(two_cores());
  Stream s(device), slow(device), other(device);
  std::latch release(1);
  slow.launch({"slow", KernelKind::vector, 1, 0}, [&](const BlockContext&) { release.wait(); });
  Event gate;
  gate.record(slow);
  std::atomic<int> consumer{0}, downstream{0};
  s.launch({"producer", KernelKind::vector, 1, 0}, [](const BlockContext&) { throw std::runtime_error("bad"); });
  gate.wait(s);
  s.launch({"consumer", KernelKind::vector, 1, 0}, [&](const BlockContext&) { consumer++; });
  Event after;
  after.record(s);
  after.wait(other);
  other.launch({"downstream", KernelKind::vector, 1, 0}, [&](const BlockContext&) { downstream++; });
  ASSERT_TRUE(query_reports_an_error(s));
  release.count_down();
  s.synchronize();  // reported once
  EXPECT_THROW(other.synchronize(), KernelError);
  EXPECT_EQ(consumer.load(), 0);
  EXPECT_EQ(downstream.load(), 0);
  s.launch({"later", KernelKind::vector, 1, 0}, [&](const BlockContext&) { consumer++; });
  s.synchronize();
  EXPECT_EQ(consumer.load(), 1);
}

// Device::synchronize reports every failed stream's error (it clears them all).
TEST(Stream, DeviceSynchronizeReportsEveryStreamsError) {
  Device device(two_cores());
  Stream a(device), b(device);
  a.launch({"a_kernel", KernelKind::vector, 1, 0}, [](const BlockContext&) { throw std::runtime_error("a failed"); });
  b.launch({"b_kernel", KernelKind::vector, 1, 0}, [](const BlockContext&) { throw std::runtime_error("b failed"); });
  try {
    device.synchronize();
    FAIL() << "no error";
  } catch (const KernelError& e) {
    EXPECT_NE(std::string(e.what()).find("a failed"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("b failed"), std::string::npos) << e.what();
  }
}

// A body that waits for its own stream or device would wait for itself
// (until the watchdog): refused at once, reported as the kernel's error.
TEST(Stream, AKernelWaitingForItsOwnStreamOrDeviceIsRefused) {
  Device device(two_cores());
  Stream s(device);
  s.launch({"waits_for_itself", KernelKind::vector, 1, 0}, [&](const BlockContext&) { s.synchronize(); });
  try {
    s.synchronize();
    FAIL() << "no error";
  } catch (const KernelError& e) {
    EXPECT_NE(std::string(e.what()).find("from inside its kernel 'waits_for_itself'"), std::string::npos) << e.what();
  }
  s.launch({"waits_for_device", KernelKind::vector, 1, 0}, [&](const BlockContext&) { device.synchronize(); });
  EXPECT_THROW(s.synchronize(), KernelError);
}

// A Stream handle that outlives its Device is refused, not a use-after-free.
TEST(Stream, AStreamUsedAfterItsDeviceIsRefused) {
  auto device = std::make_unique<Device>(two_cores());
  Stream s(*device);
  device.reset();
  for (auto use : std::vector<std::function<void()>>{
           [&] { s.launch({"k", KernelKind::vector, 1, 0}, [](const BlockContext&) {}); },
           [&] { s.synchronize(); }, [&] { s.query(); }, [&] { s.record_event(); }, [&] { s.set_limit(1, 1); }}) {
    try {
      use();
      ADD_FAILURE() << "accepted";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("after its device was destroyed"), std::string::npos) << e.what();
    }
  }
}

TEST(Stream, WatchdogNamesTheStreamAndWhatItWaitsOn) {
  Device device(two_cores());
  Stream producer(device), consumer(device);
  std::latch release(1);
  producer.launch({"stuck_kernel", KernelKind::vector, 1, 0},
                  [&](const BlockContext&) { release.wait(); });
  Event e;
  e.record(producer);
  e.wait(consumer);
  launch_busy(consumer, "after_wait", 0.1);
  const auto saved = wait_timeout();
  set_wait_timeout(std::chrono::milliseconds(200));
  try {
    consumer.synchronize();
    ADD_FAILURE() << "expected a timeout";
  } catch (const TimeoutError& err) {
    const std::string what = err.what();
    EXPECT_NE(what.find(fmt::format("stream {}", consumer.id())), std::string::npos) << what;
    EXPECT_NE(what.find(fmt::format("event {}", e.id())), std::string::npos) << what;
    EXPECT_NE(what.find(fmt::format("recorded on stream {}", producer.id())), std::string::npos)
        << what;
  }
  try {
    producer.synchronize();
    ADD_FAILURE() << "expected a timeout";
  } catch (const TimeoutError& err) {
    EXPECT_NE(std::string(err.what()).find("stuck_kernel"), std::string::npos) << err.what();
  }
  set_wait_timeout(saved);
  release.count_down();
  consumer.synchronize();
}

// The host wait hook runs while a wait sleeps; throwing from it abandons the
// wait (how Ctrl-C reaches a Python thread in synchronize()).
std::atomic<int> g_hook_calls{0};
std::atomic<bool> g_hook_throws{false};
void counting_hook() {
  ++g_hook_calls;
  if (g_hook_throws) throw std::runtime_error("interrupted by the hook");
}

TEST(Stream, HostWaitHookRunsDuringWaitsAndMayAbandonThem) {
  Device device(two_cores());
  Stream s(device);
  std::latch release(1);
  s.launch({"held", KernelKind::vector, 1, 0}, [&](const BlockContext&) { release.wait(); });
  Event e;
  e.record(s);
  set_host_wait_hook(counting_hook);
  g_hook_throws = true;
  EXPECT_THROW(s.synchronize(), std::runtime_error);
  EXPECT_THROW(e.synchronize(), std::runtime_error);
  EXPECT_THROW(device.synchronize(), std::runtime_error);
  EXPECT_EQ(g_hook_calls.load(), 3);
  g_hook_throws = false;
  std::thread opener([&] {
    std::this_thread::sleep_for(3 * kHostWaitHookPeriod);
    release.count_down();
  });
  s.synchronize();  // the hook runs (and returns) while the kernel is held
  opener.join();
  EXPECT_GE(g_hook_calls.load(), 4);
  e.synchronize();
  set_host_wait_hook(nullptr);
}

TEST(Stream, BlockDimMustFitTheLimitOfItsKind) {
  Device device(two_cores());
  Stream s(device);
  s.set_limit(2, 3);
  auto body = [](const BlockContext&) {};
  EXPECT_THROW(s.launch({"k", KernelKind::cube, 3, 0}, body), InvalidArgument);
  EXPECT_THROW(s.launch({"k", KernelKind::vector, 4, 0}, body), InvalidArgument);
  EXPECT_THROW(s.launch({"k", KernelKind::mixed, 3, 0}, body), InvalidArgument);
  EXPECT_THROW(s.launch({"k", KernelKind::comm, 0, 0}, body), InvalidArgument);
  EXPECT_NO_THROW(s.launch({"k", KernelKind::vector, 3, 0}, body));
  EXPECT_NO_THROW(s.launch({"k", KernelKind::comm, 3, 0}, body));
  EXPECT_NO_THROW(s.launch({"k", KernelKind::mixed, 2, 0}, body));
  s.synchronize();
}

TEST(Stream, CurrentStreamFollowsGuardsPerThread) {
  Device device(two_cores());
  Stream a(device), b(device);
  {
    StreamGuard ga(a);
    EXPECT_EQ(current_stream(), a);
    {
      StreamGuard gb(b);
      EXPECT_EQ(current_stream(), b);
      std::thread other([&] { EXPECT_FALSE(current_stream() == b); });
      other.join();
    }
    EXPECT_EQ(current_stream(), a);
  }
  EXPECT_EQ(current_stream(), Device::default_device().default_stream());
}

// A guard ended on another thread (a Python context collected there) leaves
// that thread's own guards alone: tokens are unique across threads.
TEST(Stream, AGuardEndedOnAnotherThreadLeavesThatThreadsGuards) {
  Device device(two_cores());
  Stream a(device), b(device);
  auto held = std::make_unique<StreamGuard>(a);  // this thread's, never ended here
  std::thread other([&] {
    StreamGuard mine(b);
    held.reset();
    EXPECT_EQ(current_stream(), b);
  });
  other.join();
  EXPECT_EQ(current_stream(), a);  // its entry stays: ended elsewhere, it restores nothing
  set_current_stream(Device::default_device().default_stream());
}

TEST(Stream, DroppedHandleStillCompletesItsWork) {
  Device device(two_cores());
  std::atomic<int> ran{0};
  {
    Stream s(device);
    for (int i = 0; i < 5; ++i)
      s.launch({"k", KernelKind::vector, 1, 0}, [&](const BlockContext&) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
        ran++;
      });
  }
  device.synchronize();
  EXPECT_EQ(ran.load(), 5);
}

TEST(Stream, ManyStreamsManyKernelsFromSeveralThreads) {
  Device device(two_cores());
  std::vector<Stream> streams;
  for (int i = 0; i < 6; ++i) streams.emplace_back(device);
  std::atomic<int64_t> sum{0};
  std::vector<std::thread> hosts;
  for (int t = 0; t < 3; ++t) {
    hosts.emplace_back([&, t] {
      for (int i = 0; i < 200; ++i) {
        Stream& s = streams[(t * 7 + i) % streams.size()];
        s.launch({"add", KernelKind::vector, 1 + i % 3, 0},
                 [&](const BlockContext& ctx) { sum += ctx.block_idx + 1; });
      }
    });
  }
  for (auto& h : hosts) h.join();
  device.synchronize();
  // sum over i of (1 + 2 + ... + block_dim) with block_dim = 1 + i % 3, per thread.
  int64_t expected = 0;
  for (int i = 0; i < 200; ++i) {
    int b = 1 + i % 3;
    expected += b * (b + 1) / 2;
  }
  EXPECT_EQ(sum.load(), 3 * expected);
}

// Under a device core limit of 1, a kernel queued behind another is
// submitted by the worker that completes the first, which runs it next:
// waking an idle worker for it would only cost a futex call and move the
// kernel away from the core whose caches hold its inputs.
// The rule follows the limit of the kernel's own stream: a device limit of 1,
// or a stream limit of 1 on an unlimited device (a trainer's stream).
TEST(Stream, ChainOfOneBlockKernelsStaysOnTheCompletingCore) {
  for (const bool device_limit : {true, false}) {
    SCOPED_TRACE(device_limit ? "device limit 1" : "stream limit 1");
    Device device(two_cores());
    if (device_limit) device.set_limit(1, 1);
    Stream s(device);
    if (!device_limit) set_stream_limit(s, 1, 1);
    for (;;) {  // both workers asleep (on a loaded machine that may take a while)
      {
        std::lock_guard lock(device.impl().ready_mutex);
        if (device.impl().sleepers == 2) break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    // The chain waits behind a gate until it is all queued: otherwise the
    // worker may drain the queue and the host submit the next link itself.
    std::atomic<bool> queued{false};
    s.launch({"gate", KernelKind::vector, 1, 0}, [&queued](const BlockContext&) {
      while (!queued.load()) std::this_thread::yield();
    });
    constexpr int kKernels = 300;
    std::vector<int> core(kKernels, -1);
    for (int i = 0; i < kKernels; ++i)
      s.launch({"link", KernelKind::vector, 1, 0}, [&core, i](const BlockContext& ctx) { core[i] = ctx.core_id; });
    queued = true;
    s.synchronize();
    for (int i = 1; i < kKernels; ++i) ASSERT_EQ(core[i], core[0]) << "kernel " << i << " moved to another core";
  }
}

// ...but the other blocks of a wider kernel still wake idle workers: both
// blocks of each 2-block kernel must run at the same time (each waits for the
// other), between 1-block kernels that leave the second worker asleep.
TEST(Stream, WiderKernelsQueuedBehindOthersWakeIdleWorkers) {
  Device device(two_cores());
  Stream s(device);
  std::atomic<int> arrived{0}, lonely{0};
  for (int i = 0; i < 10; ++i) {
    launch_busy(s, "narrow", 0.2);
    s.launch({"pair", KernelKind::vector, 2, 0}, [&, i](const BlockContext&) {
      arrived++;
      const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(1);
      while (arrived.load() < 2 * (i + 1))
        if (std::chrono::steady_clock::now() > give_up) {
          lonely++;
          return;
        }
    });
  }
  s.synchronize();
  EXPECT_EQ(lonely.load(), 0) << "a block waited alone: its kernel's second block found no awake worker";
}

// A host thread submitting to sleeping workers wakes one that is not pinned
// to its own CPU: that one would wait for the host to leave the core.
TEST(Stream, HostSubmitWakesAWorkerOffItsOwnCpu) {
  cpu_set_t saved;
  ASSERT_EQ(sched_getaffinity(0, sizeof(saved), &saved), 0);
  std::vector<int> cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &saved)) cpus.push_back(c);
  if (cpus.size() < 2) GTEST_SKIP() << "needs 2 CPUs to pin 2 workers";
  if (const char* pin = std::getenv("COREMESH_PIN"); pin && std::string(pin) == "0")
    GTEST_SKIP() << "workers are not pinned (COREMESH_PIN=0)";
  Device device({.cores = 2});
  Stream s(device);
  for (int host_cpu : {0, 1, 0, 1, 1, 0}) {
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(cpus[host_cpu], &one);
    ASSERT_EQ(sched_setaffinity(0, sizeof(one), &one), 0);
    for (;;) {  // both workers asleep (on a loaded machine that may take a while)
      {
        std::lock_guard lock(device.impl().ready_mutex);
        if (device.impl().sleepers == 2) break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    int core = -1;
    s.launch({"probe", KernelKind::vector, 1, 0}, [&core](const BlockContext& ctx) { core = ctx.core_id; });
    s.synchronize();
    EXPECT_EQ(core, 1 - host_cpu) << "the worker pinned to the host's CPU " << cpus[host_cpu] << " ran the kernel";
  }
  sched_setaffinity(0, sizeof(saved), &saved);
}

// The host allocator's soft limit holds the host back while queued kernels
// keep their tensors alive: the peak stays near the limit instead of the sum
// of everything queued.
// `gated`: the first kernel waits until the host has queued all 40 (without
// a limit the count does not then depend on how fast a loaded machine's host
// thread runs against the workers).
size_t peak_of_held_tensors(Stream& s, bool gated = false) {
  reset_host_peak();
  const size_t base = host_allocator_stats().allocated_bytes;
  auto open = std::make_shared<std::atomic<bool>>(!gated);
  for (int i = 0; i < 40; ++i) {
    Tensor t = Tensor::empty({int64_t{1} << 18});  // 1 MiB
    s.launch({"hold", KernelKind::vector, 1, 0}, [t, open](const BlockContext&) {
      while (!open->load()) std::this_thread::sleep_for(std::chrono::microseconds(100));
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    });
  }
  open->store(true);
  s.synchronize();
  return host_allocator_stats().peak_allocated_bytes - base;
}

TEST(Stream, SoftLimitHoldsTheHostBackWhileKernelsKeepTheirTensors) {
  constexpr size_t kMiB = size_t{1} << 20;
  Device device(two_cores());
  Stream s(device);
  EXPECT_GE(peak_of_held_tensors(s, /*gated=*/true), 30 * kMiB);  // unlimited: the host queues all 40 at once
  set_host_soft_limit(host_allocator_stats().allocated_bytes + 8 * kMiB);
  const size_t limited = peak_of_held_tensors(s);
  set_host_soft_limit(0);
  EXPECT_LE(limited, 9 * kMiB);
}

// A limit below what the host itself holds (tensors no kernel keeps): each
// allocation past it waits for the queued work to drain, then goes ahead, so
// the host keeps step with the workers instead of giving up and queueing
// everything at once.
TEST(Stream, SoftLimitBelowTheHostsOwnTensorsKeepsTheHostInStep) {
  constexpr size_t kMiB = size_t{1} << 20;
  Device device(two_cores());
  Stream s(device);
  const Tensor own = Tensor::empty({int64_t{2} << 20});  // 8 MiB the host holds itself
  set_host_soft_limit(host_allocator_stats().allocated_bytes - 4 * kMiB);
  const size_t limited = peak_of_held_tensors(s);
  set_host_soft_limit(0);
  EXPECT_LE(limited, 3 * kMiB);  // at most a kernel's tensor or two in flight, not all 40
}

}  // namespace
}  // namespace coremesh::runtime
