// Transpose of the last two dimensions vs the naive reference: every dtype
// (random bit patterns, NaN payloads included), odd sizes around the tile and
// the 8x8 AVX2 blocks, leading batch dimensions, bitwise equality, sentinels.
#include <random>

#include "coremesh/ops/transpose.hpp"
#include "harness.hpp"

namespace coremesh::ops {
namespace {

using namespace testing;

// A tensor of `shape` and `dtype` filled with random bytes.
Tensor random_bits(const Shape& shape, DType dtype, uint64_t seed) {
  Tensor t = Tensor::empty(shape, dtype);
  std::mt19937_64 rng(seed);
  uint8_t* p = static_cast<uint8_t*>(t.raw_data());
  for (size_t i = 0; i < t.nbytes(); ++i) p[i] = static_cast<uint8_t>(rng());
  return t;
}

Shape transposed(Shape s) {
  std::swap(s[s.size() - 2], s[s.size() - 1]);
  return s;
}

TEST(OpsTranspose, EveryDtypeBitExact) {
  const std::vector<Shape> shapes{{1, 1},     {3, 5},        {8, 8},         {7, 9},
                                  {33, 65},   {64, 64},      {65, 130},      {1, 200},
                                  {200, 1},   {2, 130, 47},  {2, 3, 31, 97}, {129, 257}};
  const DType dtypes[] = {DType::f32, DType::bf16, DType::f8e4m3, DType::f8e5m2, DType::i32, DType::i64};
  uint64_t seed = 1;
  for (DType dtype : dtypes) {
    for (const Shape& shape : shapes) {
      SCOPED_TRACE(::testing::Message() << dtype_name(dtype) << " " << shape_str(shape));
      const Tensor x = random_bits(shape, dtype, seed++);
      const Tensor ref = reference::transpose(x);
      for_each_limit([&](const LimitCase&) {
        Guarded y(transposed(shape), dtype);
        transpose_out(x, y.tensor);
        test_stream().synchronize();
        EXPECT_TRUE(bitwise_equal(y.tensor, ref));
        EXPECT_TRUE(y.intact());
      });
    }
  }
}

TEST(OpsTranspose, MatchesTheStridedView) {
  const Tensor x = randn({3, 70, 45}, 2);
  Tensor y;
  run_on_stream([&] { y = transpose(x); });
  EXPECT_EQ(y.shape(), (Shape{3, 45, 70}));
  EXPECT_TRUE(bitwise_equal(y, x.transpose(1, 2).contiguous()));
  // Twice is the identity (and the backward of transpose is transpose).
  Tensor back;
  run_on_stream([&] { back = transpose(y); });
  EXPECT_TRUE(bitwise_equal(back, x));
}

TEST(OpsTranspose, EmptyAndInvalid) {
  Tensor y;
  run_on_stream([&] { y = transpose(Tensor::empty({4, 0, 3})); });
  EXPECT_EQ(y.shape(), (Shape{4, 3, 0}));
  EXPECT_THROW(transpose(Tensor::empty({5})), InvalidArgument);
  EXPECT_THROW(transpose(randn({4, 6}, 3).transpose(0, 1)), InvalidArgument);  // not contiguous
  EXPECT_THROW(transpose_out(randn({4, 6}, 3), Tensor::empty({4, 6})), InvalidArgument);
  EXPECT_THROW(transpose_out(randn({4, 6}, 3), Tensor::empty({6, 4}, DType::bf16)), InvalidArgument);
  Tensor square = randn({8, 8}, 4);
  EXPECT_THROW(transpose_out(square, square), InvalidArgument);  // in place would mix the halves
}

}  // namespace
}  // namespace coremesh::ops
