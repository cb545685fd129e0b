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

}  // namespace
}  // namespace coremesh::ops
