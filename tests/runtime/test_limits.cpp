// Core limits: validation, resolution order, guards, capture at launch.
#include <memory>
#include <atomic>
#include <latch>
#include <thread>

#include "coremesh/core/error.hpp"
#include "helpers.hpp"

namespace coremesh::runtime {
namespace {

using namespace testing;

DeviceOptions spec_8x6() { return {.cores = 2, .cube_cores = 8, .vector_cores = 6}; }

TEST(Limits, DeviceLimitDefaultsToTheSpecAndResets) {
  Device device(spec_8x6());
  EXPECT_EQ(device.spec(), (CoreLimits{8, 6}));
  EXPECT_EQ(get_device_limit(device), (CoreLimits{8, 6}));
  set_device_limit(device, 3, 5);
  EXPECT_EQ(get_device_limit(device), (CoreLimits{3, 5}));
  set_device_limit(device, -1, 2);  // -1 leaves cube as it is
  EXPECT_EQ(get_device_limit(device), (CoreLimits{3, 2}));
  reset_device_limit(device);
  EXPECT_EQ(get_device_limit(device), (CoreLimits{8, 6}));
}

TEST(Limits, InvalidValuesAreRejectedWithAHint) {
  Device device(spec_8x6());
  Stream s(device);
  for (int bad : {0, -2, -100, 9}) {
    EXPECT_THROW(set_device_limit(device, bad, -1), InvalidArgument) << bad;
    EXPECT_THROW(set_stream_limit(s, bad, -1), InvalidArgument) << bad;
  }
  EXPECT_THROW(set_device_limit(device, -1, 7), InvalidArgument);
  try {
    set_stream_limit(s, 0, -1);
  } catch (const InvalidArgument& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("HINT"), std::string::npos) << what;
    EXPECT_NE(what.find("[1, 8]"), std::string::npos) << what;
  }
  // A rejected call changes nothing.
  EXPECT_EQ(get_device_limit(device), (CoreLimits{8, 6}));
  EXPECT_EQ(get_stream_limit(s), (CoreLimits{8, 6}));
}

TEST(Limits, StreamBeatsDeviceBeatsSpec) {
  Device device(spec_8x6());
  Stream s(device);
  EXPECT_EQ(get_stream_limit(s), (CoreLimits{8, 6}));
  set_device_limit(device, 4, 4);
  EXPECT_EQ(get_stream_limit(s), (CoreLimits{4, 4}));
  set_stream_limit(s, 2, -1);  // vector stays with the device
  EXPECT_EQ(get_stream_limit(s), (CoreLimits{2, 4}));
  set_stream_limit(s, 7, 6);  // a stream may use more than the device limit, up to the spec
  EXPECT_EQ(get_stream_limit(s), (CoreLimits{7, 6}));
  reset_stream_limit(s);
  EXPECT_EQ(get_stream_limit(s), (CoreLimits{4, 4}));
}

TEST(Limits, StreamLimitGuardScopesAndNests) {
  Device device(spec_8x6());
  Stream s(device);
  set_stream_limit(s, 5, -1);
  {
    StreamLimitGuard outer(s, 3, 2);
    EXPECT_EQ(current_stream(), s);
    EXPECT_EQ(current_limits(), (CoreLimits{3, 2}));
    {
      StreamLimitGuard inner(s, -1, 1);
      EXPECT_EQ(current_limits(), (CoreLimits{3, 1}));
    }
    EXPECT_EQ(current_limits(), (CoreLimits{3, 2}));
  }
  EXPECT_EQ(get_stream_limit(s), (CoreLimits{5, 6}));
  EXPECT_FALSE(current_stream() == s);
}

// Guards ended out of order (heap-held, or Python contexts of interleaved
// generators) still restore what was there before the first one.
TEST(Limits, GuardsEndedOutOfOrderRestoreTheLimitAndStreamBeforeThem) {
  Device device(spec_8x6());
  Stream s(device), other(device);
  set_stream_limit(s, 5, -1);
  const Stream before = current_stream();
  auto outer = std::make_unique<StreamLimitGuard>(s, 3, 2);
  auto inner = std::make_unique<StreamLimitGuard>(s, 2, 1);
  auto current = std::make_unique<StreamGuard>(other);
  outer.reset();  // ends first: the younger guards stay in force
  EXPECT_EQ(get_stream_limit(s), (CoreLimits{2, 1}));
  EXPECT_EQ(current_stream(), other);
  current.reset();
  EXPECT_EQ(current_stream(), s);
  inner.reset();  // the last one restores what was there before `outer`
  EXPECT_EQ(get_stream_limit(s), (CoreLimits{5, 6}));
  EXPECT_EQ(current_stream(), before);
}

TEST(Limits, GuardWithInvalidValueRestoresTheCurrentStream) {
  Device device(spec_8x6());
  Stream s(device);
  Stream before = current_stream();
  EXPECT_THROW(StreamLimitGuard(s, 0, 0), InvalidArgument);
  EXPECT_EQ(current_stream(), before);
}

TEST(Limits, LimitInForceIsCapturedAtLaunch) {
  Device device(spec_8x6());
  Stream s(device);
  ProfilerScope profile;
  std::latch release(1);
  set_stream_limit(s, 2, 3);
  s.launch({"held", KernelKind::vector, 1, 0}, [&](const BlockContext&) { release.wait(); });
  s.launch({"queued", KernelKind::cube, 2, 0}, [](const BlockContext&) {});
  set_stream_limit(s, 1, 1);  // changes after launch do not touch queued kernels
  release.count_down();
  s.synchronize();
  auto records = records_of(s);
  ASSERT_EQ(records.size(), 2u);
  EXPECT_EQ(records[1].name, "queued");
  EXPECT_EQ(records[1].limits, (CoreLimits{2, 3}));
  EXPECT_EQ(records[1].block_dim, 2);
}

TEST(Limits, EachThreadSeesTheLimitsOfItsCurrentStream) {
  Device device(spec_8x6());
  Stream a(device), b(device);
  set_stream_limit(a, 1, 2);
  set_stream_limit(b, 4, 5);
  std::atomic<bool> ok{true};
  auto check = [&](Stream& s, CoreLimits expected) {
    for (int i = 0; i < 1000; ++i) {
      StreamGuard g(i % 2 ? s : device.default_stream());
      CoreLimits want = i % 2 ? expected : device.limit();
      if (!(current_limits() == want)) ok = false;
    }
  };
  std::thread ta([&] { check(a, {1, 2}); });
  std::thread tb([&] { check(b, {4, 5}); });
  ta.join();
  tb.join();
  EXPECT_TRUE(ok);
}

TEST(Limits, MaxBlocksPerKind) {
  CoreLimits l{3, 5};
  EXPECT_EQ(max_blocks(l, KernelKind::cube), 3);
  EXPECT_EQ(max_blocks(l, KernelKind::vector), 5);
  EXPECT_EQ(max_blocks(l, KernelKind::comm), 5);
  EXPECT_EQ(max_blocks(l, KernelKind::mixed), 3);
}

}  // namespace
}  // namespace coremesh::runtime
