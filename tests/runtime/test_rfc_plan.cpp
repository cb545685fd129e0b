// The RFC's test plan (测试设计), on the CPU backend: multi-stream overlap,
// execution order through events, device/stream core limits read back from
// kernel_details.csv, the cross test and the op cache.
#include <atomic>

#include "coremesh/ops/elementwise.hpp"
#include "coremesh/ops/gemm.hpp"
#include "coremesh/runtime/op_cache.hpp"
#include "helpers.hpp"

namespace coremesh::runtime {
namespace {

using namespace testing;

using Operands = RfcOperands;

std::vector<std::map<std::string, std::string>> export_csv(const std::string& name) {
  const std::string dir = temp_dir(name);
  auto files = profiler_export(dir);
  return read_csv(files[0]);
}

std::vector<std::map<std::string, std::string>> rows_named(
    const std::vector<std::map<std::string, std::string>>& rows, const std::string& name) {
  std::vector<std::map<std::string, std::string>> out;
  for (auto& r : rows)
    if (r.at("name") == name) out.push_back(r);
  return out;
}

// 多流 1: dual stream, single op each: matmul on S1 overlaps add on S2.
TEST(RfcMultiStream, DualStreamSingleOpOverlaps) {
  Device device(rfc_device());
  Stream s1 = device.default_stream(), s2(device);
  Operands t;
  ProfilerScope profile;
  {
    StreamLimitGuard g(s1, 2, -1);
    ops::matmul(Tensor::full({1024, 1024}, 0.1f), Tensor::full({1024, 1024}, 0.1f));
  }
  {
    StreamLimitGuard g(s2, -1, 2);
    for (int i = 0; i < 8; ++i) ops::add(t.x, t.y);
  }
  device.synchronize();
  EXPECT_TRUE(any_overlap(records_of(s1), records_of(s2)));
}

// 多流 2: dual stream, several matmul/add on each.
TEST(RfcMultiStream, DualStreamMultiOpOverlaps) {
  Device device(rfc_device());
  Stream s1 = device.default_stream(), s2(device);
  Operands t;
  ProfilerScope profile;
  set_stream_limit(s1, 2, 2);
  set_stream_limit(s2, 2, 2);
  for (int i = 0; i < 4; ++i) {
    {
      StreamGuard g(s1);
      ops::matmul(t.a, t.b);
      ops::add(t.x, t.y);
    }
    {
      StreamGuard g(s2);
      ops::add(t.x, t.y);
      ops::matmul(t.a, t.b);
    }
  }
  device.synchronize();
  EXPECT_EQ(records_of(s1).size(), 8u);
  EXPECT_EQ(records_of(s2).size(), 8u);
  EXPECT_TRUE(any_overlap(records_of(s1), records_of(s2)));
}

// 多流 3: five streams with many ops; each stream overlaps some other stream.
TEST(RfcMultiStream, FiveStreamsManyOpsOverlap) {
  Device device(rfc_device());
  std::vector<Stream> streams{device.default_stream()};
  for (int i = 0; i < 4; ++i) streams.emplace_back(device);
  Operands t;
  ProfilerScope profile;
  for (auto& s : streams) set_stream_limit(s, 1, 1);
  for (int round = 0; round < 3; ++round) {
    for (size_t i = 0; i < streams.size(); ++i) {
      StreamGuard g(streams[i]);
      ops::matmul(t.a, t.b);
      if (i > 0) ops::add(t.x, t.y);
    }
  }
  device.synchronize();
  for (size_t i = 0; i < streams.size(); ++i) {
    bool overlaps_some = false;
    for (size_t j = 0; j < streams.size(); ++j)
      if (i != j && any_overlap(records_of(streams[i]), records_of(streams[j]))) overlaps_some = true;
    EXPECT_TRUE(overlaps_some) << "stream " << streams[i].id() << " ran alone";
  }
}

// 执行序 1: one event, one record: add on S2 waits for matmul on S1.
TEST(RfcOrder, SingleEventSingleRecordRemovesOverlap) {
  Device device(rfc_device());
  Stream s1 = device.default_stream(), s2(device);
  Operands t;
  ProfilerScope profile;
  Event e;
  {
    StreamGuard g(s1);
    ops::matmul(t.a, t.b);
    ops::matmul(t.a, t.b);
    e.record();
  }
  {
    StreamGuard g(s2);
    e.wait();
    ops::add(t.x, t.y);
    ops::add(t.x, t.y);
  }
  device.synchronize();
  auto r1 = records_of(s1), r2 = records_of(s2);
  ASSERT_EQ(r1.size(), 2u);
  ASSERT_EQ(r2.size(), 2u);
  EXPECT_FALSE(any_overlap(r1, r2));
  EXPECT_GE(span_of(r2).first, span_of(r1).second);
}

// 执行序 2: five events serialise five streams: each waits for the previous.
TEST(RfcOrder, FiveEventsSerialiseFiveStreams) {
  Device device(rfc_device());
  std::vector<Stream> streams{device.default_stream()};
  for (int i = 0; i < 4; ++i) streams.emplace_back(device);
  std::vector<Event> events(5);
  Operands t;
  ProfilerScope profile;
  for (size_t i = 0; i < streams.size(); ++i) {
    StreamGuard g(streams[i]);
    if (i > 0) events[i - 1].wait();
    ops::matmul(t.a, t.b);
    ops::add(t.x, t.y);
    events[i].record();
  }
  device.synchronize();
  for (size_t i = 1; i < streams.size(); ++i) {
    auto prev = records_of(streams[i - 1]), cur = records_of(streams[i]);
    ASSERT_EQ(cur.size(), 2u);
    EXPECT_GE(span_of(cur).first, span_of(prev).second) << "stream " << i;
    for (size_t j = 0; j < i; ++j) EXPECT_FALSE(any_overlap(records_of(streams[j]), cur));
  }
}

// 执行序 3: one event recorded on S1 gates S2..S5: all after S1, concurrent
// with each other. Concurrency is shown by a barrier, not by timing (two
// cores may run four busy workers one after another): after the gate each
// stream arrives at a counter, then waits until all four have arrived. That
// wait ends only if the event released the four streams together; if it
// chained them, the first would wait out the watchdog.
TEST(RfcOrder, OneEventGatesFourStreams) {
  Device device(rfc_device());
  Stream s1 = device.default_stream();
  std::vector<Stream> others;
  for (int i = 0; i < 4; ++i) others.emplace_back(device);
  Operands t;
  ProfilerScope profile;
  const auto saved = wait_timeout();
  set_wait_timeout(std::chrono::seconds(30));
  Event e;
  {
    StreamGuard g(s1);
    ops::matmul(t.a, t.b);
    e.record();
  }
  alignas(8) uint64_t arrived = 0;
  for (auto& s : others) {
    StreamLimitGuard g(s, 1, 1);
    e.wait();
    s.launch({"arrive", KernelKind::vector, 1, 0}, [&arrived](const BlockContext&) {
      std::atomic_ref<uint64_t>(arrived).fetch_add(1, std::memory_order_release);
    });
    ValueWait all;
    all.word = &arrived;
    all.value = others.size();
    s.wait_value(all);
    for (int i = 0; i < 3; ++i) ops::matmul(t.a, t.b);
  }
  device.synchronize();
  set_wait_timeout(saved);
  const int64_t s1_end = span_of(records_of(s1)).second;
  int64_t last_arrival = 0, first_work = INT64_MAX;
  for (auto& s : others) {
    auto records = records_of(s);
    EXPECT_GE(span_of(records).first, s1_end);
    for (auto& r : records)
      if (r.name == "arrive") last_arrival = std::max(last_arrival, r.end_ns);
      else if (r.name != "wait_value") first_work = std::min(first_work, r.start_ns);
  }
  EXPECT_LE(last_arrival, first_work) << "every gated stream arrives before any of them works on";
}

// 分核 1: device limit get/set; block_dim read back from kernel_details.csv.
TEST(RfcCoreLimits, DeviceLimitShowsInKernelDetails) {
  Device device(rfc_device());
  StreamGuard g(device.default_stream());
  Operands t;
  ProfilerScope profile;
  set_device_limit(device, 3, 5);
  EXPECT_EQ(get_device_limit(device), (CoreLimits{3, 5}));
  ops::matmul(t.a, t.b);
  ops::add(t.x, t.y);
  device.synchronize();
  auto rows = export_csv("device_limit");
  auto mm = rows_named(rows, "matmul"), add = rows_named(rows, "add");
  ASSERT_EQ(mm.size(), 1u);
  ASSERT_EQ(add.size(), 1u);
  EXPECT_EQ(mm[0]["block_dim"], "3");
  EXPECT_EQ(mm[0]["cube_num"], "3");
  EXPECT_EQ(add[0]["block_dim"], "5");
  EXPECT_EQ(add[0]["vector_num"], "5");
}

// 分核 2/3: stream limit set once, then between ops with different counts,
// then reset (back to the device's counts).
TEST(RfcCoreLimits, StreamLimitSetBetweenOpsAndReset) {
  Device device(rfc_device());
  Stream s(device);
  StreamGuard g(s);
  Operands t;
  ProfilerScope profile;
  const std::vector<int> counts{1, 4, 2, 7};
  for (int c : counts) {
    set_stream_limit(s, c, c);
    EXPECT_EQ(get_stream_limit(s), (CoreLimits{c, c}));
    ops::matmul(t.a, t.b);
  }
  reset_stream_limit(s);
  ops::matmul(t.a, t.b);
  device.synchronize();
  auto mm = rows_named(export_csv("stream_limit"), "matmul");
  ASSERT_EQ(mm.size(), counts.size() + 1);
  for (size_t i = 0; i < counts.size(); ++i)
    EXPECT_EQ(mm[i]["block_dim"], std::to_string(counts[i])) << i;
  EXPECT_EQ(mm.back()["block_dim"], "8") << "after reset the spec applies";
}

// 分核 4/5: StreamLimitGuard: inside the configured counts, outside the default.
TEST(RfcCoreLimits, StreamLimitGuardScopes) {
  Device device(rfc_device());
  Stream s(device);
  Operands t;
  ProfilerScope profile;
  {
    StreamGuard g(s);
    ops::add(t.x, t.y);  // default
  }
  {
    StreamLimitGuard g(s, 3, 6);
    EXPECT_EQ(get_stream_limit(s), (CoreLimits{3, 6}));
    ops::matmul(t.a, t.b);
    ops::add(t.x, t.y);
  }
  {
    StreamLimitGuard g(s, 5, 2);
    ops::matmul(t.a, t.b);
    ops::add(t.x, t.y);
  }
  {
    StreamGuard g(s);
    ops::matmul(t.a, t.b);  // default again
  }
  device.synchronize();
  auto rows = export_csv("guard");
  auto mm = rows_named(rows, "matmul"), add = rows_named(rows, "add");
  ASSERT_EQ(mm.size(), 3u);
  ASSERT_EQ(add.size(), 3u);
  EXPECT_EQ(add[0]["block_dim"], "8");
  EXPECT_EQ(mm[0]["block_dim"], "3");
  EXPECT_EQ(add[1]["block_dim"], "6");
  EXPECT_EQ(mm[1]["block_dim"], "5");
  EXPECT_EQ(add[2]["block_dim"], "2");
  EXPECT_EQ(mm[2]["block_dim"], "8");
}

// 交叉验证 1/2: matmul on S1 under a cube limit runs concurrently with add on
// S2 under a vector limit, each with its configured block_dim.
TEST(RfcCross, MatmulAndAddUnderSplitLimitsRunConcurrently) {
  Device device(rfc_device());
  Stream s1 = device.default_stream(), s2(device);
  Operands t;
  Tensor big_a = Tensor::full({768, 768}, 0.1f), big_b = Tensor::full({768, 768}, 0.1f);
  ProfilerScope profile;
  Event start;
  start.record(s1);
  {
    StreamLimitGuard g(s1, 2, -1);
    for (int i = 0; i < 3; ++i) ops::matmul(big_a, big_b);
  }
  {
    StreamLimitGuard g(s2, -1, 2);
    start.wait();
    for (int i = 0; i < 12; ++i) ops::add(t.x, t.y);
  }
  device.synchronize();
  auto r1 = records_of(s1), r2 = records_of(s2);
  for (auto& r : r1) EXPECT_EQ(r.block_dim, 2);
  for (auto& r : r2) EXPECT_EQ(r.block_dim, 2);
  EXPECT_TRUE(any_overlap(r1, r2));
  // Every core id used stays within the device.
  for (auto& r : profiler_records())
    for (auto& b : r.blocks) EXPECT_LT(b.core_id, device.num_cores());
}

// 算子 Cache: same op, shapes and limits -> same entry id; other limits ->
// another id; hits are counted.
TEST(RfcCache, SameLimitsSameIdOtherLimitsOtherId) {
  Device device(rfc_device());
  Stream s(device);
  Operands t;
  ProfilerScope profile;
  OpCache::global().clear();
  for (int i = 0; i < 3; ++i) {
    StreamLimitGuard g(s, 2, 4);
    ops::matmul(t.a, t.b);
  }
  {
    StreamLimitGuard g(s, 3, 4);
    ops::matmul(t.a, t.b);
  }
  device.synchronize();
  EXPECT_EQ(OpCache::global().misses(), 2u);
  EXPECT_EQ(OpCache::global().hits(), 2u);
  auto mm = rows_named(export_csv("cache"), "matmul");
  ASSERT_EQ(mm.size(), 4u);
  EXPECT_EQ(mm[0]["cache_id"], mm[1]["cache_id"]);
  EXPECT_EQ(mm[1]["cache_id"], mm[2]["cache_id"]);
  EXPECT_NE(mm[2]["cache_id"], mm[3]["cache_id"]);
  // Ids are stable: a fresh cache (as in a new run) gives the same id again.
  OpCache::global().clear();
  profiler_clear();
  {
    StreamLimitGuard g(s, 2, 4);
    ops::matmul(t.a, t.b);
  }
  device.synchronize();
  auto again = rows_named(export_csv("cache_again"), "matmul");
  ASSERT_EQ(again.size(), 1u);
  EXPECT_EQ(again[0]["cache_id"], mm[0]["cache_id"]);
}

}  // namespace
}  // namespace coremesh::runtime
