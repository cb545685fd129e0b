// Tensor, storage, errors, logging and environment parsing.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>

#include "coremesh/core/env.hpp"
#include "coremesh/core/error.hpp"
#include "coremesh/core/log.hpp"
#include "coremesh/core/tensor.hpp"

namespace coremesh {
namespace {

TEST(Tensor, StorageIs64ByteAlignedAndContiguous) {
  for (int64_t n : {1, 3, 17, 1000}) {
    Tensor t = Tensor::zeros({n, 3});
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t.raw_data()) % 64, 0u);
    EXPECT_TRUE(t.is_contiguous());
    EXPECT_EQ(t.strides(), (Shape{3, 1}));
    EXPECT_EQ(t.nbytes(), static_cast<size_t>(n * 3 * 4));
  }
}

TEST(Tensor, ViewsShareStorage) {
  Tensor t = Tensor::from_vector<float>({0, 1, 2, 3, 4, 5}, {2, 3});
  Tensor v = t.view({3, 2});
  v.data<float>()[5] = 50;
  EXPECT_EQ(t.item({1, 2}), 50);
  Tensor row = t.select(0, 1);
  EXPECT_EQ(row.shape(), (Shape{3}));
  EXPECT_EQ(row.item({0}), 3);
  Tensor cols = t.slice(1, 1, 3);
  EXPECT_EQ(cols.shape(), (Shape{2, 2}));
  EXPECT_FALSE(cols.is_contiguous());
  EXPECT_EQ(cols.item({1, 0}), 4);
  Tensor tr = t.transpose(0, 1);
  EXPECT_EQ(tr.shape(), (Shape{3, 2}));
  EXPECT_EQ(tr.item({2, 1}), 50);
  EXPECT_EQ(t.storage().use_count(), 5);
  // no elements, no order: a transposed empty tensor is contiguous (ops refused it)
  EXPECT_TRUE(Tensor::zeros({0, 3}).transpose(0, 1).is_contiguous());
}

// A copy from a view of the same memory (here its own transpose) reads every
// element before it writes one; element by element it read overwritten ones.
TEST(Tensor, CopyFromAnOverlappingViewReadsBeforeItWrites) {
  Tensor t = Tensor::from_vector<float>({1, 2, 3, 4}, {2, 2});
  t.copy_from(t.transpose(0, 1));
  EXPECT_EQ(t.to_float_vector(), (std::vector<float>{1, 3, 2, 4}));
  Tensor shifted = Tensor::from_vector<float>({1, 2, 3, 4, 5, 6}, {6});
  Tensor a = shifted.slice(0, 0, 4).view({2, 2}).transpose(0, 1);
  Tensor b = shifted.slice(0, 2, 6).view({2, 2});
  b.copy_from(a);  // a reads elements 0..3, b writes 2..5
  EXPECT_EQ(shifted.to_float_vector(), (std::vector<float>{1, 2, 1, 3, 2, 4}));
  EXPECT_FALSE(Tensor::zeros({2}).overlaps(Tensor::zeros({2})));
  EXPECT_TRUE(shifted.slice(0, 1, 3).overlaps(shifted.slice(0, 2, 4)));
  EXPECT_FALSE(shifted.slice(0, 0, 2).overlaps(shifted.slice(0, 2, 4)));
}

TEST(Tensor, ContiguousCopiesStridedViewsInOrder) {
  Tensor t = Tensor::from_vector<float>({0, 1, 2, 3, 4, 5}, {2, 3});
  Tensor c = t.transpose(0, 1).contiguous();
  EXPECT_TRUE(c.is_contiguous());
  EXPECT_EQ(c.to_float_vector(), (std::vector<float>{0, 3, 1, 4, 2, 5}));
  EXPECT_NE(c.storage(), t.storage());
}

TEST(Tensor, FillWritesEveryDtypeAndOnlyTheView) {
  for (DType dt : {DType::f32, DType::bf16, DType::f8e4m3, DType::i32, DType::i64}) {
    for (float value : {0.0f, -0.0f, 1.5f}) {
      Tensor t = Tensor::full({4, 5}, 3.0f, dt);
      t.fill(value);
      const bool integer = dt == DType::i32 || dt == DType::i64;
      for (float x : t.to_float_vector()) {
        EXPECT_EQ(x, integer ? std::trunc(value) : value);
        EXPECT_TRUE(integer || std::signbit(x) == std::signbit(value));
      }
    }
    Tensor t = Tensor::full({4, 5}, 3.0f, dt);
    t.slice(1, 1, 3).fill(0.0f);  // strided view: columns 1 and 2 only
    for (int64_t r = 0; r < 4; ++r) {
      for (int64_t c = 0; c < 5; ++c) EXPECT_EQ(t.item({r, c}), c == 1 || c == 2 ? 0.0f : 3.0f);
    }
  }
}

TEST(Tensor, ViewInfersOneDimension) {
  Tensor t = Tensor::zeros({4, 6});
  EXPECT_EQ(t.view({-1, 3}).shape(), (Shape{8, 3}));
  EXPECT_THROW(t.view({-1, -1}), InvalidArgument);
  EXPECT_THROW(t.view({5, 5}), InvalidArgument);
  EXPECT_THROW(t.transpose(0, 1).view({24}), InvalidArgument);
}

TEST(Tensor, ConvertsBetweenDtypes) {
  Tensor t = Tensor::from_vector<float>({1.0f, -2.5f, 1000.0f, 3.0e-3f}, {4});
  EXPECT_EQ(t.to(DType::bf16).to(DType::f32).to_float_vector(),
            (std::vector<float>{1.0f, -2.5f, 1000.0f, to_float(to_bf16(3.0e-3f))}));
  EXPECT_EQ(t.to(DType::f8e4m3).to_float_vector(), (std::vector<float>{1.0f, -2.5f, 448.0f,
                                                                     to_float(to_f8e4m3(3.0e-3f))}));
  EXPECT_EQ(t.to(DType::i32).to_float_vector(), (std::vector<float>{1, -2, 1000, 0}));
}

TEST(Tensor, BadUseGivesAHint) {
  Tensor t = Tensor::zeros({2, 2});
  try {
    t.data<int32_t>();
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("HINT"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("tensor.hpp"), std::string::npos) << e.what();
  }
  EXPECT_THROW(t.slice(0, 1, 3), InvalidArgument);
  EXPECT_THROW(t.select(2, 0), InvalidArgument);
  EXPECT_THROW(t.item({2, 0}), InvalidArgument);
  EXPECT_THROW(Tensor::empty({-1}), InvalidArgument);
  EXPECT_THROW(Tensor::empty({3, int64_t{0x5555555555555556}}), InvalidArgument);  // numel wraps to 2
  EXPECT_THROW(Tensor::empty({int64_t{1} << 61}), InvalidArgument);                  // bytes wrap
  EXPECT_THROW(t.view({-2, -2}), InvalidArgument);
  EXPECT_THROW(Tensor::zeros({2}).view({3, int64_t{0x5555555555555556}}), InvalidArgument);
  for (float bad : {std::nanf(""), 1e20f, -1e20f, 2147483648.0f})  // not saturated to INT_MIN
    EXPECT_THROW(Tensor::full({1}, bad).to(DType::i32), InvalidArgument) << bad;
  EXPECT_THROW(Tensor::full({1}, std::numeric_limits<float>::infinity(), DType::i64), InvalidArgument);
  EXPECT_EQ(Tensor::full({1}, -2147483648.0f).to(DType::i32).data<int32_t>()[0], INT32_MIN);
  // integer to integer: exact (a float has 24 bits), range-checked
  Tensor big = Tensor::from_vector<int64_t>({2147483647, -2147483647 - 1, 16777217}, {3});
  EXPECT_EQ(big.to(DType::i32).data<int32_t>()[0], INT32_MAX);
  EXPECT_EQ(big.to(DType::i32).data<int32_t>()[2], 16777217);
  EXPECT_THROW(Tensor::from_vector<int64_t>({int64_t{1} << 40}, {1}).to(DType::i32), InvalidArgument);
  EXPECT_EQ(Tensor().numel(), 0);  // no storage, no elements (a 0-d tensor has one)
  EXPECT_EQ(Tensor().nbytes(), 0u);
  EXPECT_EQ(Tensor::zeros({}).numel(), 1);
  EXPECT_THROW(Tensor().raw_data(), InvalidArgument);
  EXPECT_THROW(Tensor().item({}), InvalidArgument);  // these read through the null storage
  EXPECT_THROW(Tensor().to(DType::bf16), InvalidArgument);
  EXPECT_THROW(Tensor().to_float_vector(), InvalidArgument);
  EXPECT_THROW(t.copy_from(Tensor()), InvalidArgument);
  EXPECT_THROW(Tensor::wrap(nullptr, {4}, DType::f32), InvalidArgument);
  EXPECT_EQ(Tensor::wrap(nullptr, {0}, DType::f32).numel(), 0);
  EXPECT_THROW((Tensor::from_vector<float>({1, 2, 3}, {2, 2})), InvalidArgument);
}

TEST(Tensor, WrapKeepsTheOwnerAlive) {
  auto owner = std::make_shared<std::vector<float>>(6, 1.5f);
  std::weak_ptr<std::vector<float>> weak = owner;
  Tensor t = Tensor::wrap(owner->data(), {2, 3}, DType::f32, owner);
  owner.reset();
  EXPECT_FALSE(weak.expired());
  EXPECT_EQ(t.item({1, 2}), 1.5f);
  t = Tensor();
  EXPECT_TRUE(weak.expired());
}

TEST(Error, CarriesFileLineAndHint) {
  try {
    CM_CHECK(1 + 1 == 3, "fix the arithmetic", "math is broken: {}", 42);
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_EQ(e.message(), "math is broken: 42");
    EXPECT_EQ(e.hint(), "fix the arithmetic");
    EXPECT_GT(e.line(), 0);
    EXPECT_NE(std::string(e.what()).find("test_tensor.cpp:"), std::string::npos);
  }
}

TEST(Log, LevelsParseAndFilter) {
  EXPECT_EQ(parse_log_level("DEBUG"), LogLevel::debug);
  EXPECT_EQ(parse_log_level("warning"), LogLevel::warn);
  EXPECT_THROW(parse_log_level("loud"), InvalidArgument);
  const LogLevel saved = log_level();
  set_log_level(LogLevel::error);
  ::testing::internal::CaptureStderr();
  CM_LOG_INFO("hidden {}", 1);
  CM_LOG_ERROR("shown {}", 2);
  const std::string out = ::testing::internal::GetCapturedStderr();
  set_log_level(saved);
  EXPECT_EQ(out.find("hidden"), std::string::npos);
  EXPECT_NE(out.find("shown 2"), std::string::npos);
}

TEST(Env, ParsesNumbersAndSizes) {
  setenv("COREMESH_TEST_INT", "12", 1);
  setenv("COREMESH_TEST_BAD", "12x", 1);
  EXPECT_EQ(env::get_int("COREMESH_TEST_INT", 0), 12);
  EXPECT_EQ(env::get_int("COREMESH_TEST_UNSET", 7), 7);
  EXPECT_THROW(env::get_int("COREMESH_TEST_BAD", 0), InvalidArgument);
  EXPECT_EQ(env::parse_size("4096"), 4096);
  EXPECT_EQ(env::parse_size("64M"), 64ll << 20);
  EXPECT_EQ(env::parse_size("2G"), 2ll << 30);
  EXPECT_THROW(env::parse_size("3X"), InvalidArgument);
  EXPECT_THROW(env::parse_size("-1"), InvalidArgument);
}

// OpenSHMEM waits block until their condition holds: 0, inf and off turn the
// watchdog off; values past any clock's range are capped (1e10 s overflowed
// the nanosecond deadline into the past: every wait failed at once).
TEST(Env, WaitTimeoutZeroOrInfiniteMeansNoWatchdog) {
  const auto timeout_with = [](const char* value) {
    setenv("COREMESH_WAIT_TIMEOUT_S", value, 1);
    return env::wait_timeout_s();
  };
  const char* saved = std::getenv("COREMESH_WAIT_TIMEOUT_S");
  const std::string restore = saved ? saved : "";
  EXPECT_EQ(timeout_with("60"), 60.0);
  EXPECT_EQ(timeout_with("0.5"), 0.5);
  for (const char* none : {"0", "inf", "off", "1e10", "1e300"}) EXPECT_EQ(timeout_with(none), env::kNoWatchdogS) << none;
  EXPECT_LT(std::chrono::steady_clock::now().time_since_epoch() + std::chrono::seconds(int64_t(env::kNoWatchdogS)),
            std::chrono::steady_clock::duration::max());
  EXPECT_THROW(timeout_with("-1"), InvalidArgument);
  EXPECT_THROW(timeout_with("nan"), InvalidArgument);
  EXPECT_THROW(timeout_with("soon"), InvalidArgument);
  if (saved) setenv("COREMESH_WAIT_TIMEOUT_S", restore.c_str(), 1);
  else unsetenv("COREMESH_WAIT_TIMEOUT_S");
}

}  // namespace
}  // namespace coremesh
