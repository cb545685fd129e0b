// Events: record/wait semantics, timing, error propagation.
#include <atomic>
#include <latch>
#include <vector>

#include "coremesh/core/error.hpp"
#include "helpers.hpp"

namespace coremesh::runtime {
namespace {

using namespace testing;

DeviceOptions four_cores() { return {.cores = 4}; }

TEST(Event, NeverRecordedEventDoesNotBlock) {
  Device device(four_cores());
  Stream s(device);
  Event e;
  EXPECT_TRUE(e.query());
  e.synchronize();
  e.wait(s);
  std::atomic<bool> ran{false};
  s.launch({"k", KernelKind::vector, 1, 0}, [&](const BlockContext&) { ran = true; });
  s.synchronize();
  EXPECT_TRUE(ran);
}

TEST(Event, WaitGatesLaterWorkOnly) {
  Device device(four_cores());
  Stream producer(device), consumer(device);
  std::latch release(1);
  std::atomic<int> step{0};
  producer.launch({"slow", KernelKind::vector, 1, 0}, [&](const BlockContext&) {
    release.wait();
    step = 1;
  });
  Event e;
  e.record(producer);
  std::atomic<int> before_wait{-1}, after_wait{-1};
  consumer.launch({"before", KernelKind::vector, 1, 0},
                  [&](const BlockContext&) { before_wait = step.load(); });
  consumer.synchronize();  // work enqueued before wait() is not gated
  EXPECT_EQ(before_wait.load(), 0);
  e.wait(consumer);
  consumer.launch({"after", KernelKind::vector, 1, 0},
                  [&](const BlockContext&) { after_wait = step.load(); });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_FALSE(consumer.query());
  EXPECT_FALSE(e.query());
  release.count_down();
  consumer.synchronize();
  EXPECT_EQ(after_wait.load(), 1);
  EXPECT_TRUE(e.query());
}

// A stream whose last handle goes while it waits for an event still runs
// what was queued behind the wait, and records what it was asked to (its
// queue was dropped: the work lost, and a wait on its event hung).
TEST(Event, ADroppedStreamRunsWhatItQueued) {
  Device device(four_cores());
  Stream producer(device), after(device);
  std::latch release(1);
  producer.launch({"slow", KernelKind::vector, 1, 0}, [&](const BlockContext&) { release.wait(); });
  Event produced, consumed;
  produced.record(producer);
  std::atomic<int> ran{0};
  {
    Stream dropped(device);
    produced.wait(dropped);
    dropped.launch({"queued", KernelKind::vector, 1, 0}, [&](const BlockContext&) { ran = 1; });
    consumed.record(dropped);
  }
  consumed.wait(after);
  std::atomic<int> seen{-1};
  after.launch({"after", KernelKind::vector, 1, 0}, [&](const BlockContext&) { seen = ran.load(); });
  release.count_down();
  after.synchronize();
  EXPECT_EQ(ran.load(), 1);
  EXPECT_EQ(seen.load(), 1);
  EXPECT_TRUE(consumed.query());
}

TEST(Event, WaitUsesTheRecordMadeBeforeTheCall) {
  Device device(four_cores());
  Stream a(device), b(device);
  Event e;
  e.record(a);  // completes at once: a is idle
  a.synchronize();
  e.wait(b);    // captured: the completed record
  std::latch release(1);
  launch_busy(a, "noop", 0.0);
  a.launch({"held", KernelKind::vector, 1, 0}, [&](const BlockContext&) { release.wait(); });
  e.record(a);  // a later record must not affect the earlier wait
  std::atomic<bool> ran{false};
  b.launch({"k", KernelKind::vector, 1, 0}, [&](const BlockContext&) { ran = true; });
  b.synchronize();
  EXPECT_TRUE(ran);
  EXPECT_FALSE(e.query());
  release.count_down();
  e.synchronize();
  EXPECT_TRUE(e.query());
}

TEST(Event, StreamHelpersRecordAndWait) {
  Device device(four_cores());
  Stream a(device), b(device);
  std::atomic<int> value{0};
  a.launch({"set", KernelKind::vector, 1, 0}, [&](const BlockContext&) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    value = 7;
  });
  Event recorded = a.record_event();
  b.wait_event(recorded);
  std::atomic<int> seen{0};
  b.launch({"get", KernelKind::vector, 1, 0}, [&](const BlockContext&) { seen = value.load(); });
  b.synchronize();
  EXPECT_EQ(seen.load(), 7);

  a.launch({"set2", KernelKind::vector, 1, 0}, [&](const BlockContext&) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    value = 9;
  });
  b.wait_stream(a);
  b.launch({"get2", KernelKind::vector, 1, 0}, [&](const BlockContext&) { seen = value.load(); });
  b.synchronize();
  EXPECT_EQ(seen.load(), 9);
}

TEST(Event, ElapsedTimeMeasuresTheWorkBetween) {
  Device device(four_cores());
  Stream s(device);
  Event start(true), end(true);
  start.record(s);
  launch_busy(s, "work", 20.0);
  end.record(s);
  end.synchronize();
  const float ms = start.elapsed_time(end);
  EXPECT_GE(ms, 19.0f);
  EXPECT_LT(ms, 2000.0f);
}

TEST(Event, ElapsedTimeRejectsMisuse) {
  Device device(four_cores());
  Stream s(device);
  Event timed(true), untimed(false), never(true);
  timed.record(s);
  untimed.record(s);
  s.synchronize();
  EXPECT_THROW(timed.elapsed_time(untimed), InvalidArgument);
  EXPECT_THROW(timed.elapsed_time(never), InvalidArgument);
  EXPECT_EQ(timed.elapsed_time(timed), 0.0f);  // one event, one lock (this used to deadlock)
}

TEST(Event, ErrorTravelsToWaitingStreams) {
  Device device(four_cores());
  Stream a(device), b(device);
  a.launch({"fails", KernelKind::vector, 1, 0},
           [](const BlockContext&) { throw std::runtime_error("disk on fire"); });
  Event e = a.record_event();
  b.wait_event(e);
  std::atomic<bool> ran{false};
  b.launch({"dependent", KernelKind::vector, 1, 0}, [&](const BlockContext&) { ran = true; });
  EXPECT_THROW(b.synchronize(), KernelError);
  EXPECT_FALSE(ran) << "work depending on a failed kernel must not run";
  EXPECT_THROW(e.synchronize(), KernelError);
  EXPECT_THROW(a.synchronize(), KernelError);
}

// 20,000 streams, each waiting for an event of the one before, all parked
// behind one gate: opening it completes the whole chain on one thread. Each
// completion releases the next stream; they run one after another, not nested
// (nested, the chain overflowed the stack).
TEST(Event, ALongChainAcrossStreamsCompletesWithoutNesting) {
  Device device(four_cores());
  constexpr int kStreams = 20000;
  std::vector<Stream> streams;
  streams.reserve(kStreams);
  for (int i = 0; i < kStreams; ++i) streams.emplace_back(device);
  std::latch open(1);
  streams[0].launch({"gate", KernelKind::vector, 1, 0}, [&](const BlockContext&) { open.wait(); });
  for (int i = 1; i < kStreams; ++i) streams[i].wait_event(streams[i - 1].record_event());
  std::atomic<bool> ran{false};
  streams.back().launch({"last", KernelKind::vector, 1, 0}, [&](const BlockContext&) { ran = true; });
  open.count_down();
  streams.back().synchronize();
  EXPECT_TRUE(ran);
}

}  // namespace
}  // namespace coremesh::runtime
