// The training loop: the loss falls, a resumed run is bit-identical to an
// uninterrupted one, and a mismatched checkpoint is refused.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "coremesh/runtime/profiler.hpp"
#include "coremesh/train/data.hpp"
#include "coremesh/train/tokenizer.hpp"
#include "coremesh/train/trainer.hpp"
#include "test_util.hpp"

using namespace coremesh;
using namespace coremesh::train;

static std::string write_corpus(const std::string& dir) {
  const std::string path = dir + "/corpus.txt";
  write_tiny_corpus(path, 6000);
  return path;
}

static TrainConfig small_config(const std::string& dir) {
  TrainConfig c;
  c.model.vocab_size = 256, c.model.d_model = 32, c.model.n_layers = 2, c.model.n_heads = 4;
  c.model.n_kv_heads = 2, c.model.max_seq_len = 32, c.model.first_k_dense = 1;
  c.model.dense_hidden = 64, c.model.n_routed_experts = 4, c.model.top_k = 2;
  c.model.expert_hidden = 32, c.model.n_shared_experts = 1, c.model.bias_update_rate = 1e-3f;
  c.model.aux_loss_alpha = 1e-3f;
  c.data = {write_corpus(dir)};
  c.batch_size = 4, c.seq_len = 32, c.grad_accum = 2, c.steps = 20;
  c.lr = 3e-3, c.min_lr = 3e-4, c.warmup_steps = 3;
  c.val_every = 5, c.val_batches = 2, c.out_dir = dir + "/run";
  c.cores = 1, c.progress = false, c.report = false;
  return c;
}

static bool same_bits(model::Model& a, model::Model& b) {
  return a.num_params() == b.num_params() &&
         std::memcmp(a.param_data(), b.param_data(), sizeof(float) * size_t(a.num_params())) == 0;
}

TEST(Trainer, LossFalls) {
  TempDir d;
  TrainConfig c = small_config(d.path);
  c.steps = 60;
  Trainer t(c);
  TrainResult r = t.run(-1, false);
  const auto& rec = t.records();
  ASSERT_EQ(rec.size(), 60u);
  EXPECT_LT(rec.back().loss, rec.front().loss - 1.5) << "first " << rec.front().loss << " last " << rec.back().loss;
  EXPECT_GT(r.final_val_loss, 0);
  EXPECT_LT(r.final_val_loss, t.validation().front().loss);
  for (const auto& s : rec) EXPECT_GE(s.expert_balance, 1.0);
}

// val_batches past the validation split's whole batches would score its
// windows twice (a batch wrapping into a reshuffled epoch): a validation
// scores the whole batches the split holds, however many were asked for.
TEST(Trainer, ValidationScoresEachWindowOnce) {
  TempDir d;
  TrainConfig c = small_config(d.path);
  const Tokenizer bytes = Tokenizer::bytes();
  const TextDataset data(c.data, c.val_fraction, &bytes);
  const int64_t whole = DataLoader(data, Split::validation, c.batch_size, c.seq_len, c.seed).batches_per_epoch();
  std::vector<double> losses;
  for (int asked : {int(whole), int(whole) + 1, 100000}) {
    c.val_batches = asked;
    Trainer t(c);
    losses.push_back(t.validate());
  }
  EXPECT_EQ(losses[1], losses[0]);
  EXPECT_EQ(losses[2], losses[0]);
}

// An element owned twice would get two AdamW updates (with two states) per step.
TEST(Trainer, OverlappingOptimizerRangesAreRefused) {
  TempDir d;
  model::Model m(small_config(d.path).model);
  EXPECT_THROW(AdamW(m, AdamWConfig{}, {{0, 10}, {5, 20}}), InvalidArgument);
  EXPECT_NO_THROW(AdamW(m, AdamWConfig{}, {{0, 10}, {10, 20}, {20, 20}}));
}

TEST(Trainer, ResumeIsBitExact) {
  TempDir d;
  TrainConfig c = small_config(d.path);
  Trainer straight(c);
  straight.run(20, false);

  c.out_dir = d.path + "/interrupted";
  std::string ckpt;
  {
    Trainer first(c);
    TrainResult r = first.run(10, true);
    ckpt = r.checkpoint;
    ASSERT_TRUE(std::filesystem::exists(ckpt));
  }
  Trainer second(c);
  second.resume(ckpt);
  EXPECT_EQ(second.step(), 10);
  second.run(20, false);
  ASSERT_EQ(second.records().size(), 10u);
  for (size_t i = 0; i < 10; ++i) {
    EXPECT_EQ(second.records()[i].loss, straight.records()[10 + i].loss) << "step " << 10 + i;
    EXPECT_EQ(second.records()[i].grad_norm, straight.records()[10 + i].grad_norm);
  }
  EXPECT_TRUE(same_bits(second.model(), straight.model()));
  auto b1 = second.model().named_buffers(), b2 = straight.model().named_buffers();
  for (size_t i = 0; i < b1.size(); ++i)
    EXPECT_EQ(0, std::memcmp(b1[i].second.raw_data(), b2[i].second.raw_data(), b1[i].second.nbytes()));
  // A directory resumes from its latest checkpoint.
  Trainer third(c);
  third.resume(c.out_dir);
  EXPECT_EQ(third.step(), 10);
}

// A stop request (SIGINT/SIGTERM in `coremesh train`) ends run() after the
// step in flight with a checkpoint of that step; resuming it continues
// exactly as if nothing had happened.
TEST(Trainer, StopRequestSavesAndResumesBitExactly) {
  TempDir d;
  TrainConfig c = small_config(d.path);
  Trainer straight(c);
  straight.run(20, false);

  c.out_dir = d.path + "/stopped";
  Trainer first(c);
  int asked = 0;
  first.stop_when([&] { return ++asked >= 7; });  // asked at the end of each step
  const TrainResult r = first.run();
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(r.steps_done, 7);
  EXPECT_EQ(r.checkpoint, checkpoint_path(c.out_dir + "/checkpoints", 7));
  ASSERT_TRUE(std::filesystem::exists(r.checkpoint));
  Trainer second(c);
  second.resume(c.out_dir);
  ASSERT_EQ(second.step(), 7);
  EXPECT_FALSE(second.run(20, false).stopped);
  ASSERT_EQ(second.records().size(), 13u);
  for (size_t i = 0; i < 13; ++i) EXPECT_EQ(second.records()[i].loss, straight.records()[7 + i].loss) << "step " << 8 + i;
  EXPECT_TRUE(same_bits(second.model(), straight.model()));
  // metrics.jsonl: the stopped run's 7 lines, then the resumed run's 13
  std::ifstream log(c.out_dir + "/metrics.jsonl");
  int lines = 0;
  for (std::string line; std::getline(log, line); ++lines)
    EXPECT_EQ(nlohmann::json::parse(line).at("step").get<int>(), lines + 1) << line;
  EXPECT_EQ(lines, 20);
}

TEST(Trainer, MismatchedOrCorruptCheckpointIsRefused) {
  TempDir d;
  TrainConfig c = small_config(d.path);
  std::string ckpt;
  {
    Trainer t(c);
    ckpt = t.run(2, true).checkpoint;
  }
  TrainConfig other = c;
  other.model.expert_hidden = 48;
  Trainer t2(other);
  try {
    t2.resume(ckpt);
    FAIL() << "accepted a checkpoint of another model";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("expert_hidden: 32 vs 48"), std::string::npos) << e.what();
  }
  {  // flip one byte near the end (AdamW state)
    std::fstream f(ckpt, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-16, std::ios::end);
    f.put('\x7f');
  }
  Trainer t3(c);
  try {
    t3.resume(ckpt);
    FAIL() << "accepted a corrupt checkpoint";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("is corrupt"), std::string::npos) << e.what();
  }
  EXPECT_EQ(t3.step(), 0);  // nothing was half-loaded into the step count
}

// A damaged newest checkpoint of a run directory names the one before it.
TEST(Trainer, ADamagedNewestCheckpointNamesThePreviousOne) {
  TempDir d;
  TrainConfig c = small_config(d.path);
  c.ckpt_every = 1;
  std::string newest;
  {
    Trainer t(c);
    newest = t.run(2, true).checkpoint;
  }
  std::filesystem::resize_file(newest, std::filesystem::file_size(newest) / 2);
  Trainer t2(c);
  try {
    t2.resume(c.out_dir);
    FAIL() << "accepted a truncated checkpoint";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("--resume " + c.out_dir + "/checkpoints/step_00000001.safetensors"),
              std::string::npos) << e.what();
  }
}

// A step queues all of its kernels without waiting for any: with the
// trainer's stream held behind an event of a gate stream, queue_step()
// returns, and every kernel of the step starts only after that. A host
// synchronization inside the step would wait for the gate, which opens only
// after queue_step() returned (or after 30 s, failing the test).
TEST(Trainer, AStepQueuesWithoutWaitingForTheStream) {
  TempDir d;
  TrainConfig c = small_config(d.path);
  Trainer reference(c);
  reference.queue_step();
  const StepRecord want = reference.finish_step();

  Trainer t(c);
  runtime::Stream gate(t.stream().device());
  std::atomic<bool> open{false};
  gate.launch({"gate", runtime::KernelKind::vector, 1, 0}, [&open](const runtime::BlockContext&) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (!open.load() && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
  });
  runtime::Event held;
  held.record(gate);
  held.wait(t.stream());
  runtime::profiler_start();
  runtime::profiler_clear();
  t.queue_step();
  const int64_t queued_at = runtime::profiler_now_ns();
  const bool pending = !t.stream().query();
  open = true;
  const StepRecord got = t.finish_step();
  const auto records = runtime::profiler_records();
  runtime::profiler_stop();
  EXPECT_TRUE(pending) << "the step's work ran before the gate opened";
  int kernels = 0;
  for (const auto& r : records)
    if (r.stream == t.stream().id()) {
      ++kernels;
      EXPECT_GE(r.start_ns, queued_at) << r.name << " started before queue_step() returned";
    }
  EXPECT_GT(kernels, 100) << "forward, backward, clip, AdamW and the bias update of 2 micro-batches";
  EXPECT_EQ(got.loss, want.loss);  // and the gated step computes the same numbers
  EXPECT_EQ(got.grad_norm, want.grad_norm);
  EXPECT_TRUE(same_bits(t.model(), reference.model()));
}

// Graph mode: step 1 runs eagerly, step 2 is captured and every later step
// replays it. With validation (eager, other shapes) between replays and a
// checkpoint resumed in graph mode, every loss, gradient norm and expert
// balance, the weights, router biases and AdamW state equal the eager run's
// bit for bit.
TEST(Trainer, GraphModeReplaysTheEagerRunBitForBit) {
  TempDir d;
  TrainConfig c = small_config(d.path);
  c.steps = 12, c.val_every = 4;
  Trainer eager(c);
  eager.run(-1, false);

  c.graph = true;
  c.out_dir = d.path + "/graph";
  std::string ckpt;
  {
    Trainer first(c);
    ckpt = first.run(6, true).checkpoint;
    const GraphSummary g = first.graph_summary();
    EXPECT_EQ(g.step, 2);
    EXPECT_GT(g.captured_kernels, 100);
    EXPECT_GT(g.replayed_kernels, 0);
    EXPECT_LE(g.replayed_kernels, g.captured_kernels);
    EXPECT_NE(describe(g).find("graph: step 2 captured as"), std::string::npos) << describe(g);
  }
  Trainer graph(c);
  graph.resume(ckpt);
  graph.run(-1, false);
  EXPECT_EQ(graph.graph_summary().step, 8) << "the second step of the resumed run is captured";
  ASSERT_EQ(graph.records().size(), 6u);
  for (size_t i = 0; i < 6; ++i) {
    const StepRecord &a = graph.records()[i], &b = eager.records()[6 + i];
    EXPECT_EQ(a.loss, b.loss) << "step " << b.step;
    EXPECT_EQ(a.grad_norm, b.grad_norm) << "step " << b.step;
    EXPECT_EQ(a.expert_balance, b.expert_balance) << "step " << b.step;
    EXPECT_EQ(a.aux_loss, b.aux_loss) << "step " << b.step;
  }
  ASSERT_EQ(graph.validation().size(), 2u);
  EXPECT_EQ(graph.validation().back().loss, eager.validation().back().loss);
  EXPECT_TRUE(same_bits(graph.model(), eager.model()));
  auto b1 = graph.model().named_buffers(), b2 = eager.model().named_buffers();
  for (size_t i = 0; i < b1.size(); ++i)
    EXPECT_EQ(0, std::memcmp(b1[i].second.raw_data(), b2[i].second.raw_data(), b1[i].second.nbytes()));
  // the AdamW moments, through a checkpoint of each
  const CheckpointState x = load_checkpoint(graph.save_checkpoint_now()),
                        y = load_checkpoint(eager.save_checkpoint_now());
  ASSERT_EQ(x.adam_m.size(), y.adam_m.size());
  for (size_t i = 0; i < x.adam_m.size(); ++i)
    for (NamedTensors CheckpointState::*list : {&CheckpointState::adam_m, &CheckpointState::adam_v}) {
      const Tensor &a = (x.*list)[i].second, &b = (y.*list)[i].second;
      EXPECT_EQ(0, std::memcmp(a.raw_data(), b.raw_data(), a.nbytes())) << (x.*list)[i].first;
    }
}

TEST(Trainer, GraphModeRefusesPipelineLayouts) {
  TempDir d;
  TrainConfig c = small_config(d.path);
  c.graph = true, c.parallel.pp = 2;
  try {
    c.validate();
    FAIL() << "accepted graph mode with pp = 2";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("graph mode does not run pipeline layouts yet (pp = 2)"), std::string::npos)
        << e.what();
  }
}
