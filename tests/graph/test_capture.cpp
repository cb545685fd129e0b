// Capture and replay: nothing runs while capturing, edges come from stream
// order and event record/wait pairs, replay is bit-identical to eager
// execution, and what cannot be captured is refused with what to change.
#include <latch>
#include <thread>

#include "coremesh/graph/exec.hpp"
#include "coremesh/ops/activation.hpp"
#include "coremesh/ops/elementwise.hpp"
#include "coremesh/ops/gemm.hpp"
#include "coremesh/ops/moe_routing.hpp"
#include "coremesh/ops/norm.hpp"
#include "coremesh/runtime/capture.hpp"
#include "ops/harness.hpp"
#include "runtime/helpers.hpp"

namespace coremesh::graph {
namespace {

using namespace runtime;
using ops::testing::bitwise_equal;
using ops::testing::randn;
using namespace runtime::testing;

// A small block: rmsnorm -> matmul -> silu -> matmul, plus a residual add.
struct Block {
  Tensor w = randn({96}, 1), w1 = randn({96, 160}, 2), w2 = randn({160, 96}, 3);
  Tensor run(const Tensor& x) const {
    Tensor h = ops::matmul(ops::silu(ops::matmul(ops::rmsnorm(x, w).y, w1)), w2);
    return ops::add(x, h);
  }
};

TEST(GraphCapture, ReplayIsBitIdenticalToEagerAndSeesNewInputs) {
  Device device({.cores = 2});
  Stream s(device);
  StreamGuard guard(s);
  Block block;
  Tensor x = randn({70, 96}, 4);
  Tensor eager = block.run(x);
  s.synchronize();

  begin_capture(s);
  Tensor out = block.run(x);
  Graph g = end_capture();
  EXPECT_EQ(g.nodes().size(), 5u) << g.dump();
  for (size_t i = 1; i < g.nodes().size(); ++i)  // one stream: a chain in launch order
    EXPECT_EQ(g.nodes()[i].deps, std::vector<int>{g.nodes()[i - 1].id});
  Exec exec = instantiate(std::move(g));
  exec.replay(s);
  s.synchronize();
  EXPECT_TRUE(bitwise_equal(out, eager));

  x.copy_from(randn({70, 96}, 5));  // new data in the captured input
  Tensor eager2 = block.run(x);
  exec.replay(s);
  exec.replay(s);  // replays serialize on their stream
  s.synchronize();
  EXPECT_TRUE(bitwise_equal(out, eager2));
}

// Ops whose kernels accumulate into buffers (per-block partial sums, rows
// left over by a routing, batch sums) set them up inside the kernels, so a
// second replay computes what the first did.
TEST(GraphCapture, OpsKeepNoStateFromOneReplayToTheNext) {
  Device device({.cores = 2});
  Stream s(device);
  StreamGuard guard(s);
  Tensor x = randn({33, 40}, 9), w = randn({40}, 10), dy = randn({33, 40}, 11);
  Tensor rstd = ops::rmsnorm(x, w).rstd;
  Tensor a = randn({24, 16}, 12), b = randn({3, 16, 8}, 13), dc = randn({3, 24, 8}, 14);
  Tensor idx = Tensor::from_vector<int32_t>({0, 2, 2, -1, 1, 0}, {3, 2});
  Tensor rw = randn({3, 2}, 15), yp = randn({6, 40}, 16), dyr = randn({3, 40}, 17);
  Tensor row_of = ops::permute(randn({3, 40}, 18), idx, 3).row_of;
  auto run = [&] {
    auto n = ops::rmsnorm_backward(dy, x, w, rstd);
    auto m = ops::matmul_backward(dc, a, b);
    auto u = ops::unpermute_backward(dyr, yp, row_of, rw);
    return std::vector<Tensor>{n.dx, n.dw, m.da, m.db, u.dyp, u.dweights};
  };
  std::vector<Tensor> eager = run();
  s.synchronize();
  begin_capture(s);
  std::vector<Tensor> captured = run();
  Exec exec = instantiate(end_capture());
  for (int replay = 0; replay < 2; ++replay) {
    exec.replay(s);
    s.synchronize();
    for (size_t i = 0; i < eager.size(); ++i) EXPECT_TRUE(bitwise_equal(captured[i], eager[i])) << "output " << i;
  }
  // Another routing: rows the first one used are unused now.
  Tensor idx2 = Tensor::from_vector<int32_t>({1, -1, -1, 2, -1, 1}, {3, 2});
  Tensor row_of2 = ops::permute(randn({3, 40}, 18), idx2, 3).row_of;
  s.synchronize();
  row_of.copy_from(row_of2);
  eager = run();
  exec.replay(s);
  s.synchronize();
  for (size_t i = 0; i < eager.size(); ++i) EXPECT_TRUE(bitwise_equal(captured[i], eager[i])) << "new routing, output " << i;
}

TEST(GraphCapture, NothingRunsWhileCapturingAndStreamsRunAgainAfter) {
  Device device({.cores = 2});
  Stream s(device);
  StreamGuard guard(s);
  Tensor a = Tensor::full({64}, 1.0f), b = Tensor::full({64}, 2.0f), c = Tensor::zeros({64});
  begin_capture(s);
  EXPECT_TRUE(is_capturing(s));
  ops::add_out(a, b, c);
  Graph g = end_capture();
  EXPECT_FALSE(is_capturing(s));
  device.synchronize();
  EXPECT_EQ(c.item({0}), 0.0f) << "the captured add ran";
  ops::add_out(a, a, c);  // eager again
  s.synchronize();
  EXPECT_EQ(c.item({0}), 2.0f);
  Exec exec = instantiate(std::move(g));
  exec.replay(s);
  s.synchronize();
  EXPECT_EQ(c.item({0}), 3.0f);
}

// A thread that ends while capturing (it raised before end_capture) drops its
// capture: the stream runs its launches again (it stayed capturing forever,
// and every synchronize refused).
TEST(GraphCapture, AThreadEndingWhileCapturingDropsItsCapture) {
  Device device({.cores = 2});
  Stream s(device);
  std::thread([&] { begin_capture(s); }).join();
  EXPECT_FALSE(is_capturing(s));
  StreamGuard guard(s);
  Tensor a = Tensor::full({8}, 1.0f), c = Tensor::zeros({8});
  ops::add_out(a, a, c);
  s.synchronize();
  EXPECT_EQ(c.item({0}), 2.0f);
  begin_capture(s);  // and it captures again
  ops::add_out(a, c, c);
  Graph g = end_capture();
  EXPECT_EQ(g.nodes().size(), 1u);
}

// ... also when its Device went first: the capture is dropped without
// touching the Device (it wrote into the freed device: ASan's use after free).
TEST(GraphCapture, AThreadEndingAfterItsDeviceWentTouchesNothingOfIt) {
  std::latch captured(1), device_gone(1);
  std::thread t;
  {
    Device device({.cores = 1});
    Stream s(device);
    t = std::thread([&, stream = s]() mutable {
      begin_capture(stream);
      captured.count_down();
      device_gone.wait();
    });
    captured.wait();
  }
  device_gone.count_down();
  t.join();
}

// A stream forks off the capture by waiting on an event recorded on it and
// joins back the same way; the graph's edges are those record/wait pairs.
TEST(GraphCapture, ForkAndJoinThroughEvents) {
  Device device({.cores = 2});
  Stream s0(device), s1(device);
  Tensor x = randn({64, 64}, 6), y = randn({64, 64}, 7);
  Tensor p, q, r;
  Event fork, join;
  begin_capture(s0);
  {
    StreamGuard g(s0);
    p = ops::matmul(x, y);  // n0 on s0
    fork.record();
    q = ops::silu(x);       // n1 on s0
  }
  {
    StreamGuard g(s1);
    fork.wait();            // s1 joins: its work depends on n0
    r = ops::mul(p, y);     // n2 on s1
    join.record();
  }
  {
    StreamGuard g(s0);
    join.wait();
    ops::add_out(q, r, q);  // n3 on s0 after n1 and n2
  }
  Graph g = end_capture();
  ASSERT_EQ(g.nodes().size(), 4u);
  EXPECT_EQ(g.nodes()[1].deps, std::vector<int>{0});
  EXPECT_EQ(g.nodes()[2].deps, std::vector<int>{0});
  EXPECT_EQ(g.nodes()[2].stream_id, s1.id());
  EXPECT_EQ(g.nodes()[3].deps, (std::vector<int>{1, 2}));
  Exec exec = instantiate(std::move(g));
  exec.replay(s0);
  s0.synchronize();
  StreamGuard on_s0(s0);
  Tensor want = ops::add(ops::silu(x), ops::mul(ops::matmul(x, y), y));
  s0.synchronize();
  EXPECT_TRUE(bitwise_equal(q, want));
}

TEST(GraphCapture, RefusesAnEventRecordedOutsideTheCapture) {
  Device device({.cores = 2});
  Stream s(device), other(device);
  Event outside;
  outside.record(other);
  begin_capture(s);
  try {
    outside.wait(s);
    FAIL() << "expected a CaptureError";
  } catch (const CaptureError& e) {
    EXPECT_NE(std::string(e.what()).find("recorded outside the capture"), std::string::npos) << e.what();
    EXPECT_NE(e.hint().find("before begin_capture"), std::string::npos);
  }
  EXPECT_THROW(end_capture(), CaptureError) << "a refused call invalidates the capture";
  EXPECT_FALSE(is_capturing(s));
}

TEST(GraphCapture, RefusesHostSynchronization) {
  Device device({.cores = 2});
  Stream s(device);
  Event e;
  begin_capture(s);
  EXPECT_THROW(s.synchronize(), CaptureError);
  EXPECT_THROW(s.query(), CaptureError);
  EXPECT_THROW(device.synchronize(), CaptureError);
  e.record(s);
  EXPECT_THROW(e.synchronize(), CaptureError);
  try {
    end_capture();
    FAIL() << "expected a CaptureError";
  } catch (const CaptureError& err) {
    EXPECT_NE(std::string(err.what()).find("Stream::synchronize() on stream"), std::string::npos) << err.what();
  }
  s.synchronize();  // allowed again
}

TEST(GraphCapture, RefusesAnUnjoinedForkedStream) {
  Device device({.cores = 2});
  Stream s0(device), s1(device);
  Tensor x = randn({32}, 8);
  Tensor kept;
  Event fork;
  begin_capture(s0);
  fork.record(s0);
  fork.wait(s1);
  {
    StreamGuard g(s1);
    kept = ops::silu(x);
  }
  try {
    end_capture();
    FAIL() << "expected a CaptureError";
  } catch (const CaptureError& e) {
    EXPECT_NE(std::string(e.what()).find(fmt::format("stream {} (its last kernel 'silu')", s1.id())), std::string::npos)
        << e.what();
    EXPECT_NE(e.hint().find("origin stream wait"), std::string::npos);
  }
  EXPECT_FALSE(is_capturing(s1));
}

TEST(GraphCapture, RefusesAKernelWithoutAnOpDescriptor) {
  Device device({.cores = 2});
  Stream s(device);
  begin_capture(s);
  try {
    s.launch({"opaque", KernelKind::vector, 1, 0}, [](const BlockContext&) {});
    FAIL() << "expected a CaptureError";
  } catch (const CaptureError& e) {
    EXPECT_NE(std::string(e.what()).find("kernel 'opaque'"), std::string::npos) << e.what();
    EXPECT_NE(e.hint().find("OpDesc"), std::string::npos);
  }
  EXPECT_THROW(end_capture(), CaptureError);
}

TEST(GraphCapture, AKernelErrorInReplayReachesTheStream) {
  Device device({.cores = 2});
  Stream s(device);
  StreamGuard guard(s);
  Tensor ids = Tensor::from_vector<int32_t>({0, 1, 2, 3}, {2, 2});
  begin_capture(s);
  Tensor counts = ops::expert_counts(ids, 4);
  Exec exec = instantiate(end_capture());
  exec.replay(s);
  s.synchronize();
  EXPECT_EQ(counts.data<int64_t>()[3], 1);
  ids.data<int32_t>()[1] = 9;  // not an expert: the kernel throws
  exec.replay(s);
  try {
    s.synchronize();
    FAIL() << "expected a KernelError";
  } catch (const KernelError& e) {
    EXPECT_NE(std::string(e.what()).find("expert_counts"), std::string::npos) << e.what();
  }
  ids.data<int32_t>()[1] = 1;
  exec.replay(s);  // the stream works again after the error was reported
  s.synchronize();
  EXPECT_EQ(counts.data<int64_t>()[1], 1);
}

}  // namespace
}  // namespace coremesh::graph
