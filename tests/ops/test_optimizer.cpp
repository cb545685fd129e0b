// AdamW vs the double reference over several steps; clipping coefficient from
// partial sums; the clip factor flows into the update without host sync; the
// flat (arena + segments) variants vs the reference, across chunk boundaries,
// bitwise the same for every core limit, and their argument checks.
#include <cmath>
#include <cstring>
#include <functional>
#include <string>

#include "coremesh/core/error.hpp"
#include "coremesh/ops/optimizer.hpp"
#include "harness.hpp"

namespace coremesh::ops {
namespace {

using namespace testing;

TEST(OpsOptimizer, AdamWMatchesReference) {
  AdamWConfig cfg{1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f};
  for_each_limit([&](const LimitCase&) {
    Tensor p = randn({9001}, 1), m = Tensor::zeros({9001}), v = Tensor::zeros({9001});
    Tensor pr = p.clone(), mr = m.clone(), vr = v.clone();
    for (int64_t step = 1; step <= 3; ++step) {
      Tensor g = randn({9001}, 10 + step);
      adamw_step(p, g, m, v, cfg, step);
      test_stream().synchronize();
      reference::adamw_step(pr, g, mr, vr, cfg, step);
    }
    EXPECT_NMSE(p, pr, 1e-12);
    EXPECT_NMSE(m, mr, 1e-12);
    EXPECT_NMSE(v, vr, 1e-12);
  });
}

TEST(OpsOptimizer, ClipByGlobalNormFromPartials) {
  std::vector<Tensor> grads{randn({5000}, 2), randn({7, 3}, 3), Tensor::zeros({0}), randn({4097}, 4)};
  double want = 0;
  for (const Tensor& g : grads)
    for (float x : g.to_float_vector()) want += double(x) * x;
  for_each_limit([&](const LimitCase&) {
    Tensor s = grad_sq_sum(grads);
    // "All-reduce" over two PEs holding the same gradients: double the sum.
    Tensor s2 = grad_sq_sum({grads[0], grads[1], grads[2], grads[3], grads[0], grads[1], grads[3]});
    Tensor coef = clip_coefficient(s, 1.0f), none = clip_coefficient(s, 1e6f);
    test_stream().synchronize();
    EXPECT_NEAR(s.item({0}), want, want * 1e-6);
    EXPECT_NEAR(s2.item({0}), 2 * want - 0.0, want * 1e-5 + 1e-3);
    EXPECT_NEAR(coef.item({0}), 1.0 / (std::sqrt(want) + 1e-6), 1e-6);
    EXPECT_EQ(none.item({0}), 1.0f);
  });
  // Fused: the coefficient computed on the stream scales the update.
  AdamWConfig cfg{1e-2f, 0.9f, 0.99f, 1e-8f, 0.0f};
  Tensor p = randn({5000}, 5), m = Tensor::zeros({5000}), v = Tensor::zeros({5000});
  Tensor pr = p.clone(), mr = m.clone(), vr = v.clone();
  run_on_stream([&] { adamw_step(p, grads[0], m, v, cfg, 1, clip_coefficient(grad_sq_sum(grads), 1.0f)); });
  reference::adamw_step(pr, grads[0], mr, vr, cfg, 1, static_cast<float>(1.0 / (std::sqrt(want) + 1e-6)));
  EXPECT_NMSE(m, mr, 1e-10);
  EXPECT_NMSE(p, pr, 1e-10);
}

// An arena of n elements with segments at odd offsets and sizes: pieces that
// straddle chunk boundaries, end exactly on one, single elements, gaps
// (padding the kernels must not touch), given out of offset order.
constexpr int64_t kC = kOptimizerChunk;
const int64_t kArena = 3 * kC + 1237;
const std::vector<ParamSegment> kSegments{
    {kC - 5, 11, true},              // straddles the first chunk boundary
    {0, 1000, true},                 // then a gap [1000, 1003)
    {1003, kC - 5 - 1003, false},    // ends where the first segment starts
    {kC + 6, kC - 6, false},         // ends exactly on a chunk boundary
    {2 * kC, 1, true},               // one element; then a gap
    {2 * kC + 17, kC + 1200, true},  // crosses the last boundary, ends 20 before n
};

// Runs reference::adamw_step on each segment's slice (its own weight decay).
void reference_segments(const Tensor& p, const Tensor& g, const Tensor& m, const Tensor& v,
                        const std::vector<ParamSegment>& segments, AdamWConfig cfg, int64_t step,
                        float grad_scale) {
  const float wd = cfg.weight_decay;
  for (const ParamSegment& s : segments) {
    auto at = [&](const Tensor& t) { return t.slice(0, s.offset, s.offset + s.numel); };
    cfg.weight_decay = s.decay ? wd : 0.0f;
    reference::adamw_step(at(p), at(g), at(m), at(v), cfg, step, grad_scale);
  }
}

// True when the elements of a and b outside every segment are bitwise equal.
bool gaps_equal(const Tensor& a, const Tensor& b, const std::vector<ParamSegment>& segments) {
  std::vector<bool> covered(size_t(a.numel()), false);
  for (const ParamSegment& s : segments)
    for (int64_t i = s.offset; i < s.offset + s.numel; ++i) covered[size_t(i)] = true;
  for (int64_t i = 0; i < a.numel(); ++i)
    if (!covered[size_t(i)] && std::memcmp(a.data<float>() + i, b.data<float>() + i, 4) != 0) return false;
  return true;
}

TEST(OpsOptimizer, FlatSegmentsMatchReference) {
  AdamWConfig cfg{1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f};
  const Tensor p0 = randn({kArena}, 21), m0 = randn({kArena}, 22, 0.1f);
  const Tensor v0 = uniform({kArena}, 23, 0.0f, 0.02f);
  Tensor first;  // param after the first limit case: every limit must give the same bits
  for_each_limit([&](const LimitCase&) {
    Tensor p = p0.clone(), m = m0.clone(), v = v0.clone();
    Tensor pr = p.clone(), mr = m.clone(), vr = v.clone();
    for (int64_t step = 1; step <= 3; ++step) {
      Tensor g = randn({kArena}, 30 + step);
      Tensor scale = Tensor::from_vector<float>({0.5f}, {1});
      adamw_step(p, g, m, v, kSegments, cfg, step, scale);
      test_stream().synchronize();
      reference_segments(pr, g, mr, vr, kSegments, cfg, step, 0.5f);
    }
    EXPECT_NMSE(p, pr, 1e-12);
    EXPECT_NMSE(m, mr, 1e-12);
    EXPECT_NMSE(v, vr, 1e-12);
    EXPECT_TRUE(gaps_equal(p, p0, kSegments) && gaps_equal(m, m0, kSegments) && gaps_equal(v, v0, kSegments))
        << "elements outside the segments changed";
    if (!first.defined()) first = p;
    EXPECT_TRUE(bitwise_equal(p, first)) << "the result depends on the core limit";
  });
}

TEST(OpsOptimizer, FlatDecayFlagSelectsWeightDecay) {
  // Zero gradients and moments: the update is the decay alone.
  AdamWConfig cfg{0.5f, 0.9f, 0.95f, 1e-8f, 0.5f};
  Tensor p = Tensor::from_vector<float>({1, 1, 1, 1}, {4}), g = Tensor::zeros({4});
  Tensor m = Tensor::zeros({4}), v = Tensor::zeros({4});
  run_on_stream([&] { adamw_step(p, g, m, v, {{0, 1, true}, {1, 2, false}}, cfg, 1); });
  EXPECT_EQ(p.to_float_vector(), (std::vector<float>{0.75f, 1.0f, 1.0f, 1.0f}));
}

TEST(OpsOptimizer, FlatEqualsPerTensorBitwise) {
  // Pieces of every length 1..40 (vector body and scalar tail at every
  // offset) updated in one launch must give the bits of one launch per piece.
  AdamWConfig cfg{3e-3f, 0.9f, 0.95f, 1e-8f, 0.1f};
  std::vector<ParamSegment> segments;
  int64_t n = 0;
  for (int64_t len = 1; len <= 40; ++len) segments.push_back({n, len, len % 3 != 0}), n += len;
  const Tensor p0 = randn({n}, 41), g = randn({n}, 42), m0 = randn({n}, 43, 0.1f);
  const Tensor v0 = uniform({n}, 44, 0.0f, 0.02f);
  Tensor p = p0.clone(), m = m0.clone(), v = v0.clone();
  Tensor pt = p0.clone(), mt = m0.clone(), vt = v0.clone();
  run_on_stream([&] {
    adamw_step(p, g, m, v, segments, cfg, 7);
    for (const ParamSegment& s : segments) {
      auto at = [&](const Tensor& t) { return t.slice(0, s.offset, s.offset + s.numel); };
      AdamWConfig c = cfg;
      c.weight_decay = s.decay ? cfg.weight_decay : 0.0f;
      adamw_step(at(pt), at(g), at(mt), at(vt), c, 7);
    }
  });
  EXPECT_TRUE(bitwise_equal(p, pt));
  EXPECT_TRUE(bitwise_equal(m, mt));
  EXPECT_TRUE(bitwise_equal(v, vt));
  // And one segment over everything gives the bits of pieces with decay.
  for (ParamSegment& s : segments) s.decay = true;
  Tensor pa = p0.clone(), ma = m0.clone(), va = v0.clone();
  Tensor pb = p0.clone(), mb = m0.clone(), vb = v0.clone();
  run_on_stream([&] {
    adamw_step(pa, g, ma, va, segments, cfg, 7);
    adamw_step(pb, g, mb, vb, cfg, 7);
  });
  EXPECT_TRUE(bitwise_equal(pa, pb));
}

TEST(OpsOptimizer, FlatGradSqSumOverSegments) {
  Tensor g = randn({kArena}, 51);
  for (int64_t i = 0; i < kArena; ++i) g.data<float>()[i] += 1000.0f;  // large everywhere...
  double want = 0;
  for (const ParamSegment& s : kSegments)
    for (int64_t i = s.offset; i < s.offset + s.numel; ++i) want += double(g.data<float>()[i]) * g.data<float>()[i];
  Tensor first;
  for_each_limit([&](const LimitCase&) {
    Tensor s = grad_sq_sum(g, kSegments);  // ...so a counted gap would show
    test_stream().synchronize();
    EXPECT_NEAR(s.item({0}), want, want * 1e-6);
    if (!first.defined()) first = s;
    EXPECT_TRUE(bitwise_equal(s, first)) << "the sum depends on the core limit";
  });
  // Whole tensor as one segment equals the list API on the tensor alone.
  Tensor a, b;
  run_on_stream([&] {
    a = grad_sq_sum(g, {{0, kArena, false}});
    b = grad_sq_sum(std::vector<Tensor>{g});
  });
  EXPECT_TRUE(bitwise_equal(a, b));
  Tensor empty;
  run_on_stream([&] { empty = grad_sq_sum(g, {}); });
  EXPECT_EQ(empty.item({0}), 0.0f);
}

// A gradient cut at a chunk boundary into two pieces (as two PEs hold it):
// the pieces' partials side by side total to grad_sq_sum of the whole.
TEST(OpsOptimizer, PartialsOfPiecesTotalToTheWhole) {
  Tensor g = randn({kArena}, 52);
  const int64_t cut = kOptimizerChunk;  // kArena spans more than one chunk
  ASSERT_GT(kArena, cut);
  std::vector<ParamSegment> lo, hi;  // the segments clipped to each piece, relative to it
  for (const ParamSegment& s : kSegments) {
    if (s.offset < cut) lo.push_back({s.offset, std::min(s.numel, cut - s.offset), s.decay});
    if (s.offset + s.numel > cut) {
      const int64_t b = std::max(s.offset, cut);
      hi.push_back({b - cut, s.offset + s.numel - b, s.decay});
    }
  }
  Tensor whole, total;
  run_on_stream([&] {
    whole = grad_sq_sum(g, kSegments);
    const Tensor a = grad_sq_partials(g.slice(0, 0, cut), lo), b = grad_sq_partials(g.slice(0, cut, kArena), hi);
    Tensor both = Tensor::empty({a.numel() + b.numel()});
    test_stream().synchronize();  // host copies after the stream reached them
    both.slice(0, 0, a.numel()).copy_from(a);
    both.slice(0, a.numel(), both.numel()).copy_from(b);
    total = sum_partials(both);
  });
  EXPECT_TRUE(bitwise_equal(total, whole));
}

// Runs fn and returns the InvalidArgument message it throws ("" if none).
std::string invalid_argument_of(const std::function<void()>& fn) {
  try {
    run_on_stream(fn);
  } catch (const InvalidArgument& e) {
    return e.message();
  }
  return "";
}

TEST(OpsOptimizer, FlatRejectsBadArguments) {
  const AdamWConfig cfg;
  Tensor p = Tensor::zeros({100}), g = Tensor::zeros({100}), m = Tensor::zeros({100}), v = Tensor::zeros({100});
  auto step = [&](const Tensor& gg, const std::vector<ParamSegment>& s) {
    return invalid_argument_of([&] { adamw_step(p, gg, m, v, s, cfg, 1); });
  };
  auto sq = [&](const std::vector<ParamSegment>& s) { return invalid_argument_of([&] { grad_sq_sum(g, s); }); };
  EXPECT_NE(step(Tensor::zeros({99}), {{0, 10, true}}).find("must have shape [100]"), std::string::npos);
  for (const ParamSegment& bad : {ParamSegment{95, 6, true}, ParamSegment{-1, 2, true}, ParamSegment{101, 0, true},
                                  ParamSegment{0, -1, true}}) {
    SCOPED_TRACE(::testing::Message() << "segment [" << bad.offset << ", +" << bad.numel << ")");
    EXPECT_NE(step(g, {{0, 10, true}, bad}).find("segment 1 ["), std::string::npos);
    EXPECT_NE(step(g, {{0, 10, true}, bad}).find("outside the tensor of 100 elements"), std::string::npos);
    EXPECT_NE(sq({bad}).find("outside the tensor of 100 elements"), std::string::npos);
  }
  EXPECT_EQ(step(g, {{50, 10, true}, {20, 30, false}}), "");  // out of order, touching: fine
  EXPECT_EQ(step(g, {{50, 10, true}, {20, 31, false}}), "segment 1 [20, 51) overlaps segment 0 [50, 60)");
  EXPECT_NE(sq({{0, 10, false}, {5, 1, false}}).find("overlaps"), std::string::npos);
  EXPECT_EQ(step(g, {{5, 0, true}, {0, 10, false}}), "");  // empty segments overlap nothing
  // hyperparameters that would make every parameter nan or inf at once
  for (auto bad : std::vector<std::function<void(AdamWConfig&)>>{
           [](AdamWConfig& c) { c.beta1 = 1; }, [](AdamWConfig& c) { c.beta2 = 1; }, [](AdamWConfig& c) { c.beta2 = -0.1f; },
           [](AdamWConfig& c) { c.eps = 0; }, [](AdamWConfig& c) { c.lr = std::nanf(""); },
           [](AdamWConfig& c) { c.weight_decay = INFINITY; }}) {
    AdamWConfig c;
    bad(c);
    EXPECT_NE(invalid_argument_of([&] { adamw_step(p, g, m, v, {{0, 100, true}}, c, 1); }).find("adamw"), std::string::npos);
  }
}

// The lr and step read from tensors as the kernel runs: the same bits as
// the values given at launch, and a later write of the tensors reaches the
// next run (what a replayed graph relies on).
TEST(OpsOptimizer, StepValuesReadWhenTheKernelRuns) {
  AdamWConfig cfg{1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f};
  const std::vector<ParamSegment> segs{{0, 5000, true}, {5000, 4001, false}};
  Tensor p = randn({9001}, 1), m = Tensor::zeros({9001}), v = Tensor::zeros({9001});
  Tensor pr = p.clone(), mr = m.clone(), vr = v.clone();
  AdamWStepValues at{Tensor::zeros({1}), Tensor::zeros({1}, DType::i64)};
  const float lrs[] = {1e-2f, 3e-3f, 7e-4f};
  for (int64_t step = 1; step <= 3; ++step) {
    Tensor g = randn({9001}, 10 + step);
    at.lr.data<float>()[0] = lrs[step - 1];
    at.step.data<int64_t>()[0] = step;
    AdamWConfig c = cfg;
    c.lr = lrs[step - 1];
    run_on_stream([&] {
      adamw_step(p, g, m, v, segs, cfg, at);
      adamw_step(pr, g, mr, vr, segs, c, step);
    });
  }
  EXPECT_EQ(0, std::memcmp(p.raw_data(), pr.raw_data(), p.nbytes()));
  EXPECT_EQ(0, std::memcmp(m.raw_data(), mr.raw_data(), m.nbytes()));
  EXPECT_EQ(0, std::memcmp(v.raw_data(), vr.raw_data(), v.nbytes()));
  const Tensor g = randn({9001}, 20);
  EXPECT_NE(invalid_argument_of([&] { adamw_step(p, g, m, v, segs, cfg, AdamWStepValues{at.lr, {}}); })
                .find("need both tensors (lr given, step missing)"),
            std::string::npos);
  EXPECT_NE(invalid_argument_of([&] { adamw_step(p, g, m, v, segs, cfg, AdamWStepValues{at.lr, at.lr}); })
                .find("step is"),
            std::string::npos);
  // one memory for two of the states (or the gradient) mixes them: refused
  EXPECT_NE(invalid_argument_of([&] { adamw_step(p, g, m, m, segs, cfg, 1); }).find("overlaps"), std::string::npos);
  EXPECT_NE(invalid_argument_of([&] { adamw_step(p, p, m, v, segs, cfg, 1); }).find("overlaps"), std::string::npos);
}

}  // namespace
}  // namespace coremesh::ops
