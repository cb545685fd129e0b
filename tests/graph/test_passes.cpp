// Each pass on its own: the graph's text dump before and after, and the
// rewritten graph replayed bit-identical to eager execution.
#include "coremesh/graph/exec.hpp"
#include "coremesh/ops/activation.hpp"
#include "coremesh/ops/elementwise.hpp"
#include "coremesh/ops/gemm.hpp"
#include "ops/harness.hpp"
#include "runtime/helpers.hpp"

namespace coremesh::graph {
namespace {

using namespace runtime;
using ops::testing::bitwise_equal;
using ops::testing::randn;

// Two worker cores; captures on the device's default stream (s0).
struct PassTest : ::testing::Test {
  Device device{DeviceOptions{.cores = 2}};
  Stream s = device.default_stream();
  StreamGuard guard{s};

  // `t` once the stream has computed it.
  Tensor done(Tensor t) {
    s.synchronize();
    return t;
  }

  // Replays `g` without further passes and waits.
  void replay(Graph g) {
    Exec exec = instantiate(std::move(g), {.passes = false});
    exec.replay(s);
    s.synchronize();
  }
};

TEST_F(PassTest, MatmulAddFusesTheAssignAdd) {
  Tensor a = randn({32, 48}, 1), b = randn({48, 16}, 2), c = randn({32, 16}, 3);
  Tensor eager = c.clone();
  ops::add_out(eager, ops::matmul(a, b), eager);
  begin_capture(s);
  ops::add_out(c, ops::matmul(a, b), c);
  Graph g = end_capture();
  EXPECT_EQ(g.dump(),
            "graph: 2 nodes, origin stream s0\n"
            "  n0 = matmul(t0[32, 48]f32, t1[48, 16]f32) -> t2[32, 16]f32 {ta=false;tb=false;beta=0}  @s0 "
            "cores=cube:2,vector:2 limit=-\n"
            "  n1 = add(t3[32, 16]f32, t2[32, 16]f32) -> t3[32, 16]f32  @s0 cores=cube:2,vector:2 limit=- after n0\n"
            "  internal: t2\n");
  const PassResult r = fuse_matmul_add(g);
  EXPECT_EQ(r.matches, 1);
  EXPECT_EQ(g.dump(),
            "graph: 1 nodes, origin stream s0\n"
            "  n2 = matmul_add(t0[32, 48]f32, t1[48, 16]f32, t2[32, 16]f32) -> t2[32, 16]f32 "
            "{ta=false;tb=false;tile_first=false}  @s0 cores=cube:2,vector:2 limit=- fused from n0,n1\n");
  replay(std::move(g));
  EXPECT_TRUE(bitwise_equal(c, eager));
}

TEST_F(PassTest, MatmulAddFusesAnOutOfPlaceAddAndKeepsAProductSomeoneHolds) {
  Tensor a = randn({40, 24}, 4), b = randn({24, 72}, 5), x = randn({40, 72}, 6);
  Tensor eager = ops::add(ops::matmul(a, b), x);
  begin_capture(s);
  Tensor y = ops::add(ops::matmul(a, b), x);  // the product first: tile_first
  Tensor kept = ops::matmul(a, b);            // held by the caller: must stay
  Tensor z = ops::add(x, kept);
  Graph g = end_capture();
  const std::string before = g.dump();
  EXPECT_EQ(fuse_matmul_add(g).matches, 1);
  EXPECT_EQ(g.nodes().size(), 3u) << g.dump();
  EXPECT_EQ(g.nodes()[0].op->key.attrs, "ta=false;tb=false;tile_first=true");
  EXPECT_EQ(g.nodes()[1].op->key.op, "matmul");
  replay(std::move(g));
  EXPECT_TRUE(bitwise_equal(y, eager));
  EXPECT_TRUE(bitwise_equal(z, done(ops::add(x, ops::matmul(a, b)))));
}

TEST_F(PassTest, MatmulBiasFuses) {
  Tensor a = randn({30, 20}, 7), b = randn({50, 20}, 8), bias = randn({50}, 9);
  Tensor eager = ops::add_bias(ops::matmul(a, b, false, true), bias);
  begin_capture(s);
  Tensor y = ops::add_bias(ops::matmul(a, b, false, true), bias);
  Graph g = end_capture();
  EXPECT_EQ(g.dump(),
            "graph: 2 nodes, origin stream s0\n"
            "  n0 = matmul(t0[30, 20]f32, t1[50, 20]f32) -> t2[30, 50]f32 {ta=false;tb=true;beta=0}  @s0 "
            "cores=cube:2,vector:2 limit=-\n"
            "  n1 = add_bias(t2[30, 50]f32, t3[50]f32) -> t4[30, 50]f32  @s0 cores=cube:2,vector:2 limit=- after n0\n"
            "  internal: t2\n");
  EXPECT_EQ(fuse_matmul_bias(g).matches, 1);
  EXPECT_EQ(g.dump(),
            "graph: 1 nodes, origin stream s0\n"
            "  n2 = matmul_bias(t0[30, 20]f32, t1[50, 20]f32, t2[50]f32) -> t3[30, 50]f32 {ta=false;tb=true}  @s0 "
            "cores=cube:2,vector:2 limit=- fused from n0,n1\n");
  replay(std::move(g));
  EXPECT_TRUE(bitwise_equal(y, eager));
}

TEST_F(PassTest, ElementwiseChainBecomesOneKernel) {
  Tensor x = randn({5000}, 10), u = randn({5000}, 11), v = randn({5000}, 12);
  Tensor eager = ops::add(ops::mul(ops::gelu(ops::silu(x)), u), v);
  begin_capture(s);
  Tensor y = ops::add(ops::mul(ops::gelu(ops::silu(x)), u), v);
  Graph g = end_capture();
  EXPECT_EQ(g.dump(),
            "graph: 4 nodes, origin stream s0\n"
            "  n0 = silu(t0[5000]f32) -> t1[5000]f32  @s0 cores=cube:2,vector:2 limit=-\n"
            "  n1 = gelu(t1[5000]f32) -> t2[5000]f32 {tanh}  @s0 cores=cube:2,vector:2 limit=- after n0\n"
            "  n2 = mul(t2[5000]f32, t3[5000]f32) -> t4[5000]f32  @s0 cores=cube:2,vector:2 limit=- after n1\n"
            "  n3 = add(t4[5000]f32, t5[5000]f32) -> t6[5000]f32  @s0 cores=cube:2,vector:2 limit=- after n2\n"
            "  internal: t1 t2 t4\n");
  const PassResult r = fuse_elementwise_chains(g);
  EXPECT_EQ(r.matches, 1);
  EXPECT_EQ(r.removed, 3);
  EXPECT_EQ(g.dump(),
            "graph: 1 nodes, origin stream s0\n"
            "  n4 = elementwise_chain(t0[5000]f32, t1[5000]f32, t2[5000]f32) -> t3[5000]f32 "
            "{chain=silu(i0) gelu.tanh(t) mul(t,i1) add(t,i2)}  @s0 cores=cube:2,vector:2 limit=- "
            "fused from n0,n1,n2,n3\n");
  replay(std::move(g));
  EXPECT_TRUE(bitwise_equal(y, eager));
}

TEST_F(PassTest, ElementwiseChainStopsAtATensorSomeoneHolds) {
  Tensor x = randn({300}, 13);
  begin_capture(s);
  Tensor t = ops::silu(x);    // kept: the chain may not skip writing it
  Tensor y = ops::mul(ops::gelu(t), x);
  Graph g = end_capture();
  EXPECT_EQ(fuse_elementwise_chains(g).removed, 1);
  ASSERT_EQ(g.nodes().size(), 2u);
  EXPECT_EQ(g.nodes()[0].op->key.op, "silu");
  EXPECT_EQ(g.nodes()[1].op->key.attrs, "chain=gelu.tanh(i0) mul(t,i1)");
  replay(std::move(g));
  EXPECT_TRUE(bitwise_equal(y, done(ops::mul(ops::gelu(ops::silu(x)), x))));
}

TEST_F(PassTest, DeadNodesAreRemovedUntilNoneIsLeft) {
  Tensor x = randn({256}, 14);
  begin_capture(s);
  ops::mul(ops::silu(x), x);  // nobody can read either result
  Tensor y = ops::add(x, x);
  Graph g = end_capture();
  EXPECT_EQ(g.dump(),
            "graph: 3 nodes, origin stream s0\n"
            "  n0 = silu(t0[256]f32) -> t1[256]f32  @s0 cores=cube:2,vector:2 limit=-\n"
            "  n1 = mul(t1[256]f32, t0[256]f32) -> t2[256]f32  @s0 cores=cube:2,vector:2 limit=- after n0\n"
            "  n2 = add(t0[256]f32, t0[256]f32) -> t3[256]f32  @s0 cores=cube:2,vector:2 limit=- after n1\n"
            "  internal: t1 t2\n");
  const PassResult r = remove_dead_nodes(g);
  EXPECT_EQ(r.removed, 2);
  EXPECT_EQ(g.dump(),
            "graph: 1 nodes, origin stream s0\n"
            "  n2 = add(t0[256]f32, t0[256]f32) -> t1[256]f32  @s0 cores=cube:2,vector:2 limit=-\n");
  replay(std::move(g));
  EXPECT_TRUE(bitwise_equal(y, done(ops::add(x, x))));
}

TEST_F(PassTest, InstantiateRunsEveryPassAndCountsWhatWasRemoved) {
  Tensor a = randn({16, 16}, 15), b = randn({16, 16}, 16), c = randn({16, 16}, 17);
  begin_capture(s);
  ops::add_out(c, ops::matmul(a, b), c);
  ops::silu(c);  // dead
  Tensor y = ops::mul(ops::silu(c), c);
  Exec exec = instantiate(end_capture());
  EXPECT_EQ(exec.captured_nodes(), 5u);
  EXPECT_EQ(exec.nodes(), 2u) << exec.graph().dump();
  ASSERT_EQ(exec.pass_results().size(), 4u);
  EXPECT_EQ(exec.pass_results()[0].removed, 1);  // matmul_add
  EXPECT_EQ(exec.pass_results()[2].removed, 1);  // silu -> mul
  EXPECT_EQ(exec.pass_results()[3].removed, 1);  // the dead silu
}

// Two Storage objects over one buffer (Tensor::wrap of another tensor's
// memory) are one memory to the passes: the fused product must not write
// its own operand, and a write into wrapped memory is never dead (the
// passes compared Storage objects: the first replayed garbage, the second
// dropped the write).
TEST_F(PassTest, WrapsOfOneBufferAreOneMemory) {
  Tensor a = randn({64, 64}, 18), b = randn({64, 64}, 19), x = randn({64, 64}, 20);
  Tensor a_eager = a.clone();
  Tensor y_eager = Tensor::wrap(a_eager.raw_data(), {64, 64}, DType::f32, a_eager.storage());
  ops::add_out(x, ops::matmul(a_eager, b), y_eager);
  begin_capture(s);
  Tensor y = Tensor::wrap(a.raw_data(), {64, 64}, DType::f32, a.storage());  // a second view of a
  ops::add_out(x, ops::matmul(a, b), y);
  Exec exec = instantiate(end_capture());
  EXPECT_EQ(exec.nodes(), 2u) << exec.graph().dump();
  exec.replay(s);
  s.synchronize();
  EXPECT_TRUE(bitwise_equal(a, a_eager));
}

TEST_F(PassTest, AWriteIntoWrappedMemoryIsNotDead) {
  Tensor a = Tensor::full({4}, 1.f), b = Tensor::full({4}, 2.f);
  float out[4] = {};
  begin_capture(s);
  {
    Tensor wrapped = Tensor::wrap(out, {4}, DType::f32);  // the handle dies, the memory is the caller's
    ops::add_out(a, b, wrapped);
  }
  Exec exec = instantiate(end_capture());
  EXPECT_EQ(exec.nodes(), 1u) << exec.graph().dump();
  exec.replay(s);
  s.synchronize();
  for (float v : out) EXPECT_EQ(v, 3.f);
}

}  // namespace
}  // namespace coremesh::graph
