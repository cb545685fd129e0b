// Op cache logging and the profiler's exports.
#include <nlohmann/json.hpp>
#include <set>

#include "coremesh/core/log.hpp"
#include "coremesh/runtime/op_cache.hpp"
#include "helpers.hpp"

namespace coremesh::runtime {
namespace {

using namespace testing;

TEST(OpCache, DebugLogShowsTheEntryId) {
  OpCache cache;
  OpKey key{"unit_op", {{4, 4}}, {DType::f32}, {2, 3}, "t=1"};
  set_log_level(LogLevel::debug);
  ::testing::internal::CaptureStderr();
  auto [id1, t1] = cache.get(key, KernelKind::cube, [](int) { return Tiling{2, 42}; });
  auto [id2, t2] = cache.get(key, KernelKind::cube, [](int) { return Tiling{1, 43}; });
  const std::string log = ::testing::internal::GetCapturedStderr();
  set_log_level(LogLevel::warn);
  EXPECT_EQ(id1, id2);
  EXPECT_EQ(t2.align, 42) << "a hit returns the cached tiling";
  const std::string id_text = fmt::format("id={:016x}", id1);
  EXPECT_NE(log.find("op cache miss " + id_text), std::string::npos) << log;
  EXPECT_NE(log.find("op cache hit " + id_text), std::string::npos) << log;
  EXPECT_EQ(cache.hits(), 1u);
  EXPECT_EQ(cache.misses(), 1u);
}

TEST(OpCache, KeyIncludesEveryField) {
  OpKey base{"op", {{2, 3}}, {DType::f32}, {1, 1}, ""};
  std::vector<OpKey> variants(6, base);
  variants[1].op = "op2";
  variants[2].shapes = {{3, 2}};
  variants[3].dtypes = {DType::bf16};
  variants[4].limits = {2, 1};
  variants[5].limits = {1, 2};
  std::set<uint64_t> ids;
  for (auto& k : variants) ids.insert(OpCache::hash_key(k.text()));
  EXPECT_EQ(ids.size(), variants.size());
}

// peek answers as a lookup would (forced, entry, tuned, heuristic; clamped)
// and makes no entry.
TEST(OpCache, PeekAnswersLikeALookupAndMakesNoEntry) {
  OpCache& cache = OpCache::global();
  cache.clear();
  const OpKey key{"peek_test", {{4}}, {DType::f32}, {2, 2}, ""};
  const Tiling heuristic{9, 1, 0, 0};  // clamped to the key's 2 vector cores
  EXPECT_EQ(cache.peek(key, KernelKind::vector, heuristic).block_dim, 2);
  EXPECT_EQ(cache.size(), 0u);
  cache.set_tuned({{key.text(), Tiling{1, 4, 0, 0}}});
  EXPECT_EQ(cache.peek(key, KernelKind::vector, heuristic).align, 4);
  cache.force(key.text(), Tiling{1, 8, 0, 0});
  EXPECT_EQ(cache.peek(key, KernelKind::vector, heuristic).align, 8);
  EXPECT_EQ(cache.size(), 0u);
  cache.unforce_all();
  cache.set_tuned({});
  cache.clear();
}

// A tuned tiling with a tile of 0 for an op that tiles by rows and columns
// (a hand-edited cache) is not used: it divided by zero.
TEST(OpCache, ATunedTileOfZeroFallsBackToTheHeuristic) {
  OpCache& cache = OpCache::global();
  cache.clear();
  const OpKey key{"tiles_test", {{64, 64}}, {DType::f32}, {2, 2}, ""};
  const Tiling heuristic{2, 1, 32, 32};
  cache.set_tuned({{key.text(), Tiling{2, 1, 0, 16}}});
  EXPECT_EQ(cache.peek(key, KernelKind::cube, heuristic).tile_m, 32);
  EXPECT_EQ(cache.get(key, KernelKind::cube, [&](int) { return heuristic; }).second.tile_m, 32);
  cache.set_tuned({});
  cache.clear();
}

TEST(Profiler, TraceHasOneTrackPerStreamAndPerCore) {
  Device device({.cores = 2});
  Stream s1(device), s2(device);
  ProfilerScope profile;
  launch_busy(s1, "k1", 1.0, 2);
  launch_busy(s2, "k2", 1.0, 1);
  device.synchronize();
  const std::string dir = temp_dir("trace");
  auto files = profiler_export(dir);
  std::ifstream in(files[1]);
  auto trace = nlohmann::json::parse(in);
  std::set<std::string> track_names;
  int kernels = 0, blocks = 0;
  for (auto& e : trace["traceEvents"]) {
    if (e["ph"] == "M" && e["name"] == "thread_name") track_names.insert(e["args"]["name"]);
    if (e["ph"] == "X" && e["cat"] == "kernel") kernels++;
    if (e["ph"] == "X" && e["cat"] == "block") blocks++;
  }
  EXPECT_EQ(kernels, 2);
  EXPECT_EQ(blocks, 3);
  const std::string dev = fmt::format("dev{} ", device.id());
  EXPECT_TRUE(track_names.count(dev + fmt::format("stream {}", s1.id())));
  EXPECT_TRUE(track_names.count(dev + fmt::format("stream {}", s2.id())));
  EXPECT_TRUE(track_names.count(dev + "core 0") || track_names.count(dev + "core 1"));
  auto rows = read_csv(files[0]);
  ASSERT_EQ(rows.size(), 2u);
  for (auto& r : rows) {
    EXPECT_GE(std::stod(r["end_us"]), std::stod(r["start_us"]));
    EXPECT_EQ(r["kind"], "vector");
  }
}

TEST(Profiler, ExportToAnUnwritablePlaceFailsClearly) {
  EXPECT_THROW(write_kernel_details_csv("/proc/coremesh/nope.csv"), InvalidArgument);
}

TEST(Profiler, EnvironmentVariableProfilesAWholeProcess) {
  const std::string dir = temp_dir("env_profile");
  const std::string cmd = fmt::format("COREMESH_PROFILE={} {}/tests/profiled_process 3", dir,
                                      COREMESH_BINARY_DIR);
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  auto rows = read_csv(dir + "/kernel_details.csv");
  int matmuls = 0, muls = 0;
  for (auto& r : rows) {
    matmuls += r["name"] == "matmul";
    muls += r["name"] == "mul";
  }
  EXPECT_EQ(matmuls, 3);
  EXPECT_EQ(muls, 3);
  EXPECT_TRUE(std::filesystem::exists(dir + "/trace.json"));
}

}  // namespace
}  // namespace coremesh::runtime
