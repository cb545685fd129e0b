#include "coremesh/train/trainer.hpp"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "coremesh/core/error.hpp"
#include "coremesh/runtime/device.hpp"

namespace coremesh::train {
namespace fs = std::filesystem;

void TrainConfig::validate() const {
  model.validate();
  CM_CHECK(!data.empty(), "pass --data <text file> or set \"data\" in the config", "no training data");
  CM_CHECK(batch_size > 0 && seq_len > 0 && grad_accum > 0,
           "use positive batch_size, seq_len and grad_accum",
           "batch_size = {}, seq_len = {}, grad_accum = {}", batch_size, seq_len, grad_accum);
  CM_CHECK(seq_len <= model.max_seq_len, "lower seq_len or raise model.max_seq_len",
           "seq_len = {} exceeds model.max_seq_len = {}", seq_len, model.max_seq_len);
  CM_CHECK(model.vocab_size >= 256, "byte-level data needs vocab_size >= 256",
           "vocab_size = {} is too small for byte tokens", model.vocab_size);
  CM_CHECK(val_batches > 0 && val_every >= 0 && ckpt_every >= 0 && log_every > 0,
           "use positive val_batches/log_every and non-negative val_every/ckpt_every",
           "bad evaluation/checkpoint intervals");
  LrSchedule{lr, min_lr, warmup_steps, steps}.validate();
}

#define CM_JSON_FIELD(j, c, name) \
  if ((j).contains(#name)) (c).name = (j).at(#name).get<decltype((c).name)>()

TrainConfig train_config_from_json(const nlohmann::json& j, TrainConfig c) {
  try {
    if (j.contains("model")) c.model = model::model_config_from_json(j.at("model"));
    const nlohmann::json& t = j.contains("train") ? j.at("train") : j;
    for (const auto& [key, value] : t.items()) {
      static const char* known[] = {"model", "train", "data", "val_fraction", "batch_size", "seq_len",
                                    "grad_accum", "steps", "lr", "min_lr", "warmup_steps", "beta1",
                                    "beta2", "eps", "weight_decay", "grad_clip", "seed", "val_every",
                                    "val_batches", "log_every", "out_dir", "ckpt_every",
                                    "keep_checkpoints", "threads", "report"};
      bool ok = false;
      for (const char* k : known) ok = ok || key == k;
      CM_CHECK(ok, "see docs or `coremesh train --help` for the fields", "unknown train config field '{}'", key);
    }
    CM_JSON_FIELD(t, c, data);
    CM_JSON_FIELD(t, c, val_fraction);
    CM_JSON_FIELD(t, c, batch_size);
    CM_JSON_FIELD(t, c, seq_len);
    CM_JSON_FIELD(t, c, grad_accum);
    CM_JSON_FIELD(t, c, steps);
    CM_JSON_FIELD(t, c, lr);
    CM_JSON_FIELD(t, c, min_lr);
    CM_JSON_FIELD(t, c, warmup_steps);
    CM_JSON_FIELD(t, c, seed);
    CM_JSON_FIELD(t, c, val_every);
    CM_JSON_FIELD(t, c, val_batches);
    CM_JSON_FIELD(t, c, log_every);
    CM_JSON_FIELD(t, c, out_dir);
    CM_JSON_FIELD(t, c, ckpt_every);
    CM_JSON_FIELD(t, c, keep_checkpoints);
    CM_JSON_FIELD(t, c, threads);
    CM_JSON_FIELD(t, c, report);
    CM_JSON_FIELD(t, c.adam, beta1);
    CM_JSON_FIELD(t, c.adam, beta2);
    CM_JSON_FIELD(t, c.adam, eps);
    CM_JSON_FIELD(t, c.adam, weight_decay);
    CM_JSON_FIELD(t, c.adam, grad_clip);
  } catch (const nlohmann::json::exception& e) {
    CM_THROW(InvalidArgument, "give each field a value of the documented type",
             "bad train config: {}", e.what());
  }
  return c;
}

nlohmann::json to_json(const TrainConfig& c) {
  return {{"model", model::to_json(c.model)},
          {"train",
           {{"data", c.data}, {"val_fraction", c.val_fraction}, {"batch_size", c.batch_size},
            {"seq_len", c.seq_len}, {"grad_accum", c.grad_accum}, {"steps", c.steps},
            {"lr", c.lr}, {"min_lr", c.min_lr}, {"warmup_steps", c.warmup_steps},
            {"beta1", c.adam.beta1}, {"beta2", c.adam.beta2}, {"eps", c.adam.eps},
            {"weight_decay", c.adam.weight_decay}, {"grad_clip", c.adam.grad_clip},
            {"seed", c.seed}, {"val_every", c.val_every}, {"val_batches", c.val_batches},
            {"log_every", c.log_every}, {"out_dir", c.out_dir}, {"ckpt_every", c.ckpt_every},
            {"keep_checkpoints", c.keep_checkpoints}, {"threads", c.threads},
            {"report", c.report}}}};
}

static int resolve_threads(int threads) {
  return threads > 0 ? threads : std::max(1, int(::sysconf(_SC_NPROCESSORS_ONLN)));
}

Trainer::Trainer(const TrainConfig& config) : cfg_(config), rng_(config.seed) {
  cfg_.validate();
  {  // kernels tile over the runtime's cores: cap them at `threads` (device limit)
    auto& dev = runtime::Device::default_device();
    const runtime::CoreLimits spec = dev.spec();
    const int n = resolve_threads(cfg_.threads);
    dev.set_limit(std::min(n, spec.cube), std::min(n, spec.vector));
  }
  data_ = std::make_unique<TextDataset>(cfg_.data, cfg_.val_fraction);
  train_loader_ = std::make_unique<DataLoader>(*data_, Split::train, cfg_.batch_size, cfg_.seq_len, cfg_.seed);
  if (cfg_.val_fraction > 0)
    val_loader_ = std::make_unique<DataLoader>(*data_, Split::validation, cfg_.batch_size, cfg_.seq_len, cfg_.seed);
  model_ = std::make_unique<model::Model>(cfg_.model);
  model_->init_weights(rng_.next_u64());
  opt_ = std::make_unique<AdamW>(*model_, cfg_.adam);
  schedule_ = LrSchedule{cfg_.lr, cfg_.min_lr, cfg_.warmup_steps, cfg_.steps};
}

CheckpointState Trainer::checkpoint_state() const {
  CheckpointState s;
  s.config = cfg_.model;
  s.train_config = to_json(cfg_)["train"];
  s.train_config["adam_steps"] = opt_->steps();
  s.step = step_;
  s.rng_state = rng_.state();
  s.data_position = train_loader_->position();
  s.data_fingerprint = data_->fingerprint();
  s.params = model_->named_params();
  for (const auto& p : model_->params()) {
    s.adam_m.emplace_back(p.name, opt_->m().slice(0, p.offset, p.offset + p.numel).view(p.shape));
    s.adam_v.emplace_back(p.name, opt_->v().slice(0, p.offset, p.offset + p.numel).view(p.shape));
  }
  s.buffers = model_->named_buffers();
  return s;
}

std::string Trainer::save_checkpoint_now() {
  const std::string dir = (fs::path(cfg_.out_dir) / "checkpoints").string();
  const std::string path = checkpoint_path(dir, step_);
  save_checkpoint(path, checkpoint_state());
  prune_checkpoints(dir, cfg_.keep_checkpoints);
  return path;
}

void Trainer::resume(const std::string& where) {
  std::string path = where;
  if (fs::is_directory(where)) {
    path = latest_checkpoint(where);
    if (path.empty()) path = latest_checkpoint((fs::path(where) / "checkpoints").string());
    CM_CHECK(!path.empty(), "pass a checkpoint file or a directory holding step_*.safetensors",
             "no checkpoint found in '{}'", where);
  }
  CheckpointState s = load_checkpoint(path);
  check_compatible(s, cfg_.model, model_->named_params(), path);
  CM_CHECK(s.data_fingerprint == data_->fingerprint(),
           "resume with the same data files as the run that saved the checkpoint",
           "checkpoint '{}' was trained on different data (fingerprint {} vs {})", path,
           s.data_fingerprint, data_->fingerprint());
  auto copy = [&](const NamedTensors& from, const std::function<Tensor(const model::ParamInfo&)>& to,
                  const char* what) {
    std::map<std::string, Tensor> by_name(from.begin(), from.end());
    for (const auto& p : model_->params()) {
      auto it = by_name.find(p.name);
      CM_CHECK(it != by_name.end(), "resume from a complete checkpoint",
               "checkpoint '{}' lacks {} of '{}'", path, what, p.name);
      Tensor dst = to(p);
      dst.copy_from(it->second);
    }
  };
  copy(s.params, [&](const model::ParamInfo& p) { return model_->param(p.name); }, "weights");
  copy(s.adam_m, [&](const model::ParamInfo& p) { return opt_->m().slice(0, p.offset, p.offset + p.numel).view(p.shape); }, "AdamW m");
  copy(s.adam_v, [&](const model::ParamInfo& p) { return opt_->v().slice(0, p.offset, p.offset + p.numel).view(p.shape); }, "AdamW v");
  std::map<std::string, Tensor> bufs(s.buffers.begin(), s.buffers.end());
  for (auto& [name, b] : model_->named_buffers()) {
    auto it = bufs.find(name);
    CM_CHECK(it != bufs.end() && it->second.shape() == b.shape(), "resume from a complete checkpoint",
             "checkpoint '{}' lacks buffer '{}'", path, name);
    b.copy_from(it->second);
  }
  opt_->set_steps(s.train_config.value("adam_steps", s.step));
  rng_.set_state(s.rng_state);
  train_loader_->set_position(s.data_position);
  step_ = s.step;
}

double Trainer::validate() {
  if (!val_loader_) return -1;
  val_loader_->reset();
  std::vector<int32_t> x, y;
  double sum = 0;
  for (int i = 0; i < cfg_.val_batches; ++i) {
    val_loader_->next_batch(x, y);
    sum += model_->forward(x.data(), y.data(), cfg_.batch_size, cfg_.seq_len);
  }
  return sum / cfg_.val_batches;
}

TrainResult Trainer::run(int64_t until_step, bool save_at_end) {
  const int64_t end = until_step < 0 ? cfg_.steps : std::min(until_step, cfg_.steps);
  const int threads = resolve_threads(cfg_.threads);
  const double flops_tok = model::flops_per_token(cfg_.model, cfg_.seq_len);
  const double peak = measured_peak_flops(threads);
  Progress progress(cfg_.steps, step_, cfg_.log_every, stderr, cfg_.progress ? -1 : 0);
  std::vector<int32_t> x, y;
  const int64_t heat_every = std::max<int64_t>(1, cfg_.steps / 200);
  TrainResult result;
  double val = -1;
  for (; step_ < end; ++step_) {
    const double t0 = now_seconds();
    model_->reset_expert_counts();
    double loss = 0, aux = 0;
    for (int m = 0; m < cfg_.grad_accum; ++m) {
      train_loader_->next_batch(x, y);
      loss += model_->forward(x.data(), y.data(), cfg_.batch_size, cfg_.seq_len) / cfg_.grad_accum;
      aux += model_->aux_loss() / cfg_.grad_accum;
      model_->backward(1.0f / float(cfg_.grad_accum), /*accumulate=*/m > 0);
    }
    CM_CHECK(std::isfinite(loss), "lower the learning rate or enable gradient clipping",
             "loss became {} at step {}", loss, step_ + 1);
    StepRecord r;
    r.step = step_;
    r.loss = loss;
    r.aux_loss = aux;
    r.grad_norm = opt_->clip_gradients();
    r.lr = schedule_.at(step_);
    opt_->step(r.lr);
    model_->update_router_bias();
    r.seconds = now_seconds() - t0;
    r.tokens_per_s = double(cfg_.tokens_per_step()) / r.seconds;
    r.mfu = flops_tok * r.tokens_per_s / peak;
    ExpertLoadRecord load{step_, {}};
    for (const auto& counts : model_->expert_counts()) {
      r.expert_balance = std::max(r.expert_balance, expert_balance(counts));
      double sum = 0;
      for (double c : counts) sum += c;
      std::vector<double> share;
      for (double c : counts) share.push_back(sum > 0 ? c / sum : 0);
      load.load.push_back(share);
    }
    if (!load.load.empty() && step_ % heat_every == 0) expert_load_.push_back(load);
    records_.push_back(r);
    val = -1;
    if ((cfg_.val_every > 0 && (step_ + 1) % cfg_.val_every == 0) || step_ + 1 == cfg_.steps) {
      val = validate();
      if (val >= 0) val_records_.push_back({step_, val});
    }
    if (cfg_.progress) progress.update(r, val);
    if (cfg_.ckpt_every > 0 && (step_ + 1) % cfg_.ckpt_every == 0 && step_ + 1 < end) {
      std::string p = save_checkpoint_now();
      if (cfg_.progress) progress.message("saved checkpoint " + p);
    }
  }
  if (cfg_.progress) progress.finish();
  result.steps_done = step_;
  if (!records_.empty()) result.final_loss = records_.back().loss;
  if (!val_records_.empty()) result.final_val_loss = val_records_.back().loss;
  // Throughput over the steady part (the first step warms caches and allocations).
  double tok = 0, sec = 0;
  for (size_t i = records_.size() > 1 ? 1 : 0; i < records_.size(); ++i)
    tok += double(cfg_.tokens_per_step()), sec += records_[i].seconds;
  result.mean_tokens_per_s = sec > 0 ? tok / sec : 0;
  // Runs long enough to report MFU take the higher of the peaks measured at
  // their start and end (the core's speed drifts).
  result.mean_mfu = flops_tok * result.mean_tokens_per_s / (sec >= 2 ? remeasure_peak_flops(threads) : peak);
  if (save_at_end) result.checkpoint = save_checkpoint_now();
  if (cfg_.report) {
    fs::create_directories(cfg_.out_dir);
    result.report = write_report((fs::path(cfg_.out_dir) / "report.html").string(), report_data());
  }
  return result;
}

ReportData Trainer::report_data() const {
  ReportData d;
  const auto pc = model::count_params(cfg_.model);
  const auto& m = cfg_.model;
  d.summary = {
      {"model", fmt::format("{} layers, d_model {}, {} heads ({} kv), {} routed experts top-{} + {} shared, "
                            "{} gating", m.n_layers, m.d_model, m.n_heads, m.n_kv_heads,
                            m.n_routed_experts, m.top_k, m.n_shared_experts, model::gating_name(m.gating))},
      {"parameters", fmt::format("{} total, {} active per token", format_count(double(pc.total)),
                                 format_count(double(pc.active)))},
      {"data", fmt::format("{} ({} bytes)", fmt::join(cfg_.data, ", "), data_->total_bytes())},
      {"batch", fmt::format("{} x {} tokens x {} micro-batches", cfg_.batch_size, cfg_.seq_len, cfg_.grad_accum)},
      {"steps", std::to_string(step_)}};
  if (!records_.empty()) {
    d.summary.emplace_back("final training loss", fmt::format("{:.4f} nats/byte", records_.back().loss));
    double tps = 0;
    for (const auto& r : records_) tps += r.tokens_per_s;
    d.summary.emplace_back("mean tokens/s", format_count(tps / double(records_.size())));
  }
  if (!val_records_.empty())
    d.summary.emplace_back("final validation loss",
                           fmt::format("{:.4f} nats/byte = {:.3f} bits/byte", val_records_.back().loss,
                                       val_records_.back().loss / std::log(2.0)));
  d.steps = records_;
  d.validation = val_records_;
  d.expert_load = expert_load_;
  return d;
}

}  // namespace coremesh::train
