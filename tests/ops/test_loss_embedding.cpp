// Cross-entropy (stable, ignore_index) and embedding lookup/backward.
#include "coremesh/ops/embedding.hpp"
#include "coremesh/ops/loss.hpp"
#include "harness.hpp"

#include <limits>

namespace coremesh::ops {
namespace {

using namespace testing;

TEST(OpsLoss, CrossEntropyForwardBackward) {
  const int64_t N = 23, V = 517;
  Tensor logits = randn({N, V}, 1, 3.0f);
  Tensor targets = randint({N}, 2, 0, V);
  targets.data<int64_t>()[4] = -100;  // ignored row
  Tensor dloss = uniform({N}, 3, 0.1f, 1.0f);
  CrossEntropyOut ref = reference::cross_entropy(logits, targets);
  Tensor dref = reference::cross_entropy_backward(dloss, logits, targets, ref.lse);
  for_each_limit([&](const LimitCase&) {
    CrossEntropyOut out = cross_entropy(logits, targets);
    Tensor d = cross_entropy_backward(dloss, logits, targets, ref.lse);
    Tensor out32 = cross_entropy(logits, targets.to(DType::i32)).loss;
    test_stream().synchronize();
    EXPECT_NMSE(out.loss, ref.loss, 1e-12);
    EXPECT_NMSE(out.lse, ref.lse, 1e-12);
    EXPECT_NMSE(d, dref, 1e-11);
    EXPECT_TRUE(bitwise_equal(out32, out.loss));
  });
  EXPECT_EQ(ref.loss.item({4}), 0.0f);
  // Finite differences on a small case.
  Tensor z = randn({3, 7}, 4), t = randint({3}, 5, 0, 7), dl = randn({3}, 6), g;
  run_on_stream([&] { g = cross_entropy_backward(dl, z, t, cross_entropy(z, t).lse); });
  EXPECT_LT(grad_check(z, g, [&] {
              Tensor l;
              run_on_stream([&] { l = cross_entropy(z, t).loss; });
              return dot(l, dl);
            }), 1e-2);
}

TEST(OpsLoss, StableForHugeLogitsAndRejectsBadTargets) {
  Tensor z = Tensor::from_vector<float>({1e4f, 0.0f, -1e4f, 5e3f}, {2, 2});
  Tensor t = Tensor::from_vector<int64_t>({1, 0}, {2});
  CrossEntropyOut o;
  run_on_stream([&] { o = cross_entropy(z, t); });
  EXPECT_FLOAT_EQ(o.loss.item({0}), 1e4f);
  EXPECT_NEAR(o.loss.item({1}), 1.5e4f, 1.0f);
  runtime::StreamGuard guard(test_stream());
  cross_entropy(z, Tensor::from_vector<int64_t>({2, 0}, {2}));
  EXPECT_THROW(test_stream().synchronize(), Error);
}

TEST(OpsEmbedding, LookupAndBackward) {
  const int64_t V = 50, C = 37;
  Tensor table = randn({V, C}, 7);
  Tensor ids = randint({3, 11}, 8, 0, V);
  ids.data<int64_t>()[0] = ids.data<int64_t>()[1] = 5;  // repeated ids accumulate
  Tensor dy = randn({3, 11, C}, 9);
  Tensor ref = reference::embedding(table, ids), dref = reference::embedding_backward(dy, ids, V);
  for_each_limit([&](const LimitCase&) {
    Tensor out = embedding(table, ids);
    Tensor d = embedding_backward(dy, ids, V);
    Tensor d32 = embedding_backward(dy, ids.to(DType::i32), V);
    test_stream().synchronize();
    EXPECT_TRUE(bitwise_equal(out, ref));
    EXPECT_NMSE(d, dref, 1e-12);
    EXPECT_TRUE(bitwise_equal(d32, d));
    // In place: beta 1 adds onto the table gradient, beta 0 only writes it.
    Tensor acc = table.clone(), fresh = Tensor::full({V, C}, std::numeric_limits<float>::quiet_NaN());
    embedding_backward_into(dy, ids, acc, 1.0f);
    embedding_backward_into(dy, ids, fresh, 0.0f);
    test_stream().synchronize();
    Tensor want = dref.clone();
    for (int64_t i = 0; i < want.numel(); ++i) want.data<float>()[i] += table.data<float>()[i];
    EXPECT_NMSE(acc, want, 1e-12);
    EXPECT_NMSE(fresh, dref, 1e-12);
  });
  EXPECT_THROW(embedding_backward_into(dy, ids, Tensor::zeros({V, C + 1})), InvalidArgument);
  Tensor g;
  run_on_stream([&] { g = embedding_backward(dy, ids, V); });
  EXPECT_LT(grad_check(table, g, [&] {
              Tensor o;
              run_on_stream([&] { o = embedding(table, ids); });
              return dot(o, dy);
            }, 1e-2f, 40), 1e-2);
}

// Vocabulary parallelism: P slices of the logits' columns, their stats summed
// in slice order (as the all-reduce does), give the whole cross entropy, and
// each slice's backward is its columns of the whole one.
TEST(OpsLoss, VocabularySlicesGiveTheWholeCrossEntropy) {
  const int64_t N = 19, V = 516;
  Tensor logits = randn({N, V}, 11, 3.0f);
  Tensor targets = randint({N}, 12, 0, V);
  targets.data<int64_t>()[3] = -100;
  Tensor dloss = uniform({N}, 13, 0.1f, 1.0f);
  const CrossEntropyOut ref = reference::cross_entropy(logits, targets);
  const Tensor dref = reference::cross_entropy_backward(dloss, logits, targets, ref.lse);
  for (int64_t P : {1, 2, 3, 4}) {
    SCOPED_TRACE(P);
    const int64_t Vl = V / P;
    Tensor summed = Tensor::zeros({P + 1, N});
    std::vector<Tensor> slices;
    for (int64_t r = 0; r < P; ++r) {
      slices.push_back(logits.slice(1, r * Vl, (r + 1) * Vl).contiguous());
      Tensor st;
      run_on_stream([&] { st = cross_entropy_slice_stats(slices.back(), targets, {r * Vl, V}); });
      ASSERT_EQ(st.shape(), Shape({P + 1, N}));
      for (int64_t i = 0; i < st.numel(); ++i) summed.data<float>()[i] += st.data<float>()[i];
    }
    CrossEntropyOut out;
    run_on_stream([&] { out = cross_entropy_from_slice_stats(summed, targets); });
    EXPECT_NMSE(out.loss, ref.loss, 1e-12);
    EXPECT_NMSE(out.lse, ref.lse, 1e-12);
    EXPECT_EQ(out.loss.item({3}), 0.0f);
    if (P == 1) {  // one slice: the whole op's bits
      CrossEntropyOut whole;
      run_on_stream([&] { whole = cross_entropy(logits, targets); });
      EXPECT_TRUE(bitwise_equal(out.loss, whole.loss));
      EXPECT_TRUE(bitwise_equal(out.lse, whole.lse));
    }
    for (int64_t r = 0; r < P; ++r) {
      Tensor d;
      run_on_stream([&] { d = cross_entropy_backward(dloss, slices[size_t(r)], targets, out.lse, -100, {r * Vl, V}); });
      EXPECT_NMSE(d, dref.slice(1, r * Vl, (r + 1) * Vl).contiguous(), 1e-11);
    }
  }
  runtime::StreamGuard guard(test_stream());
  EXPECT_THROW(cross_entropy_slice_stats(logits.slice(1, 0, 100).contiguous(), targets, {0, V}), InvalidArgument);
  EXPECT_THROW(cross_entropy_slice_stats(logits, targets, {1, V}), InvalidArgument);
}

TEST(OpsEmbedding, VocabularySlicesSumToTheWholeLookup) {
  const int64_t V = 48, C = 21, P = 3, Vl = V / P;
  Tensor table = randn({V, C}, 14);
  Tensor ids = randint({4, 9}, 15, 0, V).to(DType::i32);
  Tensor dy = randn({4, 9, C}, 16);
  const Tensor ref = reference::embedding(table, ids), dref = reference::embedding_backward(dy, ids, V);
  Tensor sum = Tensor::zeros(ref.shape());
  for (int64_t r = 0; r < P; ++r) {
    const Tensor part = table.slice(0, r * Vl, (r + 1) * Vl).contiguous();
    Tensor out, d = Tensor::full({Vl, C}, 7.0f);
    run_on_stream([&] {
      out = embedding(part, ids, {r * Vl, V});
      embedding_backward_into(dy, ids, d, 0.0f, {r * Vl, V});
    });
    for (int64_t i = 0; i < sum.numel(); ++i) sum.data<float>()[i] += out.data<float>()[i];
    EXPECT_TRUE(bitwise_equal(d, dref.slice(0, r * Vl, (r + 1) * Vl)));
  }
  EXPECT_TRUE(bitwise_equal(sum, ref));  // one non-zero term per entry
  runtime::StreamGuard guard(test_stream());
  EXPECT_THROW(embedding(table.slice(0, 0, Vl).contiguous(), ids, {2 * Vl + 1, V}), InvalidArgument);
}

}  // namespace
}  // namespace coremesh::ops
