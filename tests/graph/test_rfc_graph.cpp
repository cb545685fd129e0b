// The RFC's static-graph cases (测试设计 分核4, 分核5, 交叉2, 交叉3) in graph
// mode: captured, instantiated, replayed; block_dim read back from
// kernel_details.csv as tests/runtime/test_rfc_plan.cpp does for the eager
// cases.
#include "coremesh/graph/exec.hpp"
#include "coremesh/ops/elementwise.hpp"
#include "coremesh/ops/gemm.hpp"
#include "ops/harness.hpp"
#include "runtime/helpers.hpp"

namespace coremesh::graph {
namespace {

using namespace runtime;
using namespace runtime::testing;
using ops::testing::bitwise_equal;

using Operands = RfcOperands;

std::vector<std::map<std::string, std::string>> rows_named(const std::string& dir_name, const std::string& name) {
  const auto files = profiler_export(temp_dir(dir_name));
  std::vector<std::map<std::string, std::string>> out;
  for (auto& r : read_csv(files[0]))
    if (r.at("name") == name) out.push_back(r);
  return out;
}

// 分核4: one stream in graph mode; StreamLimitGuard sets the core counts:
// inside its scope get_stream_limit agrees and the replayed kernels run with
// that block_dim.
TEST(RfcGraph, LimitGuardSetsBlockDimInGraphMode) {
  Device device(rfc_device());
  Stream s(device);
  Operands t;
  ProfilerScope profile;
  Tensor c, z;
  begin_capture(s);
  {
    StreamLimitGuard g(s, 3, 6);
    EXPECT_EQ(get_stream_limit(s), (CoreLimits{3, 6}));
    c = ops::matmul(t.a, t.b);
    z = ops::add(t.x, t.y);
  }
  Exec exec = instantiate(end_capture());
  device.synchronize();
  EXPECT_TRUE(profiler_records().empty()) << "a capture runs nothing";
  exec.replay(s);
  s.synchronize();
  auto mm = rows_named("graph_guard", "matmul"), add = rows_named("graph_guard", "add");
  ASSERT_EQ(mm.size(), 1u);
  ASSERT_EQ(add.size(), 1u);
  EXPECT_EQ(mm[0]["block_dim"], "3");
  EXPECT_EQ(mm[0]["cube_num"], "3");
  EXPECT_EQ(add[0]["block_dim"], "6");
  EXPECT_EQ(add[0]["vector_num"], "6");
  EXPECT_EQ(get_stream_limit(s), (CoreLimits{8, 8})) << "the guard restored the stream";
  EXPECT_NEAR(c.item({0, 0}), 384 * 0.01f * 0.02f, 1e-6);
  EXPECT_FLOAT_EQ(z.item({7}), 3.0f);
}

// 分核5: several matmuls, each in its own limit scope, and outside the scopes
// the default: each replays with its own count.
TEST(RfcGraph, EachLimitScopeReplaysWithItsCount) {
  Device device(rfc_device());
  Stream s(device);
  Operands t;
  const std::vector<int> counts{1, 4, 2, 7};
  std::vector<Tensor> outs;
  begin_capture(s);
  {
    StreamGuard g(s);
    outs.push_back(ops::matmul(t.a, t.b));  // default
  }
  for (int c : counts) {
    StreamLimitGuard g(s, c, c);
    EXPECT_EQ(get_stream_limit(s), (CoreLimits{c, c}));
    outs.push_back(ops::matmul(t.a, t.b));
  }
  {
    StreamGuard g(s);
    outs.push_back(ops::matmul(t.a, t.b));  // default again
  }
  Exec exec = instantiate(end_capture());
  ProfilerScope profile;
  exec.replay(s);
  s.synchronize();
  auto mm = rows_named("graph_scopes", "matmul");
  ASSERT_EQ(mm.size(), counts.size() + 2);
  EXPECT_EQ(mm.front()["block_dim"], "8");
  for (size_t i = 0; i < counts.size(); ++i) EXPECT_EQ(mm[i + 1]["block_dim"], std::to_string(counts[i])) << i;
  EXPECT_EQ(mm.back()["block_dim"], "8");
}

// 交叉2: matmul on S1 under a cube limit and add on S2 under a vector limit,
// ordered by events, run concurrently in replay with their counts.
TEST(RfcGraph, TwoStreamsReplayConcurrentlyWithTheirLimits) {
  Device device(rfc_device());
  Stream s1(device), s2(device);
  Operands t;
  Tensor big_a = Tensor::full({768, 768}, 0.1f), big_b = Tensor::full({768, 768}, 0.1f);
  std::vector<Tensor> products, sums;
  Event fork, join;
  begin_capture(s1);
  fork.record(s1);
  {
    StreamLimitGuard g(s1, 2, -1);
    for (int i = 0; i < 3; ++i) products.push_back(ops::matmul(big_a, big_b));
  }
  {
    StreamLimitGuard g(s2, -1, 2);
    fork.wait();
    for (int i = 0; i < 12; ++i) sums.push_back(ops::add(t.x, t.y));
    join.record();
  }
  join.wait(s1);
  Graph graph = end_capture();
  ASSERT_EQ(graph.nodes().size(), 15u);
  Exec exec = instantiate(std::move(graph));
  EXPECT_EQ(exec.nodes(), 15u) << "different streams and limits: nothing fuses";
  ProfilerScope profile;
  exec.replay(s1);
  s1.synchronize();
  auto r1 = records_of(s1), r2 = records_of(s2);
  ASSERT_EQ(r1.size(), 3u);
  ASSERT_EQ(r2.size(), 12u);
  for (auto& r : r1) {
    EXPECT_EQ(r.block_dim, 2);
    EXPECT_EQ(r.limits.cube, 2);
  }
  for (auto& r : r2) {
    EXPECT_EQ(r.block_dim, 2);
    EXPECT_EQ(r.limits.vector, 2);
  }
  EXPECT_TRUE(any_overlap(r1, r2)) << "the two captured streams should overlap in replay";
  EXPECT_NEAR(products[2].item({5, 5}), 768 * 0.1f * 0.1f, 1e-3);
  EXPECT_FLOAT_EQ(sums[11].item({3}), 3.0f);
}

// 交叉3: MatmulAssignaddFusion (C += A B). Without stream or core-limit
// attributes it fuses and the fused node has none; across two streams, or
// under different core limits, it does not.
TEST(RfcGraph, MatmulAssignaddFusionRespectsStreamsAndLimits) {
  Device device(rfc_device());
  Stream s1(device), s2(device);
  Operands t;
  const Tensor c0 = Tensor::full({384, 384}, 1.0f);
  Tensor eager = c0.clone();
  {
    StreamGuard g(s1);
    ops::add_out(eager, ops::matmul(t.a, t.b), eager);
    s1.synchronize();
  }

  Tensor c = c0.clone();
  begin_capture(s1);
  {
    StreamGuard g(s1);
    ops::add_out(c, ops::matmul(t.a, t.b), c);
  }
  Exec fused = instantiate(end_capture());
  ASSERT_EQ(fused.nodes(), 1u) << fused.graph().dump();
  const Node& n = fused.graph().nodes()[0];
  EXPECT_EQ(n.op->key.op, "matmul_add");
  EXPECT_EQ(n.stream_limit, (CoreLimits{0, 0})) << "no core_num attribute";
  EXPECT_EQ(n.stream_id, s1.id());
  fused.replay(s1);
  s1.synchronize();
  EXPECT_TRUE(bitwise_equal(c, eager));

  Tensor c2 = c0.clone();
  Event e, back;
  begin_capture(s1);
  {
    StreamGuard g(s1);
    Tensor p = ops::matmul(t.a, t.b);
    e.record();
    StreamGuard g2(s2);
    e.wait();
    ops::add_out(c2, p, c2);
    back.record();
  }
  back.wait(s1);
  Exec split_streams = instantiate(end_capture());
  EXPECT_EQ(split_streams.nodes(), 2u) << "matmul on S1 and add on S2 must not fuse";
  split_streams.replay(s1);
  s1.synchronize();
  EXPECT_TRUE(bitwise_equal(c2, eager));

  Tensor c3 = c0.clone();
  begin_capture(s1);
  {
    Tensor p;
    {
      StreamLimitGuard g(s1, 2, -1);
      p = ops::matmul(t.a, t.b);
    }
    StreamGuard g(s1);
    ops::add_out(c3, p, c3);
  }
  Exec split_limits = instantiate(end_capture());
  EXPECT_EQ(split_limits.nodes(), 2u) << "different core limits must not fuse";
  split_limits.replay(s1);
  s1.synchronize();
  EXPECT_TRUE(bitwise_equal(c3, eager));
}

}  // namespace
}  // namespace coremesh::graph
