// Using a trained model: generation (greedy is deterministic and is the
// argmax of the model's own logits; sampling follows its seed), evaluation
// (the mean loss over every window), and the CLI refusing a checkpoint of
// another model shape.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>

#include "coremesh/runtime/stream.hpp"
#include "coremesh/train/generate.hpp"
#include "coremesh/train/trainer.hpp"
#include "test_util.hpp"

using namespace coremesh;
using namespace coremesh::train;

namespace {

std::string corpus(const std::string& dir) {
  std::string path = dir + "/text.txt";
  std::ofstream out(path);
  for (int i = 0; i < 400; ++i) out << "the quick brown fox jumps over the lazy dog. ";
  return path;
}

TrainConfig tiny(const std::string& dir) {
  TrainConfig c;
  c.model.vocab_size = 256, c.model.d_model = 32, c.model.n_layers = 2, c.model.n_heads = 4;
  c.model.n_kv_heads = 2, c.model.max_seq_len = 32, c.model.dense_hidden = 64;
  c.model.n_routed_experts = 4, c.model.top_k = 2, c.model.expert_hidden = 32;
  c.data = {corpus(dir)};
  c.batch_size = 4, c.seq_len = 32, c.steps = 30, c.lr = 1e-2, c.warmup_steps = 2;
  c.out_dir = dir + "/run", c.cores = 1, c.progress = false, c.report = false, c.val_every = 0;
  c.sample_tokens = 8;
  return c;
}

}  // namespace

TEST(Generate, GreedyIsTheArgmaxAndDeterministic) {
  TempDir d;
  Trainer t(tiny(d.path));
  t.run(-1, false);
  runtime::StreamGuard on(t.stream());
  model::Model& m = t.model();
  const std::string prompt = "the quick brown";
  const std::string a = generate(m, prompt, {12, 0.0, 0, 1}), b = generate(m, prompt, {12, 0.0, 0, 99});
  EXPECT_EQ(a, b) << "temperature 0 ignores the seed";
  ASSERT_EQ(a.size(), 12u);
  // The first byte is the argmax of the last position's logits.
  std::vector<int32_t> tok(prompt.begin(), prompt.end());
  m.forward(7, {tok.data(), tok.data(), 1, int(tok.size())});
  const Tensor logits_t = m.logits(7);
  m.close_slot(7);
  t.stream().synchronize();
  const std::vector<float> logits = logits_t.to_float_vector();
  const float* last = logits.data() + (tok.size() - 1) * 256;
  EXPECT_EQ(int(uint8_t(a[0])), int(std::max_element(last, last + 256) - last));
  // Sampling: the same seed gives the same text. The trainer's sample is
  // generate's temperature sampling with its config's settings and the seed
  // seed + steps done (30 here): not greedy.
  EXPECT_EQ(generate(m, prompt, {20, 1.0, 0, 5}), generate(m, prompt, {20, 1.0, 0, 5}));
  EXPECT_EQ(generate(m, "And ", {8, 0.8, 40, 1 + 30}), t.sample());
  EXPECT_THROW(generate(m, "", {}), InvalidArgument);
}

// A byte-level model with a padded vocabulary (1000 > 256 bytes): generation
// samples among the bytes (it sampled id 630 and failed, at the end of a run).
TEST(Generate, APaddedByteVocabularySamplesBytes) {
  TempDir d;
  TrainConfig c = tiny(d.path);
  c.model.vocab_size = 1000, c.steps = 2;
  Trainer t(c);
  t.run(-1, false);
  runtime::StreamGuard on(t.stream());
  for (uint64_t seed = 0; seed < 20; ++seed)
    EXPECT_EQ(generate(t.model(), "the", {16, 2.0, 0, seed}).size(), 16u);  // hot and untruncated: every id likely
}

TEST(Generate, EvalIsTheMeanLossOverEveryWindow) {
  TempDir d;
  TrainConfig c = tiny(d.path);
  c.steps = 3;
  Trainer t(c);
  const std::string ckpt = t.run(-1, true).checkpoint;
  auto m = load_model(ckpt);
  TextDataset data({c.data[0]}, 0.0);
  runtime::Stream s;
  runtime::StreamGuard on(s);
  const EvalResult r = evaluate(*m, data, Split::train, 3, 32);  // 5 batches of 3 and a last one of 2
  const auto windows = data.windows(Split::train, 32);
  ASSERT_EQ(r.tokens, int64_t(windows.size()) * 32);
  double sum = 0;
  std::vector<int32_t> buf(33);
  for (const auto& w : windows) {  // one window at a time
    data.read_window(w, 32, buf.data());
    m->forward(0, {buf.data(), buf.data() + 1, 1, 32});
    const Tensor l = m->token_losses(0);
    m->close_slot(0);
    s.synchronize();
    sum += mean_of(l) * 32;
  }
  EXPECT_NEAR(r.loss, sum / double(r.tokens), 1e-6 * r.loss);
  EXPECT_NEAR(r.bits_per_byte(), r.loss / std::log(2.0), 1e-12);
}

TEST(Generate, TheCliRefusesACheckpointOfAnotherModel) {
  TempDir d;
  TrainConfig c = tiny(d.path);
  c.steps = 2, c.warmup_steps = 1;
  Trainer(c).run(-1, true);
  const std::string exe = std::string(COREMESH_BINARY_DIR) + "/coremesh";
  TrainConfig other = c;
  other.model.d_model = 48;
  std::ofstream(d.path + "/other.json") << to_json(other).dump();
  std::ofstream(d.path + "/same.json") << to_json(c).dump();
  const std::string base = exe + " generate --checkpoint " + c.out_dir + " --prompt 'the ' --tokens 4";
  EXPECT_EQ(std::system((base + " --config " + d.path + "/same.json > " + d.path + "/ok.txt 2>&1").c_str()), 0);
  EXPECT_NE(std::system((base + " --config " + d.path + "/other.json > " + d.path + "/err.txt 2>&1").c_str()), 0);
  std::ifstream err(d.path + "/err.txt");
  const std::string text((std::istreambuf_iterator<char>(err)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("model.d_model: 32 vs 48"), std::string::npos) << text;
  const std::string eval = exe + " eval --checkpoint " + c.out_dir + " --data " + c.data[0] + " > " + d.path +
                           "/eval.txt 2>&1";
  EXPECT_EQ(std::system(eval.c_str()), 0);
  std::ifstream ev(d.path + "/eval.txt");
  const std::string etext((std::istreambuf_iterator<char>(ev)), std::istreambuf_iterator<char>());
  EXPECT_NE(etext.find("bits/byte"), std::string::npos) << etext;
}
