// `coremesh generate` and `coremesh eval`: using a trained checkpoint.
//
//   coremesh generate --checkpoint runs/x --prompt "And God said" --tokens 200 --temperature 0.8 --top-k 20
//   coremesh eval --checkpoint runs/x                      # the run's held-out validation split
//   coremesh eval --checkpoint runs/x --data data/other.txt --max-bytes 1000000
//
// --checkpoint takes a file or a run directory (its latest checkpoint). The
// model comes from the checkpoint; with --config, the config's model section
// must be the checkpoint's (the differences are listed otherwise). Both use
// the tokenizer the checkpoint carries, and show a progress bar on stderr
// (train::ProgressBar) unless --no-progress.
#include <fmt/format.h>

#include <charconv>
#include <filesystem>
#include <limits>
#include <fstream>
#include <iterator>

#include "commands.hpp"
#include "coremesh/core/error.hpp"
#include "coremesh/train/generate.hpp"
#include "coremesh/train/progress_bar.hpp"
#include "coremesh/train/trainer.hpp"

namespace coremesh::cli {
namespace {
namespace fs = std::filesystem;

std::string resolve_checkpoint(const std::string& where) {
  if (!fs::is_directory(where)) return where;
  std::string path = train::latest_checkpoint(where);
  if (path.empty()) path = train::latest_checkpoint((fs::path(where) / "checkpoints").string());
  CM_CHECK(!path.empty(), "pass a checkpoint file or a run directory holding checkpoints/step_*.safetensors",
           "no checkpoint found in '{}'", where);
  return path;
}

struct Loaded {
  std::unique_ptr<model::Model> model;
  train::CheckpointState state;
  std::unique_ptr<train::Tokenizer> tokenizer;  // the checkpoint's (bytes if it has none)
};

Loaded load(const std::string& where, const std::string& config) {
  Loaded l;
  const std::string path = resolve_checkpoint(where);
  l.model = train::load_model(path, &l.state);
  l.tokenizer = std::make_unique<train::Tokenizer>(
      l.state.tokenizer.empty() ? train::Tokenizer::bytes()
                                : train::Tokenizer::from_serialized(l.state.tokenizer, "the tokenizer of '" + path + "'"));
  if (!config.empty()) {
    std::ifstream in(config);
    CM_CHECK(in.good(), "check the --config path", "cannot open config '{}'", config);
    const std::string text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
    const train::TrainConfig cfg = train::train_config_from_text(text, config);
    const auto diffs = model::config_differences(l.state.config, cfg.model);
    if (!diffs.empty()) {
      std::string text = fmt::format("checkpoint '{}' holds another model than '{}':", path, config);
      for (const auto& d : diffs) text += "\n  - model." + d + " (checkpoint vs config)";
      CM_THROW(InvalidArgument, "use the config the checkpoint was trained with, or drop --config", "{}", text);
    }
  }
  return l;
}

// A progress bar fed by train::OnProgress: made at its first call, which
// brings the total; reset() erases it.
struct BarFeed {
  train::ProgressBar::Options options;
  std::unique_ptr<train::ProgressBar> bar;
  BarFeed(std::string label, std::string unit, bool on) {
    options.label = std::move(label), options.unit = std::move(unit);
    if (!on) options.mode = train::ProgressBar::Mode::off;
  }
  train::OnProgress feed() {
    return [this](int64_t done, int64_t total) {
      if (!bar) bar = std::make_unique<train::ProgressBar>(total, options);
      bar->set(done);
    };
  }
};

// The files and split eval scores: --data whole, or else the run's own
// validation split (its data files, held out by its val_fraction).
struct EvalData {
  std::unique_ptr<train::TextDataset> data;
  train::Split split;
  std::string what;
};

// (`tokenizer`, the checkpoint's, outlives the data)
EvalData eval_data(const std::vector<std::string>& files, const train::TrainConfig& trained,
                   const train::CheckpointState& state, const train::Tokenizer& tokenizer) {
  if (!files.empty())
    return {std::make_unique<train::TextDataset>(files, 0.0, &tokenizer), train::Split::train,
            fmt::format("{}", fmt::join(files, ", "))};
  CM_CHECK(trained.val_fraction > 0, "pass --data <text file> to score",
           "the run held out no validation data (val_fraction 0)");
  for (const auto& f : trained.data)
    CM_CHECK(fs::exists(f), "run eval where the run was started (its paths are relative to there), or pass --data",
             "the run's data file '{}' is not here", f);
  auto data = std::make_unique<train::TextDataset>(trained.data, trained.val_fraction, &tokenizer);
  CM_CHECK(data->fingerprint() == state.data_fingerprint, "pass --data to score these files anyway",
           "the run's data files ({}) changed since it was trained: their validation split is not the one it held out",
           fmt::join(trained.data, ", "));
  return {std::move(data), train::Split::validation,
          fmt::format("the validation split of {}", fmt::join(trained.data, ", "))};
}

}  // namespace

void register_generate_command(CLI::App& app) {
  struct Flags {
    std::string checkpoint, prompt, config;
    train::SampleOptions o;
    bool no_progress = false;
  };
  auto f = std::make_shared<Flags>();
  auto* cmd = app.add_subcommand("generate", "Continue a prompt with a trained model");
  cmd->add_option("--checkpoint", f->checkpoint, "checkpoint file or run directory")->required();
  cmd->add_option("--prompt", f->prompt, "text to continue")->required();
  cmd->add_option("--config", f->config, "refuse the checkpoint unless its model is this config's");
  cmd->add_option("--tokens", f->o.tokens, "tokens to generate")->capture_default_str();
  cmd->add_option("--temperature", f->o.temperature, "0: greedy; higher: more random")->capture_default_str();
  cmd->add_option("--top-k", f->o.top_k, "sample among the k most likely tokens (0: all)")->capture_default_str();
  cmd->add_option("--seed", f->o.seed, "sampling seed")
      ->capture_default_str()
      ->check(CLI::Validator(
          [](std::string& text) -> std::string {  // CLI11 wraps -1 and saturates 1e30 into the same seed
            uint64_t v = 0;
            const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
            return ec == std::errc() && end == text.data() + text.size()
                       ? ""
                       : "give a whole number in [0, 18446744073709551615], not '" + text + "'";
          },
          "UINT"));
  cmd->add_flag("--no-progress", f->no_progress, "no progress bar (on stderr)");
  cmd->callback([f] {
    Loaded l = load(f->checkpoint, f->config);
    BarFeed progress("generate", "tokens", !f->no_progress);
    const std::string text = train::generate(*l.model, *l.tokenizer, f->prompt, f->o, progress.feed());
    progress.bar.reset();  // erased before the text
    fmt::print("{}{}\n", f->prompt, text);
  });
}

void register_eval_command(CLI::App& app) {
  struct Flags {
    std::string checkpoint, config;
    std::vector<std::string> data;
    int batch_size = 0, seq_len = 0;
    int64_t max_bytes = 0;
    bool no_progress = false;
  };
  auto f = std::make_shared<Flags>();
  auto* cmd = app.add_subcommand("eval", "Loss of a trained model on its run's validation split or on text files");
  cmd->add_option("--checkpoint", f->checkpoint, "checkpoint file or run directory")->required();
  cmd->add_option("--data", f->data, "text files to score, all of each (default: the run's validation split)");
  cmd->add_option("--max-bytes", f->max_bytes, "score at most this many bytes of text (whole windows spread evenly, at least one; 0: all)")
      ->check(CLI::Range(int64_t{0}, std::numeric_limits<int64_t>::max()).description("INT >= 0"));
  cmd->add_option("--config", f->config, "refuse the checkpoint unless its model is this config's");
  cmd->add_option("--batch-size", f->batch_size, "sequences per batch (default: the training run's)")
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--seq-len", f->seq_len, "tokens per window (default: the training run's)")
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_flag("--no-progress", f->no_progress, "no progress bar (on stderr)");
  cmd->callback([f] {
    Loaded l = load(f->checkpoint, f->config);
    nlohmann::json saved = l.state.train_config;
    saved.erase("adam_steps");  // run state, not config fields
    saved.erase("tokens");
    saved.erase("tokens_per_step");
    const train::TrainConfig trained = train::train_config_from_json({{"train", saved}});
    const int B = f->batch_size > 0 ? f->batch_size : trained.batch_size;
    const int T = f->seq_len > 0 ? f->seq_len : trained.seq_len;
    const EvalData d = eval_data(f->data, trained, l.state, *l.tokenizer);
    BarFeed progress("eval", "tokens", !f->no_progress);
    const train::EvalResult r = train::evaluate(*l.model, *d.data, d.split, B, T, f->max_bytes, progress.feed());
    progress.bar.reset();
    fmt::print("eval: {} tokens ({} bytes) of {} in windows of {}: loss {:.4f} nats/token = {:.3f} bits/byte\n",
               r.tokens, r.bytes, d.what, T, r.loss, r.bits_per_byte());
  });
}

}  // namespace coremesh::cli
