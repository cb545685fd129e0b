#include "coremesh/parallel/plan.hpp"

#include <algorithm>
#include <limits>

#include "coremesh/core/error.hpp"
#include "coremesh/parallel/context_parallel.hpp"
#include "coremesh/parallel/expert_parallel.hpp"
#include "coremesh/parallel/schedule_generators.hpp"
#include "coremesh/parallel/tensor_parallel.hpp"
#include "coremesh/runtime/profiler.hpp"
#include "coremesh/shmem/session.hpp"

#include <cstring>

namespace coremesh::parallel {

SplitSizes split_sizes(const ModelShape& s) { return {s.experts, s.heads, s.layers, s.seq_len, s.kv_heads}; }

namespace {

int64_t cp_tokens(const PlanConfig& c) { return int64_t(c.shape.batch) * (c.shape.seq_len / std::max(c.parallel.cp, 1)); }

// The sizes of the tensor-parallel all-reduces: a micro-batch's residual
// stream, the vocabulary-parallel cross entropy's stats ((tp + 1) x tokens)
// and the routed experts' gate weights (tokens x top-k).
std::vector<int64_t> tp_sizes(const PlanConfig& c) {
  const int64_t tokens = cp_tokens(c);
  std::vector<int64_t> sizes{tokens * c.shape.d_model, (c.parallel.tp + 1) * tokens};
  if (!c.shape.moe_layers.empty()) sizes.push_back(tokens * c.shape.top_k);
  return sizes;
}

// Every MoE layer's moe_replicas sites; a site takes one token slice's rows.
ShmemExperts::Shape expert_shape(const PlanConfig& c) {
  const ModelShape& s = c.shape;
  const int slices = c.parallel.moe_replicas;
  const int64_t slice_tokens = (s.tokens() + slices - 1) / slices;
  ShmemExperts::Shape shape{s.experts, s.d_model, slice_tokens * s.top_k, s.expert_capacity, s.moe_layers, slices};
  shape.hidden = s.tp_expert_hidden;
  shape.balance = c.parallel.expert_balance, shape.balance_window = c.parallel.balance_window;
  shape.shadow_cost = c.parallel.shadow_cost;
  shape.fused = c.parallel.fused_comm;
  shape.wire = c.parallel.fused_comm ? s.expert_rows : DType::f32;  // the FP8 (bf16) dispatch is a fused op
  return shape;
}

ShmemContext::Sizes context_shape(const PlanConfig& c) {
  return {c.shape.batch, c.shape.seq_len / c.parallel.cp, c.shape.tp_heads, c.shape.tp_kv_heads, c.shape.head_dim};
}

bool zigzag(const ParallelConfig& p) { return p.cp_zigzag && p.cp_comm == CpComm::ring; }

// What PE `pe` holds: the chunks its pipeline rank's placement gives it, its
// ep index's experts, its TP share.
StageLayout layout_of(const PlanConfig& c, const Mesh& mesh, const Schedule& schedule, int pe) {
  const Coords k = mesh.coords(pe);
  const std::vector<PartRange> parts = stage_parts(c.shape.parts(), schedule.num_stages());
  StageLayout s;
  for (int chunk = 0; chunk < schedule.chunks; ++chunk)
    s.chunks.push_back(parts[size_t(schedule.stage_of(k[Dim::pp], chunk))]);
  const int ep = mesh.degree(Dim::ep);
  if (ep > 1) {
    const int local = c.shape.experts / ep;
    s.expert_begin = k[Dim::ep] * local, s.expert_end = s.expert_begin + local;
  }
  s.tp = mesh.degree(Dim::tp), s.tp_rank = k[Dim::tp];
  s.sequence_parallel = c.parallel.sequence_parallel && s.tp > 1;
  if (ep > 1) s.expert_shadows = ShmemExperts::shadow_slots(expert_shape(c)), s.fused_experts = c.parallel.fused_comm;
  return s;
}

PipelineExecutor::Setup executor_setup(const PlanConfig& c, const Mesh& mesh, const Schedule& schedule, int pe) {
  PipelineExecutor::Setup s;
  s.schedule = schedule;
  s.rank = mesh.coords(pe)[Dim::pp];
  s.pes = mesh.group(Dim::pp, pe);
  s.shape = c.shape;
  const Coords mine = mesh.coords(pe);
  s.stage_of = [c, mesh, schedule, mine](int rank) {
    Coords k = mine;
    k[Dim::pp] = rank;
    return layout_of(c, mesh, schedule, mesh.rank(k));
  };
  s.params_of = c.params_of;
  s.tied_embeddings = true;  // a stage holds the head's replica only where the table is tied
  // F&B's halves on two streams, unless both would use the one TP buffer or
  // the expert exchanges (whose peers must meet them in one order)
  s.pair_streams = c.parallel.tp == 1 && c.parallel.ep == 1;
  s.timed = c.report;
  return s;
}

}  // namespace

std::vector<std::string> layout_problems(const PlanConfig& c, int world) {
  const ParallelConfig& p = c.parallel;
  std::vector<std::string> out = Mesh::problems(p, world, split_sizes(c.shape));
  auto refuse = [&](bool bad, std::string what) {
    if (bad) out.push_back(std::move(what));
  };
  refuse(p.cp > 1 && p.pp > 1, fmt::format("set cp or pp to 1 (cp {} x pp {}): context parallelism does not run in "
                                           "pipeline stages yet", p.cp, p.pp));
  refuse(p.sequence_parallel && p.pp > 1,
         fmt::format("set sequence_parallel false or pp to 1 (pp {}): pipeline stages send the whole residual "
                     "stream, sequence parallelism does not run in them yet", p.pp));
  refuse(p.sequence_parallel && p.tp == 1, "sequence_parallel splits the tokens over the tensor-parallel ranks: set "
                                           "tp to 2 or more, or drop sequence_parallel");
  refuse(p.sequence_parallel && p.tp > 1 && cp_tokens(c) % p.tp != 0,
         fmt::format("sequence_parallel splits a micro-batch's {} tokens (batch_size {} x seq_len {} / cp {}) over "
                     "tp {}: choose batch_size x seq_len / cp divisible by tp",
                     cp_tokens(c), c.shape.batch, c.shape.seq_len, p.cp, p.tp));
  refuse(p.cp > 1 && c.shape.balance_loss,
         fmt::format("set model.aux_loss_alpha to 0 or cp to 1 (cp {}): the sequence-wise balance loss needs whole "
                     "sequences", p.cp));
  refuse(c.graph && p.pp > 1, fmt::format("graph mode does not run pipeline layouts yet (pp = {}): drop graph or use "
                                          "pp = 1", p.pp));
  refuse(c.graph && p.tp > 1, fmt::format("graph mode does not capture tensor parallelism yet (tp = {}): drop graph "
                                          "or use tp = 1", p.tp));
  refuse(c.graph && p.cp > 1, fmt::format("graph mode does not capture context parallelism yet (cp = {}): drop --graph "
                                          "or set cp to 1", p.cp));
  refuse(p.moe_replicas > 1 && c.shape.moe_layers.empty(),
         fmt::format("moe_replicas {} slices the MoE layers' tokens and this model has none: set moe_replicas to 1",
                     p.moe_replicas));
  refuse(cp_tokens(c) > 0 && p.moe_replicas > cp_tokens(c),  // no tokens: the batch's own check says so
         fmt::format("moe_replicas {} is more slices than a micro-batch has tokens ({}): choose at most {}",
                     p.moe_replicas, cp_tokens(c), cp_tokens(c)));
  refuse(p.comm_cores > 0 && p.moe_replicas == 1,
         fmt::format("comm_cores {} limits the comm stream of sliced MoE exchanges: set moe_replicas to 2 or more, "
                     "or comm_cores to 0", p.comm_cores));
  const bool balance = p.expert_balance != ExpertBalance::none;
  refuse(balance && p.ep == 1, "expert_balance spreads the hot experts over the expert-parallel group: set ep to 2 "
                               "or more, or expert_balance to none");
  refuse(balance && p.moe_replicas > 1,
         fmt::format("expert_balance does not run with token slices yet (moe_replicas {}): set moe_replicas to 1 or "
                     "expert_balance to none", p.moe_replicas));
  if (out.empty() && p.pp > 1) {
    try {
      stage_parts(c.shape.parts(), plan_schedule(p, c.micro_batches).num_stages());
    } catch (const InvalidArgument& e) {
      out.push_back(fmt::format("{} ({})", e.message(), e.hint()));
    }
  }
  return out;
}

std::vector<PartRange> stage_parts(int parts, int stages) {
  CM_CHECK(stages >= 1 && stages <= parts,
           fmt::format("use at most {} pipeline stages (pp x chunks per rank) for this model, or add layers", parts),
           "{} stages for a model of {} parts", stages, parts);
  std::vector<PartRange> out;
  for (int s = 0; s < stages; ++s) out.push_back({s * parts / stages, (s + 1) * parts / stages});
  return out;
}

Schedule plan_schedule(const ParallelConfig& p, int micro_batches) {
  if (p.pp == 1) return one_f_one_b(1, micro_batches);
  const bool interleaved = p.schedule == PipelineSchedule::interleaved;
  Schedule s = p.schedule_file.empty()
                   ? make_schedule(p.schedule, p.pp, micro_batches, interleaved ? p.virtual_stages : 2)
                   : load_schedule(p.schedule_file);
  CM_CHECK(s.ranks == p.pp && s.micro_batches == micro_batches,
           "run a schedule written for this pp and number of micro-batches (grad_accum)",
           "schedule '{}' is for pp {} and {} micro-batches, the run has pp {} and {}", s.name, s.ranks,
           s.micro_batches, p.pp, micro_batches);
  validate(s);
  return executed_form(s);  // textbook DualPipe: the form that is one PE's run bit for bit
}

StageLayout stage_of_pe(const PlanConfig& config, int world, int pe) {
  const Mesh mesh(config.parallel, world, split_sizes(config.shape));
  return layout_of(config, mesh, plan_schedule(config.parallel, config.micro_batches), pe);
}

ParallelPlan::ParallelPlan(const PlanConfig& config, runtime::Device& device)
    : cfg_(config),
      mesh_(config.parallel, config.parallel.world(), split_sizes(config.shape)),
      schedule_(plan_schedule(config.parallel, config.micro_batches)),
      device_(device) {
  const std::vector<std::string> problems = layout_problems(cfg_, mesh_.world());
  CM_CHECK(problems.empty(), problems.empty() ? "" : problems.front(), "the layout cannot run: {}",
           fmt::join(problems, "; "));
  const ParallelConfig& p = cfg_.parallel;
  // A layout of one PE trains alone, also inside a job of several.
  if (mesh_.world() > 1)
    CM_CHECK(job_pes() == mesh_.world(),
             "start a parallel layout with `coremesh train` (it launches its PEs) or under `coremesh run -n N`",
             "the parallel layout needs {} PEs, this job has {}", mesh_.world(), job_pes());
  pe_ = mesh_.world() > 1 ? shmem::my_pe() : 0;
  auto group = [&](Dim d) { return Group::of(mesh_.group(d, pe_), pe_); };
  if (p.ep > 1) experts_ = std::make_unique<ShmemExperts>(group(Dim::ep), expert_shape(cfg_));
  if (p.tp > 1)
    tensor_ = std::make_unique<ShmemTensor>(group(Dim::tp), tp_sizes(cfg_), p.sequence_parallel, p.tp_comm_overlap,
                                            p.fused_comm ? cp_tokens(cfg_) : 0);
  if (p.cp > 1) context_ = std::make_unique<ShmemContext>(group(Dim::cp), p.cp_comm, zigzag(p), context_shape(cfg_));
  if (mesh_.world() > 1) {
    // the report's executed schedule: asked for on any PE (the leader writes it)
    cfg_.report = p.pp > 1 && max_over_world({int64_t(cfg_.report || runtime::profiler_enabled())})[0] > 0;
    int64_t most = int64_t(cfg_.shape.layers) * std::max(cfg_.shape.experts, 1) + 8;
    for (const auto& list : schedule_.actions) most = std::max(most, int64_t(2 * list.size()));
    gather_ = std::make_unique<WorldGather>(most);
  }
  executor_ = std::make_unique<PipelineExecutor>(executor_setup(cfg_, mesh_, schedule_, pe_), device);
}

ParallelPlan::~ParallelPlan() = default;

StageLayout ParallelPlan::stage_of(int pe) const { return layout_of(cfg_, mesh_, schedule_, pe); }

std::vector<PartRange> ParallelPlan::counted_chunks(int pe) const {
  std::vector<PartRange> chunks = stage_of(pe).chunks;
  if (schedule_.placement == Placement::bidirectional) chunks.resize(1);  // copy 0's stage
  return chunks;
}

Seams ParallelPlan::seams() {
  Seams s;
  if (experts_) s.experts = experts_.get();
  if (context_) s.context = context_.get();
  if (tensor_) s.tensor = tensor_.get();
  s.tied = executor_->tied_seam();
  s.moe_replicas = cfg_.parallel.moe_replicas;
  s.comm_cores = cfg_.parallel.comm_cores;
  return s;
}

std::function<Tensor(int64_t)> ParallelPlan::arena() const {
  if (mesh_.world() == 1) return {};
  return [](int64_t n) {  // symmetric: the largest stage's size on every PE
    const int64_t most = max_over_world({n})[0];
    return symmetric_tensor({most}).slice(0, 0, n);
  };
}

std::function<Tensor(int64_t)> ParallelPlan::state_allocator() const { return arena(); }

void ParallelPlan::attach(StageModel& model) {
  GradientSync::Setup s;
  s.mesh = &mesh_;
  s.me = pe_;
  s.stage_of = [this](int pe) { return stage_of(pe); };
  s.counted_chunks = [this](int pe) { return counted_chunks(pe); };
  s.params_of = cfg_.params_of;
  s.zero = cfg_.parallel.zero;
  s.overlap = schedule_.placement != Placement::bidirectional;  // DualPipe sums its copies first
  s.backwards_per_part = schedule_.micro_batches;
  sync_ = std::make_unique<GradientSync>(s, model, device_);
}

std::vector<int32_t> ParallelPlan::my_tokens(const std::vector<int32_t>& tokens, int B, int T) const {
  if (!context_) return tokens;
  const SequenceSplit& split = context_->split();
  const int Tl = T / split.cp;
  std::vector<int32_t> out(size_t(B) * Tl);
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < Tl; ++t) out[size_t(b * Tl + t)] = tokens[size_t(b * T + split.global(split.rank, t, Tl))];
  return out;
}

// ---- the step

void ParallelPlan::run_step(StageModel& model) {
  sync_->begin_step();
  executor_->run(model);
}

void ParallelPlan::finish_gradients() {
  sync_->finish();
  sync_->sum_expert_load();
}

void ParallelPlan::after_optimizer(StageModel& model) {
  sync_->gather_parameters();
  executor_->sync_tied_table(model);  // after the gather: the embedding's table is whole
}

// ---- host

std::vector<double> ParallelPlan::sum_over_world(const std::vector<double>& mine) {
  return gather_ ? gather_->sum(mine) : mine;
}

std::vector<ParallelPlan::Totals> ParallelPlan::over_world(const std::vector<double>& mine) {
  const std::vector<double> all = gather_ ? gather_->gather(mine) : mine;
  std::vector<Totals> out(mine.size());
  for (size_t i = 0; i < mine.size(); ++i) {
    out[i].max = all[i];
    for (size_t pe = 0; pe * mine.size() < all.size(); ++pe) {
      out[i].sum += all[pe * mine.size() + i];
      out[i].max = std::max(out[i].max, all[pe * mine.size() + i]);
    }
  }
  return out;
}

bool ParallelPlan::reports(int part) const {
  const Coords c = mesh_.coords(pe_);
  return c[Dim::dp] == 0 && c[Dim::cp] == 0 && c[Dim::ep] == 0 && c[Dim::tp] == 0 &&
         holds_part({counted_chunks(pe_)}, part);
}

std::vector<ParallelPlan::Executed> ParallelPlan::gather_executed() {
  std::vector<Executed> out;
  if (!cfg_.report || !gather_) return out;
  const std::vector<std::pair<int64_t, int64_t>>& times = executor_->action_times();
  size_t most = 0;
  for (const auto& list : schedule_.actions) most = std::max(most, list.size());
  std::vector<int64_t> mine(2 * most, 0);
  for (size_t i = 0; i < times.size() && i < most; ++i) mine[2 * i] = times[i].first, mine[2 * i + 1] = times[i].second;
  const std::vector<int64_t> all = gather_->gather(mine);
  auto times_of = [&](int rank) {  // data replica 0's
    return all.data() + mine.size() * size_t(holder(rank, 0, 0));
  };
  int64_t origin = std::numeric_limits<int64_t>::max();
  for (int r = 0; r < schedule_.ranks; ++r)
    for (size_t i = 0; i < mine.size(); i += 2)
      if (times_of(r)[i] > 0) origin = std::min(origin, times_of(r)[i]);
  for (int r = 0; r < schedule_.ranks; ++r) {
    const int64_t* t = times_of(r);
    const std::vector<Action>& actions = schedule_.actions[size_t(r)];
    for (size_t i = 0; i < actions.size(); ++i)
      out.push_back({r, to_string(actions[i]), action_category(actions[i].kind), double(t[2 * i] - origin) / 1e6,
                     double(t[2 * i + 1] - origin) / 1e6});
  }
  return out;
}

int ParallelPlan::holder(int rank, int ep, int tp) const {
  Coords c;
  c[Dim::pp] = rank, c[Dim::ep] = ep, c[Dim::tp] = tp;
  return mesh_.rank(c);
}

int ParallelPlan::rank_of_part(int part) const {
  for (int r = 0; r < schedule_.ranks; ++r)
    if (holds_part({counted_chunks(holder(r, 0, 0))}, part)) return r;
  CM_THROW(InvalidArgument, "report this: a part no pipeline rank holds", "part {}", part);
}

void ParallelPlan::fetch(void* dst, const Tensor& src, int64_t at, int64_t n, int pe) const {
  if (pe == pe_) {
    std::memcpy(dst, static_cast<const std::byte*>(src.raw_data()) + at * int64_t(dtype_size(src.dtype())),
                size_t(n) * dtype_size(src.dtype()));
    return;
  }
  get_from(dst, src, at, n, pe);
}

void ParallelPlan::barrier() const {
  if (mesh_.world() > 1) world_barrier();
}

int64_t ParallelPlan::symmetric_bytes(const PlanConfig& c, int world) {
  if (world <= 1) return 0;
  const ParallelConfig& p = c.parallel;
  const Mesh mesh(p, world, split_sizes(c.shape));
  const Schedule schedule = plan_schedule(p, c.micro_batches);
  // weights, gradients, AdamW's m and v: four arenas of the largest stage
  int64_t arena = 0;
  for (int pe = 0; pe < world; ++pe) arena = std::max(arena, c.params_of(layout_of(c, mesh, schedule, pe)).arena_size);
  int64_t bytes = 4 * 4 * arena;
  bytes += GradientSync::symmetric_bytes_bound(arena, c.shape.layers * c.shape.routing_stats());
  bytes += PipelineExecutor::symmetric_layout(executor_setup(c, mesh, schedule, 0)).bytes();
  if (p.tp > 1) bytes += ShmemTensor::symmetric_bytes(p.tp, tp_sizes(c), p.fused_comm ? cp_tokens(c) : 0);
  if (p.cp > 1) bytes += ShmemContext::symmetric_bytes(p.cp_comm, p.cp, context_shape(c));
  if (p.ep > 1) bytes += ShmemExperts::symmetric_bytes(p.ep, expert_shape(c));
  return bytes + kHeapSlack;
}

}  // namespace coremesh::parallel
