#include "coremesh/train/train_config.hpp"

#include <cfloat>

#include "coremesh/core/allocator.hpp"
#include "coremesh/core/error.hpp"
#include "coremesh/core/json.hpp"
#include "coremesh/model/layout.hpp"
#include "coremesh/parallel/schedule_simulator.hpp"
#include "coremesh/train/lr_schedule.hpp"
#include "coremesh/train/tokenizer.hpp"

namespace coremesh::train {

namespace {
// The optimizer runs on floats: a beta the float rounds to 1 is refused here,
// not at the first step.
std::function<std::string(const double&)> adam_beta() {
  return [](const double& v) { return v >= 0 && float(v) < 1.0f ? "" : fmt::format("{} must be in [0, 1) as a float", v); };
}
// lr, eps and weight decay reach the optimizer as floats: > 0 (or 0 where
// `zero` allows it) and a normal float (1e39 became inf at the first step).
std::function<std::string(const double&)> float_value(bool zero) {
  return [zero](const double& v) {
    if (zero && v == 0) return std::string();
    return v > 0 && v >= double(FLT_MIN) && v <= double(FLT_MAX)
               ? std::string()
               : fmt::format("{} must be {} a normal float ({:g} to {:g})", v, zero ? "0 or" : "positive and",
                             double(FLT_MIN), double(FLT_MAX));
  };
}
}  // namespace

const FieldTable<TrainConfig>& train_fields() {
  using T = TrainConfig;
  static const FieldTable<T> t =
      FieldTable<T>("train")
          .add("data", [](T& c) -> auto& { return c.data; }, "text files")
          .add("tokenizer", [](T& c) -> auto& { return c.tokenizer; },
               "SentencePiece model (`coremesh tokenizer train`); empty: bytes. model.vocab_size is its piece count")
          .add("val_fraction", [](T& c) -> auto& { return c.val_fraction; }, "share of each file held out",
               in_range<double>(0.0, 0.5))
          .add("batch_size", [](T& c) -> auto& { return c.batch_size; }, "sequences per micro-batch", positive<int>())
          .add("seq_len", [](T& c) -> auto& { return c.seq_len; }, "tokens per sequence", positive<int>())
          .add("grad_accum", [](T& c) -> auto& { return c.grad_accum; },
               "micro-batches per step on each data-parallel rank (also the pipeline's micro-batches)",
               positive<int>())
          .alias("microbatches")
          .add("steps", [](T& c) -> auto& { return c.steps; }, "optimizer steps", positive<int64_t>())
          .add("lr", [](T& c) -> auto& { return c.lr; }, "peak learning rate", float_value(false))
          .add("min_lr", [](T& c) -> auto& { return c.min_lr; }, "final learning rate of the cosine",
               float_value(true))
          .add("warmup_steps", [](T& c) -> auto& { return c.warmup_steps; }, "linear warmup steps",
               non_negative<int64_t>())
          .flag("warmup")
          .add("beta1", [](T& c) -> auto& { return c.adam.beta1; }, "AdamW beta1", adam_beta())
          .add("beta2", [](T& c) -> auto& { return c.adam.beta2; }, "AdamW beta2", adam_beta())
          .add("eps", [](T& c) -> auto& { return c.adam.eps; }, "AdamW epsilon", float_value(false))
          .add("weight_decay", [](T& c) -> auto& { return c.adam.weight_decay; }, "AdamW weight decay (matrices)",
               float_value(true))
          .add("grad_clip", [](T& c) -> auto& { return c.adam.grad_clip; }, "global gradient norm clip (<= 0: off)")
          .add("seed", [](T& c) -> auto& { return c.seed; }, "initialization and data order seed")
          .add("val_every", [](T& c) -> auto& { return c.val_every; }, "validation every N steps (0: at the end)",
               non_negative<int>())
          .add("val_batches", [](T& c) -> auto& { return c.val_batches; },
               "batches per validation (at most the validation split's whole batches)", positive<int>())
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
               "tokens sampled at each validation (0: none)", non_negative<int>())
          .add("sample_prompt", [](T& c) -> auto& { return c.sample_prompt; }, "prompt of those samples")
          .add("sample_temperature", [](T& c) -> auto& { return c.sample_temperature; },
               "their temperature (0: greedy); the seed is seed + the step", non_negative<double>())
          .add("sample_top_k", [](T& c) -> auto& { return c.sample_top_k; },
               "their k most likely tokens to sample among (0: all)", non_negative<int>());
  return t;
}

namespace {

// Whether `s` is well-formed UTF-8 (the config is written as JSON, which must be).
bool valid_utf8(const std::string& s) { return utf8_prefix(s) == s.size(); }

}  // namespace

void TrainConfig::validate(bool need_data) const {
  model.validate();
  std::vector<std::string> p = train_fields().problems(*this);
  if (need_data && data.empty()) p.push_back("no training data: pass --data <text file> or set train.data");
  if (out_dir.empty()) p.push_back("out_dir is empty: give the run a directory (--out DIR or train.out_dir)");
  if (!valid_utf8(sample_prompt)) p.push_back("sample_prompt is not UTF-8 text: give a prompt in UTF-8");
  std::error_code ec;
  if (!parallel.schedule_file.empty() && !std::filesystem::is_regular_file(parallel.schedule_file, ec))
    p.push_back(fmt::format("schedule_file '{}' is not a file: give a schedule's text form (coremesh schedule --text-only)",
                            parallel.schedule_file));
  if (seq_len > model.max_seq_len)
    p.push_back(fmt::format("seq_len = {} exceeds model.max_seq_len = {}: lower seq_len or raise max_seq_len",
                            seq_len, model.max_seq_len));
  if (tokenizer.empty() && model.vocab_size < 256)
    p.push_back(fmt::format("vocab_size = {} is too small for byte tokens: use vocab_size >= 256", model.vocab_size));
  if (min_lr > lr) p.push_back(fmt::format("min_lr = {} is above lr = {}", min_lr, lr));
  const std::vector<std::string> tp = model::tp_problems(model, parallel.tp);
  p.insert(p.end(), tp.begin(), tp.end());
  for (auto& q : parallel::layout_problems(plan_config(*this), parallel.world()))
    if (tp.empty() || q.rfind("tp = ", 0) != 0) p.push_back(std::move(q));  // the heads said once
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
  if (!j.contains("train")) {  // the flat form: the train fields at the top (none of them an object)
    for (const auto& [key, value] : j.items())
      CM_CHECK(key == "model" || key == "parallel" || !value.is_object(),
               "the config's sections are \"model\", \"train\" and \"parallel\"", "unknown config section '{}'", key);
    return train_fields().from_json(j, c, {"model", "parallel"});
  }
  for (const auto& [key, value] : j.items())
    CM_CHECK(key == "model" || key == "train" || key == "parallel",
             "the config's sections are \"model\", \"train\" and \"parallel\"", "unknown config section '{}'", key);
  return train_fields().from_json(j.at("train"), c);
}

TrainConfig train_config_from_text(std::string_view text, const std::string& source) {
  return train_config_from_json(parse_user_json(text, source));
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

parallel::PlanConfig plan_config(const TrainConfig& c) {
  parallel::PlanConfig p;
  p.parallel = c.parallel;
  p.shape = model::model_shape(c.model, c.batch_size, c.seq_len, c.parallel.tp);
  p.micro_batches = c.grad_accum;
  p.graph = c.graph;
  p.report = c.report;
  p.params_of = [m = c.model](const parallel::StageLayout& s) { return model::stage_params(m, s); };
  return p;
}

int64_t rank_step_bytes(const TrainConfig& c, int rank) {
  const int world = c.parallel.world();
  const parallel::PlanConfig plan = plan_config(c);
  const model::MemoryEstimate e = model::estimate_memory(c.model, c.batch_size, c.seq_len / c.parallel.cp,
                                                         world > 1 ? parallel::stage_of_pe(plan, world, rank)
                                                                   : model::StageLayout{});
  const parallel::Schedule q = parallel::plan_schedule(c.parallel, c.grad_accum);
  const int pipeline_rank = world > 1 ? parallel::Mesh(c.parallel, world, parallel::split_sizes(plan.shape))
                                            .coords(rank)[parallel::Dim::pp] : 0;
  const double slots = double(parallel::simulate(q, {}).peak_slots.at(size_t(pipeline_rank))) / q.chunks;
  // a pipeline rank keeps each message it sent until the step ends (the put reads it on the stream)
  int64_t sends = 0;
  if (c.parallel.pp > 1)
    for (const parallel::Action& a : q.actions.at(size_t(pipeline_rank)))
      sends += a.kind == parallel::ActionKind::SendF || a.kind == parallel::ActionKind::SendB;
  const int64_t message = int64_t(c.batch_size) * (c.seq_len / c.parallel.cp) * c.model.d_model * 4;
  const int64_t step = int64_t(slots * double(e.activations)) + e.step() - e.activations + sends * message;
  // A parallel rank's host queues its exchanges ahead of its compute: held
  // to one step it lost 30-35% of its throughput (ep 2, pp 2 of the demo's
  // model on 2 cores); it may run ahead by one more step's transients.
  return world > 1 ? 2 * step : step;
}

int64_t run_ahead_limit(int64_t built, int64_t step) { return int64_t(1.05 * double(built + step)); }

int64_t rank_host_bytes(const TrainConfig& c, int rank) {
  int64_t built = 0;
  if (c.parallel.world() == 1) {
    const model::MemoryEstimate e = model::estimate_memory(c.model, c.batch_size, c.seq_len);
    built = e.weights + e.gradients + e.optimizer;
  }
  return int64_t(host_footprint_limit(size_t(run_ahead_limit(built, rank_step_bytes(c, rank)))));
}

int64_t rank_checkpoint_bytes(const TrainConfig& c, int rank) {
  const int world = c.parallel.world();
  if (world == 1 || rank != 0) return 0;
  const int64_t whole = model::count_params(c.model).total;
  const int64_t mine = model::count_params(c.model, parallel::stage_of_pe(plan_config(c), world, 0)).total;
  const int64_t my_state = c.parallel.zero ? mine / c.parallel.dp : mine;  // ZeRO-1: its share of m and v
  return 12 * whole + 4 * (whole - mine) + 8 * (whole - my_state);
}

}  // namespace coremesh::train
