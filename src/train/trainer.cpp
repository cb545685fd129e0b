#include "coremesh/train/trainer.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <set>
#include <tuple>

#include <fmt/ranges.h>

#include "coremesh/core/allocator.hpp"
#include "coremesh/core/error.hpp"
#include "coremesh/core/log.hpp"
#include "coremesh/graph/exec.hpp"
#include "coremesh/parallel/comm.hpp"
#include "coremesh/runtime/capture.hpp"
#include "coremesh/train/generate.hpp"
#include "coremesh/train/metrics.hpp"
#include "coremesh/train/progress_bar.hpp"

namespace coremesh::train {

class Trainer::Busy {
 public:
  Busy(Trainer& t, const char* what) : t_(t) {
    std::thread::id expected{};
    if (!t_.busy_thread_.compare_exchange_strong(expected, std::this_thread::get_id()))
      CM_CHECK(expected == std::this_thread::get_id(), "call a Trainer from one thread at a time",
               "Trainer::{} while another thread is inside the same trainer", what);
    ++t_.busy_depth_;
  }
  ~Busy() {
    if (--t_.busy_depth_ == 0) t_.busy_thread_.store(std::thread::id{});
  }
  Busy(const Busy&) = delete;
  Busy& operator=(const Busy&) = delete;

 private:
  Trainer& t_;
};

// Calls that read or write the state a queued step is still changing.
#define CM_REFUSE_WHILE_QUEUED(what)                                                                   \
  CM_CHECK(!step_queued_, "finish_step() the queued step first",                                     \
           "{} while a step is queued (it would see the step half done)", what)

namespace fs = std::filesystem;

Trainer::Trainer(const TrainConfig& config, runtime::Device& device)
    : cfg_(config), stream_(device), rng_(config.seed) {
  cfg_.validate();
  // kernels tile over the device's cores: this run's stream may use `cores` of them
  const runtime::CoreLimits spec = device.spec();
  cores_ = cfg_.cores > 0 ? std::min({cfg_.cores, spec.cube, spec.vector}) : std::min(spec.cube, spec.vector);
  runtime::set_stream_limit(stream_, cores_, cores_);
  tokenizer_ = std::make_unique<Tokenizer>(cfg_.tokenizer.empty() ? Tokenizer::bytes()
                                                                  : Tokenizer::from_file(cfg_.tokenizer));
  CM_CHECK(cfg_.tokenizer.empty() || cfg_.model.vocab_size == tokenizer_->vocab_size(),
           fmt::format("set model.vocab_size to {} (--vocab-size {}), or leave it out of the config and flags "
                       "to take the tokenizer's",
                       tokenizer_->vocab_size(), tokenizer_->vocab_size()),
           "model.vocab_size = {} but tokenizer '{}' has {} pieces", cfg_.model.vocab_size, cfg_.tokenizer,
           tokenizer_->vocab_size());
  data_ = std::make_unique<TextDataset>(cfg_.data, cfg_.val_fraction, tokenizer_.get());
  train_loader_ = std::make_unique<DataLoader>(*data_, Split::train, cfg_.batch_size, cfg_.seq_len, cfg_.seed);
  if (cfg_.val_fraction > 0)
    val_loader_ = std::make_unique<DataLoader>(*data_, Split::validation, cfg_.batch_size, cfg_.seq_len, cfg_.seed);
  check_every_pe_has_this_run();  // before the plan, whose collectives are sized by the settings
  plan_ = std::make_unique<parallel::ParallelPlan>(plan_config(cfg_), device);
  if (val_loader_) {
    // Past the split's whole batches a validation would score windows twice.
    val_batches_ = int(std::min<int64_t>(cfg_.val_batches, val_loader_->batches_per_epoch()));
    if (val_batches_ < cfg_.val_batches && leader())
      CM_LOG_WARN("val_batches = {} but the validation split holds {} batch{} of {} x {} tokens: each validation "
                  "scores those (raise val_fraction for more)",
                  cfg_.val_batches, val_batches_, val_batches_ == 1 ? "" : "es", cfg_.batch_size, cfg_.seq_len);
  }
  model_ = std::make_unique<model::Model>(cfg_.model, plan_->stage(), plan_->seams(), plan_->arena());
  plan_->attach(*model_);
  opt_ = std::make_unique<AdamW>(*model_, cfg_.adam, plan_->owned_ranges(), plan_->state_allocator());
  model_->init_weights(rng_.next_u64());
  {
    runtime::StreamGuard on(stream_);
    plan_->sync_tied_table(*model_);  // a head apart from the embedding holds a replica of its table
  }
  lr_ = LrSchedule{cfg_.lr, cfg_.min_lr, cfg_.warmup_steps, cfg_.steps};
  limit_run_ahead();
}

// Every PE must train the same run: a setting that differs between PEs (a
// Python script's seed or lr per PE, a config edited on one host) trains a
// model no single-PE run reproduces, silently, or hangs in an exchange.
// Each setting's text hashes to 62 bits; the world's maxima of the hashes
// and of their negations meet exactly when every PE's hash is the same, and
// they are the same on every PE, so every PE decides alike. Paths, the core
// count and what only the leader prints may differ between hosts; the
// data's contents may not.
void Trainer::check_every_pe_has_this_run() {
  if (cfg_.parallel.world() == 1 || parallel::job_pes() != cfg_.parallel.world()) return;  // the plan says why
  static const std::set<std::string> per_pe = {"train.data", "train.tokenizer", "train.out_dir", "train.cores",
                                               "train.report", "train.log_every", "parallel.schedule_file"};
  std::vector<std::pair<std::string, std::string>> settings;  // name, its text here
  const nlohmann::json config = to_json(cfg_);
  for (const auto& [section, fields] : config.items())
    for (const auto& [key, value] : fields.items())
      if (!per_pe.count(section + "." + key)) settings.emplace_back(section + "." + key, value.dump());
  settings.emplace_back("the training data's contents", data_->fingerprint());
  const size_t n = settings.size();
  std::vector<int64_t> mine(2 * n);
  for (size_t i = 0; i < n; ++i) {
    uint64_t h = 1469598103934665603ULL;  // FNV-1a
    for (unsigned char c : settings[i].second) h = (h ^ c) * 1099511628211ULL;
    mine[i] = int64_t(h >> 2), mine[n + i] = -mine[i];
  }
  const std::vector<int64_t> most = parallel::max_over_world(mine);
  std::vector<std::string> differ;
  for (size_t i = 0; i < n; ++i)
    if (most[i] != -most[n + i]) differ.push_back(fmt::format("{} (here {})", settings[i].first, settings[i].second));
  CM_CHECK(differ.empty(),
           "give every PE the same settings: one config file and the same flags, or the same values in "
           "every PE's script (a seed or lr taken per PE differs)",
           "the PEs were given different training settings: {}", fmt::join(differ, ", "));
}

Trainer::~Trainer() {
  if (set_soft_limit_) set_host_soft_limit(0);
}

// The host runs ahead of the device unless held back, by a whole step's
// backward and a whole validation, and every queued kernel keeps its
// tensors: the host allocator's soft limit (coremesh/core/allocator.hpp)
// holds this rank to what it holds once built (weights, gradients and
// optimizer state where they are host memory, the data) plus its step's
// estimate (rank_step_bytes), plus 5%. COREMESH_HOST_SOFT_LIMIT_MB (MiB, 0:
// none) overrides it.
void Trainer::limit_run_ahead() {
  if (std::getenv("COREMESH_HOST_SOFT_LIMIT_MB") != nullptr) return;
  const int64_t built = int64_t(host_allocator_stats().allocated_bytes);
  const int64_t step = rank_step_bytes(cfg_, plan_->pe());
  const int64_t limit = run_ahead_limit(built, step);
  set_host_soft_limit(size_t(limit));
  set_soft_limit_ = true;
  CM_LOG_DEBUG("host soft limit {}: built {}, step {}", format_bytes(double(limit)),
               format_bytes(double(built)), format_bytes(double(step)));
}

namespace {

// This PE's share of whole-model tensors (by name): its parameters (its
// experts' rows, its tensor-parallel slices) and its AdamW state (the ranges it owns).
void load_state(model::Model& model, AdamW& opt, const NamedTensors& params,
                             const NamedTensors& adam_m, const NamedTensors& adam_v) {
  std::map<std::string, Tensor> P(params.begin(), params.end()), M(adam_m.begin(), adam_m.end()),
      V(adam_v.begin(), adam_v.end());
  auto held = [&](const std::map<std::string, Tensor>& from, const model::ParamInfo& p) -> Tensor {
    auto it = from.find(p.name);
    CM_CHECK(it != from.end(), "resume from a complete checkpoint", "the checkpoint lacks '{}'", p.name);
    const Tensor& t = it->second;
    CM_CHECK(t.numel() == shape_numel(p.whole_shape), "resume a checkpoint of this model",
             "'{}' has {} elements, the model's has {}", p.name, t.numel(), shape_numel(p.whole_shape));
    return model::held_part(p, t);  // this PE's experts' rows, its TP slice
  };
  for (const model::ParamInfo& p : model.params())
    std::memcpy(model.param_data() + p.offset, held(P, p).data<float>(), size_t(p.numel) * sizeof(float));
  // AdamW state: each owned range, element by element from the parameters it covers
  for (size_t i = 0; i < opt.owned().size(); ++i) {
    const auto [b, e] = opt.owned()[i];
    for (const model::ParamInfo& p : model.params()) {
      const int64_t lo = std::max(b, p.offset), hi = std::min(e, p.offset + p.numel);
      if (lo >= hi) continue;
      const int64_t to = opt.state_offset(i) + (lo - b), from = lo - p.offset;
      std::memcpy(opt.m().data<float>() + to, held(M, p).data<float>() + from, size_t(hi - lo) * sizeof(float));
      std::memcpy(opt.v().data<float>() + to, held(V, p).data<float>() + from, size_t(hi - lo) * sizeof(float));
    }
  }
}

}  // namespace

// The whole model as one PE's (names, shapes, values), assembled on the
// leader from the PEs that hold each piece (data replica 0's; under ZeRO-1
// the optimizer state from its shards' owners); collective.
CheckpointState Trainer::checkpoint_state() {
  CheckpointState s;
  s.config = cfg_.model;
  s.train_config = to_json(cfg_)["train"];
  s.train_config["adam_steps"] = opt_->steps();
  s.train_config["tokens"] = tokens_done_;  // trained on so far (the batch or layout may change on resume)
  s.train_config["tokens_per_step"] = tokens_per_step();  // every data rank's: a resume on fewer says so
  s.step = step_;
  s.rng_state = rng_.state();
  s.data_position = train_loader_->position();
  s.data_fingerprint = data_->fingerprint();
  s.tokenizer = tokenizer_->serialized();
  // router biases, each from the PE that reports its layer
  const model::ModelConfig& mc = cfg_.model;
  const int64_t E = mc.n_routed_experts;
  std::vector<double> bias(size_t(std::max<int64_t>(1, mc.n_layers * E)), 0.0);
  for (const auto& [name, b] : model_->named_buffers()) {  // "layers.<l>.router_bias"
    const int l = std::stoi(name.substr(7));
    if (plan_->reports(2 + 2 * l))
      for (int64_t e = 0; e < E; ++e) bias[size_t(l * E + e)] = b.data<float>()[e];
  }
  bias = plan_->sum_over_world(bias);
  for (int l = 0; l < mc.n_layers; ++l) {
    if (!mc.is_moe_layer(l)) continue;
    Tensor b = Tensor::empty({E});
    for (int64_t e = 0; e < E; ++e) b.data<float>()[e] = float(bias[size_t(l * E + e)]);
    s.buffers.emplace_back("layers." + std::to_string(l) + ".router_bias", b);
  }
  plan_->barrier();  // every PE's step is done: their arenas hold the state to save
  if (leader()) {
    const int ep = cfg_.parallel.ep, tp = cfg_.parallel.tp;
    std::map<std::tuple<int, int, int>, model::ParamLayout> layouts;  // per (pipeline rank, ep, tp) holder
    for (const model::ParamInfo& w : model::layout_params(mc).params) {
      const int rank = plan_->rank_of_part(w.part);
      Tensor x = Tensor::empty(w.shape), m = Tensor::empty(w.shape), v = Tensor::empty(w.shape);
      for (int j = 0; j < (w.expert() ? ep : 1); ++j)  // each ep rank's experts, each TP rank's slice
        for (int k = 0; k < tp; ++k) {
          auto [it, fresh] = layouts.try_emplace({rank, j, k});
          if (fresh) it->second = model::layout_params(mc, plan_->holder_stage(rank, j, k));
          const model::ParamInfo* p = nullptr;
          for (const auto& q : it->second.params)
            if (q.name == w.name && !q.tied_replica) p = &q;
          CM_ASSERT(p != nullptr);
          if (!p->tp_first) continue;  // a copy: the first holder's is read
          const int from = plan_->holder(rank, j, k);
          Tensor px = Tensor::empty(p->shape), pm = Tensor::empty(p->shape), pv = Tensor::empty(p->shape);
          plan_->fetch(px.raw_data(), model_->param_arena(), p->offset, p->numel, from);
          const auto group = p->expert() ? parallel::ReduceGroup::expert
                             : p->tp_partial_grad ? parallel::ReduceGroup::tp_shared
                                                  : parallel::ReduceGroup::dense;
          for (const auto& q : plan_->locate_state(from, group, p->tp_copies, p->offset, p->offset + p->numel)) {
            plan_->fetch(pm.data<float>() + q.at, opt_->m(), q.offset, q.length, q.pe);
            plan_->fetch(pv.data<float>() + q.at, opt_->v(), q.offset, q.length, q.pe);
          }
          model::place_part(*p, px, x), model::place_part(*p, pm, m), model::place_part(*p, pv, v);
        }
      s.params.emplace_back(w.name, x), s.adam_m.emplace_back(w.name, m), s.adam_v.emplace_back(w.name, v);
    }
  }
  plan_->barrier();  // nobody changes its arenas before the leader has read them
  return s;
}

namespace {

// Whether `checkpoint` is one of out_dir's own (out_dir/checkpoints/step_N).
bool checkpoint_of(const std::string& out_dir, const std::string& checkpoint) {
  std::error_code ec;
  const fs::path dir = fs::weakly_canonical(fs::path(out_dir) / "checkpoints", ec);
  return !ec && fs::weakly_canonical(checkpoint, ec).parent_path() == dir && !ec;
}

}  // namespace

void Trainer::claim_out_dir(bool start_over, const std::string& ways_out) {
  Busy entered(*this, "claim_out_dir");
  if (owns_out_dir_) return;
  const bool set_aside = !resumed_from_.empty() &&
                         fs::path(resumed_from_).parent_path().filename().string().rfind("superseded_after_step_", 0) == 0;
  const std::string hint = set_aside ? "continue a checkpoint that a rollback set aside into another --out (out_dir): "
                                       "this directory goes on from its own checkpoints"
                           : !ways_out.empty() ? ways_out
                                               : "resume that run, give another out_dir, or start over (coremesh train "
                                                 "--overwrite; Python: overwrite=True), which deletes its checkpoints "
                                                 "and metrics.jsonl";
  // One process writes a directory at a time (two runs appended to one
  // metrics.jsonl and interleaved their checkpoints): the leader locks it for
  // this trainer's life.
  const std::string busy_hint = "wait for that run to end (or stop it), or give another out_dir";
  std::exception_ptr lock_error;
  if (leader() && !out_dir_lock_) {
    try {
      out_dir_lock_ = FileLock::acquire((fs::path(cfg_.out_dir) / ".coremesh.lock").string(),
                                        fmt::format("'{}'", cfg_.out_dir), busy_hint);
    } catch (const Error&) {
      lock_error = std::current_exception();
    }
  }
  const bool busy = plan_->world() > 1 ? parallel::max_over_world({int64_t(lock_error != nullptr)})[0] > 0
                                       : lock_error != nullptr;
  if (lock_error) std::rethrow_exception(lock_error);
  CM_CHECK(!busy, busy_hint, "'{}' is in use by another run (PE 0 found its lock)", cfg_.out_dir);
  // The leader looks (the other PEs may not share its file system); all agree.
  const bool own_run = !resumed_from_.empty() && checkpoint_of(cfg_.out_dir, resumed_from_);
  const bool other_run = leader() && !own_run && !start_over &&
                         !latest_checkpoint((fs::path(cfg_.out_dir) / "checkpoints").string()).empty();
  const bool refused = plan_->world() > 1 ? parallel::max_over_world({int64_t(other_run)})[0] > 0 : other_run;
  if (other_run) refuse_other_run(cfg_.out_dir, hint);  // throws, naming the latest
  CM_CHECK(!refused, hint, "'{}' holds another run's checkpoints (PE 0 found them)", cfg_.out_dir);
  if (leader() && own_run) {  // resumed from an earlier checkpoint of this run: the later ones go aside
    const std::string aside = set_aside_after(cfg_.out_dir, step_);
    if (!aside.empty())
      CM_LOG_WARN("resumed at step {} of a run that went further: its later checkpoints and metrics.jsonl are "
                  "now in '{}'", step_, aside);
  } else if (leader() && start_over) {
    train::start_over(cfg_.out_dir);
  }
  owns_out_dir_ = true;
}

std::string Trainer::save_checkpoint_now() {
  Busy entered(*this, "save_checkpoint_now");
  CM_REFUSE_WHILE_QUEUED("save_checkpoint_now");
  claim_out_dir();
  stream_.synchronize();  // the weights and the optimizer state as of the last step
  const std::string dir = (fs::path(cfg_.out_dir) / "checkpoints").string();
  const std::string path = checkpoint_path(dir, step_);
  const CheckpointState s = checkpoint_state();  // collective when parallel
  if (leader()) {
    const std::string previous = latest_checkpoint(dir);
    try {
      save_checkpoint(path, s);
    } catch (const Error& e) {  // nothing of the previous checkpoints was touched: say which to resume
      CM_THROW(InvalidArgument, e.hint() + (previous.empty() ? "" : ", then --resume " + dir),
               "the checkpoint of step {} was not saved: {}; the last complete one is {}", step_, e.message(),
               previous.empty() ? std::string("none (nothing saved yet)") : "'" + previous + "'");
    }
    prune_checkpoints(dir, cfg_.keep_checkpoints);
  }
  plan_->barrier();  // the file is complete before any PE goes on (and may read it)
  return path;
}

// A resume may change how the run goes on (lr, batch, clipping, ...): the
// leader says which settings differ from the checkpoint's run. The split
// between training and validation text may not move: validation would score
// text the run already trained on.
void Trainer::report_changed_settings(const nlohmann::json& saved, const std::string& path) const {
  static const std::set<std::string> kept{"steps", "out_dir", "log_every", "report", "val_every", "val_batches",
                                           "ckpt_every", "keep_checkpoints", "cores", "graph", "data", "tokenizer",
                                           "sample_tokens", "sample_prompt", "sample_temperature", "sample_top_k",
                                           "adam_steps", "tokens", "tokens_per_step"};
  const nlohmann::json now = to_json(cfg_)["train"];
  if (saved.contains("val_fraction"))
    CM_CHECK(saved["val_fraction"] == now["val_fraction"],
             fmt::format("resume with val_fraction {} (another one moves the validation split into text the run "
                         "already trained on)", saved["val_fraction"].dump()),
             "checkpoint '{}' was trained with val_fraction {}, this run has {}", path, saved["val_fraction"].dump(),
             now["val_fraction"].dump());
  std::vector<std::string> changed;
  for (const auto& [key, value] : now.items())
    if (!kept.count(key) && saved.contains(key) && saved[key] != value)
      changed.push_back(fmt::format("{} {} -> {}", key, saved[key].dump(), value.dump()));
  // what a layout or the step count changes without a train setting saying so
  if (saved.contains("tokens_per_step") && saved["tokens_per_step"] != tokens_per_step())
    changed.push_back(fmt::format("tokens per step {} -> {} (batch x seq_len x grad_accum x data ranks)",
                                  saved["tokens_per_step"].dump(), tokens_per_step()));
  if (saved.contains("steps") && saved["steps"] != now["steps"] && cfg_.min_lr != cfg_.lr)
    changed.push_back(fmt::format("steps {} -> {} (the learning rate's decay now ends at step {})",
                                  saved["steps"].dump(), now["steps"].dump(), cfg_.steps));
  if (!changed.empty() && leader())
    CM_LOG_WARN("resuming '{}' with settings other than its run's: {}", path, fmt::join(changed, ", "));
}

void Trainer::resume(const std::string& where) {
  Busy entered(*this, "resume");
  CM_REFUSE_WHILE_QUEUED("resume");
  std::string path = where;
  if (fs::is_directory(where)) {
    path = latest_checkpoint(where);
    if (path.empty()) path = latest_checkpoint((fs::path(where) / "checkpoints").string());
    CM_CHECK(!path.empty(), "pass a checkpoint file or a directory holding step_*.safetensors",
             "no checkpoint found in '{}'", where);
  }
  CheckpointState s;
  try {
    s = load_checkpoint(path);
  } catch (const InvalidArgument& e) {  // a damaged newest checkpoint of a directory: name the one before
    const std::string before = previous_checkpoint(fs::path(path).parent_path().string());
    if (!fs::is_directory(where) || before.empty()) throw;
    CM_THROW(InvalidArgument,
             fmt::format("resume from the checkpoint before it: --resume {} (and move the damaged one away)", before),
             "{}", e.message());
  }
  // before the model's shapes: a tokenizer left out shows first as another vocab size
  const std::string saved_tokenizer = s.train_config.is_object() ? s.train_config.value("tokenizer", "") : "";
  CM_CHECK(s.tokenizer == tokenizer_->serialized(),
           saved_tokenizer.empty() || s.tokenizer.empty()
               ? "resume with the tokenizer the checkpoint was trained with (train.tokenizer / --tokenizer)"
               : fmt::format("resume with the tokenizer the checkpoint was trained with: --tokenizer {}",
                             saved_tokenizer),
           "checkpoint '{}' was trained with {}, this run uses {}", path,
           s.tokenizer.empty() ? "bytes" : "another tokenizer", cfg_.tokenizer.empty() ? "bytes" : "'" + cfg_.tokenizer + "'");
  std::vector<std::pair<std::string, Shape>> whole;  // the 1-PE model's names and shapes
  for (const auto& p : model::layout_params(cfg_.model).params) whole.emplace_back(p.name, p.shape);
  check_compatible(s, cfg_.model, whole, path);
  CM_CHECK(s.data_fingerprint == data_->fingerprint(),
           "resume with the same data files as the run that saved the checkpoint",
           "checkpoint '{}' was trained on different data (fingerprint {} vs {})", path,
           s.data_fingerprint, data_->fingerprint());
  report_changed_settings(s.train_config, path);
  stream_.synchronize();
  load_state(*model_, *opt_, s.params, s.adam_m, s.adam_v);
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
  std::erase_if(records_, [&](const StepRecord& r) { return r.step >= step_; });  // an in-process rewind
  std::erase_if(val_records_, [&](const ValRecord& r) { return r.step >= step_; });
  tokens_done_ = s.train_config.value("tokens", step_ * tokens_per_step());  // older checkpoints: this run's rate
  resumed_from_ = path;
  owns_out_dir_ = false;  // claim_out_dir() decides what this run may write where
  metrics_.reset();  // the next run() continues the checkpoint's run's metrics
}

double Trainer::validate() {
  Busy entered(*this, "validate");
  CM_REFUSE_WHILE_QUEUED("validate");
  if (!val_loader_) return -1;
  runtime::StreamGuard on(stream_);
  val_loader_->reset();
  const int cp = plan_->cp();  // each CP rank's tokens; their means are summed below
  std::vector<int32_t> x, y;
  std::vector<Tensor> losses;
  int64_t bytes = 0;  // of the text the targets stand for
  // The leader's bar follows the batches as the stream finishes them (an
  // event after each); the work is queued ahead as before.
  const bool show = cfg_.progress && leader();
  ProgressBar bar(val_batches_, {.label = "validation", .unit = "batches",
                                     .mode = show ? ProgressBar::Mode::automatic : ProgressBar::Mode::off});
  std::vector<runtime::Event> batch_done(show ? size_t(val_batches_) : 0);
  // A stop (Ctrl-C) ends a long validation: every kAgreeEvery batches the PEs
  // agree on it, each after its queued batches ran (one sum, the same batch on all).
  constexpr int kAgreeEvery = 32;
  validation_stopped_ = false;
  int done = 0;
  for (int i = 0; i < val_batches_; ++i, ++done) {
    if (i > 0 && i % kAgreeEvery == 0 && stop_requested_) {
      stream_.synchronize();
      if (plan_->sum_over_world({stop_requested_() ? 1.0 : 0.0})[0] > 0) {
        validation_stopped_ = true;
        break;
      }
    }
    val_loader_->next_batch(x, y);
    bytes += tokenizer_->count_bytes(y.data(), int64_t(y.size()));
    if (cp > 1) x = plan_->my_tokens(x, cfg_.batch_size, cfg_.seq_len), y = plan_->my_tokens(y, cfg_.batch_size, cfg_.seq_len);
    model_->set_step_batches({{x.data(), y.data(), cfg_.batch_size, cfg_.seq_len / cp}});
    const Tensor l = plan_->forward_only(*model_);  // the last stage has the losses
    if (l.defined()) losses.push_back(l);
    if (show) batch_done[size_t(i)].record(stream_);
  }
  for (int i = 0; i < done && size_t(i) < batch_done.size(); ++i) batch_done[size_t(i)].synchronize(), bar.set(i + 1);
  bar.finish();
  stream_.synchronize();
  if (validation_stopped_) return -1;  // no loss over part of the split
  double sum = 0;
  for (const Tensor& l : losses) sum += mean_of(l);
  // one data replica's, one TP rank's
  const bool counted = plan_->data_index() == 0 && plan_->counts_loss();
  sum = plan_->sum_over_world({counted ? sum : 0.0})[0] / cp;
  const double loss = sum / val_batches_;
  const double tokens = double(val_batches_) * cfg_.batch_size * cfg_.seq_len;
  last_val_bpb_ = bytes > 0 ? loss * tokens / double(bytes) / std::log(2.0) : -1;
  return loss;
}

std::string Trainer::sample() {
  Busy entered(*this, "sample");
  CM_REFUSE_WHILE_QUEUED("sample");
  runtime::StreamGuard on(stream_);
  SampleOptions o;
  o.tokens = cfg_.sample_tokens;
  o.temperature = cfg_.sample_temperature;
  o.top_k = cfg_.sample_top_k;
  o.seed = cfg_.seed + uint64_t(step_);
  return generate(*model_, *tokenizer_, cfg_.sample_prompt, o);
}

int64_t Trainer::tokens_per_step() const {
  return cfg_.tokens_per_step() * plan_->data_ranks();
}

// Graph mode (cfg.graph): the first step of a run runs eagerly (it fills
// the op cache and allocates what lives across steps, such as the
// expert-parallel buffers); the second is captured into a graph,
// instantiated and replayed; every later step refills the graph's inputs
// (tokens, targets, lr, step count), rewinds the statistics it adds into and
// replays it. Validation and sampling, whose shapes differ, run eagerly.
void Trainer::queue_step() {
  Busy entered(*this, "queue_step");
  runtime::StreamGuard on(stream_);
  CM_CHECK(!step_queued_, "finish_step() the queued step first", "a step is already queued");
  step_start_ = now_seconds();
  if (step_graph_) {
    read_step_batches(0);  // into the graph's inputs
    model_->reuse_stats();
    opt_->advance(lr_.at(step_));
    step_graph_->replay(stream_);
  } else if (cfg_.graph && eager_steps_ > 0) {
    capture_step();
  } else {
    launch_step();
    ++eager_steps_;
  }
  step_queued_ = true;
}

void Trainer::capture_step() {
  opt_->read_step_values_when_run();
  graph::begin_capture(stream_);
  try {
    launch_step();
  } catch (...) {
    try {
      graph::end_capture();
    } catch (const runtime::CaptureError&) {  // the capture is abandoned either way
    }
    throw;
  }
  try {
    step_graph_ = graph::instantiate(graph::end_capture());
  } catch (const runtime::CaptureError& e) {
    CM_THROW(InvalidArgument, "train without graph mode (drop --graph)",
             "graph mode cannot capture this layout's training step: {} ({})", e.message(), e.hint());
  }
  model_->keep_stats();
  graph_step_ = step_ + 1;
  step_graph_->replay(stream_);
}

std::string describe(const GraphSummary& g) {
  std::string passes;
  for (const auto& p : g.passes)
    if (p.matches > 0) passes += fmt::format("{}{} {}x", passes.empty() ? "" : ", ", p.name, p.matches);
  return fmt::format("graph: step {} captured as {} kernels, {} per replay ({})", g.step, g.captured_kernels,
                     g.replayed_kernels, passes.empty() ? "nothing fused" : passes);
}

GraphSummary Trainer::graph_summary() const {
  GraphSummary g;
  if (!step_graph_) return g;
  g.step = graph_step_;
  g.captured_kernels = int64_t(step_graph_->captured_nodes());
  g.replayed_kernels = int64_t(step_graph_->nodes());
  g.passes = step_graph_->pass_results();
  return g;
}

model::MicroBatch Trainer::micro_batch(int m, std::vector<int32_t>& x, std::vector<int32_t>& y, float scale) {
  const int cp = plan_->cp(), T = cfg_.seq_len / cp;  // CP: this rank's chunks of each sequence
  if (cp > 1) x = plan_->my_tokens(x, cfg_.batch_size, cfg_.seq_len), y = plan_->my_tokens(y, cfg_.batch_size, cfg_.seq_len);
  model::MicroBatch b{x.data(), y.data(), cfg_.batch_size, T, scale};
  if (!cfg_.graph) return b;
  const int64_t n = int64_t(cfg_.batch_size) * T;
  while (graph_inputs_.size() <= size_t(m))
    graph_inputs_.push_back({Tensor::empty({n}, DType::i32), Tensor::empty({n}, DType::i32)});
  auto& [tokens, targets] = graph_inputs_[size_t(m)];
  std::copy(x.begin(), x.end(), tokens.data<int32_t>());
  std::copy(y.begin(), y.end(), targets.data<int32_t>());
  b.token_ids = tokens, b.target_ids = targets;
  return b;
}

// The step's micro-batches are those of a 1-PE run accumulating
// grad_accum x data_ranks of them; this PE takes its data_index-th run of
// grad_accum. Graph mode's replay reads them into the graph's inputs only.
std::vector<model::MicroBatch> Trainer::read_step_batches(float scale) {
  const int a = cfg_.grad_accum;
  xs_.resize(size_t(a)), ys_.resize(size_t(a));
  std::vector<model::MicroBatch> batches;
  for (int g = 0; g < a * plan_->data_ranks(); ++g) {
    const bool here = g / a == plan_->data_index();
    std::vector<int32_t> &x = here ? xs_[size_t(g % a)] : x_, &y = here ? ys_[size_t(g % a)] : y_;
    train_loader_->next_batch(x, y);
    if (here) batches.push_back(micro_batch(g % a, x, y, scale));
  }
  return batches;
}

float Trainer::loss_scale() const {
  // every micro-batch's loss weighs 1 / (their number); CP ranks hold 1/cp of each sequence: their losses add up
  return 1.0f / float(cfg_.grad_accum * plan_->data_ranks() * plan_->cp());
}

void Trainer::launch_gradients(std::vector<model::MicroBatch> batches) {
  model_->reset_stats();
  model_->zero_grad();
  model_->set_step_batches(std::move(batches));
  plan_->run_step(*model_);  // the schedule's actions; each part's sum starts once its backwards are done
  model_->seal_gradients();
  plan_->finish_gradients();
}

runtime::TuneWorkload Trainer::tuning_workload() {
  auto batches = std::make_shared<std::vector<model::MicroBatch>>(read_step_batches(loss_scale()));
  // Each run is a whole step from the same state: the weights, AdamW's
  // moments and step count and the router biases are put back before it.
  std::vector<Tensor> state{model_->param_arena(), opt_->m(), opt_->v()};
  for (const auto& [name, t] : model_->named_buffers()) state.push_back(t);
  auto saved = std::make_shared<std::vector<std::vector<char>>>();
  for (const Tensor& t : state) {
    const char* p = static_cast<const char*>(t.raw_data());
    saved->emplace_back(p, p + t.nbytes());
  }
  const int64_t t0 = opt_->steps();
  runtime::TuneWorkload w;
  w.run = [this, batches, state, saved, t0] {
    for (size_t i = 0; i < state.size(); ++i) std::memcpy(state[i].raw_data(), (*saved)[i].data(), (*saved)[i].size());
    opt_->set_steps(t0);
    runtime::StreamGuard on(stream_);
    launch_gradients(*batches);
    grad_sq_ = plan_->grad_sq_sum();
    opt_->clip_gradients(grad_sq_);
    opt_->step(cfg_.lr);  // the peak rate: a zero warmup rate would hide what the gradients became
    plan_->after_optimizer(*model_);
    model_->update_router_bias();
    stream_.synchronize();
  };
  w.result = [this] {
    const Tensor &g = model_->grad_arena(), &p = model_->param_arena();
    std::vector<float> out(g.data<float>(), g.data<float>() + g.numel());
    out.insert(out.end(), p.data<float>(), p.data<float>() + p.numel());
    out.push_back(float(model_->read_stats().loss));
    return out;
  };
  if (plan_->world() > 1) w.sum_over_pes = [this](double mine) { return plan_->sum_over_world({mine})[0]; };
  return w;
}

void Trainer::launch_step() {
  launch_gradients(read_step_batches(loss_scale()));
  grad_sq_ = plan_->grad_sq_sum();
  opt_->clip_gradients(grad_sq_);
  opt_->step(lr_.at(step_));
  plan_->after_optimizer(*model_);  // ZeRO-1's gather of the parameters, the tied table
  model_->update_router_bias();     // every replica's routers see the step's global load
}

std::vector<std::vector<double>> Trainer::every_expert_load(const std::vector<std::vector<double>>& mine) {
  if (plan_->world() == 1) return mine;
  const model::ModelConfig& m = cfg_.model;
  const int64_t E = m.n_routed_experts;
  std::vector<double> v(size_t(std::max<int64_t>(1, m.n_layers * E)), 0.0);
  size_t i = 0;
  for (int l = 0; l < m.n_layers; ++l) {
    if (!m.is_moe_layer(l) || !model::holds_part(model_->stage(), 2 + 2 * l)) continue;
    const std::vector<double>& counts = mine.at(i++);
    if (plan_->reports(2 + 2 * l)) std::copy(counts.begin(), counts.end(), v.begin() + l * E);
  }
  v = plan_->sum_over_world(v);
  std::vector<std::vector<double>> out;
  for (int l = 0; l < m.n_layers; ++l)
    if (m.is_moe_layer(l)) out.emplace_back(v.begin() + l * E, v.begin() + (l + 1) * E);
  return out;
}

StepRecord& Trainer::finish_step() {
  Busy entered(*this, "finish_step");
  CM_CHECK(step_queued_, "queue_step() before finish_step()", "no step is queued");
  stream_.synchronize();
  step_queued_ = false;
  model::StepStats st = model_->read_stats();
  StepRecord r;
  r.step = step_;
  r.lr = lr_.at(step_);
  // the loss on the last stage(s), the balance losses and loads of every stage (TP ranks hold the same)
  // ... and whether any PE was asked to stop: one sum, no extra round
  const double counted = plan_->counts_loss() ? 1.0 : 0.0;
  const double asked = stop_requested_ && stop_requested_() ? 1.0 : 0.0;
  const std::vector<double> t = plan_->sum_over_world({counted * st.loss, counted * st.aux_loss, asked});
  r.loss = t[0], r.aux_loss = t[1];
  stop_agreed_ = t[2] > 0;
  st.expert_load = every_expert_load(st.expert_load);
  executed_.clear();
  for (const auto& a : plan_->gather_executed()) executed_.push_back({a.rank, a.action, a.cat, a.start_ms, a.end_ms});
  r.grad_norm = AdamW::grad_norm(grad_sq_);
  // A non-finite gradient has already updated the weights in memory: the run
  // stops before any of it is saved (the last checkpoint stays the latest).
  CM_CHECK(std::isfinite(r.loss) && std::isfinite(r.grad_norm), "lower the learning rate or enable gradient clipping",
           "{} became {} at step {} (nothing of this step is saved)", std::isfinite(r.loss) ? "the gradient norm" : "the loss",
           std::fabs(std::isfinite(r.loss) ? r.grad_norm : r.loss), step_ + 1);  // fabs: nan, not -nan
  r.seconds = now_seconds() - step_start_;
  r.tokens_per_s = double(tokens_per_step()) / r.seconds;
  last_load_ = {step_, {}};
  for (const auto& counts : st.expert_load) {
    r.expert_balance = std::max(r.expert_balance, expert_balance(counts));
    double sum = 0;
    for (double c : counts) sum += c;
    std::vector<double> share;
    for (double c : counts) share.push_back(sum > 0 ? c / sum : 0);
    last_load_.load.push_back(share);
  }
  records_.push_back(r);
  ++step_;
  tokens_done_ += tokens_per_step();
  return records_.back();
}

TrainResult Trainer::run(int64_t until_step, bool save_at_end) {
  Busy entered(*this, "run");
  CM_REFUSE_WHILE_QUEUED("run");
  runtime::StreamGuard on(stream_);
  const int64_t end = until_step < 0 ? cfg_.steps : std::min(until_step, cfg_.steps);
  const double flops_tok = model::flops_per_token(cfg_.model, cfg_.seq_len);
  const int pes = plan_->world();  // MFU over every PE's cores
  const double peak = measured_peak_flops(cores_) * pes;
  claim_out_dir();
  Progress progress(cfg_.steps, step_, cfg_.log_every, stderr, cfg_.progress ? -1 : 0);
  TrainResult result;
  const bool fresh_log = leader() && !metrics_;
  if (fresh_log)
    metrics_ = std::make_unique<MetricsLog>(
        metrics_path(), step_, resumed_from_.empty() ? "" : metrics_path_of_checkpoint(resumed_from_));
  validate_if_missed(fresh_log, result);
  double val = -1;
  while (step_ < end && !result.stopped) {
    const bool captures = cfg_.graph && !step_graph_;
    queue_step();
    if (captures && step_graph_ && cfg_.progress && leader()) progress.message(describe(graph_summary()));
    StepRecord& r = finish_step();  // advances step_
    const int64_t done = r.step + 1;
    r.mfu = flops_tok * r.tokens_per_s / peak;
    MetricsLine line{r, -1, tokens_done_, last_load_.load, memory_now(), std::nullopt, 0};
    line.memory.optimizer_state_bytes = opt_->state_bytes();
    val = -1;
    if (stop_agreed_ && done < end) {  // every PE stops here; the checkpoint follows the loop
      if (metrics_) metrics_->append(line);
      if (cfg_.progress) {
        progress.update(r);
        progress.message(fmt::format("stop requested: stopped after step {}", done));
      }
      result.stopped = true;
      break;
    }
    // The last step's checkpoint comes before its validation and samples: a
    // stop while they run (however long) loses no trained step.
    if (done == end && save_at_end) result.checkpoint = save_checkpoint_now();
    if ((cfg_.val_every > 0 && done % cfg_.val_every == 0) || done == cfg_.steps) {
      val = validate();
      if (validation_stopped_) {  // every PE: the stop was agreed inside it
        if (metrics_) metrics_->append(line);
        if (cfg_.progress) progress.message(fmt::format("stop requested: validation after step {} stopped", done));
        result.stopped = true;
        break;
      }
      CM_CHECK(std::isfinite(val), "lower the learning rate or enable gradient clipping",
               "the validation loss became {} after step {}", std::fabs(val), done);
      if (val >= 0) val_records_.push_back({r.step, val, last_val_bpb_});
      line.val_loss = val;
      line.val_bits_per_byte = last_val_bpb_;
      if (cfg_.samples_at_validation()) {
        line.sample = SampleRecord{r.step, cfg_.sample_prompt, sample()};
        if (cfg_.progress)
          progress.message(fmt::format("sample at step {}: {}", done,
                                       printable(cfg_.sample_prompt + line.sample->text)));
      }
    }
    if (metrics_) metrics_->append(line);
    if (cfg_.progress) progress.update(r, val);
    if (cfg_.ckpt_every > 0 && done % cfg_.ckpt_every == 0 && done < end) {
      std::string p = save_checkpoint_now();
      if (cfg_.progress) progress.message("saved checkpoint " + p);
    }
  }
  if (cfg_.progress) progress.finish();
  result.steps_done = step_;
  if (step_graph_) result.graph = describe(graph_summary());
  if (!records_.empty()) result.final_loss = records_.back().loss;
  if (!val_records_.empty())
    result.final_val_loss = val_records_.back().loss, result.final_val_bits_per_byte = val_records_.back().bits_per_byte;
  for (const auto& share : last_load_.load) result.final_balance.push_back(expert_balance(share));
  // Throughput over the steady part (the first step warms caches and allocations).
  double tok = 0, sec = 0;
  for (size_t i = records_.size() > 1 ? 1 : 0; i < records_.size(); ++i)
    tok += double(tokens_per_step()), sec += records_[i].seconds;
  result.mean_tokens_per_s = sec > 0 ? tok / sec : 0;
  // Runs long enough to report MFU take the higher of the peaks measured at
  // their start and end (the core's speed drifts).
  result.mean_mfu = flops_tok * result.mean_tokens_per_s / (sec >= 2 ? remeasure_peak_flops(cores_) * pes : peak);
  if ((save_at_end || result.stopped) && result.checkpoint.empty()) result.checkpoint = save_checkpoint_now();
  if (cfg_.report && leader()) {
    fs::create_directories(cfg_.out_dir);
    result.report = write_report((fs::path(cfg_.out_dir) / "report.html").string(), report_data());
  }
  return result;
}

// A run stopped during its validation (or on the step before it) left that
// step's line without one: the resumed run validates first and adds it.
void Trainer::validate_if_missed(bool fresh_log, TrainResult& result) {
  const bool due = step_ > 0 && ((cfg_.val_every > 0 && step_ % cfg_.val_every == 0) || step_ == cfg_.steps);
  int64_t missed = fresh_log && due && metrics_->validation_missing();
  if (plan_->world() > 1) missed = parallel::max_over_world({missed})[0];  // the leader's file decides
  if (!missed) return;
  const double val = validate();
  if (validation_stopped_) {  // nothing trained since the checkpoint: it is the one to name, not to rewrite
    result.stopped = true;
    result.checkpoint = resumed_from_;
    return;
  }
  CM_CHECK(std::isfinite(val), "lower the learning rate or enable gradient clipping",
           "the validation loss became {} after step {}", std::fabs(val), step_);
  if (val < 0) return;
  val_records_.push_back({step_ - 1, val, last_val_bpb_});
  std::optional<SampleRecord> sampled;  // every PE samples (experts may be apart); the leader writes it
  if (cfg_.samples_at_validation()) sampled = SampleRecord{step_ - 1, cfg_.sample_prompt, sample()};
  if (metrics_) metrics_->add_validation(val, last_val_bpb_, sampled);
}

std::string Trainer::metrics_path() const { return (fs::path(cfg_.out_dir) / "metrics.jsonl").string(); }

// Every series and final number of the report comes from metrics.jsonl, the
// resumed run's earlier steps included, so the two cannot disagree.
ReportData Trainer::report_data() const {
  ReportData d;
  const std::vector<MetricsLine> lines = fs::exists(metrics_path()) ? read_metrics(metrics_path())
                                                                    : std::vector<MetricsLine>{};
  fill_report(d, lines, std::max<int64_t>(1, cfg_.steps / 200));  // the heatmap: about 200 columns
  const auto pc = model::count_params(cfg_.model);
  const auto& m = cfg_.model;
  d.summary = {
      {"model", fmt::format("{} layers, d_model {}, {} heads ({} kv), {} routed experts top-{} + {} shared, "
                            "{} gating", m.n_layers, m.d_model, m.n_heads, m.n_kv_heads,
                            m.n_routed_experts, m.top_k, m.n_shared_experts, model::gating_name(m.gating))},
      {"parameters", fmt::format("{} total, {} active per token", format_count(double(pc.total)),
                                 format_count(double(pc.active)))},
      {"data", fmt::format("{} ({} bytes)", fmt::join(cfg_.data, ", "), data_->total_bytes())},
      {"tokenizer", cfg_.tokenizer.empty() ? tokenizer_->describe()
                                           : fmt::format("{}: {}, {:.2f} bytes per token (training split)",
                                                         cfg_.tokenizer, tokenizer_->describe(),
                                                         double(data_->split_bytes(Split::train)) /
                                                             double(std::max<int64_t>(1, data_->split_tokens(Split::train))))},
      {"batch", fmt::format("{} x {} tokens x {} micro-batches", cfg_.batch_size, cfg_.seq_len, cfg_.grad_accum)},
      {"steps", std::to_string(step_)}};
  if (!d.steps.empty()) {
    d.summary.emplace_back("final training loss", fmt::format("{:.4f} nats/token", d.steps.back().loss));
    double tps = 0;
    for (const auto& r : d.steps) tps += r.tokens_per_s;
    d.summary.emplace_back("mean tokens/s", format_count(tps / double(d.steps.size())));
    d.summary.emplace_back("final expert balance",
                           fmt::format("{:.2f} (busiest expert's tokens / mean per expert, worst MoE layer; 1 = even)",
                                       d.steps.back().expert_balance));
  }
  if (!d.validation.empty())
    d.summary.emplace_back("final validation loss",
                           fmt::format("{:.4f} nats/token = {:.3f} bits/byte", d.validation.back().loss,
                                       d.validation.back().bits_per_byte));
  d.summary.emplace_back("metrics", metrics_path());
  d.sampling = cfg_.sample_temperature > 0
                   ? fmt::format("temperature {}, top-k {}, seed {} + the step", cfg_.sample_temperature,
                                 cfg_.sample_top_k, cfg_.seed)
                   : "greedy";
  if (cfg_.parallel.pp > 1) {
    const parallel::Schedule& s = plan_->schedule();
    d.schedule = fmt::format("{} on {} ranks, {} micro-batches", s.name, s.ranks, s.micro_batches);
    d.executed = executed_;
  }
  return d;
}

}  // namespace coremesh::train
