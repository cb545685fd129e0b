// `coremesh train`: single-PE training of the MoE model on byte-level text.
//
//   coremesh train --config run.json --data data/bible.txt --steps 500
//   coremesh train --config run.json --dry-run      # sizes, FLOPs, memory; no training
//   coremesh train --config run.json --resume runs/x  # continue from the latest checkpoint
//
// Precedence: built-in defaults < config file (JSON: {"model": {...},
// "train": {...}}) < flags.
#include <fmt/format.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "commands.hpp"
#include "coremesh/core/error.hpp"
#include "coremesh/runtime/profiler.hpp"
#include "coremesh/train/trainer.hpp"

namespace coremesh::cli {
namespace {

struct TrainFlags {
  std::string config, resume, profile_dir;
  bool dry_run = false, no_progress = false;
  train::TrainConfig cfg;
  std::string gating, precision, drop_policy;
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

void run_train(TrainFlags& f, CLI::App* cmd) {
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
  auto set = [&](const char* name, auto& dst, const auto& src) {
    if (cmd->count(name) > 0) dst = src;
  };
  const auto& o = f.cfg;
  set("--data", cfg.data, o.data);
  set("--steps", cfg.steps, o.steps);
  set("--batch-size", cfg.batch_size, o.batch_size);
  set("--seq-len", cfg.seq_len, o.seq_len);
  set("--grad-accum", cfg.grad_accum, o.grad_accum);
  set("--lr", cfg.lr, o.lr);
  set("--min-lr", cfg.min_lr, o.min_lr);
  set("--warmup", cfg.warmup_steps, o.warmup_steps);
  set("--weight-decay", cfg.adam.weight_decay, o.adam.weight_decay);
  set("--grad-clip", cfg.adam.grad_clip, o.adam.grad_clip);
  set("--seed", cfg.seed, o.seed);
  set("--val-every", cfg.val_every, o.val_every);
  set("--val-batches", cfg.val_batches, o.val_batches);
  set("--val-fraction", cfg.val_fraction, o.val_fraction);
  set("--log-every", cfg.log_every, o.log_every);
  set("--out", cfg.out_dir, o.out_dir);
  set("--ckpt-every", cfg.ckpt_every, o.ckpt_every);
  set("--keep-checkpoints", cfg.keep_checkpoints, o.keep_checkpoints);
  set("--threads", cfg.threads, o.threads);
  set("--d-model", cfg.model.d_model, o.model.d_model);
  set("--layers", cfg.model.n_layers, o.model.n_layers);
  set("--heads", cfg.model.n_heads, o.model.n_heads);
  set("--kv-heads", cfg.model.n_kv_heads, o.model.n_kv_heads);
  set("--first-k-dense", cfg.model.first_k_dense, o.model.first_k_dense);
  set("--dense-hidden", cfg.model.dense_hidden, o.model.dense_hidden);
  set("--experts", cfg.model.n_routed_experts, o.model.n_routed_experts);
  set("--shared-experts", cfg.model.n_shared_experts, o.model.n_shared_experts);
  set("--top-k", cfg.model.top_k, o.model.top_k);
  set("--expert-hidden", cfg.model.expert_hidden, o.model.expert_hidden);
  set("--groups", cfg.model.n_groups, o.model.n_groups);
  set("--topk-groups", cfg.model.topk_groups, o.model.topk_groups);
  set("--bias-rate", cfg.model.bias_update_rate, o.model.bias_update_rate);
  set("--aux-alpha", cfg.model.aux_loss_alpha, o.model.aux_loss_alpha);
  set("--capacity-factor", cfg.model.capacity_factor, o.model.capacity_factor);
  set("--max-seq-len", cfg.model.max_seq_len, o.model.max_seq_len);
  if (cmd->count("--seq-len") > 0 && cmd->count("--max-seq-len") == 0 && f.config.empty())
    cfg.model.max_seq_len = std::max(cfg.model.max_seq_len, cfg.seq_len);
  nlohmann::json extra;
  if (!f.gating.empty()) extra["gating"] = f.gating;
  if (!f.drop_policy.empty()) extra["drop_policy"] = f.drop_policy;
  if (!f.precision.empty()) extra["precision"] = f.precision;
  if (!extra.empty()) {
    nlohmann::json mj = model::to_json(cfg.model);
    mj.update(extra);
    cfg.model = model::model_config_from_json(mj);
  }
  if (f.no_progress) cfg.progress = false;

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
  if (!r.checkpoint.empty()) fmt::print("checkpoint: {}\n", r.checkpoint);
  if (!r.report.empty()) fmt::print("report: {}\n", std::filesystem::absolute(r.report).string());
}

}  // namespace

void register_train_command(CLI::App& app) {
  auto f = std::make_shared<TrainFlags>();
  auto* cmd = app.add_subcommand("train", "Train the MoE transformer on byte-level text (one PE)");
  auto& c = f->cfg;
  cmd->add_option("--config", f->config, "JSON config: {\"model\": {...}, \"train\": {...}}");
  cmd->add_option("--data", c.data, "text files (byte-level tokens)");
  cmd->add_option("--resume", f->resume, "checkpoint file or run directory to continue from");
  cmd->add_flag("--dry-run", f->dry_run, "print parameter count, FLOPs per token and memory; do not train");
  cmd->add_option("--profile", f->profile_dir, "write kernel_details.csv and a Chrome trace here");
  cmd->add_flag("--no-progress", f->no_progress, "no progress output");
  cmd->add_option("--steps", c.steps, "optimizer steps");
  cmd->add_option("--batch-size", c.batch_size, "sequences per micro-batch");
  cmd->add_option("--seq-len", c.seq_len, "tokens per sequence");
  cmd->add_option("--grad-accum", c.grad_accum, "micro-batches per step");
  cmd->add_option("--lr", c.lr, "peak learning rate");
  cmd->add_option("--min-lr", c.min_lr, "final learning rate of the cosine");
  cmd->add_option("--warmup", c.warmup_steps, "linear warmup steps");
  cmd->add_option("--weight-decay", c.adam.weight_decay, "AdamW weight decay (matrices)");
  cmd->add_option("--grad-clip", c.adam.grad_clip, "global gradient norm clip (<= 0: off)");
  cmd->add_option("--seed", c.seed, "initialization and data order seed");
  cmd->add_option("--val-every", c.val_every, "validation every N steps (0: at the end)");
  cmd->add_option("--val-batches", c.val_batches, "batches per validation");
  cmd->add_option("--val-fraction", c.val_fraction, "share of each file held out");
  cmd->add_option("--log-every", c.log_every, "log line every N steps off a terminal");
  cmd->add_option("--out", c.out_dir, "run directory (checkpoints, report.html, config.json)");
  cmd->add_option("--ckpt-every", c.ckpt_every, "checkpoint every N steps (0: at the end)");
  cmd->add_option("--keep-checkpoints", c.keep_checkpoints, "keep the newest N checkpoints");
  cmd->add_option("--threads", c.threads, "compute threads (0: all CPUs)");
  cmd->add_option("--d-model", c.model.d_model, "model width");
  cmd->add_option("--layers", c.model.n_layers, "decoder layers");
  cmd->add_option("--heads", c.model.n_heads, "attention heads");
  cmd->add_option("--kv-heads", c.model.n_kv_heads, "key/value heads (GQA)");
  cmd->add_option("--first-k-dense", c.model.first_k_dense, "leading dense layers");
  cmd->add_option("--dense-hidden", c.model.dense_hidden, "dense SwiGLU hidden size");
  cmd->add_option("--experts", c.model.n_routed_experts, "routed experts");
  cmd->add_option("--shared-experts", c.model.n_shared_experts, "shared experts");
  cmd->add_option("--top-k", c.model.top_k, "experts per token");
  cmd->add_option("--expert-hidden", c.model.expert_hidden, "expert SwiGLU hidden size");
  cmd->add_option("--groups", c.model.n_groups, "expert groups (group-limited routing)");
  cmd->add_option("--topk-groups", c.model.topk_groups, "groups kept per token");
  cmd->add_option("--bias-rate", c.model.bias_update_rate, "aux-loss-free bias update rate");
  cmd->add_option("--aux-alpha", c.model.aux_loss_alpha, "balance loss weight");
  cmd->add_option("--capacity-factor", c.model.capacity_factor, "expert capacity factor (<= 0: none)");
  cmd->add_option("--max-seq-len", c.model.max_seq_len, "longest sequence the model accepts");
  cmd->add_option("--gating", f->gating, "softmax | sigmoid");
  cmd->add_option("--drop-policy", f->drop_policy, "token_order | low_score");
  cmd->add_option("--precision", f->precision, "GEMM precision of the transformer blocks: f32, bf16 or fp8 (DeepSeek-V3 block scaling); master weights stay f32");
  cmd->callback([f, cmd] { run_train(*f, cmd); });
}

}  // namespace coremesh::cli
