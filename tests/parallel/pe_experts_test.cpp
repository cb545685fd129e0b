// Expert-parallel dispatch/combine at every PE count against a host
// reference built from every PE's (deterministic) routing: the rows each
// owner receives, in (local expert, source) order, its group lists, the round
// trip back to the sources, and the backward's mirror pair. Some experts get
// no rows from anyone and the last PE sends none.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

#include "coremesh/ops/elementwise.hpp"
#include "coremesh/ops/grouped_gemm.hpp"
#include "coremesh/ops/quant.hpp"
#include "coremesh/parallel/expert_balance.hpp"
#include "coremesh/parallel/expert_parallel.hpp"
#include "coremesh/runtime/stream.hpp"
#include "coremesh/shmem/shmem.hpp"

using namespace coremesh;
using namespace coremesh::parallel;

namespace {

constexpr int E = 12;     // divides over 1, 2, 3 and 4 PEs
constexpr int64_t C = 5;  // row width
constexpr int64_t R = 40; // rows a PE sends at most

// PE `pe`'s rows at `round`, grouped by expert: counts per expert, then values.
struct Source {
  std::vector<int64_t> counts, offsets;
  std::vector<float> rows;
};
Source source(int pe, int n, int round, int64_t width = C) {
  Source s;
  std::mt19937 rng(uint32_t(pe * 7919 + round));
  s.counts.assign(E, 0);
  const int64_t total = pe == n - 1 && n > 1 ? 0 : R - pe;  // the last PE sends none
  for (int64_t i = 0; i < total; ++i) {
    const int e = int(rng() % E);
    if (e == 3 || e == 7) continue;  // nobody routes to experts 3 and 7
    ++s.counts[size_t(e)];
  }
  s.offsets.assign(E + 1, 0);
  for (int e = 0; e < E; ++e) s.offsets[size_t(e + 1)] = s.offsets[size_t(e)] + s.counts[size_t(e)];
  for (int64_t i = 0; i < s.offsets[E] * width; ++i) s.rows.push_back(float(pe * 1000 + round * 100) + float(i) * 0.5f);
  return s;
}

Tensor rows_tensor(const Source& s, int64_t width = C) {  // (R, width): the rows, then zeros
  Tensor t = Tensor::zeros({R, width});
  std::copy(s.rows.begin(), s.rows.end(), t.data<float>());
  return t;
}

}  // namespace

TEST(ExpertParallel, DispatchCombineAndTheirBackward) {
  const int me = shmem::my_pe(), n = shmem::n_pes();
  std::vector<int> world;
  for (int p = 0; p < n; ++p) world.push_back(p);
  ShmemExperts experts(Group::of(world, me), {E, C, R, -1, {1, 2}});
  const int El = E / n;
  runtime::Stream stream;
  runtime::StreamGuard on(stream);
  for (int round = 0; round < 3; ++round)
    for (int layer : {1, 2}) {
      SCOPED_TRACE(::testing::Message() << "round " << round << " layer " << layer);
      const Source mine = source(me, n, round * 2 + layer);
      const Tensor xp = rows_tensor(mine);
      const Tensor offsets = Tensor::from_vector(mine.offsets, {E + 1});
      const auto d = experts.dispatch(xp, offsets, {layer}, {});
      // identity experts, then double them on the way back in the backward
      const Tensor back = experts.combine(d.rows, d);
      const Tensor dy = ops::add(xp, xp);
      const Tensor drows = experts.combine_backward(dy, d);
      const Tensor dx = experts.dispatch_backward(drows, d);
      stream.synchronize();
      // what this PE's experts receive: (local expert e, source s) in order
      std::vector<Source> all;
      for (int p = 0; p < n; ++p) all.push_back(source(p, n, round * 2 + layer));
      std::vector<float> want;
      std::vector<int64_t> want_off{0}, want_src{0};
      for (int e = 0; e < El; ++e) {
        const int global = me * El + e;
        for (int s = 0; s < n; ++s) {
          const Source& x = all[size_t(s)];
          want.insert(want.end(), x.rows.begin() + x.offsets[size_t(global)] * C,
                      x.rows.begin() + x.offsets[size_t(global + 1)] * C);
          want_src.push_back(int64_t(want.size()) / C);
        }
        want_off.push_back(int64_t(want.size()) / C);
      }
      ASSERT_EQ(d.sources, n);
      EXPECT_EQ(std::vector<int64_t>(d.offsets.data<int64_t>(), d.offsets.data<int64_t>() + El + 1), want_off);
      EXPECT_EQ(std::vector<int64_t>(d.source_offsets.data<int64_t>(),
                                     d.source_offsets.data<int64_t>() + int64_t(El) * n + 1),
                want_src);
      ASSERT_GE(d.rows.size(0), int64_t(want.size()) / C);
      EXPECT_TRUE(std::equal(want.begin(), want.end(), d.rows.data<float>())) << "received rows";
      // the round trip gives each source its own rows back, and the backward dy
      EXPECT_EQ(0, std::memcmp(back.raw_data(), xp.raw_data(), xp.nbytes())) << "combine";
      EXPECT_EQ(0, std::memcmp(dx.raw_data(), dy.raw_data(), dy.nbytes())) << "dispatch backward";
      const std::vector<float> d2 = drows.to_float_vector();
      for (size_t i = 0; i < want.size(); ++i) ASSERT_EQ(d2[i], want[i] + want[i]) << "combine backward at " << i;
    }
  shmem::barrier();
}

// Fused (alltoallv_grouped_matmul): the experts' first GEMM runs on each
// source's slot as it lands; its output, regrouped with the rows, equals one
// grouped GEMM over the received rows bit for bit (a GEMM's rows do not
// depend on the rows beside them), over rounds and two sites. The mirror
// (grouped_matmul_alltoallv, matmul_combine) runs an identity GEMM expert by
// expert and every source gets its rows back exactly; the backward as unfused.
TEST(ExpertParallel, FusedDispatchRunsTheFirstGemmPerSource) {
  const int me = shmem::my_pe(), n = shmem::n_pes();
  std::vector<int> world;
  for (int p = 0; p < n; ++p) world.push_back(p);
  ShmemExperts::Shape shape{E, C, R, -1, {1, 2}};
  shape.fused = true;
  ShmemExperts experts(Group::of(world, me), shape);
  const int El = E / n;
  constexpr int64_t W = 7;
  Tensor w = Tensor::empty({El, W, C});
  for (int64_t i = 0; i < w.numel(); ++i) w.data<float>()[i] = float((i * 37 + me * 11) % 19) * 0.125f - 1.0f;
  Tensor eye = Tensor::zeros({El, C, C});
  for (int e = 0; e < El; ++e)
    for (int64_t c = 0; c < C; ++c) eye.data<float>()[(e * C + c) * C + c] = 1.0f;
  int calls = 0;
  const ExpertDispatcher::FirstGemm first{
      W, [&](const Tensor& rows, const Tensor&, const Tensor& offsets, const Tensor& out) {
        ++calls;
        ops::grouped_matmul_out(rows, w, offsets, out);
      }};
  runtime::Stream stream;
  runtime::StreamGuard on(stream);
  for (int round = 0; round < 3; ++round)
    for (int layer : {1, 2}) {
      SCOPED_TRACE(::testing::Message() << "round " << round << " layer " << layer);
      const Source mine = source(me, n + 1, round * 2 + layer);  // n + 1: every PE sends rows
      const Tensor xp = rows_tensor(mine);
      calls = 0;
      const auto d = experts.dispatch(xp, Tensor::from_vector(mine.offsets, {E + 1}), {layer}, {}, first);
      EXPECT_EQ(calls, n) << "one GEMM per source";
      ASSERT_TRUE(d.first.defined());
      // the mirror: an identity GEMM expert by expert, each expert's runs sent as it is done
      int ranges = 0;
      const Tensor back = experts.matmul_combine(Tensor::empty(d.rows.shape()), [&](const Tensor& y, int64_t b, int64_t e) {
        ++ranges;
        ops::grouped_matmul_out(d.rows, eye, d.offsets, y, ops::WeightLayout::nk, {b, e});
      }, d);
      EXPECT_EQ(ranges, El) << "one GEMM per local expert";
      const Tensor dx = experts.dispatch_backward(experts.combine_backward(xp, d), d);
      stream.synchronize();
      const Tensor want = ops::reference::grouped_matmul(d.rows, w, d.offsets);
      ASSERT_EQ(d.first.shape(), want.shape());
      const int64_t routed = d.offsets.data<int64_t>()[El];
      float worst = 0;  // the naive reference sums in another order: within a few ulps
      for (int64_t i = 0; i < want.numel(); ++i)
        worst = std::max(worst, std::abs(d.first.data<float>()[i] - want.data<float>()[i]));
      EXPECT_LE(worst, 1e-4f);
      for (int64_t i = routed * W; i < d.first.numel(); ++i) ASSERT_EQ(d.first.data<float>()[i], 0.0f) << "padding";
      const Tensor one = ops::grouped_matmul(d.rows, w, d.offsets);  // the unfused GEMM, the same engine
      stream.synchronize();
#if defined(__AVX2__) && defined(__FMA__)  // our GEMM engine is row-exact; OpenBLAS (sanitizer builds) blocks by row count
      EXPECT_EQ(0, std::memcmp(one.raw_data(), d.first.raw_data(), one.nbytes())) << "one grouped GEMM";
#else
      for (int64_t i = 0; i < one.numel(); ++i)
        ASSERT_NEAR(d.first.data<float>()[i], one.data<float>()[i], 1e-6f * (1 + std::abs(one.data<float>()[i])));
#endif
      EXPECT_EQ(0, std::memcmp(back.raw_data(), xp.raw_data(), xp.nbytes())) << "combine";
      EXPECT_EQ(0, std::memcmp(dx.raw_data(), xp.raw_data(), xp.nbytes())) << "dispatch backward";
    }
  shmem::barrier();
}

// The wire (Shape::wire): bf16 rows, or fp8 rows with their 1x128 scales,
// travel as the experts' first GEMM reads them, converted by the source. The
// owner gets the bits of converting the f32 rows it would have received,
// padding included (a zero tile's scale is 1). Fused, the GEMM per source
// equals one GEMM over those rows. Combine and the backward still move f32.
// A width of 200 gives two scale tiles per row.
TEST(ExpertParallel, RowsTravelInTheFormTheFirstGemmReads) {
  const int me = shmem::my_pe(), n = shmem::n_pes();
  std::vector<int> world;
  for (int p = 0; p < n; ++p) world.push_back(p);
  constexpr int64_t C2 = 200, W = 6;
  ShmemExperts plain(Group::of(world, me), {E, C2, R, -1, {1}});
  const int El = E / n;
  Tensor w = Tensor::empty({El, W, C2});
  for (int64_t i = 0; i < w.numel(); ++i) w.data<float>()[i] = float((i * 37 + me * 11) % 19) * 0.125f - 1.0f;
  runtime::Stream stream;
  runtime::StreamGuard on(stream);
  const ops::QuantizedTensor w8 = ops::quantize_fp8_weight(w);
  const Tensor w16 = ops::cast(w, DType::bf16);
  for (DType wire : {DType::bf16, DType::f8e4m3})
    for (bool fused : {false, true}) {
      ShmemExperts::Shape shape{E, C2, R, -1, {1}};
      shape.wire = wire, shape.fused = fused;
      ShmemExperts experts(Group::of(world, me), shape);
      const ExpertDispatcher::FirstGemm first{
          W, [&](const Tensor& rows, const Tensor& scale, const Tensor& offsets, const Tensor& out) {
            if (wire == DType::f8e4m3) ops::grouped_matmul_fp8({rows, scale}, w8, offsets, out);
            else ops::grouped_matmul_out(rows, w16, offsets, out);
          }};
      for (int round = 0; round < 3; ++round) {
        SCOPED_TRACE(::testing::Message() << dtype_name(wire) << (fused ? " fused" : "") << " round " << round);
        const Source mine = source(me, n + 1, round, C2);
        const Tensor xp = rows_tensor(mine, C2), offsets = Tensor::from_vector(mine.offsets, {E + 1});
        const auto ref = plain.dispatch(xp, offsets, {1}, {}, {});
        const auto d = experts.dispatch(xp, offsets, {1}, {}, first);
        ASSERT_EQ(d.rows.dtype(), wire);
        ASSERT_EQ(d.first.defined(), fused);
        ops::QuantizedTensor want{ops::cast(ref.rows, DType::bf16), Tensor()};
        if (wire == DType::f8e4m3) want = ops::quantize_fp8_act(ref.rows);
        Tensor one;
        if (fused) one = Tensor::empty(d.first.shape()), first.run(d.rows, d.scale, d.offsets, one);
        const Tensor back = experts.combine(ref.rows, d), ref_back = plain.combine(ref.rows, ref);
        const Tensor dx = experts.dispatch_backward(experts.combine_backward(xp, d), d);
        stream.synchronize();
        ASSERT_EQ(d.rows.nbytes(), want.data.nbytes());
        EXPECT_EQ(0, std::memcmp(d.rows.raw_data(), want.data.raw_data(), want.data.nbytes())) << "rows";
        ASSERT_EQ(d.scale.defined(), wire == DType::f8e4m3);
        if (d.scale.defined()) {
          ASSERT_EQ(d.scale.shape(), want.scale.shape());
          EXPECT_EQ(0, std::memcmp(d.scale.raw_data(), want.scale.raw_data(), want.scale.nbytes())) << "scales";
        }
        EXPECT_EQ(0, std::memcmp(d.offsets.raw_data(), ref.offsets.raw_data(), ref.offsets.nbytes()));
#if defined(__AVX2__) && defined(__FMA__)  // our GEMM engine is row-exact; OpenBLAS (sanitizer builds) blocks by row count
        if (fused) {
          EXPECT_EQ(0, std::memcmp(one.raw_data(), d.first.raw_data(), one.nbytes())) << "one grouped GEMM";
        }
#else
        for (int64_t i = 0; fused && i < one.numel(); ++i)
          ASSERT_NEAR(d.first.data<float>()[i], one.data<float>()[i], 1e-6f * (1 + std::abs(one.data<float>()[i])));
#endif
        EXPECT_EQ(0, std::memcmp(back.raw_data(), xp.raw_data(), xp.nbytes())) << "combine";
        EXPECT_EQ(0, std::memcmp(ref_back.raw_data(), xp.raw_data(), xp.nbytes())) << "combine (f32 wire)";
        EXPECT_EQ(0, std::memcmp(dx.raw_data(), xp.raw_data(), xp.nbytes())) << "dispatch backward";
      }
    }
  shmem::barrier();
}

TEST(ExpertParallel, ALargerMicroBatchIsRefusedWithTheFix) {
  const int me = shmem::my_pe(), n = shmem::n_pes();
  std::vector<int> world;
  for (int p = 0; p < n; ++p) world.push_back(p);
  ShmemExperts experts(Group::of(world, me), {E, C, R, -1, {0}});
  const Tensor big = Tensor::zeros({R + 1, C}), offsets = Tensor::zeros({E + 1}, DType::i64);
  try {
    experts.dispatch(big, offsets, {0}, {});
    ADD_FAILURE() << "accepted more rows than the buffers hold";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("the buffers take 40 rows"), std::string::npos) << e.what();
  }
  shmem::barrier();
}

// Members given another member order or other sizes are refused on each of
// them (the rows went to the wrong PEs, silently); the same group then builds.
TEST(ExpertParallel, MembersThatDisagreeAreRefused) {
  const int me = shmem::my_pe(), n = shmem::n_pes();
  if (n < 2) GTEST_SKIP() << "a group of 2 PEs or more";
  std::vector<int> world;
  for (int p = 0; p < n; ++p) world.push_back(p);
  std::vector<int> order = world;
  if (me == 0) std::reverse(order.begin(), order.end());
  for (const auto& [pes, rows] : {std::pair{order, R}, std::pair{world, me == n - 1 ? R + 1 : R}}) {
    try {
      ShmemExperts experts(Group::of(pes, me), {E, C, rows, -1, {0}});
      ADD_FAILURE() << "accepted members that disagree";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("were listed by members given different member lists or sizes"), std::string::npos) << e.what();
    }
  }
  ShmemExperts agreed(Group::of(world, me), {E, C, R, -1, {0}});
  EXPECT_EQ(agreed.local_experts(), E / n);
}

// The next dispatch of a layer may only follow its combine: the owners'
// receive buffers are free again only then.
TEST(ExpertParallel, DispatchingALayerTwiceWithoutCombineIsRefused) {
  const int me = shmem::my_pe(), n = shmem::n_pes();
  std::vector<int> world;
  for (int p = 0; p < n; ++p) world.push_back(p);
  ShmemExperts experts(Group::of(world, me), {E, C, R, -1, {0, 1}});
  const Tensor rows = Tensor::zeros({R, C}), offsets = Tensor::zeros({E + 1}, DType::i64);
  const auto d = experts.dispatch(rows, offsets, {0}, {});
  try {
    experts.dispatch(rows, offsets, {0}, {});
    ADD_FAILURE() << "a second dispatch of layer 0 before its combine was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("previous dispatch was not combined"), std::string::npos) << e.what();
  }
  const auto other = experts.dispatch(rows, offsets, {1}, {});  // another layer is independent
  experts.combine(other.rows, other);
  experts.combine(d.rows, d);
  experts.dispatch(rows, offsets, {0}, {});  // combined: accepted again
  runtime::current_stream().synchronize();
  shmem::barrier();
}

// Shadowed experts (expert_balance shadow): every source sends most of its
// rows to expert 0; the plan (parallel::plan_shadows on everyone's counts,
// here at no cost per shadow) shadows it and maybe more. Each source keeps
// its rows of the shadowed experts it does not own as groups of its own,
// after its experts' groups, with the owners' weights; the owners get the
// rest; the round trip and the backward give every row back where it was;
// the weight-gradient parts of the shadow groups land in their owners'
// (expert, source) places. Three rounds reuse the buffers.
TEST(ExpertParallel, ShadowedExpertsComputeTheirRowsAtTheSource) {
  const int me = shmem::my_pe(), n = shmem::n_pes();
  std::vector<int> world;
  for (int p = 0; p < n; ++p) world.push_back(p);
  constexpr int64_t F = 3;
  ShmemExperts::Shape shape{E, C, R, -1, {0}};
  shape.hidden = F, shape.balance = ExpertBalance::shadow, shape.shadow_cost = 0;
  ShmemExperts experts(Group::of(world, me), shape);
  const int El = E / n, S = experts.shadow_slots();
  ASSERT_EQ(S, E / 2);
  // expert e's weights: w13 (2F, C) then w2 (C, F), values e * 100 + i
  auto weights_of = [&](int e) {
    std::vector<float> w(size_t(3 * F * C));
    for (size_t i = 0; i < w.size(); ++i) w[i] = float(e * 100) + float(i);
    return w;
  };
  std::vector<float> w13v, w2v;
  for (int e = 0; e < El; ++e) {
    const std::vector<float> w = weights_of(me * El + e);
    w13v.insert(w13v.end(), w.begin(), w.begin() + 2 * F * C);
    w2v.insert(w2v.end(), w.begin() + 2 * F * C, w.end());
  }
  const Tensor w13 = Tensor::from_vector(w13v, {El, 2 * F, C}), w2 = Tensor::from_vector(w2v, {El, C, F});
  runtime::Stream stream;
  runtime::StreamGuard on(stream);
  auto skewed = [&](int pe, int round) {  // 20 + pe + round rows of expert 0, one of every other expert
    Source s;
    s.counts.assign(E, 1);
    s.counts[0] = 20 + pe + round;
    s.offsets.assign(E + 1, 0);
    for (int e = 0; e < E; ++e) s.offsets[size_t(e + 1)] = s.offsets[size_t(e)] + s.counts[size_t(e)];
    for (int64_t i = 0; i < s.offsets[E] * C; ++i) s.rows.push_back(float(pe * 1000 + round * 100) + float(i) * 0.5f);
    return s;
  };
  for (int round = 0; round < 3; ++round) {
    SCOPED_TRACE(::testing::Message() << "round " << round);
    std::vector<Source> all;
    std::vector<std::vector<int64_t>> counts;
    for (int p = 0; p < n; ++p) all.push_back(skewed(p, round)), counts.push_back(all.back().counts);
    const std::vector<int> plan = plan_shadows(counts, S, 0.0).shadowed;
    if (n > 1) {
      ASSERT_FALSE(plan.empty()) << "nothing shadowed: the test would show nothing";
    }
    auto shadowed = [&](int e) { return std::find(plan.begin(), plan.end(), e) != plan.end(); };
    const Source& mine = all[size_t(me)];
    const Tensor xp = rows_tensor(mine), offsets = Tensor::from_vector(mine.offsets, {E + 1});
    const auto d = experts.dispatch(xp, offsets, {0}, {w13, w2});
    const Tensor back = experts.combine(d.rows, d);  // identity experts
    const Tensor dy = ops::add(xp, xp);
    const Tensor drows = experts.combine_backward(dy, d);
    const Tensor dx = experts.dispatch_backward(drows, d);
    // parts: group i of PE p holds p * 1000 + i
    const int64_t groups = int64_t(El) * n + S, P13 = 2 * F * C;
    Tensor parts = Tensor::empty({groups, 2 * F, C});
    for (int64_t i = 0; i < groups; ++i) std::fill_n(parts.data<float>() + i * P13, P13, float(me * 1000 + i));
    d.exchange_parts(parts, 0);
    stream.synchronize();
    // the groups: my experts' rows from every source but the shadowed
    // experts' from others, then my rows of each slot's expert I do not own
    std::vector<float> want;
    std::vector<int64_t> want_off{0};
    for (int e = 0; e < El; ++e) {
      const int global = me * El + e;
      for (int s = 0; s < n; ++s) {
        const Source& x = all[size_t(s)];
        if (s != me && shadowed(global)) continue;
        want.insert(want.end(), x.rows.begin() + x.offsets[size_t(global)] * C,
                    x.rows.begin() + x.offsets[size_t(global + 1)] * C);
      }
      want_off.push_back(int64_t(want.size()) / C);
    }
    for (int k = 0; k < S; ++k) {
      if (k < int(plan.size()) && plan[size_t(k)] / El != me) {
        const int e = plan[size_t(k)];
        want.insert(want.end(), mine.rows.begin() + mine.offsets[size_t(e)] * C,
                    mine.rows.begin() + mine.offsets[size_t(e + 1)] * C);
      }
      want_off.push_back(int64_t(want.size()) / C);
    }
    EXPECT_EQ(std::vector<int64_t>(d.offsets.data<int64_t>(), d.offsets.data<int64_t>() + El + S + 1), want_off);
    ASSERT_GE(d.rows.size(0), int64_t(want.size()) / C);
    EXPECT_TRUE(std::equal(want.begin(), want.end(), d.rows.data<float>())) << "received and own shadow rows";
    EXPECT_EQ(0, std::memcmp(back.raw_data(), xp.raw_data(), xp.nbytes())) << "combine";
    EXPECT_EQ(0, std::memcmp(dx.raw_data(), dy.raw_data(), dy.nbytes())) << "dispatch backward";
    const std::vector<float> d2 = drows.to_float_vector();
    for (size_t i = 0; i < want.size(); ++i) ASSERT_EQ(d2[i], want[i] + want[i]) << "combine backward at " << i;
    // the weights of every group: mine, then each slot's expert's (zeros where I compute none)
    for (int k = 0; k < El + S; ++k) {
      const int slot = k - El;
      const int e = k < El ? me * El + k : slot < int(plan.size()) ? plan[size_t(slot)] : -1;
      std::vector<float> w = k < El || (e >= 0 && e / El != me) ? weights_of(e) : std::vector<float>(size_t(3 * F * C), 0.0f);
      EXPECT_TRUE(std::equal(w.begin(), w.begin() + P13, d.w13.data<float>() + k * P13)) << "w13 of group " << k;
      EXPECT_TRUE(std::equal(w.begin() + P13, w.end(), d.w2.data<float>() + k * F * C)) << "w2 of group " << k;
    }
    // the parts: where another source computed one of my shadowed experts,
    // its shadow group's part; everywhere else mine
    for (int64_t i = 0; i < groups; ++i) {
      float want_part = float(me * 1000 + i);
      if (i < int64_t(El) * n) {
        const int e = me * El + int(i / n), s = int(i % n);
        const auto k = std::find(plan.begin(), plan.end(), e) - plan.begin();
        if (s != me && shadowed(e)) want_part = float(s * 1000 + int64_t(El) * n + k);
      }
      EXPECT_EQ(parts.data<float>()[i * P13], want_part) << "part of group " << i;
      EXPECT_EQ(parts.data<float>()[i * P13 + P13 - 1], want_part) << "part of group " << i;
    }
  }
  shmem::barrier();
}

// A dispatch with shadow slots needs the layer's weights (a shadow of one of
// this PE's experts computes with them): without, a clear refusal.
TEST(ExpertParallel, ShadowsWithoutTheWeightsAreRefused) {
  const int me = shmem::my_pe(), n = shmem::n_pes();
  std::vector<int> world;
  for (int p = 0; p < n; ++p) world.push_back(p);
  ShmemExperts::Shape shape{E, C, R, -1, {0}};
  shape.hidden = 3, shape.balance = ExpertBalance::shadow;
  ShmemExperts experts(Group::of(world, me), shape);
  const Tensor rows = Tensor::zeros({R, C}), offsets = Tensor::zeros({E + 1}, DType::i64);
  try {
    experts.dispatch(rows, offsets, {0}, {});
    ADD_FAILURE() << "a dispatch with shadow slots and no weights was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("pass the layer's routed-expert weights"), std::string::npos) << e.what();
  }
  shmem::barrier();
}
