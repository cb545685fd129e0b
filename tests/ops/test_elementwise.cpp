// Element-wise ops against their references: add/mul, and the bias add
// (also in place), under every core limit of the harness.
#include "coremesh/ops/elementwise.hpp"
#include "harness.hpp"

namespace coremesh::ops {
namespace {

using namespace testing;

TEST(Elementwise, AddAndMulMatchTheirDefinition) {
  for_each_limit([](const LimitCase&) {
    Tensor a = randn({3, 70001}, 1), b = randn({3, 70001}, 2);
    Tensor s = add(a, b), p = mul(a, b);
    test_stream().synchronize();
    for (int64_t i = 0; i < a.numel(); i += 997) {
      EXPECT_EQ(s.data<float>()[i], a.data<float>()[i] + b.data<float>()[i]);
      EXPECT_EQ(p.data<float>()[i], a.data<float>()[i] * b.data<float>()[i]);
    }
  });
}

TEST(Elementwise, AddBiasMatchesTheReferenceAlsoInPlace) {
  for_each_limit([](const LimitCase&) {
    Tensor x = randn({4, 33, 129}, 3), bias = randn({129}, 4);
    Tensor y = add_bias(x, bias);
    Tensor z = x.clone();
    add_bias_out(z, bias, z);
    test_stream().synchronize();
    Tensor want = reference::add_bias(x, bias);
    EXPECT_TRUE(bitwise_equal(y, want));
    EXPECT_TRUE(bitwise_equal(z, want));
  });
}

TEST(Elementwise, AddBiasRefusesAMismatchedBias) {
  run_on_stream([] {
    EXPECT_THROW(add_bias(randn({4, 8}, 5), randn({7}, 6)), InvalidArgument);
    EXPECT_THROW(add_bias_out(randn({4, 8}, 5), randn({8}, 6), randn({4, 9}, 7)), InvalidArgument);
  });
}

// An output shifted over an input would read what the kernel already wrote:
// refused; exactly the input (in place) is fine.
TEST(Elementwise, AnOutputOverlappingAnInputIsRefusedUnlessInPlace) {
  run_on_stream([] {
    Tensor buf = randn({24}, 8);
    Tensor x = buf.slice(0, 0, 20), shifted = buf.slice(0, 4, 24), ones = randn({20}, 9);
    try {
      add_out(x, ones, shifted);
      ADD_FAILURE() << "a shifted output was accepted";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("overlaps a"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("in place"), std::string::npos) << e.what();
    }
    EXPECT_THROW(mul_out(ones, x, shifted), InvalidArgument);
    EXPECT_THROW(add_bias_out(x.view({4, 5}), buf.slice(0, 2, 7), x.view({4, 5})), InvalidArgument);
    const Tensor want = add(x, ones);
    add_out(x, ones, x);  // in place
    test_stream().synchronize();
    EXPECT_TRUE(bitwise_equal(x, want));
  });
}

}  // namespace
}  // namespace coremesh::ops
