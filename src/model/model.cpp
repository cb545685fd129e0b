#include "coremesh/model/model.hpp"

#include <cmath>
#include <cstring>
#include <set>

#include "coremesh/core/error.hpp"
#include "coremesh/model/rng.hpp"
#include "coremesh/ops/elementwise.hpp"
#include "coremesh/parallel/comm.hpp"
#include "coremesh/ops/moe_routing.hpp"
#include "coremesh/runtime/stream.hpp"
#include "parts.hpp"

namespace coremesh::model {
using namespace detail;

Model::Model(const ModelConfig& config, const StageLayout& stage, parallel::Seams seams,
             const ArenaAllocator& arena)
    : config_(config), seams_(seams),
      moe_streams_(std::make_unique<MoeStreams>(seams.moe_replicas, seams.comm_cores)) {
  config_.validate();
  CM_CHECK(seams_.moe_replicas >= 1 && seams_.comm_cores >= 0, "set moe_replicas >= 1 and comm_cores >= 0",
           "moe_replicas {}, comm_cores {}", seams_.moe_replicas, seams_.comm_cores);
  stage_ = resolve_stage(config_, stage);
  layout_ = layout_params(config_, stage_);
  tp_ = tp_shape(config_, stage_);
  const ArenaAllocator alloc = arena ? arena : [](int64_t n) { return Tensor::zeros({n}); };
  weights_ = alloc(layout_.arena_size);
  grads_ = alloc(layout_.arena_size);
  written_.assign(layout_.params.size(), 0);
  part_grads_.assign(size_t(num_parts(config_)), 0);
  const int P = num_parts(config_);
  parts_.resize(size_t(P));
  router_bias_.resize(size_t(config_.n_layers));
  int moe = 0;
  auto find = [&](const std::string& name) { return layout_.index_of(name); };
  for (int i = 0; i < P; ++i) {
    if (!holds_part(stage_, i)) continue;
    auto p = std::make_unique<PartParams>();
    p->part = part_at(config_, i);
    const std::string l = "layers." + std::to_string(p->part.layer) + ".";
    switch (p->part.kind) {
      case PartKind::embedding: p->table = find("wte"); break;
      case PartKind::attention:
        p->norm = find(l + "attn_norm"), p->qkv = find(l + "wq"), p->wo = find(l + "wo");
        break;
      case PartKind::ffn:
        p->norm = find(l + "ffn_norm");
        if (!config_.is_moe_layer(p->part.layer)) {
          p->w13 = find(l + "w1"), p->w2 = find(l + "w2");
          break;
        }
        p->router = find(l + "router"), p->ew13 = find(l + "experts.w13"), p->ew2 = find(l + "experts.w2");
        p->w13 = find(l + "shared.w1"), p->w2 = find(l + "shared.w2");
        p->moe = moe++;
        router_bias_[size_t(p->part.layer)] = Tensor::zeros({config_.n_routed_experts});
        break;
      case PartKind::head:
        p->norm = find("final_norm");
        p->table = config_.tied_embeddings ? layout_.regions[size_t(i)].end - 1 : find("lm_head");
        if (config_.tied_embeddings && !layout_.params[size_t(p->table)].tied_replica) p->table = find("wte");
        break;
    }
    parts_[size_t(i)] = std::move(p);
  }
  reset_stats();
}

Model::~Model() = default;

// ---- parameters

void Model::init_weights(uint64_t seed) {
  // Draw in the whole model's order and keep what this stage holds, so that
  // every layout starts from the 1-PE weights (each normal takes 2 draws).
  Rng rng(seed);
  const float out_std = config_.init_std / std::sqrt(2.0f * float(config_.n_layers));
  for (const ParamInfo& whole : layout_params(config_).params) {
    const int local = layout_.index_of(whole.name);
    const bool is_norm = whole.group == ParamGroup::norm;
    if (is_norm) {
      if (local >= 0) wview(local).fill(1.0f);
      continue;
    }
    if (local < 0) {
      rng.skip(2 * uint64_t(whole.numel));
      continue;
    }
    const ParamInfo& p = layout_.params[size_t(local)];
    const bool out_proj = whole.name.ends_with(".wo") || whole.name.ends_with(".w2");
    const float std = out_proj ? out_std : config_.init_std;
    if (p.tp_dim >= 0) {  // a tensor-parallel slice: draw the whole tensor, keep the slice
      Tensor all = Tensor::empty(whole.shape);
      float* a = all.data<float>();
      for (int64_t i = 0; i < whole.numel; ++i) a[i] = std * rng.normal();
      wview(local).copy_from(held_part(p, all));
      continue;
    }
    const int64_t begin = p.expert() ? p.expert_begin * (whole.numel / whole.shape[0]) : 0;
    rng.skip(2 * uint64_t(begin));
    float* w = param_data() + p.offset;
    for (int64_t i = 0; i < p.numel; ++i) w[i] = std * rng.normal();
    rng.skip(2 * uint64_t(whole.numel - begin - p.numel));
  }
  for (auto& b : router_bias_)
    if (b.defined()) b.fill(0.0f);
}

Tensor Model::wview(int param, Shape shape) const {
  const ParamInfo& p = layout_.params.at(size_t(param));
  if (shape.empty()) shape = p.shape;
  return weights_.slice(0, p.offset, p.offset + shape_numel(shape)).view(shape);
}

Tensor Model::gview(int param, Shape shape) const {
  const ParamInfo& p = layout_.params.at(size_t(param));
  if (shape.empty()) shape = p.shape;
  return grads_.slice(0, p.offset, p.offset + shape_numel(shape)).view(shape);
}

Tensor Model::param(const std::string& name) const {
  const int i = layout_.index_of(name);
  CM_CHECK(i >= 0, "see Model::params() for the names", "no parameter '{}' in this stage", name);
  return wview(i);
}

Tensor Model::grad(const std::string& name) const {
  const int i = layout_.index_of(name);
  CM_CHECK(i >= 0, "see Model::params() for the names", "no parameter '{}' in this stage", name);
  return gview(i);
}

std::vector<std::pair<std::string, Tensor>> Model::named_params() const {
  std::vector<std::pair<std::string, Tensor>> out;
  for (size_t i = 0; i < layout_.params.size(); ++i) out.emplace_back(layout_.params[i].name, wview(int(i)));
  return out;
}

std::vector<std::pair<std::string, Tensor>> Model::named_grads() const {
  std::vector<std::pair<std::string, Tensor>> out;
  for (size_t i = 0; i < layout_.params.size(); ++i) out.emplace_back(layout_.params[i].name, gview(int(i)));
  return out;
}

std::vector<std::pair<std::string, Tensor>> Model::named_buffers() const {
  std::vector<std::pair<std::string, Tensor>> out;
  for (size_t l = 0; l < router_bias_.size(); ++l)
    if (router_bias_[l].defined()) out.emplace_back("layers." + std::to_string(l) + ".router_bias", router_bias_[l]);
  return out;
}

MoeParams Model::moe_params(const PartParams& p) const {
  const int64_t C = config_.d_model, SF = tp_.shared_hidden;
  MoeParams m{wview(p.router), wview(p.ew13), wview(p.ew2), {}, {}};
  if (SF > 0) m.sw13 = wview(p.w13, {2 * SF, C}), m.sw2 = wview(p.w2);  // shared.w3 follows shared.w1
  return m;
}

MoeGrads Model::moe_grads(const PartParams& p) const {
  const int64_t C = config_.d_model, SF = tp_.shared_hidden;
  MoeGrads g{{p.router}, {p.ew13}, {p.ew2}, {}, {}};
  if (SF > 0) g.sw13 = {p.w13, 2, {2 * SF, C}}, g.sw2 = {p.w2};
  return g;
}

// ---- gradients
//
// Each micro-batch's weight gradients are computed on their own (beta 0 on
// the first write of each parameter) and added to the step's sum in
// micro-batch order: the first micro-batch of the step writes straight into
// the gradient arena, later ones into a scratch arena that is then added in
// (one add over each part's region when the part is done). So the gradient of
// a step is ((g0 + g1) + g2) ..., whether the micro-batches ran on this PE or
// on data-parallel PEs whose sum runs in rank order.

float Model::take_beta(int first, int count) {
  const float beta = written_.at(size_t(first)) ? 1.0f : 0.0f;
  for (int i = first; i < first + count; ++i) written_.at(size_t(i)) = 1;
  return beta;
}

void Model::zero_grad() { std::fill(part_grads_.begin(), part_grads_.end(), 0); }

void Model::continue_gradient_sum(int chunk) {
  CM_CHECK(chunk >= 0 && chunk < num_chunks(), "pass a chunk index of this stage", "no chunk {}", chunk);
  const PartRange r = stage_.chunks[size_t(chunk)];
  for (int part = r.begin; part < r.end; ++part) {
    CM_CHECK(part_grads_[size_t(part)] == 0, "continue a sum before the chunk's first weight half of the step",
             "part {} already has {} weight halves this step", part, part_grads_[size_t(part)]);
    part_grads_[size_t(part)] = 1;
  }
}

int Model::seal_gradients() {
  int sealed = 0;
  for (int part = 0; part < num_parts(config_); ++part) {
    if (!parts_[size_t(part)] || part_grads_[size_t(part)] > 0) continue;
    const int64_t b = layout_.region_offset[size_t(part)];
    grads_.slice(0, b, b + layout_.region_size[size_t(part)]).fill(0.0f);
    sealed += layout_.regions[size_t(part)].end - layout_.regions[size_t(part)].begin;
    part_grads_[size_t(part)] = 1;
  }
  return sealed;
}

// One micro-batch's weight-gradient half of a chunk: jobs run at once into
// their part's target (the arena, or the scratch arena for the step's later
// micro-batches); end_part() adds a part's scratch into the arena and reports
// the part's gradients as ready. With a TiedEmbedding seam, the head's
// replica of the table hands its product over instead (tied_job) and the
// embedding's table starts from the head's product, as one PE's does.
class Model::WeightPhase final : public WgradSink {
 public:
  WeightPhase(Model& m, int slot, int chunk) : m_(m), slot_(slot) {
    const PartRange r = m.stage_.chunks[size_t(chunk)];
    for (int i = m.layout_.regions[size_t(r.begin)].begin; i < m.layout_.regions[size_t(r.end - 1)].end; ++i)
      m.written_[size_t(i)] = 0;
    for (int part = r.begin; part < r.end; ++part)
      if (m.part_grads_[size_t(part)] > 0 && !m.scratch_.defined()) m.scratch_ = Tensor::zeros({m.layout_.arena_size});
  }
  void add(const GradRef& ref, Job job) override {
    if (tied_job(m_, slot_, ref, job)) return;
    if (m_.seams_.tied && m_.holds_embedding() && ref.first == m_.part(0).table) {
      // the embedding's rows go onto the head's product: dwte = head's + rows
      const Tensor dw = view(ref), head = m_.seams_.tied->take_head_gradient(slot_);
      parallel::copy_on_stream(head, dw);
      take_beta(ref);
      job(dw, 1.0f);
      return;
    }
    job(view(ref), take_beta(ref));
  }
  // The replica's product of the slot's micro-batch, computed at once into a
  // tensor of its own and given to the seam; false for any other job.
  static bool tied_job(Model& m, int slot, const GradRef& ref, const Job& job) {
    const ParamInfo& p = m.layout_.params.at(size_t(ref.first));
    if (!m.seams_.tied || !p.tied_replica) return false;
    const Tensor dw = Tensor::empty(p.shape);
    job(dw, 0.0f);
    m.seams_.tied->head_gradient(slot, dw);
    return true;
  }
  bool immediate() const override { return true; }
  Tensor view(const GradRef& ref) override {
    const ParamInfo& p = m_.layout_.params.at(size_t(ref.first));
    const Tensor& target = m_.part_grads_[size_t(p.part)] == 0 ? m_.grads_ : m_.scratch_;
    const Shape shape = ref.shape.empty() ? p.shape : ref.shape;
    return target.slice(0, p.offset, p.offset + shape_numel(shape)).view(shape);
  }
  float take_beta(const GradRef& ref) override { return m_.take_beta(ref.first, ref.count); }
  void end_part(int part) {
    if (m_.part_grads_[size_t(part)]++ > 0) {  // the step's sum so far += this micro-batch's
      const int64_t b = m_.layout_.region_offset[size_t(part)], e = b + m_.layout_.region_size[size_t(part)];
      Tensor sum = m_.grads_.slice(0, b, e);
      ops::add_out(sum, m_.scratch_.slice(0, b, e), sum);
    }
    if (m_.on_gradients_) m_.on_gradients_(part);
  }

 private:
  Model& m_;
  int slot_;
};

namespace {

// The input-gradient half's sink when the weight half is deferred: it keeps
// the jobs, each with the part that made it (a tied replica's runs at once:
// the embedding's stage needs it for its own).
class DeferSink final : public WgradSink {
 public:
  using RunNow = std::function<bool(const GradRef&, const Job&)>;
  DeferSink(std::vector<DeferredWgrad>& jobs, RunNow now) : jobs_(jobs), now_(std::move(now)) {}
  int part = 0;
  void add(const GradRef& ref, Job job) override {
    if (!now_(ref, job)) jobs_.push_back({ref, std::move(job), part});
  }
  bool immediate() const override { return false; }
  Tensor view(const GradRef&) override { CM_ASSERT(false); }
  float take_beta(const GradRef&) override { CM_ASSERT(false); }

 private:
  std::vector<DeferredWgrad>& jobs_;
  RunNow now_;
};

}  // namespace

// ---- slots

namespace {

void check_tokens(const int32_t* t, int64_t n, int64_t V, const char* what) {
  for (int64_t i = 0; i < n; ++i)
    CM_CHECK(t[i] >= 0 && t[i] < V, fmt::format("{}s must lie in [0, vocab_size = {})", what, V),
             "{} {} at position {} is out of range", what, t[i], i);
}

}  // namespace

Model::Slot& Model::slot(int index, const char* what) const {
  auto it = slots_.find(index);
  CM_CHECK(it != slots_.end(), "open the slot (open_slot or forward) before using it", "{}: slot {} is not open",
           what, index);
  return *it->second;
}

const Model::PartParams& Model::part(int index) const { return *parts_.at(size_t(index)); }

bool Model::slot_open(int index) const { return slots_.count(index) > 0; }

void Model::open_slot(int index, const MicroBatch& b) {
  const ModelConfig& c = config_;
  CM_CHECK(!slot_open(index), "finish the slot's backward or close it before reusing it", "slot {} is already open",
           index);
  CM_CHECK(b.B > 0 && b.T > 0, "pass a micro-batch of B >= 1 sequences of T >= 1 tokens", "micro-batch {}x{}",
           b.B, b.T);
  CM_CHECK(b.T <= c.max_seq_len, "lower seq_len or raise max_seq_len in the model config",
           "sequence length {} exceeds max_seq_len {}", b.T, c.max_seq_len);
  const int64_t N = int64_t(b.B) * b.T;
  auto s = std::make_unique<Slot>();
  s->B = b.B, s->T = b.T, s->loss_scale = b.loss_scale;
  // the host pointer's tokens copied, or the tensor read in place
  auto ids = [&](const int32_t* host, const Tensor& t, const char* what) {
    if (t.defined()) {
      CM_CHECK(t.dtype() == DType::i32 && t.numel() == N && t.is_contiguous(),
               "pass B*T contiguous i32 ids", "slot {}: {} ids are {}", index, what, t.describe());
      check_tokens(t.data<int32_t>(), N, c.vocab_size, what);
      return t.view({N});
    }
    CM_CHECK(host, "pass the tokens to the stage that holds the embedding and the targets to the one that holds "
             "the head", "slot {}: no {}s", index, what);
    check_tokens(host, N, c.vocab_size, what);
    return Tensor::from_vector(std::vector<int32_t>(host, host + N), {N});
  };
  if (holds_embedding()) s->ids = ids(b.tokens, b.token_ids, "token");
  if (holds_head()) s->targets = ids(b.targets, b.target_ids, "target");
  s->positions = seams_.context->positions(b.T);
  s->attention.resize(size_t(c.n_layers));
  s->ffn.resize(size_t(c.n_layers));
  s->forwarded.assign(stage_.chunks.size(), 0);
  s->backwarded.assign(stage_.chunks.size(), 0);
  slots_[index] = std::move(s);
}

void Model::open_slot(int mb) {
  CM_CHECK(mb >= 0 && mb < int(step_batches_.size()), "set_step_batches() with every micro-batch of the step first",
           "micro-batch {} of {} set", mb, step_batches_.size());
  open_slot(mb, step_batches_[size_t(mb)]);
}

void Model::close_slot(int index) {
  slot(index, "close_slot");
  slots_.erase(index);
}

Tensor Model::forward_chunk(int index, int chunk, const Tensor& input) {
  Slot& s = slot(index, "forward_chunk");
  CM_CHECK(chunk >= 0 && chunk < num_chunks(), "pass a chunk index of this stage", "no chunk {}", chunk);
  CM_CHECK(!s.forwarded[size_t(chunk)], "run each chunk's forward once per slot",
           "slot {} chunk {} already ran forward", index, chunk);
  const PartRange r = stage_.chunks[size_t(chunk)];
  const int64_t N = s.B * s.T;
  Residual x;
  if (r.begin == 0) {
    x = Parts::embedding_forward(*this, s, part(0));
  } else {
    CM_CHECK(input.defined() && input.shape() == Shape({N, config_.d_model}),
             "pass the previous stage's output (N, d_model) as the input",
             "chunk {} needs an input of ({}, {}), got {}", chunk, N, config_.d_model, input.describe());
    x = {input, {}};
  }
  s.forwarded[size_t(chunk)] = 1;
  for (int i = std::max(r.begin, 1); i < r.end; ++i) {
    const PartParams& p = part(i);
    switch (p.part.kind) {
      case PartKind::attention: x = Parts::attention_forward(*this, s, p, x); break;
      case PartKind::ffn: x = Parts::ffn_forward(*this, s, p, x); break;
      case PartKind::head: Parts::head_forward(*this, s, p, x); return {};
      case PartKind::embedding: break;
    }
  }
  // the stage's output: the residual stream as one tensor (x + delta)
  return x.delta.defined() ? ops::add(x.x, x.delta) : x.x;
}

Tensor Model::backward_chunk(int index, int chunk, const Tensor& grad_output, bool defer) {
  Slot& s = slot(index, "backward_chunk");
  CM_CHECK(chunk >= 0 && chunk < num_chunks(), "pass a chunk index of this stage", "no chunk {}", chunk);
  CM_CHECK(s.forwarded[size_t(chunk)] && !s.backwarded[size_t(chunk)],
           "run a chunk's backward once, after its forward", "slot {} chunk {}: backward without a forward or twice",
           index, chunk);
  const PartRange r = stage_.chunks[size_t(chunk)];
  const int last = num_parts(config_) - 1;
  if (r.end - 1 != last)
    CM_CHECK(grad_output.defined() && grad_output.shape() == Shape({s.B * s.T, config_.d_model}),
             "pass the next stage's input gradient (N, d_model)", "chunk {} needs a gradient of its output, got {}",
             chunk, grad_output.describe());
  // the parts of the chunk in reverse; after each, `done(part)`
  Tensor d;
  auto run = [&](WgradSink& sink, const std::function<void(int)>& done) {
    d = grad_output;
    if (r.end - 1 == last) d = Parts::head_backward(*this, s, part(last), sink), done(last);
    for (int i = std::min(r.end, last) - 1; i >= std::max(r.begin, 1); --i) {
      const PartParams& p = part(i);
      d = p.part.kind == PartKind::attention ? Parts::attention_backward(*this, s, p, d, sink)
                                             : Parts::ffn_backward(*this, s, p, d, sink);
      done(i);
    }
    if (r.begin == 0) {
      Parts::embedding_backward(*this, s, part(0), d, sink);
      done(0);
      d = Tensor();
    }
  };
  if (defer) {
    auto& p = pending_[{index, chunk}];
    CM_CHECK(!p, "run backward_weight for the slot's chunk first", "slot {} chunk {} has pending weight gradients",
             index, chunk);
    p = std::make_unique<Pending>();
    DeferSink sink(p->jobs, [&](const GradRef& ref, const WgradSink::Job& job) {
      return WeightPhase::tied_job(*this, index, ref, job);
    });
    sink.part = r.end - 1;
    run(sink, [&](int i) { sink.part = i - 1; });
  } else {
    WeightPhase phase(*this, index, chunk);
    run(phase, [&](int i) { phase.end_part(i); });
  }
  s.backwarded[size_t(chunk)] = 1;
  bool done = true;
  for (uint8_t b : s.backwarded) done = done && b;
  if (done) slots_.erase(index);  // the weight-gradient jobs hold what they still need
  return d;
}

void Model::backward_weight(int index, int chunk) {
  auto it = pending_.find({index, chunk});
  CM_CHECK(it != pending_.end(), "call backward_chunk(..., defer_weight_grads = true) first",
           "slot {} chunk {} has no deferred weight gradients", index, chunk);
  const std::unique_ptr<Pending> pending = std::move(it->second);
  pending_.erase(it);
  // the jobs in the order the input half made them, part by part (reverse)
  WeightPhase phase(*this, index, chunk);
  const PartRange r = stage_.chunks[size_t(chunk)];
  size_t j = 0;
  for (int part = r.end - 1; part >= r.begin; --part) {
    for (; j < pending->jobs.size() && pending->jobs[j].part == part; ++j) {
      phase.add(pending->jobs[j].ref, std::move(pending->jobs[j].job));
    }
    phase.end_part(part);
  }
  CM_ASSERT(j == pending->jobs.size());
}

void Model::forward(int index, const MicroBatch& batch) {
  CM_CHECK(holds_embedding() && holds_head(), "drive a pipeline stage with forward_chunk/backward_chunk",
           "forward() runs a whole-model stage; this stage holds parts {}..{}", stage_.chunks.front().begin,
           stage_.chunks.back().end - 1);
  open_slot(index, batch);
  Tensor x;
  for (int c = 0; c < num_chunks(); ++c) x = forward_chunk(index, c, x);
}

void Model::backward(int index) {
  Tensor d;
  for (int c = num_chunks() - 1; c >= 0; --c) d = backward_chunk(index, c, d);
}

Tensor Model::logits(int index) const { return slot(index, "logits").head.logits; }
Tensor Model::token_losses(int index) const { return slot(index, "token_losses").head.loss; }

// ---- statistics and balancing

void Model::reset_stats() {
  losses_.clear();
  aux_losses_.clear();
  load_.clear();
  for (const auto& p : parts_)
    if (p && p->moe >= 0) load_.push_back(Tensor::zeros({routing_stats_size()}, DType::i64));
}

void Model::keep_stats() { kept_ = {losses_, aux_losses_, load_}; }

void Model::reuse_stats() {
  losses_ = kept_.losses, aux_losses_ = kept_.aux_losses, load_ = kept_.load;
  for (Tensor& l : load_) std::memset(l.raw_data(), 0, l.nbytes());
}

StepStats Model::read_stats() const {
  StepStats st;
  for (const Recorded& r : losses_) {
    double sum = 0;
    const float* v = r.values.data<float>();
    for (int64_t n = 0; n < r.values.numel(); ++n) sum += v[n];
    st.loss += sum / double(r.values.numel()) * r.scale;
    ++st.forwards;
  }
  for (const Recorded& r : aux_losses_) st.aux_loss += double(r.values.data<float>()[0]) * r.scale;
  const int64_t E = config_.n_routed_experts;
  for (const Tensor& l : load_) {
    const int64_t* v = l.data<int64_t>();
    st.expert_load.emplace_back(v, v + E);
    st.dropped += v[E];
  }
  return st;
}

int64_t Model::routing_stats_size() const {
  const int64_t E = config_.n_routed_experts;
  return E + 1 + (config_.keeps_selection_margins() ? E * 2 * ops::kMarginBins : 0);
}

void Model::update_router_bias() {
  if (config_.bias_update_rate <= 0) return;
  const int64_t E = config_.n_routed_experts;
  const ops::BiasUpdate mode = config_.bias_update == BiasUpdate::sign           ? ops::BiasUpdate::sign
                               : config_.bias_update == BiasUpdate::proportional ? ops::BiasUpdate::proportional
                                                                                 : ops::BiasUpdate::margin;
  for (const auto& p : parts_) {
    if (!p || p->moe < 0) continue;
    const Tensor& stats = load_[size_t(p->moe)];
    const Tensor margins = mode == ops::BiasUpdate::margin
                               ? stats.slice(0, E + 1, stats.numel()).view({E, 2, ops::kMarginBins})
                               : Tensor();
    ops::update_expert_bias(router_bias_[size_t(p->part.layer)], stats.slice(0, 0, E), config_.bias_update_rate, mode,
                            margins);
  }
}

// ---- memory

Model::SavedBytes Model::saved_bytes(int index) const {
  // Each storage once (views share storage, e.g. the next layer's x is this
  // layer's output); weight copies apart from the activations.
  const Slot& s = slot(index, "saved_bytes");
  std::set<const Storage*> seen;
  auto bytes = [&](const Tensor& t) -> int64_t {
    if (!t.defined() || !seen.insert(t.storage().get()).second) return 0;
    return int64_t(t.storage()->bytes());
  };
  auto input = [&](const GemmInput& in) { return bytes(in.x) + bytes(in.fp8.data) + bytes(in.fp8.scale); };
  auto mlp = [&](const MlpActs& m) { return bytes(m.gu) + input(m.g); };
  SavedBytes out;
  for (const AttentionActs& a : s.attention) {
    out.weight_copies += bytes(a.wqkv.bf16) + bytes(a.wo.bf16);
    out.activations += bytes(a.x) + bytes(a.arstd) + input(a.an) + bytes(a.q) + bytes(a.k) + bytes(a.v) +
                       bytes(a.at.out) + bytes(a.at.lse);
  }
  for (const FfnActs& a : s.ffn) {
    const MoeActs& m = a.moe;
    out.weight_copies += bytes(a.mlp.w13.bf16) + bytes(a.mlp.w2.bf16) + bytes(m.w13.bf16) + bytes(m.w2.bf16) +
                         bytes(m.shared.w13.bf16) + bytes(m.shared.w2.bf16);
    out.activations += bytes(a.h) + bytes(a.frstd) + input(a.ffn_in) + bytes(a.fn) + mlp(a.mlp);
    out.activations += bytes(m.x) + bytes(m.scores) + bytes(m.sel_idx) + bytes(m.sel_w) + bytes(m.idx) + bytes(m.w) +
                       mlp(m.shared) + bytes(m.aux);
    for (const MoeSlice& r : m.slices)
      out.activations += bytes(r.offsets) + bytes(r.row_of) + bytes(r.routed.rows) + bytes(r.routed.offsets) +
                         input(r.xp) + bytes(r.gu) + input(r.g) + bytes(r.ye);
  }
  const HeadActs& h = s.head;
  out.activations += bytes(s.ids) + bytes(s.targets) + bytes(s.positions) + bytes(h.xL) + bytes(h.xf) +
                     bytes(h.frstd) + bytes(h.logits) + bytes(h.lse) + bytes(h.loss);
  return out;
}

}  // namespace coremesh::model
