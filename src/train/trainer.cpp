#include "coremesh/train/trainer.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "coremesh/core/error.hpp"
#include "coremesh/graph/exec.hpp"
#include "coremesh/runtime/capture.hpp"
#include "coremesh/shmem/collectives.hpp"
#include "coremesh/shmem/session.hpp"
#include "coremesh/train/generate.hpp"

namespace coremesh::train {
namespace fs = std::filesystem;

const FieldTable<TrainConfig>& train_fields() {
  using T = TrainConfig;
  static const FieldTable<T> t =
      FieldTable<T>("train")
          .add("data", [](T& c) -> auto& { return c.data; }, "text files (byte-level tokens)")
          .add("val_fraction", [](T& c) -> auto& { return c.val_fraction; }, "share of each file held out",
               in_range<double>(0.0, 0.5))
          .add("batch_size", [](T& c) -> auto& { return c.batch_size; }, "sequences per micro-batch", positive<int>())
          .add("seq_len", [](T& c) -> auto& { return c.seq_len; }, "tokens per sequence", positive<int>())
          .add("grad_accum", [](T& c) -> auto& { return c.grad_accum; },
               "micro-batches per step on each data-parallel rank (also the pipeline's micro-batches)",
               positive<int>())
          .alias("microbatches")
          .add("steps", [](T& c) -> auto& { return c.steps; }, "optimizer steps", positive<int64_t>())
          .add("lr", [](T& c) -> auto& { return c.lr; }, "peak learning rate", positive<double>())
          .add("min_lr", [](T& c) -> auto& { return c.min_lr; }, "final learning rate of the cosine",
               non_negative<double>())
          .add("warmup_steps", [](T& c) -> auto& { return c.warmup_steps; }, "linear warmup steps",
               non_negative<int64_t>())
          .flag("warmup")
          .add("beta1", [](T& c) -> auto& { return c.adam.beta1; }, "AdamW beta1", in_range<double>(0.0, 1.0))
          .add("beta2", [](T& c) -> auto& { return c.adam.beta2; }, "AdamW beta2", in_range<double>(0.0, 1.0))
          .add("eps", [](T& c) -> auto& { return c.adam.eps; }, "AdamW epsilon", positive<double>())
          .add("weight_decay", [](T& c) -> auto& { return c.adam.weight_decay; }, "AdamW weight decay (matrices)",
               non_negative<double>())
          .add("grad_clip", [](T& c) -> auto& { return c.adam.grad_clip; }, "global gradient norm clip (<= 0: off)")
          .add("seed", [](T& c) -> auto& { return c.seed; }, "initialization and data order seed")
          .add("val_every", [](T& c) -> auto& { return c.val_every; }, "validation every N steps (0: at the end)",
               non_negative<int>())
          .add("val_batches", [](T& c) -> auto& { return c.val_batches; }, "batches per validation",
               positive<int>())
          .add("log_every", [](T& c) -> auto& { return c.log_every; }, "log line every N steps off a terminal",
               positive<int>())
          .add("out_dir", [](T& c) -> auto& { return c.out_dir; },
               "run directory (checkpoints, report.html, config.json)")
          .flag("out")
          .add("ckpt_every", [](T& c) -> auto& { return c.ckpt_every; }, "checkpoint every N steps (0: at the end)",
               non_negative<int>())
          .add("keep_checkpoints", [](T& c) -> auto& { return c.keep_checkpoints; },
               "keep the newest N checkpoints (0: all)", non_negative<int>())
          .add("cores", [](T& c) -> auto& { return c.cores; },
               "compute cores this PE's kernels may use (0: all of its device)", non_negative<int>())
          .alias("threads")
          .add("report", [](T& c) -> auto& { return c.report; }, "write report.html at the end")
          .add("graph", [](T& c) -> auto& { return c.graph; },
               "capture the second step into a graph and replay it for every later step (single PE, dp, ep)")
          .add("sample_tokens", [](T& c) -> auto& { return c.sample_tokens; },
               "bytes of greedy sample at each validation (0: none)", non_negative<int>())
          .add("sample_prompt", [](T& c) -> auto& { return c.sample_prompt; }, "prompt of those samples");
  return t;
}

void TrainConfig::validate() const {
  model.validate();
  std::vector<std::string> p = train_fields().problems(*this);
  for (auto& q : parallel.problems()) p.push_back(std::move(q));
  if (data.empty()) p.push_back("no training data: pass --data <text file> or set train.data");
  if (seq_len > model.max_seq_len)
    p.push_back(fmt::format("seq_len = {} exceeds model.max_seq_len = {}: lower seq_len or raise max_seq_len",
                            seq_len, model.max_seq_len));
  if (model.vocab_size < 256)
    p.push_back(fmt::format("vocab_size = {} is too small for byte tokens: use vocab_size >= 256", model.vocab_size));
  if (min_lr > lr) p.push_back(fmt::format("min_lr = {} is above lr = {}", min_lr, lr));
  if (graph && parallel.pp > 1)
    p.push_back(fmt::format("graph mode does not run pipeline layouts yet (pp = {}): drop graph or use pp = 1",
                            parallel.pp));
  if (parallel.sequence_parallel && parallel.pp > 1)
    p.push_back(fmt::format("set sequence_parallel false or pp to 1 (pp {}): pipeline stages send the whole "
                            "residual stream, sequence parallelism does not run in them yet", parallel.pp));
  if (parallel.cp > 1 && parallel.pp > 1)
    p.push_back(fmt::format("set cp or pp to 1 (cp {} x pp {}): context parallelism does not run in pipeline "
                            "stages yet", parallel.cp, parallel.pp));
  if (graph && parallel.tp > 1)
    p.push_back(fmt::format("graph mode does not capture tensor parallelism yet (tp = {}): drop graph or use tp = 1",
                            parallel.tp));
  for (auto& q : model::tp_problems(model, parallel.tp)) p.push_back(std::move(q));
  if (parallel.sequence_parallel && parallel.tp == 1)
    p.push_back("sequence_parallel splits the tokens over the tensor-parallel ranks: set tp to 2 or more, or drop "
                "sequence_parallel");
  const int64_t tokens = int64_t(batch_size) * (seq_len / std::max(parallel.cp, 1));
  if (parallel.sequence_parallel && parallel.tp > 1 && tokens % parallel.tp != 0)
    p.push_back(fmt::format("sequence_parallel splits a micro-batch's {} tokens (batch_size {} x seq_len {} / cp {}) "
                            "over tp {}: choose batch_size x seq_len / cp divisible by tp",
                            tokens, batch_size, seq_len, parallel.cp, parallel.tp));
  if (!p.empty()) {
    std::string text = "invalid training config:";
    for (const auto& s : p) text += "\n  - " + s;
    CM_THROW(InvalidArgument, "fix the fields listed above in the config file or with flags", "{}", text);
  }
  LrSchedule{lr, min_lr, warmup_steps, steps}.validate();
}

TrainConfig train_config_from_json(const nlohmann::json& j, TrainConfig c) {
  CM_CHECK(j.is_object(), "write the config as a JSON object {\"model\": ..., \"train\": ..., \"parallel\": ...}",
           "the config is not a JSON object");
  if (j.contains("model")) c.model = model::model_config_from_json(j.at("model"));
  if (j.contains("parallel")) c.parallel = parallel::parallel_fields().from_json(j.at("parallel"), c.parallel);
  const nlohmann::json& t = j.contains("train") ? j.at("train") : j;
  return train_fields().from_json(t, c, {"model", "train", "parallel"});
}

nlohmann::json to_json(const TrainConfig& c) {
  return {{"model", model::to_json(c.model)},
          {"train", train_fields().to_json(c)},
          {"parallel", parallel::parallel_fields().to_json(c.parallel)}};
}

std::vector<std::string> config_differences(const TrainConfig& a, const TrainConfig& b) {
  std::vector<std::string> out;
  for (const auto& d : model::config_differences(a.model, b.model)) out.push_back("model." + d);
  for (const auto& d : train_fields().differences(a, b)) out.push_back("train." + d);
  for (const auto& d : parallel::parallel_fields().differences(a.parallel, b.parallel)) out.push_back("parallel." + d);
  return out;
}

Trainer::Trainer(const TrainConfig& config, runtime::Device& device)
    : cfg_(config), stream_(device), rng_(config.seed) {
  cfg_.validate();
  // A layout of one PE trains alone, also inside a job of several.
  const int world = cfg_.parallel.world();
  if (world > 1)
    CM_CHECK(shmem::initialized() && shmem::n_pes() == world,
             "start a parallel layout with `coremesh train` (it launches its PEs) or under `coremesh run -n N`",
             "the parallel layout needs {} PEs, this job has {}", world, shmem::initialized() ? shmem::n_pes() : 1);
  // kernels tile over the device's cores: this run's stream may use `cores` of them
  const runtime::CoreLimits spec = device.spec();
  cores_ = cfg_.cores > 0 ? std::min({cfg_.cores, spec.cube, spec.vector}) : std::min(spec.cube, spec.vector);
  runtime::set_stream_limit(stream_, cores_, cores_);
  data_ = std::make_unique<TextDataset>(cfg_.data, cfg_.val_fraction);
  train_loader_ = std::make_unique<DataLoader>(*data_, Split::train, cfg_.batch_size, cfg_.seq_len, cfg_.seed);
  if (cfg_.val_fraction > 0)
    val_loader_ = std::make_unique<DataLoader>(*data_, Split::validation, cfg_.batch_size, cfg_.seq_len, cfg_.seed);
  if (cfg_.parallel.pp > 1) {
    pipe_ = std::make_unique<Pipeline>(cfg_, device);
    model_ = std::make_unique<model::Model>(cfg_.model, pipe_->stage(), pipe_->seams(), pipe_->arena());
    pipe_->attach(*model_);
    opt_ = std::make_unique<AdamW>(*model_, cfg_.adam, pipe_->owned_ranges(), pipe_->state_allocator());
  } else if (world > 1) {
    dist_ = std::make_unique<Distributed>(cfg_, device);
    model_ = std::make_unique<model::Model>(cfg_.model, dist_->stage(), dist_->seams(), dist_->arena());
    dist_->attach(*model_);
    opt_ = std::make_unique<AdamW>(*model_, cfg_.adam, dist_->owned_ranges(), dist_->state_allocator());
  } else {
    model_ = std::make_unique<model::Model>(cfg_.model);
    opt_ = std::make_unique<AdamW>(*model_, cfg_.adam);
  }
  model_->init_weights(rng_.next_u64());
  if (pipe_) {
    runtime::StreamGuard on(stream_);
    pipe_->sync_tied_table();  // a head beside the embedding on one PE holds a replica of it too
  }
  schedule_ = LrSchedule{cfg_.lr, cfg_.min_lr, cfg_.warmup_steps, cfg_.steps};
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

CheckpointState Trainer::checkpoint_state() {
  CheckpointState s;
  s.config = cfg_.model;
  s.train_config = to_json(cfg_)["train"];
  s.train_config["adam_steps"] = opt_->steps();
  s.step = step_;
  s.rng_state = rng_.state();
  s.data_position = train_loader_->position();
  s.data_fingerprint = data_->fingerprint();
  s.buffers = model_->named_buffers();  // router biases: the same on every PE
  if (pipe_) {
    pipe_->gather_state(*model_, *opt_, s.params, s.adam_m, s.adam_v, s.buffers);  // each stage's, on the leader
    return s;
  }
  if (dist_) {
    dist_->gather_state(*model_, *opt_, s.params, s.adam_m, s.adam_v);  // whole-model tensors on the leader
    return s;
  }
  s.params = model_->named_params();
  for (const auto& p : model_->params()) {
    s.adam_m.emplace_back(p.name, opt_->m_of(p));
    s.adam_v.emplace_back(p.name, opt_->v_of(p));
  }
  return s;
}

std::string Trainer::save_checkpoint_now() {
  stream_.synchronize();  // the weights and the optimizer state as of the last step
  const std::string dir = (fs::path(cfg_.out_dir) / "checkpoints").string();
  const std::string path = checkpoint_path(dir, step_);
  const CheckpointState s = checkpoint_state();  // collective when parallel
  if (leader()) {
    save_checkpoint(path, s);
    prune_checkpoints(dir, cfg_.keep_checkpoints);
  }
  if (dist_ || pipe_) shmem::barrier();  // the file is complete before any PE goes on (and may read it)
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
  std::vector<std::pair<std::string, Shape>> whole;  // the 1-PE model's names and shapes
  for (const auto& p : model::layout_params(cfg_.model).params) whole.emplace_back(p.name, p.shape);
  check_compatible(s, cfg_.model, whole, path);
  CM_CHECK(s.data_fingerprint == data_->fingerprint(),
           "resume with the same data files as the run that saved the checkpoint",
           "checkpoint '{}' was trained on different data (fingerprint {} vs {})", path,
           s.data_fingerprint, data_->fingerprint());
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
}

double Trainer::validate() {
  if (!val_loader_) return -1;
  runtime::StreamGuard on(stream_);
  val_loader_->reset();
  std::vector<int32_t> x, y;
  std::vector<Tensor> losses;
  for (int i = 0; i < cfg_.val_batches; ++i) {
    val_loader_->next_batch(x, y);
    if (pipe_) {  // the last stage has the losses
      const Tensor l = pipe_->forward_only({x.data(), y.data(), cfg_.batch_size, cfg_.seq_len});
      if (l.defined()) losses.push_back(l);
      continue;
    }
    const int cp = dist_ ? dist_->cp() : 1;  // each CP rank's tokens; their mean is summed below
    if (cp > 1) x = dist_->my_tokens(x, cfg_.batch_size, cfg_.seq_len), y = dist_->my_tokens(y, cfg_.batch_size, cfg_.seq_len);
    model_->forward(0, {x.data(), y.data(), cfg_.batch_size, cfg_.seq_len / cp});
    losses.push_back(model_->token_losses(0));
    model_->close_slot(0);
  }
  stream_.synchronize();
  double sum = 0;
  for (const Tensor& l : losses) sum += mean_of(l);
  if (pipe_) {  // one replica's, one TP rank's
    const bool counted = pipe_->data_index() == 0 && pipe_->first_tp_rank();
    sum = pipe_->over_world({counted ? sum : 0.0})[0].sum;
  }
  if (dist_ && dist_->cp() > 1) sum = dist_->sum_over_data_ranks(sum) / (dist_->data_ranks() * dist_->cp());
  return sum / cfg_.val_batches;
}

std::string Trainer::sample() {
  runtime::StreamGuard on(stream_);
  SampleOptions o;
  o.tokens = cfg_.sample_tokens;
  return generate(*model_, cfg_.sample_prompt, o);
}

int64_t Trainer::tokens_per_step() const {
  return cfg_.tokens_per_step() * (dist_ ? dist_->data_ranks() : pipe_ ? pipe_->data_ranks() : 1);
}

// Graph mode (cfg.graph): the first step of a run runs eagerly (it fills
// the op cache and allocates what lives across steps, such as the
// expert-parallel buffers); the second is captured into a graph,
// instantiated and replayed; every later step refills the graph's inputs
// (tokens, targets, lr, step count), rewinds the statistics it adds into and
// replays it. Validation and sampling, whose shapes differ, run eagerly.
void Trainer::queue_step() {
  runtime::StreamGuard on(stream_);
  CM_CHECK(!step_queued_, "finish_step() the queued step first", "a step is already queued");
  step_start_ = now_seconds();
  if (step_graph_) {
    read_step_batches();
    model_->reuse_stats();
    opt_->advance(schedule_.at(step_));
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

model::MicroBatch Trainer::micro_batch(int m, float scale) {
  const int cp = dist_ ? dist_->cp() : 1, T = cfg_.seq_len / cp;  // CP: this rank's chunks of each sequence
  if (cp > 1) x_ = dist_->my_tokens(x_, cfg_.batch_size, cfg_.seq_len), y_ = dist_->my_tokens(y_, cfg_.batch_size, cfg_.seq_len);
  model::MicroBatch b{x_.data(), y_.data(), cfg_.batch_size, T, scale};
  if (!cfg_.graph) return b;
  const int64_t n = int64_t(cfg_.batch_size) * T;
  while (graph_inputs_.size() <= size_t(m))
    graph_inputs_.push_back({Tensor::empty({n}, DType::i32), Tensor::empty({n}, DType::i32)});
  auto& [tokens, targets] = graph_inputs_[size_t(m)];
  std::copy(x_.begin(), x_.end(), tokens.data<int32_t>());
  std::copy(y_.begin(), y_.end(), targets.data<int32_t>());
  b.token_ids = tokens, b.target_ids = targets;
  return b;
}

// The step's micro-batches are those of a 1-PE run accumulating
// grad_accum x data_ranks of them; this PE takes its data_index-th run of
// grad_accum.
void Trainer::read_step_batches() {
  const int a = cfg_.grad_accum;
  const int ranks = dist_ ? dist_->data_ranks() : 1, mine = dist_ ? dist_->data_index() : 0;
  for (int g = 0; g < a * ranks; ++g) {
    train_loader_->next_batch(x_, y_);
    if (g / a == mine) micro_batch(g % a, 0);
  }
}

void Trainer::launch_step() {
  model_->reset_stats();
  model_->zero_grad();
  // every micro-batch's loss weighs 1 / (their number)
  const int a = cfg_.grad_accum;
  const int ranks = dist_ ? dist_->data_ranks() : pipe_ ? pipe_->data_ranks() : 1;
  const int mine = dist_ ? dist_->data_index() : pipe_ ? pipe_->data_index() : 0;
  const int cp = dist_ ? dist_->cp() : 1;  // CP ranks hold 1/cp of each sequence: their losses add up
  const float scale = 1.0f / float(a * ranks * cp);
  if (pipe_) {  // every stage reads the step's micro-batches; the schedule says when each runs
    xs_.resize(size_t(a)), ys_.resize(size_t(a));
    std::vector<model::MicroBatch> batches;
    for (int g = 0; g < a * ranks; ++g) {
      const bool here = g / a == mine;
      std::vector<int32_t> &x = here ? xs_[size_t(g % a)] : x_, &y = here ? ys_[size_t(g % a)] : y_;
      train_loader_->next_batch(x, y);
      if (here) batches.push_back({x.data(), y.data(), cfg_.batch_size, cfg_.seq_len, scale});
    }
    pipe_->run(batches);
    model_->seal_gradients();
    pipe_->sum_over_data_ranks();
    grad_sq_ = pipe_->grad_sq_sum();
    opt_->clip_gradients(grad_sq_);
    opt_->step(schedule_.at(step_));
    pipe_->after_optimizer();  // ZeRO-1's gather of the parameters, the tied table
    model_->update_router_bias();  // each stage's routers see all of the step's micro-batches
    return;
  }
  for (int g = 0; g < a * ranks; ++g) {
    train_loader_->next_batch(x_, y_);
    if (g / a != mine) continue;
    const int m = g % a;
    if (dist_ && m == a - 1) dist_->arm();  // the last backward: sum each part's gradients once it is done
    model_->forward(m, micro_batch(m, scale));
    model_->backward(m);
  }
  model_->seal_gradients();
  if (dist_) {
    dist_->finish_backward();
    grad_sq_ = dist_->grad_sq_sum();
    opt_->clip_gradients(grad_sq_);
  } else {
    grad_sq_ = opt_->clip_gradients();
  }
  opt_->step(schedule_.at(step_));
  if (dist_) dist_->after_optimizer(), dist_->sum_expert_load();
  model_->update_router_bias();
}

StepRecord& Trainer::finish_step() {
  CM_CHECK(step_queued_, "queue_step() before finish_step()", "no step is queued");
  stream_.synchronize();
  step_queued_ = false;
  model::StepStats st = model_->read_stats();
  StepRecord r;
  r.step = step_;
  r.lr = schedule_.at(step_);
  r.loss = dist_ ? dist_->sum_over_data_ranks(st.loss) : st.loss;
  r.aux_loss = dist_ ? dist_->sum_over_data_ranks(st.aux_loss) : st.aux_loss;
  if (pipe_) {  // the loss on the last stage(s), the balance losses and loads of every stage
    const double counted = pipe_->first_tp_rank() ? 1.0 : 0.0;  // TP ranks hold the same
    const auto t = pipe_->over_world({counted * st.loss, counted * st.aux_loss});
    r.loss = t[0].sum, r.aux_loss = t[1].sum;
    st.expert_load = pipe_->every_expert_load(st.expert_load);
    pipe_->gather_executed();  // the report's executed schedule
  }
  r.grad_norm = AdamW::grad_norm(grad_sq_);
  CM_CHECK(std::isfinite(r.loss), "lower the learning rate or enable gradient clipping",
           "loss became {} at step {}", r.loss, step_ + 1);
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
  return records_.back();
}

TrainResult Trainer::run(int64_t until_step, bool save_at_end) {
  runtime::StreamGuard on(stream_);
  const int64_t end = until_step < 0 ? cfg_.steps : std::min(until_step, cfg_.steps);
  const double flops_tok = model::flops_per_token(cfg_.model, cfg_.seq_len);
  const int pes = dist_ || pipe_ ? cfg_.parallel.world() : 1;  // MFU over every PE's cores
  const double peak = measured_peak_flops(cores_) * pes;
  Progress progress(cfg_.steps, step_, cfg_.log_every, stderr, cfg_.progress ? -1 : 0);
  const int64_t heat_every = std::max<int64_t>(1, cfg_.steps / 200);
  TrainResult result;
  double val = -1;
  while (step_ < end) {
    const bool captures = cfg_.graph && !step_graph_;
    queue_step();
    if (captures && step_graph_ && cfg_.progress && leader()) progress.message(describe(graph_summary()));
    StepRecord& r = finish_step();  // advances step_
    const int64_t done = r.step + 1;
    r.mfu = flops_tok * r.tokens_per_s / peak;
    if (!last_load_.load.empty() && r.step % heat_every == 0) expert_load_.push_back(last_load_);
    val = -1;
    if ((cfg_.val_every > 0 && done % cfg_.val_every == 0) || done == cfg_.steps) {
      val = validate();
      if (val >= 0) val_records_.push_back({r.step, val});
      if (cfg_.sample_tokens > 0 && !pipe_ && cfg_.parallel.cp == 1 && cfg_.parallel.tp == 1) {  // a whole model on one PE
        samples_.push_back({r.step, cfg_.sample_prompt, sample()});
        if (cfg_.progress)
          progress.message(fmt::format("sample at step {}: {}", done,
                                       printable(cfg_.sample_prompt + samples_.back().text)));
      }
    }
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
  if (!val_records_.empty()) result.final_val_loss = val_records_.back().loss;
  for (const auto& share : last_load_.load) result.final_balance.push_back(expert_balance(share));
  // Throughput over the steady part (the first step warms caches and allocations).
  double tok = 0, sec = 0;
  for (size_t i = records_.size() > 1 ? 1 : 0; i < records_.size(); ++i)
    tok += double(tokens_per_step()), sec += records_[i].seconds;
  result.mean_tokens_per_s = sec > 0 ? tok / sec : 0;
  // Runs long enough to report MFU take the higher of the peaks measured at
  // their start and end (the core's speed drifts).
  result.mean_mfu = flops_tok * result.mean_tokens_per_s / (sec >= 2 ? remeasure_peak_flops(cores_) * pes : peak);
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
    d.summary.emplace_back("final expert balance",
                           fmt::format("{:.2f} (busiest expert's tokens / mean per expert, worst MoE layer; 1 = even)",
                                       records_.back().expert_balance));
  }
  if (!val_records_.empty())
    d.summary.emplace_back("final validation loss",
                           fmt::format("{:.4f} nats/byte = {:.3f} bits/byte", val_records_.back().loss,
                                       val_records_.back().loss / std::log(2.0)));
  d.steps = records_;
  d.validation = val_records_;
  d.expert_load = expert_load_;
  d.samples = samples_;
  if (pipe_) {
    const parallel::Schedule& s = pipe_->schedule();
    d.schedule = fmt::format("{} on {} ranks, {} micro-batches", s.name, s.ranks, s.micro_batches);
    d.executed = pipe_->executed();
  }
  return d;
}

}  // namespace coremesh::train
