// The runtime side of graph mode: stream capture records kernels with their
// dependencies (stream order, event record/wait) instead of running them,
// and a KernelDag runs such kernels as one stream item, in dependency order,
// independent ones concurrently.
#include <mutex>
#include <thread>

#include "coremesh/runtime/capture.hpp"
#include "coremesh/runtime/dag.hpp"
#include "helpers.hpp"

namespace coremesh::runtime {
namespace {

using namespace testing;

// A kernel with a minimal descriptor (capture refuses kernels without one).
LaunchInfo described(const std::string& name, int block_dim = 1) {
  LaunchInfo info{name, KernelKind::vector, block_dim, 0};
  info.op = std::make_shared<const OpDesc>(OpDesc{{name, {}, {}, {1, 1}, ""}, {}, {}});
  return info;
}

TEST(StreamCapture, RecordsStreamOrderAndEventEdgesWithoutRunning) {
  Device device({.cores = 2});
  Stream s0(device), s1(device);
  std::atomic<int> ran{0};
  auto body = [&ran](const BlockContext&) { ++ran; };
  Event fork, join;
  auto session = begin_stream_capture(s0);
  s0.launch(described("a"), body);  // 0
  fork.record(s0);
  s0.launch(described("b"), body);  // 1 after 0
  fork.wait(s1);
  s1.launch(described("c"), body);  // 2 after 0 (forked)
  join.record(s1);
  join.wait(s0);
  s0.launch(described("d"), body);  // 3 after 1 and 2
  Captured c = end_stream_capture(session);
  device.synchronize();
  EXPECT_EQ(ran.load(), 0);
  ASSERT_EQ(c.kernels.size(), 4u);
  EXPECT_EQ(c.origin_stream, s0.id());
  EXPECT_TRUE(c.kernels[0].deps.empty());
  EXPECT_EQ(c.kernels[1].deps, std::vector<int>{0});
  EXPECT_EQ(c.kernels[2].deps, std::vector<int>{0});
  EXPECT_EQ(c.kernels[2].stream_id, s1.id());
  EXPECT_EQ(c.kernels[3].deps, (std::vector<int>{1, 2}));
  EXPECT_FALSE(is_capturing(s1));
}

TEST(StreamCapture, KeepsTheLimitsInForceAndTheStreamLimitAttribute) {
  Device device({.cores = 2, .cube_cores = 4, .vector_cores = 4});
  Stream s(device);
  auto session = begin_stream_capture(s);
  s.launch(described("free"), [](const BlockContext&) {});
  {
    StreamLimitGuard g(s, -1, 3);
    s.launch(described("limited", 3), [](const BlockContext&) {});
  }
  Captured c = end_stream_capture(session);
  EXPECT_EQ(c.kernels[0].limits, (CoreLimits{4, 4}));
  EXPECT_EQ(c.kernels[0].stream_limit, (CoreLimits{0, 0}));
  EXPECT_EQ(c.kernels[1].limits, (CoreLimits{4, 3}));
  EXPECT_EQ(c.kernels[1].stream_limit, (CoreLimits{0, 3}));
}

// Node 0 fans out to 1 and 2, which meet (each waits for the other to have
// started: only possible if they run concurrently), and both join into 3.
TEST(KernelDag, RunsInDependencyOrderAndIndependentNodesConcurrently) {
  Device device({.cores = 2});
  Stream s(device);
  std::mutex mutex;
  std::vector<int> order;
  std::atomic<int> arrived{0};
  std::atomic<bool> met{true};
  auto body = [&](int i) {
    return [&, i](const BlockContext&) {
      if (i == 1 || i == 2) {
        ++arrived;
        const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
        while (arrived.load() % 2 != 0 && std::chrono::steady_clock::now() < until) std::this_thread::yield();
        if (arrived.load() % 2 != 0) met = false;
      }
      std::lock_guard lock(mutex);
      order.push_back(i);
    };
  };
  std::vector<DagNode> nodes(4);
  for (int i = 0; i < 4; ++i) nodes[size_t(i)] = {{described("n" + std::to_string(i)), body(i)}, {2, 2}, -1, 0, {}};
  nodes[1].deps = {0};
  nodes[2].deps = {0};
  nodes[2].stream_id = 77;  // shown by the profiler as captured
  nodes[3].deps = {1, 2};
  KernelDag dag(device, std::move(nodes));
  ProfilerScope profile;
  dag.launch(s);
  dag.launch(s);  // runs of one graph are serialized
  s.synchronize();
  EXPECT_TRUE(met.load()) << "nodes 1 and 2 did not run concurrently";
  ASSERT_EQ(order.size(), 8u);
  for (int run = 0; run < 2; ++run) {
    EXPECT_EQ(order[size_t(4 * run)], 0);
    EXPECT_EQ(order[size_t(4 * run + 3)], 3);
  }
  int on_replay_stream = 0, on_captured = 0;
  for (auto& r : profiler_records()) {
    on_replay_stream += r.stream == s.id();
    on_captured += r.stream == 77 && r.name == "n2";
  }
  EXPECT_EQ(on_replay_stream, 6);
  EXPECT_EQ(on_captured, 2);
}

TEST(KernelDag, ANodeErrorSkipsTheRestAndReachesTheStream) {
  Device device({.cores = 2});
  Stream s(device);
  std::atomic<int> after{0};
  std::vector<DagNode> nodes(2);
  nodes[0] = {{described("fails"), [](const BlockContext&) { throw std::runtime_error("boom"); }}, {2, 2}, -1, 0, {}};
  nodes[1] = {{described("after"), [&after](const BlockContext&) { ++after; }}, {2, 2}, -1, 0, {0}};
  KernelDag dag(device, std::move(nodes));
  dag.launch(s);
  try {
    s.synchronize();
    FAIL() << "expected a KernelError";
  } catch (const KernelError& e) {
    EXPECT_NE(std::string(e.what()).find("kernel 'fails'"), std::string::npos) << e.what();
  }
  EXPECT_EQ(after.load(), 0);
}

TEST(KernelDag, RefusesNodesThatDoNotFitTheirLimits) {
  Device device({.cores = 2});
  std::vector<DagNode> nodes(1);
  nodes[0] = {{described("wide", 3), [](const BlockContext&) {}}, {2, 2}, -1, 0, {}};
  EXPECT_THROW(KernelDag(device, std::move(nodes)), InvalidArgument);
}

}  // namespace
}  // namespace coremesh::runtime
