// The tiling tuner and its cache: a budgeted search that keeps results exact
// (a tiling that changes them is found by bisection and discarded), a cache
// that round-trips and that a stale fingerprint or version makes ignored.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <thread>

#include "coremesh/core/error.hpp"
#include "coremesh/core/log.hpp"
#include "coremesh/ops/gemm.hpp"
#include "coremesh/runtime/op_registry.hpp"
#include "coremesh/runtime/tuner.hpp"

namespace coremesh::runtime {
namespace {

// A test op whose output is its block_dim (wrong for any tiling but its own)
// and one whose output is independent of it; both offer block_dim 1..4.
std::vector<Tiling> up_to_four(const OpKey&, const Tiling& h, int) {
  std::vector<Tiling> out;
  for (int b = 1; b <= 4; ++b) out.push_back({b, h.align, 0, 0});
  return out;
}
[[maybe_unused]] const bool registered = register_op("tuner_test_sensitive", {0, nullptr, up_to_four}) &&
                                         register_op("tuner_test_exact", {0, nullptr, up_to_four}) &&
                                         register_op("tuner_test_slow_heuristic", {0, nullptr, up_to_four});

void launch_test_op(Stream& s, const std::string& op, float* out) {
  const OpKey key{op, {{4}}, {DType::f32}, s.effective_limits(), ""};
  auto [id, t] = OpCache::global().get(key, KernelKind::vector, [](int) { return Tiling{2, 1, 0, 0}; });
  const bool sensitive = op == "tuner_test_sensitive";
  s.launch({op, KernelKind::vector, t.block_dim, id}, [out, sensitive](const BlockContext& ctx) {
    if (ctx.block_idx == 0) *out = sensitive ? float(ctx.block_dim) : 7.0f;
  });
}

class Tuner : public ::testing::Test {
 protected:
  void SetUp() override {
    OpCache::global().clear();
    OpCache::global().set_tuned({});
    set_current_stream(stream_);
  }
  void TearDown() override {
    OpCache::global().clear();
    OpCache::global().set_tuned({});
    set_current_stream(device_.default_stream());
  }
  Device device_{DeviceOptions{4, 4, 4, false, 0}};
  Stream stream_{device_};
};

TEST_F(Tuner, DiscardsTheTilingsThatChangeTheResultAndKeepsTheRest) {
  float a = 0, b = 0;
  const TuneWorkload w{[&] {
                         launch_test_op(stream_, "tuner_test_sensitive", &a);
                         launch_test_op(stream_, "tuner_test_exact", &b);
                         stream_.synchronize();
                       },
                       [&] { return std::vector<float>{a, b}; }};
  TuneOptions o;
  o.budget = 1.0;
  o.repeats = 2;
  const TuneReport r = tune(w, o);
  ASSERT_EQ(r.keys.size(), 2u);
  const TunedKey& exact = r.keys[0].entry.key.op == "tuner_test_exact" ? r.keys[0] : r.keys[1];
  const TunedKey& sensitive = r.keys[0].entry.key.op == "tuner_test_exact" ? r.keys[1] : r.keys[0];
  EXPECT_EQ(sensitive.candidates, 4);
  EXPECT_EQ(sensitive.rejected, 3) << "block_dim 1, 3 and 4 change its output";
  EXPECT_EQ(sensitive.best.block_dim, 2) << "only the heuristic is exact";
  EXPECT_EQ(exact.rejected, 0) << "bisection blames only the op that changed the result";
  EXPECT_GT(exact.evaluations, 0);
  // Afterwards every key runs its heuristic again (nothing left forced).
  launch_test_op(stream_, "tuner_test_sensitive", &a);
  stream_.synchronize();
  EXPECT_EQ(a, 2.0f);
}

// A launch of 20 ms at its heuristic (block_dim 2), 2 ms at any other
// block_dim; `used` says which ran.
void launch_slow_heuristic(Stream& s, std::atomic<int>& used) {
  const OpKey key{"tuner_test_slow_heuristic", {{4}}, {DType::f32}, s.effective_limits(), ""};
  auto [id, t] = OpCache::global().get(key, KernelKind::vector, [](int) { return Tiling{2, 1, 0, 0}; });
  s.launch({"tuner_test_slow_heuristic", KernelKind::vector, t.block_dim, id}, [&used](const BlockContext& ctx) {
    if (ctx.block_idx != 0) return;
    used = ctx.block_dim;
    std::this_thread::sleep_for(std::chrono::milliseconds(ctx.block_dim == 2 ? 20 : 2));
  });
}

// The launches' timings pick a tiling; the whole run decides whether it
// stays. Here the pick's launches are 10x shorter; in the second workload
// it costs the rest of the run 60 ms (as a grid that holds cores another
// stream needs would), and every key keeps its heuristic.
TEST_F(Tuner, TheStepDecidesWhetherThePicksStay) {
  std::atomic<int> used{0};
  for (const bool costs_the_step : {false, true}) {
    SCOPED_TRACE(costs_the_step ? "the pick costs the step" : "the pick shortens the step");
    OpCache::global().clear();
    const TuneWorkload w{[&] {
                           launch_slow_heuristic(stream_, used);
                           stream_.synchronize();
                           if (costs_the_step && used != 2) std::this_thread::sleep_for(std::chrono::milliseconds(60));
                         },
                         [] { return std::vector<float>{1.0f}; }};
    TuneOptions o;
    o.budget = 1.0;
    const TuneReport r = tune(w, o);
    ASSERT_EQ(r.keys.size(), 1u);
    const TunedKey& k = r.keys[0];
    EXPECT_TRUE(r.step_checked);
    EXPECT_EQ(r.step_kept, !costs_the_step);
    EXPECT_EQ(k.best.block_dim == 2, costs_the_step) << describe(k.best);
    EXPECT_EQ(r.cache().entries.at(0).tiling, k.best);
    if (costs_the_step) EXPECT_GT(r.step_tuned_s, r.step_heuristic_s + 0.03);
    else EXPECT_LT(r.step_tuned_s, r.step_heuristic_s - 0.01);
  }
  // step_rounds 0: the launches decide, as before the check
  OpCache::global().clear();
  TuneOptions o;
  o.budget = 1.0;
  o.step_rounds = 0;
  const TuneReport r = tune({[&] {
                               launch_slow_heuristic(stream_, used);
                               stream_.synchronize();
                             },
                             [] { return std::vector<float>{1.0f}; }},
                            o);
  EXPECT_FALSE(r.step_checked);
  EXPECT_NE(r.keys.at(0).best.block_dim, 2);
  o.step_rounds = -1;
  EXPECT_THROW(tune({[] {}, [] { return std::vector<float>{}; }}, o), InvalidArgument);
}

// The picks stay only if every run with them beat every run without: here
// two of every three runs with the pick take 2 ms and the third 42 ms, so
// its median (2 ms) beats the heuristic's 20 ms but not in every run.
TEST_F(Tuner, APickShorterOnlyInTheMedianIsNotKept) {
  OpCache::global().clear();
  std::atomic<int> used{0};
  int pick_runs = 0;
  const TuneWorkload w{[&] {
                         launch_slow_heuristic(stream_, used);
                         stream_.synchronize();
                         if (used != 2 && ++pick_runs % 3 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(40));
                       },
                       [] { return std::vector<float>{1.0f}; }};
  TuneOptions o;
  o.budget = 1.0;
  const TuneReport r = tune(w, o);
  EXPECT_TRUE(r.step_checked);
  EXPECT_LT(r.step_tuned_s, r.step_heuristic_s) << "the medians favour the pick";
  EXPECT_FALSE(r.step_kept);
  EXPECT_EQ(r.keys.at(0).best.block_dim, 2) << describe(r.keys.at(0).best);
}

// An agreed op (a protocol between PEs): its chunk count (tile_m) runs
// 4 ms per chunk below 4 and 2 ms at 4, and 8 chunks change the result.
const bool agreed_registered = register_op(
    "tuner_test_agreed",
    {0, nullptr,
     [](const OpKey&, const Tiling& h, int) {
       std::vector<Tiling> out;
       for (int64_t c : {1, 2, 4, 8}) out.push_back({h.block_dim, h.align, c, 0});
       return out;
     },
     true});

TEST_F(Tuner, AgreedTilingsAreChosenOverWholeRuns) {
  ASSERT_TRUE(agreed_registered);
  OpCache::global().clear();
  int64_t chunks_used = 0;
  const TuneWorkload w{[&] {
                         const OpKey key{"tuner_test_agreed", {{4}}, {DType::f32}, stream_.effective_limits(), ""};
                         chunks_used = OpCache::global()
                                           .get(key, KernelKind::vector, [](int) { return Tiling{1, 1, 2, 0}; })
                                           .second.tile_m;
                         // 4 chunks fastest by a margin no loaded machine blurs (2 ms against 4 was flaky)
                         std::this_thread::sleep_for(std::chrono::milliseconds(chunks_used == 4 ? 1 : 10 * chunks_used));
                       },
                       [&] { return std::vector<float>{chunks_used == 8 ? 1.0f : 0.0f}; }};
  TuneOptions o;
  o.budget = 1.0;
  const TuneReport r = tune(w, o);
  ASSERT_EQ(r.keys.size(), 1u);
  const TunedKey& k = r.keys[0];
  EXPECT_TRUE(k.agreed);
  EXPECT_EQ(k.candidates, 4);
  EXPECT_EQ(k.evaluations, 4 * o.step_rounds) << "each candidate over step_rounds whole runs";
  EXPECT_EQ(k.rejected, 1) << "8 chunks change the result";
  EXPECT_EQ(k.best.tile_m, 4) << describe(k.best);
  EXPECT_LT(k.best_s, k.heuristic_s);
  EXPECT_EQ(r.cache().entries.at(0).tiling, k.best);
  // step_rounds 0: no whole runs to decide by, so the heuristic stays
  OpCache::global().clear();
  o.step_rounds = 0;
  EXPECT_EQ(tune(w, o).keys.at(0).best.tile_m, 2);
}

TEST_F(Tuner, MatmulPicksAnExactTilingWithinTheBudget) {
  std::vector<float> xs(192 * 160), ys(160 * 224);
  for (size_t i = 0; i < xs.size(); ++i) xs[i] = float(i % 17) * 0.25f - 2.0f;
  for (size_t i = 0; i < ys.size(); ++i) ys[i] = float(i % 13) * 0.125f - 0.75f;
  const Tensor x = Tensor::from_vector(xs, {192, 160}), y = Tensor::from_vector(ys, {160, 224});
  const Tensor heuristic = ops::matmul(x, y);
  stream_.synchronize();
  Tensor out;
  const TuneWorkload w{[&] {
                         out = ops::matmul(x, y);
                         stream_.synchronize();
                       },
                       [&] { return out.to_float_vector(); }};
  OpCache::global().clear();
  TuneOptions o;  // a quarter of the exhaustive search's evaluations
  const TuneReport r = tune(w, o);
  ASSERT_EQ(r.keys.size(), 1u);
  const TunedKey& k = r.keys[0];
  EXPECT_EQ(k.entry.key.op, "matmul");
  EXPECT_GT(k.candidates, 8) << "grids up to 8 x 8 tiles on 4 blocks";
  EXPECT_LE(k.evaluations, int(std::ceil(o.budget * k.candidates * o.repeats)));
  EXPECT_GT(k.best_s, 0);
  EXPECT_LE(k.best_s, k.heuristic_s) << "the heuristic is a candidate: the pick is never slower on its own timings";
  // The pick, loaded as a tuned tiling, is what the next run uses.
  OpCache::global().clear();
  OpCache::global().set_tuned({{k.entry.key.text(), k.best}});
  const Tensor again = ops::matmul(x, y);
  stream_.synchronize();
  ASSERT_EQ(OpCache::global().entries().size(), 1u);
  EXPECT_EQ(OpCache::global().entries()[0].tiling, k.best);
  EXPECT_EQ(again.to_float_vector(), heuristic.to_float_vector()) << "the pick was checked against the heuristic's result";
}

TEST_F(Tuner, ExhaustiveSearchTimesEveryCandidateRepeatsTimes) {
  float a = 0;
  const TuneWorkload w{[&] {
                         launch_test_op(stream_, "tuner_test_exact", &a);
                         stream_.synchronize();
                       },
                       [&] { return std::vector<float>{a}; }};
  TuneOptions o;
  o.repeats = 3;
  const TuneReport r = tune_exhaustive(w, o);
  ASSERT_EQ(r.keys.size(), 1u);
  EXPECT_EQ(r.keys[0].evaluations, 4 * 3);
}

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("coremesh_tuner_" + name)).string();
}

TEST_F(Tuner, CacheRoundTripsAndLoadsIntoTheOpCache) {
  TuningCacheFile f{coremesh_version(), machine_fingerprint(), {}};
  const OpKey key{"tuner_test_exact", {{4}}, {DType::f32}, stream_.effective_limits(), ""};
  f.entries.push_back({key.text(), key.op, {3, 1, 0, 0}, {2, 1, 0, 0}, 1e-5, 2e-5, 4, 8, 1});
  const std::string path = temp_path("roundtrip.json");
  write_tuning_cache(path, f);
  const TuningCacheFile back = read_tuning_cache(path);
  ASSERT_EQ(back.entries.size(), 1u);
  EXPECT_EQ(back.entries[0].tiling, (Tiling{3, 1, 0, 0}));
  EXPECT_EQ(back.entries[0].rejected, 1);
  EXPECT_EQ(load_tuning_cache(path), 1u);
  float a = 0;
  launch_test_op(stream_, "tuner_test_exact", &a);
  stream_.synchronize();
  EXPECT_EQ(OpCache::global().entries().at(0).tiling.block_dim, 3);
  EXPECT_EQ(OpCache::global().entries().at(0).heuristic.block_dim, 2);
  std::remove(path.c_str());
}

TEST_F(Tuner, StaleCachesAreIgnoredWithAWarning) {
  const std::string path = temp_path("stale.json");
  for (const TuningCacheFile& f : {TuningCacheFile{coremesh_version(), "another machine | 64 cpus", {}},
                                   TuningCacheFile{"0.0.0-old", machine_fingerprint(), {}}}) {
    TuningCacheFile g = f;
    g.entries.push_back({"k", "tuner_test_exact", {3, 1, 0, 0}, {2, 1, 0, 0}, 0, 0, 0, 0, 0});
    write_tuning_cache(path, g);
    ::testing::internal::CaptureStderr();
    EXPECT_EQ(load_tuning_cache(path), 0u);
    const std::string log = ::testing::internal::GetCapturedStderr();
    EXPECT_NE(log.find("stale tuning cache"), std::string::npos) << log;
    EXPECT_EQ(OpCache::global().tuned_count(), 0u);
  }
  std::remove(path.c_str());
}

// A rerun adds its keys; a key it searched less thoroughly (a short time
// limit: the heuristic, 0 evaluations) keeps the earlier pick. Caches of other
// machines are not merged (their tilings would be lost).
TEST_F(Tuner, MergeKeepsTheMoreThoroughlySearchedPick) {
  const auto entry = [](const char* key, int block_dim, int evaluations) {
    return TunedEntry{key, "op", {block_dim, 1, 0, 0}, {1, 1, 0, 0}, 0, 0, 4, evaluations, 0};
  };
  const TuningCacheFile base{coremesh_version(), machine_fingerprint(),
                             {entry("a", 3, 12), entry("b", 2, 5), entry("c", 4, 9)}};
  const TuningCacheFile rerun{coremesh_version(), machine_fingerprint(),
                              {entry("a", 1, 0), entry("b", 4, 5), entry("d", 2, 3)}};
  const TuningCacheFile merged = merge(base, rerun);
  std::map<std::string, int> picks;
  for (const TunedEntry& e : merged.entries) picks[e.key] = e.tiling.block_dim;
  EXPECT_EQ(picks, (std::map<std::string, int>{{"a", 3}, {"b", 4}, {"c", 4}, {"d", 2}}));
  const TuningCacheFile other{coremesh_version(), "another machine | 64 cpus", {entry("a", 3, 12)}};
  EXPECT_THROW(merge(other, rerun), InvalidArgument);
  EXPECT_EQ(stale_reason(base), "");
  EXPECT_NE(stale_reason(other).find("another machine"), std::string::npos);
}

TEST_F(Tuner, BadCacheFilesSayWhatToDo) {
  EXPECT_THROW(read_tuning_cache(temp_path("missing.json")), InvalidArgument);
  const std::string path = temp_path("bad.json");
  for (const char* text : {"{not json", R"({"format": "other"})",
                           R"({"format": "coremesh-tuning-cache", "version": 99})",
                           R"({"format": "coremesh-tuning-cache", "version": 1, "coremesh_version": "x", "machine": "m",
                               "entries": [{"key": "k", "tiling": {"block_dim": 0, "align": 1}}]})"}) {
    std::ofstream(path) << text;
    EXPECT_THROW(read_tuning_cache(path), InvalidArgument) << text;
  }
  std::remove(path.c_str());
}

TEST_F(Tuner, AnUntunedKeyIsReportedOnce) {
  OpCache::global().set_tuned({{"some other key", Tiling{1, 1, 0, 0}}});
  float a = 0, b = 0;
  ::testing::internal::CaptureStderr();
  launch_test_op(stream_, "tuner_test_exact", &a);
  launch_test_op(stream_, "tuner_test_sensitive", &b);
  stream_.synchronize();
  const std::string log = ::testing::internal::GetCapturedStderr();
  const size_t first = log.find("has no tiling for");
  ASSERT_NE(first, std::string::npos) << log;
  EXPECT_EQ(log.find("has no tiling for", first + 1), std::string::npos) << log;
  EXPECT_EQ(b, 2.0f) << "the untuned key runs its heuristic";
}

}  // namespace
}  // namespace coremesh::runtime
