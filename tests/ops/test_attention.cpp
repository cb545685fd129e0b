// Flash attention (MHA, GQA, causal and not, odd lengths spanning several
// tiles) vs the materialized reference; backward vs reference and finite
// differences; LSE merge equals attention over the union of keys; RoPE.
#include <cmath>

#include "coremesh/ops/attention.hpp"
#include "coremesh/ops/rope.hpp"
#include "harness.hpp"

namespace coremesh::ops {
namespace {

using namespace testing;

struct AttnCase {
  int64_t B, T, S, H, Hkv, D;
  bool causal;
};

TEST(OpsAttention, ForwardBackwardMatchReference) {
  const AttnCase cases[] = {
      {2, 150, 150, 4, 4, 16, true},   // MHA, 3 query tiles, 2 key tiles
      {1, 137, 137, 6, 2, 8, true},    // GQA 3:1
      {2, 33, 70, 2, 1, 12, false},    // cross attention, MQA
      {1, 40, 300, 8, 2, 20, false},   // GQA 4:1 over 3 key tiles (online softmax), D % 8 != 0
      {1, 1, 1, 1, 1, 4, true},
  };
  for (const AttnCase& c : cases) {
    SCOPED_TRACE(::testing::Message() << "T=" << c.T << " S=" << c.S << " H=" << c.H << " Hkv=" << c.Hkv);
    Tensor q = randn({c.B, c.T, c.H, c.D}, 1), k = randn({c.B, c.S, c.Hkv, c.D}, 2);
    Tensor v = randn({c.B, c.S, c.Hkv, c.D}, 3), dout = randn({c.B, c.T, c.H, c.D}, 4);
    AttentionOut ref = reference::attention(q, k, v, c.causal);
    AttentionGrads gref = reference::attention_backward(dout, q, k, v, c.causal);
    for_each_limit([&](const LimitCase&) {
      AttentionOut o = flash_attention(q, k, v, c.causal);
      AttentionGrads g = flash_attention_backward(dout, q, k, v, ref.out, ref.lse, c.causal);
      test_stream().synchronize();
      EXPECT_NMSE(o.out, ref.out, 1e-11);
      EXPECT_NMSE(o.lse, ref.lse, 1e-12);
      EXPECT_NMSE(g.dq, gref.dq, 1e-10);
      EXPECT_NMSE(g.dk, gref.dk, 1e-10);
      EXPECT_NMSE(g.dv, gref.dv, 1e-10);
    });
  }
}

TEST(OpsAttention, GradientCheck) {
  Tensor q = randn({1, 9, 4, 4}, 5), k = randn({1, 9, 2, 4}, 6), v = randn({1, 9, 2, 4}, 7);
  Tensor dout = randn({1, 9, 4, 4}, 8);
  AttentionGrads g;
  run_on_stream([&] {
    AttentionOut o = flash_attention(q, k, v);
    g = flash_attention_backward(dout, q, k, v, o.out, o.lse);
  });
  auto loss = [&] {
    AttentionOut o;
    run_on_stream([&] { o = flash_attention(q, k, v); });
    return dot(o.out, dout);
  };
  EXPECT_LT(grad_check(q, g.dq, loss), 1e-2);
  EXPECT_LT(grad_check(k, g.dk, loss), 1e-2);
  EXPECT_LT(grad_check(v, g.dv, loss), 1e-2);
}

TEST(OpsAttention, MergeOfTwoKeyHalvesEqualsFullAttention) {
  // Queries at the end of a causal sequence attend to keys [0,40) fully and
  // to [40,80) causally: the ring-attention split of one step.
  const int64_t B = 2, T = 40, H = 3, D = 8;
  Tensor q = randn({B, T, H, D}, 9), k = randn({B, 2 * T, H, D}, 10), v = randn({B, 2 * T, H, D}, 11);
  Tensor k1 = k.slice(1, 0, T).contiguous(), k2 = k.slice(1, T, 2 * T).contiguous();
  Tensor v1 = v.slice(1, 0, T).contiguous(), v2 = v.slice(1, T, 2 * T).contiguous();
  // Full reference: keys [0, 2T) with query t at position T + t.
  Tensor qfull = Tensor::zeros({B, 2 * T, H, D});
  qfull.slice(1, T, 2 * T).copy_from(q);
  AttentionOut full = reference::attention(qfull, k, v, true);
  Tensor want = full.out.slice(1, T, 2 * T).contiguous();
  Tensor want_lse = full.lse.slice(2, T, 2 * T).contiguous();
  for_each_limit([&](const LimitCase&) {
    AttentionOut a = flash_attention(q, k1, v1, false);
    AttentionOut b = flash_attention(q, k2, v2, true);
    AttentionOut m = merge_attention(a.out, a.lse, b.out, b.lse);
    test_stream().synchronize();
    EXPECT_NMSE(m.out, want, 1e-11);
    EXPECT_NMSE(m.lse, want_lse, 1e-12);
  });
  // An empty partial (lse = -inf) leaves the other one unchanged.
  Tensor empty_lse = Tensor::full({B, H, T}, -INFINITY), zeros = Tensor::zeros({B, T, H, D});
  AttentionOut a, m;
  run_on_stream([&] {
    a = flash_attention(q, k1, v1, false);
    m = merge_attention(zeros, empty_lse, a.out, a.lse);
  });
  EXPECT_TRUE(bitwise_equal(m.lse, a.lse));
  EXPECT_NMSE(m.out, a.out, 1e-14);
}

TEST(OpsRope, ForwardBackward) {
  for (bool interleaved : {false, true}) {
    RopeConfig cfg{10000.0f, interleaved};
    Tensor x = randn({2, 13, 3, 10}, 12), dy = randn({2, 13, 3, 10}, 13);
    Tensor pos = rope_positions(13, 1000);
    pos.data<int64_t>()[5] = 7;  // arbitrary (zig-zag) positions are allowed
    Tensor ref = reference::rope(x, pos, cfg);
    for_each_limit([&](const LimitCase&) {
      Tensor y = rope(x, pos, cfg);
      Tensor back = rope_backward(y, pos, cfg);  // rotation by -a undoes it
      test_stream().synchronize();
      EXPECT_NMSE(y, ref, 1e-12);
      EXPECT_NMSE(back, x, 1e-12);
    });
    Tensor g;
    run_on_stream([&] { g = rope_backward(dy, pos, cfg); });
    EXPECT_LT(grad_check(x, g, [&] {
                Tensor y;
                run_on_stream([&] { y = rope(x, pos, cfg); });
                return dot(y, dy);
              }), 1e-2);
  }
}

TEST(OpsRope, PackedQkvMatchesRopeOnEachPart) {
  const int64_t B = 2, T = 7, H = 4, Hkv = 2, D = 6, W = (H + 2 * Hkv) * D;
  for (bool interleaved : {false, true}) {
    RopeConfig cfg{500.0f, interleaved};
    Tensor qkv = randn({B, T, W}, 21);
    Tensor pos = rope_positions(T, 3);
    auto part = [&](const Tensor& t, int64_t h0, int64_t h) {
      return t.slice(2, h0 * D, (h0 + h) * D).contiguous().view({B, T, h, D});
    };
    Tensor q_ref = reference::rope(part(qkv, 0, H), pos, cfg);
    Tensor k_ref = reference::rope(part(qkv, H, Hkv), pos, cfg);
    Tensor v_ref = part(qkv, H + Hkv, Hkv);
    for_each_limit([&](const LimitCase&) {
      QkvHeads o = rope_qkv(qkv, H, Hkv, pos, cfg);
      Tensor back = rope_qkv_backward(o.q, o.k, o.v, pos, cfg);  // undoes the rotation
      test_stream().synchronize();
      EXPECT_NMSE(o.q, q_ref, 1e-12);
      EXPECT_NMSE(o.k, k_ref, 1e-12);
      EXPECT_TRUE(bitwise_equal(o.v, v_ref));
      EXPECT_NMSE(back, qkv, 1e-12);
    });
    // the backward is the adjoint: <rope_qkv(x), (dq,dk,dv)> = <x, rope_qkv_backward(dq,dk,dv)>
    Tensor dq = randn({B, T, H, D}, 22), dk = randn({B, T, Hkv, D}, 23), dv = randn({B, T, Hkv, D}, 24);
    Tensor g;
    run_on_stream([&] { g = rope_qkv_backward(dq, dk, dv, pos, cfg); });
    EXPECT_LT(grad_check(qkv, g, [&] {
                QkvHeads o;
                run_on_stream([&] { o = rope_qkv(qkv, H, Hkv, pos, cfg); });
                return dot(o.q, dq) + dot(o.k, dk) + dot(o.v, dv);
              }), 1e-2);
  }
}

TEST(OpsRope, PackedQkvRejectsBadShapes) {
  Tensor pos = rope_positions(3);
  EXPECT_THROW(rope_qkv(Tensor::zeros({1, 3, 30}), 4, 3, pos), InvalidArgument);  // 3 !| 4
  EXPECT_THROW(rope_qkv(Tensor::zeros({1, 3, 30}), 4, 2, pos), InvalidArgument);  // 30 != 8*D
  EXPECT_THROW(rope_qkv(Tensor::zeros({1, 4, 48}), 4, 2, pos), InvalidArgument);  // positions
}

// Scalars that would turn every output into nan are refused at the call.
TEST(OpsAttention, NonFiniteScalarsAreRefused) {
  Tensor pos = rope_positions(3), x = Tensor::zeros({1, 3, 2, 8});
  for (float base : {0.0f, -2.0f, std::nanf("")}) EXPECT_THROW(rope(x, pos, {base, false}), InvalidArgument) << base;
  EXPECT_THROW(flash_attention(x, x, x, true, std::nanf("")), InvalidArgument);
  EXPECT_THROW(flash_attention(x, x, x, true, INFINITY), InvalidArgument);
}

}  // namespace
}  // namespace coremesh::ops
