// Subword tokenizers (SentencePiece): training, exact round trips and byte
// counts; a run trained with one carries it in its checkpoints, generates
// and evaluates (bits per byte) with it and resumes bit-exactly; a corrupt
// tokenizer, one of another vocab size or another run's is refused with a
// message.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "coremesh/runtime/stream.hpp"
#include "coremesh/train/generate.hpp"
#include "coremesh/train/safetensors.hpp"
#include "coremesh/train/trainer.hpp"
#include "test_util.hpp"

using namespace coremesh;
using namespace coremesh::train;

namespace {

std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Lines of words from 24 syllables (deterministic): enough distinct pairs
// for a few hundred merges.
std::string corpus(const std::string& dir) {
  const char* syl[] = {"the", "and", "lo", "rd", "sa", "id", "un", "to", "him", "of", "is", "ra",
                       "el", "be", "go", "th", "er", "in", "es", "on", "ch", "il", "dr", "en"};
  std::string path = dir + "/text.txt";
  std::ofstream out(path);
  uint64_t x = 11;
  auto next = [&] { return (x = x * 6364136223846793005ULL + 1442695040888963407ULL) >> 33; };
  for (int line = 0; line < 1500; ++line) {
    out << "  " << line % 50 + 1 << ' ';
    for (int w = 0; w < 10; ++w) {
      const int n = 1 + int(next() % 3);
      for (int s = 0; s < n; ++s) out << syl[next() % 24 % (8 + next() % 16)];
      out << (w % 4 == 3 ? ", " : " ");
    }
    out << "amen.\n";
  }
  return path;
}

TrainConfig tiny(const std::string& dir, const std::string& tokenizer, int vocab) {
  TrainConfig c;
  c.model.vocab_size = vocab, c.model.d_model = 32, c.model.n_layers = 2, c.model.n_heads = 4;
  c.model.n_kv_heads = 2, c.model.max_seq_len = 32, c.model.dense_hidden = 64;
  c.model.n_routed_experts = 4, c.model.top_k = 2, c.model.expert_hidden = 32;
  c.data = {dir + "/text.txt"}, c.tokenizer = tokenizer, c.val_fraction = 0.1;
  c.batch_size = 4, c.seq_len = 32, c.steps = 3, c.lr = 1e-2, c.warmup_steps = 1;
  c.out_dir = dir + "/run", c.cores = 1, c.progress = false, c.report = false, c.val_every = 0, c.val_batches = 2;
  c.sample_tokens = 6;
  return c;
}

// One trained tokenizer for the whole suite (training takes a moment).
struct Fixture : ::testing::Test {
  static inline TempDir* dir = nullptr;
  static inline std::string model;
  static void SetUpTestSuite() {
    dir = new TempDir;
    corpus(dir->path);
    model = dir->path + "/tok.model";
    TokenizerTrainOptions o;
    o.data = {dir->path + "/text.txt"}, o.vocab_size = 400, o.model = "bpe", o.val_fraction = 0.1, o.threads = 1;
    train_tokenizer(o, model);
  }
  static void TearDownTestSuite() { delete dir; }
};
using TokenizerTest = Fixture;

}  // namespace

TEST_F(TokenizerTest, BpeRoundTripsExactlyAndCountsBytes) {
  const Tokenizer t = Tokenizer::from_file(model);
  ASSERT_FALSE(t.byte_level());
  EXPECT_EQ(t.vocab_size(), 400);
  // double spaces, a leading space, characters never seen in training, newlines
  const std::string text = " the lord said  unto him,\n\nan \xc3\xa9l\xc3\xa8ve: 3 \xe2\x82\xac\nand the end";
  const std::vector<int32_t> ids = t.encode(text);
  EXPECT_EQ(t.decode(ids), text);
  EXPECT_EQ(t.count_bytes(ids.data(), int64_t(ids.size())), int64_t(text.size()));
  // line-wise encoding is the encoding of the lines, joined by newline tokens
  std::vector<int32_t> joined = t.encode(" the lord said  unto him,");
  for (int i = 0; i < 2; ++i) joined.push_back(t.encode("\n")[0]);
  EXPECT_EQ(std::vector<int32_t>(ids.begin(), ids.begin() + std::ptrdiff_t(joined.size())), joined);
  // the training text compresses
  const std::string corpus_text = read_all(dir->path + "/text.txt");
  const std::vector<int32_t> all = t.encode(corpus_text);
  EXPECT_EQ(t.count_bytes(all.data(), int64_t(all.size())), int64_t(corpus_text.size()));
  EXPECT_GT(double(corpus_text.size()) / double(all.size()), 2.0);
  // bytes: the identity
  const Tokenizer b = Tokenizer::bytes();
  EXPECT_EQ(b.encode("ab\n").size(), 3u);
  EXPECT_EQ(b.decode(b.encode(text)), text);
}

// Bytes outside well-formed UTF-8 (Latin-1 text, a truncated sequence, an
// overlong form, a surrogate) are each their own byte piece: two different
// bytes stay different and the count is the input's (SentencePiece read each
// as U+FFFD: three byte pieces, all alike, and bits per byte came out 37% low).
TEST_F(TokenizerTest, BytesThatAreNotUtf8AreTheirOwnPieces) {
  const Tokenizer t = Tokenizer::from_file(model);
  const std::string latin1 = "caf\xe9 na\xefve \xff\xfe", more = "the \xe2\x82 \xc0\xaf \xed\xa0\x80 end\n";
  const std::vector<int32_t> a = t.encode(latin1), b = t.encode(more);
  EXPECT_EQ(t.count_bytes(a.data(), int64_t(a.size())), int64_t(latin1.size()));
  EXPECT_EQ(t.count_bytes(b.data(), int64_t(b.size())), int64_t(more.size()));
  EXPECT_NE(t.encode("\xe9"), t.encode("\xef"));
  EXPECT_EQ(t.encode("\xe9").size(), 1u);
  // the UTF-8 around them round-trips; each such byte decodes as U+FFFD
  EXPECT_EQ(t.decode(t.encode("caf\xc3\xa9 \xe9!")), "caf\xc3\xa9 \xef\xbf\xbd!");
  EXPECT_EQ(utf8_prefix("ab\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80"), 11u);
  EXPECT_EQ(utf8_prefix("a\xc0\xaf"), 1u);       // overlong '/'
  EXPECT_EQ(utf8_prefix("a\xed\xa0\x80"), 1u);   // a surrogate
  EXPECT_EQ(utf8_prefix("a\xf4\x90\x80\x80"), 1u);  // past U+10FFFF
  EXPECT_EQ(utf8_prefix("a\xe2\x82"), 1u);       // cut short
  // ids outside the vocabulary are refused, not read past the table
  EXPECT_THROW(t.token_bytes(400), InvalidArgument);
  const int32_t bad[] = {1, 999999};
  EXPECT_THROW(t.count_bytes(bad, 2), InvalidArgument);
}

TEST_F(TokenizerTest, UnigramTrainsToo) {
  TokenizerTrainOptions o;
  o.data = {dir->path + "/text.txt"}, o.vocab_size = 350, o.model = "unigram", o.threads = 1;
  const Tokenizer t = train_tokenizer(o, dir->path + "/uni.model");
  EXPECT_EQ(t.vocab_size(), 350);
  const std::string text = "and the lord\nsaid \xe2\x82\xac";
  EXPECT_EQ(t.decode(t.encode(text)), text);
  EXPECT_EQ(Tokenizer::from_file(dir->path + "/uni.model").serialized(), t.serialized());
}

// Lines past SentencePiece's 16384 bytes were skipped silently: the corpus
// as one line learns as much as with its newlines (pieces cut before spaces).
TEST_F(TokenizerTest, ALongLineIsLearnedFromInPieces) {
  std::string text = read_all(dir->path + "/text.txt");
  std::replace(text.begin(), text.end(), '\n', ' ');
  ASSERT_GT(text.size(), 4u * 16384);
  const std::string one_line = dir->path + "/one_line.txt";
  std::ofstream(one_line, std::ios::binary) << text;
  TokenizerTrainOptions o;
  o.data = {one_line}, o.vocab_size = 400, o.model = "bpe", o.val_fraction = 0.1, o.threads = 1;
  const Tokenizer t = train_tokenizer(o, dir->path + "/one_line.model");
  const Tokenizer lines = Tokenizer::from_file(model);
  const double ratio = double(t.encode(text).size()) / double(lines.encode(text).size());
  EXPECT_LT(ratio, 1.1) << "the one-line corpus's tokenizer compresses it " << ratio << "x worse";
  EXPECT_EQ(t.decode(t.encode(text)), text);
}

// A FIFO as training text or as a checkpoint is refused at once (opening
// one waited for a writer; the text is read again by the training run).
TEST_F(TokenizerTest, AFifoIsRefusedNotWaitedFor) {
  const std::string fifo = dir->path + "/fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  TokenizerTrainOptions o;
  o.data = {fifo}, o.vocab_size = 400, o.threads = 1;
  try {
    train_tokenizer(o, dir->path + "/fifo.model");
    ADD_FAILURE() << "accepted a FIFO";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("not a regular file"), std::string::npos) << e.what();
  }
  EXPECT_THROW(read_safetensors(fifo), InvalidArgument);
  std::filesystem::remove(fifo);
  // an output nothing can be written to is refused before the training (it failed after it)
  o.data = {dir->path + "/text.txt"};
  try {
    train_tokenizer(o, "/proc/coremesh_test.model");
    ADD_FAILURE() << "accepted /proc";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("cannot make a file in '/proc'"), std::string::npos) << e.what();
  }
}

TEST_F(TokenizerTest, CorruptOrMissingFilesAreRefusedWithAMessage) {
  const std::string good = read_all(model);
  std::ofstream(dir->path + "/garbage.model") << "this is not a model";
  std::ofstream(dir->path + "/half.model", std::ios::binary) << good.substr(0, good.size() / 2);
  for (const char* name : {"garbage.model", "half.model"}) {
    try {
      Tokenizer::from_file(dir->path + "/" + name);
      ADD_FAILURE() << name << " was accepted";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("is not a valid SentencePiece model"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("coremesh tokenizer train"), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(Tokenizer::from_file(dir->path + "/missing.model"), InvalidArgument);
  TokenizerTrainOptions o;
  o.data = {dir->path + "/text.txt"}, o.vocab_size = 100;
  EXPECT_THROW(train_tokenizer(o, dir->path + "/small.model"), InvalidArgument);
  o.data = {dir->path}, o.vocab_size = 400;
  try {
    train_tokenizer(o, dir->path + "/dir.model");
    ADD_FAILURE() << "a directory was read as a data file";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("is a directory"), std::string::npos) << e.what();
  }
}

TEST_F(TokenizerTest, VocabMismatchIsRefusedSayingWhatToSet) {
  try {
    Trainer t(tiny(dir->path, model, 256));
    FAIL() << "vocab 256 with a 400-piece tokenizer was accepted";
  } catch (const InvalidArgument& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("model.vocab_size = 256 but tokenizer"), std::string::npos) << m;
    EXPECT_NE(m.find("set model.vocab_size to 400"), std::string::npos) << m;
  }
}

TEST_F(TokenizerTest, RunCarriesItGeneratesEvaluatesAndResumes) {
  TrainConfig c = tiny(dir->path, model, 400);
  c.out_dir = dir->path + "/r1", c.val_every = 3, c.steps = 5;
  Trainer t(c);
  const TrainResult r = t.run(3, true);  // 3 of 5 steps, validated and saved at step 3
  // validation in bits per byte: loss x tokens / bytes / ln 2, bytes those of the targets' text
  ASSERT_GT(r.final_val_bits_per_byte, 0);
  {
    TextDataset data(c.data, c.val_fraction, &t.tokenizer());
    DataLoader val(data, Split::validation, c.batch_size, c.seq_len, c.seed);
    std::vector<int32_t> x, y;
    int64_t bytes = 0;
    for (int i = 0; i < c.val_batches; ++i) val.next_batch(x, y), bytes += t.tokenizer().count_bytes(y.data(), int64_t(y.size()));
    const double tokens = double(c.val_batches * c.batch_size * c.seq_len);
    EXPECT_NEAR(r.final_val_bits_per_byte, r.final_val_loss * tokens / double(bytes) / std::log(2.0), 1e-9);
    EXPECT_LT(r.final_val_bits_per_byte, r.final_val_loss / std::log(2.0)) << "tokens hold more than a byte";
  }
  // the checkpoint carries the tokenizer
  const CheckpointState s = load_checkpoint(r.checkpoint);
  EXPECT_EQ(s.tokenizer, read_all(model));
  // generate decodes with it; evaluate reports bits per byte of the text scored
  auto m = load_model(r.checkpoint);
  const Tokenizer tok = Tokenizer::from_serialized(s.tokenizer, "checkpoint");
  runtime::Stream stream;
  runtime::StreamGuard on(stream);
  const std::string text = generate(*m, tok, "the lord", {6, 0.0, 0, 1});
  EXPECT_GE(text.size(), 6u) << "6 tokens, each at least a byte";
  EXPECT_EQ(text, generate(*m, tok, "the lord", {6, 0.0, 0, 2})) << "greedy";
  TextDataset data(c.data, 0.0, &tok);
  const EvalResult e = evaluate(*m, data, Split::train, 4, 32);
  int64_t bytes = 0;
  for (const auto& w : data.windows(Split::train, 32)) bytes += data.window_bytes(w, 32);
  EXPECT_EQ(e.bytes, bytes);
  EXPECT_GT(double(e.bytes) / double(e.tokens), 2.0);
  EXPECT_NEAR(e.bits_per_byte(), e.loss * double(e.tokens) / double(e.bytes) / std::log(2.0), 1e-12);
  // max_bytes counts text, not tokens (it scored 2.6x the bytes asked for)
  const EvalResult part = evaluate(*m, data, Split::train, 4, 32, bytes / 4);
  EXPECT_LE(part.bytes, bytes / 4);
  EXPECT_GT(part.bytes, bytes / 5);
  // resume continues bit-exactly (against a straight 5-step run)
  TrainConfig c5 = c;
  c5.out_dir = dir->path + "/r5";
  Trainer straight(c5);
  straight.run(-1, false);
  TrainConfig cr = c5;
  cr.out_dir = dir->path + "/rr";
  Trainer resumed(cr);
  resumed.resume(r.checkpoint);
  resumed.run(-1, false);
  ASSERT_EQ(resumed.records().size(), 2u);
  for (size_t i = 0; i < 2; ++i) EXPECT_EQ(resumed.records()[i].loss, straight.records()[3 + i].loss);
  // ... and only with the same tokenizer
  TrainConfig bytes_cfg = tiny(dir->path, "", 400);
  Trainer other(bytes_cfg);
  try {
    other.resume(r.checkpoint);
    ADD_FAILURE() << "a byte-level run resumed a tokenizer's checkpoint";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("was trained with another tokenizer, this run uses bytes"), std::string::npos)
        << e.what();
  }
  // a resume that left the tokenizer out (so the byte vocab, 256): said before the vocab sizes, naming the file
  Trainer bytes_run(tiny(dir->path, "", 256));
  try {
    bytes_run.resume(r.checkpoint);
    ADD_FAILURE() << "a byte-level run resumed a tokenizer's checkpoint";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("--tokenizer " + model), std::string::npos) << e.what();
  }
}

TEST_F(TokenizerTest, ACheckpointWithADamagedOrMismatchedTokenizerIsRefused) {
  TrainConfig c = tiny(dir->path, model, 400);
  c.out_dir = dir->path + "/r2", c.steps = 1;
  const std::string path = Trainer(c).run(-1, true).checkpoint;
  CheckpointState s = load_checkpoint(path);
  auto refused = [&](const std::string& file, const std::string& words) {
    try {
      load_checkpoint(file);
      ADD_FAILURE() << file << " was accepted";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
    }
  };
  // a tokenizer of another vocab size than the model's
  CheckpointState wrong = s;
  wrong.config.vocab_size = 512;
  save_checkpoint(dir->path + "/wrong.safetensors", wrong);
  refused(dir->path + "/wrong.safetensors", "has a model of vocab_size 512 but its tokenizer has 400 pieces");
  // not a model at all
  CheckpointState junk = s;
  junk.tokenizer = "junk";
  save_checkpoint(dir->path + "/junk.safetensors", junk);
  refused(dir->path + "/junk.safetensors", "is not a valid SentencePiece model");
  // a flipped character of the stored model
  std::string bytes = read_all(path);
  const size_t at = bytes.find("\"tokenizer\":\"");
  ASSERT_NE(at, std::string::npos);
  char& ch = bytes[at + 40];
  ch = ch == 'A' ? 'B' : 'A';
  std::ofstream(dir->path + "/flipped.safetensors", std::ios::binary) << bytes;
  refused(dir->path + "/flipped.safetensors", "its tokenizer does not match its recorded checksum");
}

TEST_F(TokenizerTest, TheCliTrainsATokenizerAndUsesIt) {
  const std::string exe = std::string(COREMESH_BINARY_DIR) + "/coremesh", d = dir->path;
  const std::string tok = "'" + exe + "' tokenizer train --vocab 380 --model bpe --threads 1 --data " + d +
                          "/text.txt --out " + d + "/cli.model > " + d + "/tok.txt 2>&1";
  ASSERT_EQ(std::system(tok.c_str()), 0) << read_all(d + "/tok.txt");
  EXPECT_NE(read_all(d + "/tok.txt").find("bytes per token"), std::string::npos) << read_all(d + "/tok.txt");
  // the config leaves vocab_size out: the tokenizer's is taken
  TrainConfig c = tiny(d, d + "/cli.model", 380);
  c.out_dir = d + "/cli", c.val_every = 3;
  nlohmann::json j = to_json(c);
  j["model"].erase("vocab_size");
  std::ofstream(d + "/cfg.json") << j.dump();
  const std::string train = "'" + exe + "' train --config " + d + "/cfg.json > " + d + "/train.txt 2>&1";
  ASSERT_EQ(std::system(train.c_str()), 0) << read_all(d + "/train.txt");
  EXPECT_NE(read_all(d + "/train.txt").find("bits/byte"), std::string::npos) << read_all(d + "/train.txt");
  const std::string gen = "'" + exe + "' generate --checkpoint " + d + "/cli --prompt 'the lord' --tokens 5 > " + d +
                          "/gen.txt 2>&1";
  ASSERT_EQ(std::system(gen.c_str()), 0) << read_all(d + "/gen.txt");
  EXPECT_EQ(read_all(d + "/gen.txt").rfind("the lord", 0), 0u) << read_all(d + "/gen.txt");
  const std::string eval = "'" + exe + "' eval --checkpoint " + d + "/cli --data " + d + "/text.txt > " + d +
                           "/eval.txt 2>&1";
  ASSERT_EQ(std::system(eval.c_str()), 0) << read_all(d + "/eval.txt");
  EXPECT_NE(read_all(d + "/eval.txt").find("bits/byte"), std::string::npos) << read_all(d + "/eval.txt");
  // a vocab given that is not the tokenizer's is refused, saying what to set
  const std::string bad = "'" + exe + "' train --config " + d + "/cfg.json --vocab-size 256 --out " + d + "/bad > " + d +
                          "/bad.txt 2>&1";
  EXPECT_NE(std::system(bad.c_str()), 0);
  EXPECT_NE(read_all(d + "/bad.txt").find("set model.vocab_size to 380"), std::string::npos) << read_all(d + "/bad.txt");
}
