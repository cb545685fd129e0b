// `coremesh train`: training of the MoE model on byte-level text.
//
//   coremesh train --config run.json --data data/bible.txt --steps 500
//   coremesh train --config run.json --dry-run      # sizes, FLOPs, memory; no training
//   coremesh train --config run.json --resume runs/x  # continue from the latest checkpoint
//
// Precedence: built-in defaults < config file (JSON: {"model": {...},
// "train": {...}, "parallel": {...}}) < flags. The flags are generated from
// the configs' field tables (`coremesh train --help` lists them all).
#include <fmt/format.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "commands.hpp"
#include "coremesh/core/error.hpp"
#include "coremesh/runtime/profiler.hpp"
#include "coremesh/train/trainer.hpp"
#include "field_flags.hpp"

namespace coremesh::cli {
namespace {

struct TrainFlags {
  std::string config, resume, profile_dir;
  bool dry_run = false, no_progress = false;
  std::unique_ptr<FieldFlags<model::ModelConfig>> model;
  std::unique_ptr<FieldFlags<train::TrainConfig>> train;
  std::unique_ptr<FieldFlags<parallel::ParallelConfig>> parallel;
};

void print_dry_run(const train::TrainConfig& c) {
  const auto& m = c.model;
  const auto p = model::count_params(m);
  const double fpt = model::flops_per_token(m, c.seq_len);
  const auto mem = model::estimate_memory(m, c.batch_size, c.seq_len);
  fmt::print("model: {} layers ({} dense, {} MoE), d_model {}, heads {} (kv {}), head dim {}\n",
             m.n_layers, m.n_layers - m.n_moe_layers(), m.n_moe_layers(), m.d_model, m.n_heads,
             m.n_kv_heads, m.head_dim());
  if (m.n_routed_experts > 0)
    fmt::print("experts: {} routed (top-{}, {} gating, {} groups keep {}), {} shared, hidden {}\n",
               m.n_routed_experts, m.top_k, model::gating_name(m.gating), m.n_groups, m.topk_groups,
               m.n_shared_experts, m.expert_hidden);
  fmt::print("parameters: {} total ({}), {} active per token, {} in routed experts\n", p.total,
             train::format_count(double(p.total)), train::format_count(double(p.active)),
             train::format_count(double(p.expert)));
  fmt::print("FLOPs per token (train, seq_len {}): {}\n", c.seq_len, train::format_count(fpt));
  fmt::print("FLOPs per step ({} tokens): {}\n", c.tokens_per_step(),
             train::format_count(fpt * double(c.tokens_per_step())));
  const std::string copies = mem.weight_copies > 0
      ? fmt::format(", {} weight copies", train::format_bytes(double(mem.weight_copies))) : "";
  fmt::print("memory: weights {}, gradients {}, AdamW {}, activations {} (micro-batch {}x{}, {}){}, total {}\n",
             train::format_bytes(double(mem.weights)), train::format_bytes(double(mem.gradients)),
             train::format_bytes(double(mem.optimizer)), train::format_bytes(double(mem.activations)),
             c.batch_size, c.seq_len, model::precision_name(m.precision), copies,
             train::format_bytes(double(mem.total())));
}

train::TrainConfig read_config(const TrainFlags& f) {
  train::TrainConfig cfg;
  if (!f.config.empty()) {
    std::ifstream in(f.config);
    CM_CHECK(in.good(), "check the --config path", "cannot open config '{}'", f.config);
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(in);
    } catch (const nlohmann::json::exception& e) {
      CM_THROW(InvalidArgument, "fix the JSON syntax", "cannot parse '{}': {}", f.config, e.what());
    }
    cfg = train::train_config_from_json(j);
  }
  // Flags override the file only when given.
  f.model->apply(cfg.model);
  f.train->apply(cfg);
  f.parallel->apply(cfg.parallel);
  // Without a config file, a longer --seq-len raises max_seq_len with it.
  if (f.train->given("seq_len") && !f.model->given("max_seq_len") && f.config.empty())
    cfg.model.max_seq_len = std::max(cfg.model.max_seq_len, cfg.seq_len);
  if (f.no_progress) cfg.progress = false;
  return cfg;
}

void run_train(const TrainFlags& f) {
  train::TrainConfig cfg = read_config(f);
  if (f.dry_run) {
    cfg.model.validate();
    print_dry_run(cfg);
    if (!cfg.data.empty()) cfg.validate();
    fmt::print("config OK (dry run: nothing trained)\n");
    return;
  }
  cfg.validate();
  std::filesystem::create_directories(cfg.out_dir);
  {
    std::ofstream(std::filesystem::path(cfg.out_dir) / "config.json") << train::to_json(cfg).dump(2) << "\n";
  }
  print_dry_run(cfg);
  train::Trainer trainer(cfg);
  fmt::print("compute cores: {}\n", trainer.cores());
  if (!f.resume.empty()) {
    trainer.resume(f.resume);
    fmt::print("resumed from '{}' at step {}\n", f.resume, trainer.step());
  }
  if (!f.profile_dir.empty()) runtime::profiler_start();
  train::TrainResult r = trainer.run();
  if (!f.profile_dir.empty()) {
    runtime::profiler_stop();
    for (const auto& p : runtime::profiler_export(f.profile_dir)) fmt::print("profile: {}\n", p);
  }
  fmt::print("done: {} steps, loss {:.4f}", r.steps_done, r.final_loss);
  if (r.final_val_loss >= 0)
    fmt::print(", validation {:.4f} nats/byte = {:.3f} bits/byte", r.final_val_loss,
               r.final_val_loss / std::log(2.0));
  fmt::print("\nthroughput: {:.0f} tokens/s, MFU {:.1f}% of the measured GEMM peak\n",
             r.mean_tokens_per_s, 100 * r.mean_mfu);
  if (!r.final_balance.empty())
    fmt::print("expert balance at the last step, per MoE layer: {:.2f} (busiest expert's tokens / mean; 1 = even)\n",
               fmt::join(r.final_balance, ", "));
  if (!r.checkpoint.empty()) fmt::print("checkpoint: {}\n", r.checkpoint);
  if (!r.report.empty()) fmt::print("report: {}\n", std::filesystem::absolute(r.report).string());
}

}  // namespace

void register_train_command(CLI::App& app) {
  auto f = std::make_shared<TrainFlags>();
  auto* cmd = app.add_subcommand("train", "Train the MoE transformer on byte-level text");
  cmd->add_option("--config", f->config, "JSON config: {\"model\": {...}, \"train\": {...}, \"parallel\": {...}}");
  cmd->add_option("--resume", f->resume, "checkpoint file or run directory to continue from");
  cmd->add_flag("--dry-run", f->dry_run, "print parameter count, FLOPs per token and memory; do not train");
  cmd->add_option("--profile", f->profile_dir, "write kernel_details.csv and a Chrome trace here");
  cmd->add_flag("--no-progress", f->no_progress, "no progress output");
  f->train = std::make_unique<FieldFlags<train::TrainConfig>>(*cmd, train::train_fields(), "Training");
  f->model = std::make_unique<FieldFlags<model::ModelConfig>>(*cmd, model::model_fields(), "Model");
  f->parallel = std::make_unique<FieldFlags<parallel::ParallelConfig>>(*cmd, parallel::parallel_fields(), "Parallel");
  cmd->callback([f] { run_train(*f); });
}

}  // namespace coremesh::cli
