// metrics.jsonl: a tiny training writes one line per step with every field;
// a resumed run keeps the lines up to its checkpoint and appends the rest
// (none twice, none lost, a line cut by a crash dropped), also into another
// run directory; the report is drawn from the file.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

#include "coremesh/train/metrics_log.hpp"
#include "coremesh/train/trainer.hpp"
#include "test_util.hpp"

using namespace coremesh;
using namespace coremesh::train;
using nlohmann::json;

namespace {

TrainConfig tiny_config(const std::string& dir) {
  TrainConfig c;
  c.model.vocab_size = 256, c.model.d_model = 32, c.model.n_layers = 3, c.model.n_heads = 4;
  c.model.n_kv_heads = 2, c.model.max_seq_len = 32, c.model.first_k_dense = 1;
  c.model.dense_hidden = 64, c.model.n_routed_experts = 4, c.model.top_k = 2;
  c.model.expert_hidden = 32, c.model.n_shared_experts = 1, c.model.bias_update_rate = 1e-3f;
  write_tiny_corpus(dir + "/corpus.txt", 6000);
  c.data = {dir + "/corpus.txt"};
  c.batch_size = 4, c.seq_len = 32, c.steps = 8;
  c.lr = 3e-3, c.min_lr = 3e-4, c.warmup_steps = 2;
  c.val_every = 2, c.val_batches = 1, c.sample_tokens = 6, c.out_dir = dir + "/run";
  c.cores = 1, c.progress = false, c.report = false;
  return c;
}

// The file's complete lines, as text.
std::vector<std::string> raw_lines(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> out;
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

std::vector<json> json_lines(const std::string& path) {
  std::vector<json> out;
  for (const auto& line : raw_lines(path)) out.push_back(json::parse(line));
  return out;
}

std::vector<int64_t> steps_of(const std::vector<json>& lines) {
  std::vector<int64_t> s;
  for (const auto& j : lines) s.push_back(j.at("step").get<int64_t>());
  return s;
}

std::vector<int64_t> one_to(int64_t n) {
  std::vector<int64_t> s;
  for (int64_t i = 1; i <= n; ++i) s.push_back(i);
  return s;
}

}  // namespace

TEST(MetricsLog, ATinyRunWritesALinePerStepWithEveryField) {
  TempDir d;
  TrainConfig c = tiny_config(d.path);
  Trainer t(c);
  t.run(6, false);
  ASSERT_EQ(t.metrics_path(), c.out_dir + "/metrics.jsonl");
  const std::vector<json> lines = json_lines(t.metrics_path());
  ASSERT_EQ(steps_of(lines), one_to(6));
  const std::vector<std::string> keys = {"step", "loss", "aux_loss", "lr", "grad_norm", "tokens", "tokens_per_s",
                                         "step_seconds", "mfu", "expert_balance", "expert_load", "memory", "time"};
  double last_time = 0;
  size_t validated = 0;
  for (size_t i = 0; i < lines.size(); ++i) {
    const json& j = lines[i];
    const StepRecord& r = t.records()[i];
    for (const auto& k : keys) EXPECT_TRUE(j.contains(k)) << "step " << i + 1 << " lacks " << k;
    EXPECT_EQ(j["loss"].get<double>(), r.loss);  // exact: JSON numbers round-trip doubles
    EXPECT_EQ(j["aux_loss"].get<double>(), r.aux_loss);
    EXPECT_EQ(j["lr"].get<double>(), r.lr);
    EXPECT_EQ(j["grad_norm"].get<double>(), r.grad_norm);
    EXPECT_EQ(j["tokens_per_s"].get<double>(), r.tokens_per_s);
    EXPECT_EQ(j["mfu"].get<double>(), r.mfu);
    EXPECT_GT(r.mfu, 0);
    EXPECT_LE(r.mfu, 1);
    EXPECT_EQ(j["tokens"].get<int64_t>(), int64_t(i + 1) * t.tokens_per_step());
    // two MoE layers (layers 1 and 2) of four experts
    ASSERT_EQ(j["expert_load"].size(), 2u);
    ASSERT_EQ(j["expert_balance"].size(), 2u);
    double worst = 0;
    for (size_t l = 0; l < 2; ++l) {
      const auto shares = j["expert_load"][l].get<std::vector<double>>();
      ASSERT_EQ(shares.size(), 4u);
      double sum = 0;
      for (double s : shares) {
        EXPECT_GE(s, 0);
        sum += s;
      }
      EXPECT_NEAR(sum, 1.0, 1e-12);
      EXPECT_GE(j["expert_balance"][l].get<double>(), 1.0);
      worst = std::max(worst, j["expert_balance"][l].get<double>());
    }
    EXPECT_NEAR(worst, r.expert_balance, 1e-12);
    EXPECT_GT(j["memory"]["tensor_bytes"].get<int64_t>(), 0);
    EXPECT_GE(j["memory"]["cached_bytes"].get<int64_t>(), 0);
    EXPECT_EQ(j["memory"]["optimizer_state_bytes"].get<int64_t>(), t.optimizer_state_bytes());
    EXPECT_GT(j["memory"]["peak_rss_bytes"].get<int64_t>(), j["memory"]["tensor_bytes"].get<int64_t>());
    EXPECT_GE(j["time"].get<double>(), last_time);
    last_time = j["time"].get<double>();
    // validation and a sample on steps 2, 4, 6 only
    const bool validates = (i + 1) % 2 == 0;
    ASSERT_EQ(j.contains("val_loss"), validates) << "step " << i + 1;
    ASSERT_EQ(j.contains("sample"), validates) << "step " << i + 1;
    if (validates) {
      EXPECT_EQ(j["val_loss"].get<double>(), t.validation().at(validated++).loss);
      // bytes: one byte a token, so bits per byte is the loss over ln 2
      EXPECT_NEAR(j["val_bits_per_byte"].get<double>(), j["val_loss"].get<double>() / std::log(2.0), 1e-12);
      EXPECT_EQ(j["sample"]["prompt"], c.sample_prompt);
      EXPECT_FALSE(j["sample"]["text"].get<std::string>().empty());
    }
  }
  EXPECT_GT(last_time, 1.6e9);
  // the reader gives back the trainer's records
  const std::vector<MetricsLine> back = read_metrics(t.metrics_path());
  ASSERT_EQ(back.size(), 6u);
  for (size_t i = 0; i < back.size(); ++i) {
    EXPECT_EQ(back[i].record.step, t.records()[i].step);
    EXPECT_EQ(back[i].record.loss, t.records()[i].loss);
    EXPECT_EQ(back[i].record.seconds, t.records()[i].seconds);
  }
}

TEST(MetricsLog, ResumeKeepsTheLinesUpToTheCheckpointAndAppendsTheRest) {
  TempDir d;
  TrainConfig c = tiny_config(d.path);
  c.out_dir = d.path + "/straight";
  Trainer straight(c);
  straight.run(8, false);
  const std::vector<json> want = json_lines(straight.metrics_path());

  // A run that saved a checkpoint at step 4 and died while writing step 7's line.
  c.out_dir = d.path + "/crashed";
  c.ckpt_every = 4;
  std::vector<std::string> before;
  {
    Trainer first(c);
    first.run(6, false);
    before = raw_lines(first.metrics_path());
    ASSERT_EQ(before.size(), 6u);
    std::ofstream(first.metrics_path(), std::ios::app) << R"({"step": 7, "loss": 1.2)";  // no newline
  }
  EXPECT_EQ(read_metrics(c.out_dir + "/metrics.jsonl").size(), 6u) << "a torn last line is skipped";

  Trainer second(c);
  second.resume(c.out_dir);  // its latest checkpoint: step 4
  ASSERT_EQ(second.step(), 4);
  second.run(8, false);
  const std::vector<std::string> after = raw_lines(second.metrics_path());
  const std::vector<json> lines = json_lines(second.metrics_path());
  ASSERT_EQ(steps_of(lines), one_to(8)) << "every step once: none lost, none twice";
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(after[i], before[i]) << "line " << i + 1 << " kept byte for byte";
  for (size_t i = 4; i < 8; ++i) {  // the resumed steps repeat the straight run's numbers (bit-exact resume)
    EXPECT_EQ(lines[i]["loss"], want[i]["loss"]) << "step " << i + 1;
    EXPECT_EQ(lines[i]["grad_norm"], want[i]["grad_norm"]);
    EXPECT_EQ(lines[i]["expert_load"], want[i]["expert_load"]);
    EXPECT_EQ(lines[i].contains("val_loss"), want[i].contains("val_loss"));
    if (want[i].contains("val_loss")) {
      EXPECT_EQ(lines[i]["val_loss"], want[i]["val_loss"]);
    }
  }
}

// A run stopped during the validation of its checkpoint's step (its line
// lacks the validation and its sample): the resume validates and samples
// that step first, the same numbers and text as a straight run, in the
// line's place and key order.
TEST(MetricsLog, AResumeAddsTheValidationAndSampleThatAStopCutShort) {
  TempDir d;
  TrainConfig c = tiny_config(d.path);
  c.out_dir = d.path + "/straight";
  Trainer straight(c);
  straight.run(6, false);
  const std::vector<std::string> want = raw_lines(straight.metrics_path());
  ASSERT_NE(want[3].find("\"sample\""), std::string::npos);

  c.out_dir = d.path + "/stopped";
  {
    Trainer first(c);
    first.run(4, true);  // the checkpoint of step 4, then its validation
    std::vector<std::string> lines = raw_lines(first.metrics_path());
    nlohmann::ordered_json last = nlohmann::ordered_json::parse(lines.back());
    for (const char* key : {"val_loss", "val_bits_per_byte", "sample"}) last.erase(key);
    lines.back() = last.dump();
    std::ofstream out(first.metrics_path(), std::ios::trunc);
    for (const auto& l : lines) out << l << "\n";
  }
  Trainer second(c);
  second.resume(c.out_dir);
  ASSERT_EQ(second.step(), 4);
  second.run(6, false);
  const std::vector<std::string> got = raw_lines(second.metrics_path());
  ASSERT_EQ(got.size(), 6u);
  const auto without_time = [](const std::string& line) {
    nlohmann::ordered_json j = nlohmann::ordered_json::parse(line);
    j.erase("time"), j.erase("step_seconds"), j.erase("tokens_per_s"), j.erase("mfu"), j.erase("memory");
    return j.dump();
  };
  EXPECT_EQ(without_time(got[3]), without_time(want[3]));
}

// "tokens" counts what was trained on: a resume with a larger batch adds the
// new batch's tokens to the checkpoint's count (it was steps x the new batch).
TEST(MetricsLog, TokensCountAcrossAResumeWithAnotherBatch) {
  TempDir d;
  TrainConfig c = tiny_config(d.path);
  c.out_dir = d.path + "/first";
  std::string ckpt;
  {
    Trainer first(c);
    ckpt = first.run(2, true).checkpoint;
  }
  const int64_t before = int64_t(c.batch_size) * c.seq_len;
  c.batch_size *= 2;
  c.out_dir = d.path + "/second";
  Trainer second(c);
  second.resume(ckpt);
  second.run(4, false);
  const std::vector<json> lines = json_lines(second.metrics_path());
  ASSERT_EQ(lines.size(), 4u);
  EXPECT_EQ(lines[1]["tokens"].get<int64_t>(), 2 * before);
  EXPECT_EQ(lines[3]["tokens"].get<int64_t>(), 2 * before + 2 * (2 * before));
}

TEST(MetricsLog, ResumingIntoAnotherDirectoryCarriesTheHistory) {
  TempDir d;
  TrainConfig c = tiny_config(d.path);
  std::string ckpt;
  {
    Trainer first(c);
    ckpt = first.run(4, true).checkpoint;
  }
  const std::vector<std::string> source = raw_lines(c.out_dir + "/metrics.jsonl");
  ASSERT_EQ(source.size(), 4u);
  EXPECT_EQ(metrics_path_of_checkpoint(ckpt), c.out_dir + "/metrics.jsonl");
  c.out_dir = d.path + "/continued";
  Trainer second(c);
  second.resume(ckpt);
  second.run(6, false);
  const std::vector<std::string> lines = raw_lines(second.metrics_path());
  ASSERT_EQ(steps_of(json_lines(second.metrics_path())), one_to(6));
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(lines[i], source[i]);
  EXPECT_EQ(raw_lines(d.path + "/run/metrics.jsonl"), source) << "the source run's file is left alone";
}

TEST(MetricsLog, AFreshRunStartsAnEmptyFile) {
  TempDir d;
  TrainConfig c = tiny_config(d.path);
  std::filesystem::create_directories(c.out_dir);
  std::ofstream(c.out_dir + "/metrics.jsonl") << R"({"step": 1, "loss": 9})" << "\n" << "junk\n";
  Trainer t(c);
  t.run(2, false);
  EXPECT_EQ(steps_of(json_lines(t.metrics_path())), one_to(2));
}

TEST(MetricsLog, TheReportIsDrawnFromTheFile) {
  TempDir d;
  TrainConfig c = tiny_config(d.path);
  {
    Trainer first(c);
    first.run(4, true);
  }
  Trainer t(c);  // resumed: its in-memory records hold only steps 5 and 6
  t.resume(c.out_dir);
  t.run(6, false);
  ASSERT_EQ(t.records().size(), 2u);
  ReportData r = t.report_data();
  const std::vector<MetricsLine> lines = read_metrics(t.metrics_path());
  ASSERT_EQ(r.steps.size(), 6u);
  for (size_t i = 0; i < 6; ++i) {
    EXPECT_EQ(r.steps[i].step, int64_t(i));
    EXPECT_EQ(r.steps[i].loss, lines[i].record.loss);
  }
  ASSERT_EQ(r.validation.size(), 3u);
  EXPECT_EQ(r.validation.back().loss, lines.back().val_loss);
  EXPECT_EQ(r.samples.size(), 3u);
  EXPECT_EQ(r.expert_load.size(), 6u);
  // the file is the source: a changed line changes the report
  std::vector<std::string> raw = raw_lines(t.metrics_path());
  json last = json::parse(raw.back());
  last["loss"] = 9.5;
  raw.back() = last.dump();
  std::ofstream out(t.metrics_path(), std::ios::trunc);
  for (const auto& line : raw) out << line << "\n";
  out.close();
  r = t.report_data();
  EXPECT_EQ(r.steps.back().loss, 9.5);
  bool found = false;
  for (const auto& [k, v] : r.summary) found |= k == "final training loss" && v.rfind("9.5000", 0) == 0;
  EXPECT_TRUE(found);
  EXPECT_NE(render_report_html(r).find("metrics.jsonl"), std::string::npos);
}

TEST(MetricsLog, LinesRoundTripAndBadBytesAreReplaced) {
  TempDir d;
  MetricsLine m;
  m.record.step = 2, m.record.loss = 1.25, m.record.lr = 1e-3, m.record.seconds = 0.5;
  m.record.aux_loss = std::numeric_limits<double>::quiet_NaN();  // written as null, read back (it was refused)
  m.val_loss = 1.5, m.tokens = 384;
  m.expert_load = {{0.5, 0.25, 0.25, 0.0}};
  m.memory = {100, 200, 250, 300};
  m.sample = SampleRecord{2, "And ", std::string("the \xff\xfe end")};  // not UTF-8
  const std::string path = d.path + "/metrics.jsonl";
  {
    MetricsLog log(path, 0);
    log.append(m);
    m.record.step = 3, m.val_loss = -1, m.sample.reset();
    log.append(m);
  }
  const std::vector<MetricsLine> back = read_metrics(path);
  ASSERT_EQ(back.size(), 2u);
  EXPECT_EQ(back[0].record.step, 2);
  EXPECT_EQ(back[0].val_loss, 1.5);
  EXPECT_TRUE(std::isnan(back[0].record.aux_loss));
  EXPECT_EQ(back[0].record.expert_balance, 2.0);  // 0.5 of 4 experts: twice the mean
  EXPECT_EQ(back[0].memory.cached_bytes, 200);
  EXPECT_EQ(back[0].memory.optimizer_state_bytes, 250);
  ASSERT_TRUE(back[0].sample.has_value());
  EXPECT_EQ(back[0].sample->text, "the \xEF\xBF\xBD\xEF\xBF\xBD end");  // U+FFFD twice
  EXPECT_EQ(back[1].val_loss, -1);
  EXPECT_FALSE(back[1].sample.has_value());
  EXPECT_EQ(json::parse(raw_lines(path)[0])["step"], 3) << "the file counts steps from 1";
  // a damaged line that is not the last is refused with its number
  std::ofstream(path, std::ios::app) << "{\"step\": 5, \"loss\": \n" << raw_lines(path)[0] << "\n";
  try {
    read_metrics(path);
    FAIL() << "a corrupt line was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("line 3"), std::string::npos) << e.what();
  }
}
