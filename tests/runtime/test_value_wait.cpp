// Value waits (Stream::wait_value): a stream parks until a word written by
// someone else (here: a host thread, standing in for a peer process)
// satisfies a comparison, without holding a worker.
#include <atomic>
#include <fstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "coremesh/core/error.hpp"
#include "coremesh/runtime/capture.hpp"
#include "coremesh/runtime/dag.hpp"
#include "helpers.hpp"

namespace coremesh::runtime {
namespace {

using namespace testing;
using namespace std::chrono_literals;

void store(uint64_t& word, uint64_t value) {
  std::atomic_ref<uint64_t>(word).store(value, std::memory_order_release);
}

ValueWait wait_for(const uint64_t& word, WaitCmp cmp, uint64_t value) {
  ValueWait w;
  w.word = &word;
  w.cmp = cmp;
  w.value = value;
  return w;
}

// Sets `flag` when the stream reaches this point.
void launch_mark(Stream& s, std::atomic<bool>& flag, const char* name = "mark") {
  s.launch({name, KernelKind::vector, 1, 0}, [&flag](const BlockContext&) { flag = true; });
}

TEST(ValueWait, ComparisonsMatchTheirDefinition) {
  const uint64_t values[] = {0, 1, 2, UINT64_MAX};
  for (uint64_t a : values)
    for (uint64_t b : values) {
      EXPECT_EQ(wait_cmp_holds(a, WaitCmp::eq, b), a == b);
      EXPECT_EQ(wait_cmp_holds(a, WaitCmp::ne, b), a != b);
      EXPECT_EQ(wait_cmp_holds(a, WaitCmp::gt, b), a > b);
      EXPECT_EQ(wait_cmp_holds(a, WaitCmp::ge, b), a >= b);
      EXPECT_EQ(wait_cmp_holds(a, WaitCmp::lt, b), a < b);
      EXPECT_EQ(wait_cmp_holds(a, WaitCmp::le, b), a <= b);
    }
}

// The point of the feature: with one worker, a kernel that waited inside
// would keep the compute stream from running until the word is written.
TEST(ValueWait, AParkedStreamDoesNotHoldTheOnlyWorker) {
  Device device({.cores = 1});
  Stream comm(device), compute(device);
  alignas(8) uint64_t word = 0;
  std::atomic<bool> after_wait{false};
  const auto saved = wait_timeout();
  set_wait_timeout(5s);  // a wait holding the worker fails the test in seconds, not minutes
  comm.wait_value(wait_for(word, WaitCmp::ge, 2));
  launch_mark(comm, after_wait);
  std::atomic<int> computed{0};
  for (int i = 0; i < 20; ++i)
    compute.launch({"compute", KernelKind::vector, 1, 0}, [&](const BlockContext&) { ++computed; });
  compute.synchronize();  // would hang (until the watchdog) if the wait held the worker
  EXPECT_EQ(computed.load(), 20);
  EXPECT_FALSE(comm.query());
  store(word, 1);  // not enough
  std::this_thread::sleep_for(20ms);
  EXPECT_FALSE(after_wait.load());
  store(word, 2);
  comm.synchronize();
  EXPECT_TRUE(after_wait.load());
  set_wait_timeout(saved);
}

// The work after the wait sees what the writer wrote before the word
// (release/acquire through the wait).
TEST(ValueWait, LaterWorkSeesWhatWasWrittenBeforeTheWord) {
  Device device({.cores = 2});
  Stream s(device);
  constexpr int kRounds = 200;
  std::vector<int> data(kRounds, 0);
  std::vector<int> seen(kRounds, -1);
  alignas(8) uint64_t word = 0;
  for (int r = 0; r < kRounds; ++r) {
    s.wait_value(wait_for(word, WaitCmp::ge, uint64_t(r + 1)));
    s.launch({"read", KernelKind::vector, 1, 0}, [&, r](const BlockContext&) { seen[size_t(r)] = data[size_t(r)]; });
  }
  std::thread writer([&] {
    for (int r = 0; r < kRounds; ++r) {
      data[size_t(r)] = r * 3 + 1;
      store(word, uint64_t(r + 1));
      if (r % 16 == 0) std::this_thread::sleep_for(100us);
    }
  });
  s.synchronize();
  writer.join();
  for (int r = 0; r < kRounds; ++r) EXPECT_EQ(seen[size_t(r)], r * 3 + 1) << r;
}

TEST(ValueWait, EventsOrderOtherStreamsAfterTheWaitOnly) {
  Device device({.cores = 1});
  Stream comm(device), compute(device);
  alignas(8) uint64_t word = 0;
  Event before, after;
  before.record(comm);
  comm.wait_value(wait_for(word, WaitCmp::eq, 7));
  after.record(comm);
  std::atomic<bool> gated{false}, free{false};
  before.wait(compute);
  launch_mark(compute, free, "free");
  after.wait(compute);
  launch_mark(compute, gated, "gated");
  before.synchronize();
  for (int i = 0; i < 200 && !free.load(); ++i) std::this_thread::sleep_for(1ms);
  EXPECT_TRUE(free.load()) << "an event recorded before the wait does not wait for it";
  EXPECT_FALSE(after.query());
  EXPECT_FALSE(gated.load());
  store(word, 7);
  compute.synchronize();
  EXPECT_TRUE(gated.load());
  EXPECT_TRUE(after.query());
}

TEST(ValueWait, AReadyWordDoesNotPark) {
  Device device({.cores = 1});
  Stream s(device);
  alignas(8) uint64_t word = 5;
  std::atomic<bool> done{false};
  s.wait_value(wait_for(word, WaitCmp::le, 5));
  launch_mark(s, done);
  s.synchronize();
  EXPECT_TRUE(done.load());
}

TEST(ValueWait, TimeoutNamesWhatItWaitsForAndSkipsLaterWork) {
  Device device({.cores = 1});
  Stream s(device);
  alignas(8) uint64_t word = 3;
  ValueWait w = wait_for(word, WaitCmp::ge, 4);
  w.name = "bucket_wait";
  w.describe = [] { return std::string("PE 1 waits for PE 0's half of bucket 2"); };
  w.timeout = 200ms;
  s.wait_value(std::move(w));
  std::atomic<bool> skipped{true};
  s.launch({"after", KernelKind::vector, 1, 0}, [&](const BlockContext&) { skipped = false; });
  try {
    s.synchronize();
    ADD_FAILURE() << "expected the watchdog";
  } catch (const KernelError& e) {
    const std::string what = e.what();
    for (const std::string& part :
         {fmt::format("wait 'bucket_wait' on stream {}", s.id()), std::string("watchdog"),
          std::string("PE 1 waits for PE 0's half of bucket 2"), std::string("the word is 3, waiting for >= 4")})
      EXPECT_NE(what.find(part), std::string::npos) << part << " in: " << what;
  }
  EXPECT_TRUE(skipped.load());
  std::atomic<bool> done{false};  // the error was reported: the stream runs again
  launch_mark(s, done);
  s.synchronize();
  EXPECT_TRUE(done.load());
}

TEST(ValueWait, AnErrorFromThePollEndsTheWait) {
  Device device({.cores = 1});
  Stream s(device);
  alignas(8) uint64_t word = 0;
  std::atomic<int> polls{0};
  ValueWait w = wait_for(word, WaitCmp::ne, 0);
  w.poll = [&polls] {
    if (++polls == 3) throw Error("PE 2 exited with status 1", "", __FILE__, __LINE__);
  };
  s.wait_value(std::move(w));
  try {
    s.synchronize();
    ADD_FAILURE() << "expected the poll's error";
  } catch (const KernelError& e) {
    EXPECT_NE(std::string(e.what()).find("PE 2 exited with status 1"), std::string::npos) << e.what();
  }
  EXPECT_EQ(polls.load(), 3);
}

TEST(ValueWait, RefusesAMisalignedWord) {
  Device device({.cores = 1});
  Stream s(device);
  alignas(8) uint64_t words[2] = {0, 0};
  ValueWait w;
  w.word = reinterpret_cast<const uint64_t*>(reinterpret_cast<const char*>(words) + 4);
  EXPECT_THROW(s.wait_value(w), InvalidArgument);
  w.word = nullptr;
  EXPECT_THROW(s.wait_value(w), InvalidArgument);
}

// Many streams parked at once, released in an order unrelated to the
// order they parked in (the poller checks all of them each round).
TEST(ValueWait, ManyStreamsParkAndWakeIndependently) {
  Device device({.cores = 2});
  constexpr int kStreams = 6, kRounds = 30;
  std::vector<Stream> streams;
  for (int i = 0; i < kStreams; ++i) streams.emplace_back(device);
  alignas(8) uint64_t words[kStreams] = {};
  std::atomic<int> ran[kStreams] = {};
  for (int r = 0; r < kRounds; ++r)
    for (int i = 0; i < kStreams; ++i) {
      streams[size_t(i)].wait_value(wait_for(words[i], WaitCmp::ge, uint64_t(r + 1)));
      streams[size_t(i)].launch({"step", KernelKind::vector, 1, 0}, [&ran, i, r](const BlockContext&) {
        EXPECT_EQ(ran[i].load(), r);
        ++ran[i];
      });
    }
  std::thread writer([&] {
    for (int r = 0; r < kRounds; ++r)
      for (int i = kStreams - 1; i >= 0; --i) {
        store(words[i], uint64_t(r + 1));
        if ((r + i) % 7 == 0) std::this_thread::sleep_for(50us);
      }
  });
  for (auto& s : streams) s.synchronize();
  writer.join();
  for (int i = 0; i < kStreams; ++i) EXPECT_EQ(ran[i].load(), kRounds);
}

TEST(ValueWait, TheProfilerShowsTheParkedIntervalOnTheStreamsTrack) {
  Device device({.cores = 1});
  Stream s(device);
  alignas(8) uint64_t word = 0;
  profiler_clear();
  profiler_start();
  ValueWait w = wait_for(word, WaitCmp::ge, 1);
  w.name = "grad_wait";
  s.wait_value(std::move(w));
  std::this_thread::sleep_for(30ms);
  store(word, 1);
  s.synchronize();
  profiler_stop();
  const auto records = records_of(s);
  ASSERT_EQ(records.size(), 1u);
  EXPECT_EQ(records[0].name, "grad_wait");
  EXPECT_EQ(records[0].block_dim, 0);
  EXPECT_GE(records[0].end_ns - records[0].start_ns, 20'000'000);
  const std::string path = ::testing::TempDir() + "/value_wait_trace.json";
  write_chrome_trace(path);
  const auto trace = nlohmann::json::parse(std::ifstream(path));
  int waits = 0;
  for (const auto& e : trace["traceEvents"])
    if (e.value("cat", "") == "wait" && e["name"] == "grad_wait") {
      ++waits;
      EXPECT_EQ(e["tid"], device.id() * 10000 + s.id());
    }
  EXPECT_EQ(waits, 1);
  profiler_clear();
}

TEST(ValueWait, IsCapturedAsANodeThatWaitsWhenReplayed) {
  Device device({.cores = 2});
  Stream s(device);
  alignas(8) uint64_t word = 0;
  std::atomic<int> after{0};
  auto session = begin_stream_capture(s);
  s.wait_value(wait_for(word, WaitCmp::ge, 1));
  LaunchInfo info{"after", KernelKind::vector, 1, 0};
  info.op = std::make_shared<const OpDesc>(OpDesc{{"after", {}, {}, {1, 1}, ""}, {}, {}});
  s.launch(info, [&after](const BlockContext&) { ++after; });
  Captured c = end_stream_capture(session);
  ASSERT_EQ(c.kernels.size(), 2u);
  ASSERT_NE(c.kernels[0].kernel.info.op, nullptr);
  EXPECT_EQ(c.kernels[0].kernel.info.op->key.op, "wait_value");
  EXPECT_EQ(c.kernels[0].kernel.info.op->key.attr("cmp"), ">=");
  EXPECT_EQ(c.kernels[1].deps, std::vector<int>{0});
  std::vector<DagNode> nodes;
  for (auto& k : c.kernels) nodes.push_back({k.kernel, k.limits, -1, 0, k.deps});
  KernelDag dag(device, std::move(nodes));
  dag.launch(s);
  std::this_thread::sleep_for(20ms);
  EXPECT_EQ(after.load(), 0);
  store(word, 1);
  s.synchronize();
  EXPECT_EQ(after.load(), 1);
}

}  // namespace
}  // namespace coremesh::runtime
