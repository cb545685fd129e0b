// A run's configuration from the command line, as `train`, `simulate` and
// `plan` read it: built-in defaults < the --config file (JSON: {"model":
// {...}, "train": {...}, "parallel": {...}}) < flags, which are generated from
// the configs' field tables.
#pragma once

#include <CLI/CLI.hpp>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "coremesh/core/error.hpp"
#include "coremesh/train/tokenizer.hpp"
#include "coremesh/train/train_config.hpp"
#include "field_flags.hpp"

namespace coremesh::cli {

struct ConfigFlags {
  std::string config;
  std::unique_ptr<FieldFlags<model::ModelConfig>> model;
  std::unique_ptr<FieldFlags<train::TrainConfig>> train;
  std::unique_ptr<FieldFlags<parallel::ParallelConfig>> parallel;

  void add(CLI::App& cmd) {
    cmd.add_option("--config", config, "JSON config: {\"model\": {...}, \"train\": {...}, \"parallel\": {...}}");
    train = std::make_unique<FieldFlags<train::TrainConfig>>(cmd, train::train_fields(), "Training");
    model = std::make_unique<FieldFlags<model::ModelConfig>>(cmd, model::model_fields(), "Model");
    parallel = std::make_unique<FieldFlags<parallel::ParallelConfig>>(cmd, parallel::parallel_fields(), "Parallel");
  }

  train::TrainConfig read() const { return read(config); }
  // With `config` read from another file (a run's own config.json).
  train::TrainConfig read(const std::string& config) const {
    train::TrainConfig cfg;
    bool vocab_in_file = false;
    if (!config.empty()) {
      std::error_code ec;
      CM_CHECK(!std::filesystem::is_directory(config, ec), "pass the JSON file, not its directory",
               "--config '{}' is a directory", config);
      std::ifstream in(config);
      CM_CHECK(in.good(), "check the --config path", "cannot open config '{}'", config);
      const std::string text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
      cfg = train::train_config_from_text(text, config);
      const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);  // parsed above
      vocab_in_file = j.is_object() && j.contains("model") && j.at("model").is_object() && j.at("model").contains("vocab_size");
    }
    // Flags override the file only when given.
    model->apply(cfg.model);
    train->apply(cfg);
    parallel->apply(cfg.parallel);
    // Without a config file, a longer --seq-len raises max_seq_len with it.
    if (train->given("seq_len") && !model->given("max_seq_len") && config.empty())
      cfg.model.max_seq_len = std::max(cfg.model.max_seq_len, cfg.seq_len);
    // A tokenizer sets the vocabulary unless the config or a flag gives it
    // (then the trainer refuses a mismatch).
    if (!cfg.tokenizer.empty() && !vocab_in_file && !model->given("vocab_size"))
      cfg.model.vocab_size = train::Tokenizer::from_file(cfg.tokenizer).vocab_size();
    return cfg;
  }
};

}  // namespace coremesh::cli
