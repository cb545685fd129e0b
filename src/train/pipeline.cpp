#include "coremesh/train/pipeline.hpp"

#include <algorithm>
#include <chrono>
#include <functional>
#include <map>
#include <optional>
#include <set>

#include "coremesh/core/error.hpp"
#include "coremesh/ops/elementwise.hpp"
#include "coremesh/ops/optimizer.hpp"
#include "coremesh/parallel/schedule_generators.hpp"
#include "coremesh/runtime/profiler.hpp"
#include "coremesh/shmem/collectives.hpp"
#include "coremesh/shmem/rma.hpp"
#include "coremesh/shmem/session.hpp"
#include "coremesh/shmem/stream_ops.hpp"
#include "coremesh/shmem/team.hpp"
#include "coremesh/train/distributed.hpp"
#include "coremesh/train/trainer.hpp"

namespace coremesh::train {
namespace {

using parallel::ActionKind;
using parallel::Dim;
constexpr int64_t K = ops::kOptimizerChunk;

// The parameters of `params` inside [b, e), clipped, relative to b.
std::vector<ops::ParamSegment> segments_in(const std::vector<model::ParamInfo>& params, int64_t b, int64_t e) {
  std::vector<ops::ParamSegment> out;
  for (const auto& p : params) {
    const int64_t lo = std::max(b, p.offset), hi = std::min(e, p.offset + p.numel);
    if (lo < hi) out.push_back({lo - b, hi - lo, p.weight_decay});
  }
  return out;
}

int64_t steady_ns() {  // one clock for every process of the machine
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// From a mark launched before the work to one launched after: what the stream
// did in between (the action's kernels, a receive's wait). Profiling: a named
// interval on the stage's track of the trace; `times`: the interval, for the
// report.
class StreamSpan {
 public:
  StreamSpan(int stage, std::string name, std::string cat, std::pair<int64_t, int64_t>* times)
      : span_(std::make_shared<runtime::SpanRecord>()), times_(times) {
    span_->track = fmt::format("pipeline stage {}", stage), span_->name = std::move(name), span_->cat = std::move(cat);
    runtime::current_stream().launch(parallel::launch_info("span_begin", runtime::KernelKind::comm, 1),
                                     [s = span_, t = times_](const runtime::BlockContext&) {
                                       s->start_ns = runtime::profiler_now_ns();
                                       if (t) t->first = steady_ns();
                                     });
  }
  ~StreamSpan() {
    runtime::current_stream().launch(parallel::launch_info("span_end", runtime::KernelKind::comm, 1),
                                     [s = span_, t = times_](const runtime::BlockContext&) {
                                       s->end_ns = runtime::profiler_now_ns();
                                       if (t) t->second = steady_ns();
                                       if (runtime::profiler_enabled()) runtime::profiler_add_span(*s);
                                     });
  }
  StreamSpan(const StreamSpan&) = delete;
  StreamSpan& operator=(const StreamSpan&) = delete;

 private:
  std::shared_ptr<runtime::SpanRecord> span_;
  std::pair<int64_t, int64_t>* times_;
};

int replica_index(const model::ParamLayout& l) {
  for (size_t i = 0; i < l.params.size(); ++i)
    if (l.params[i].tied_replica) return int(i);
  return -1;
}

}  // namespace

std::vector<model::PartRange> stage_parts(const model::ModelConfig& c, int stages) {
  const int P = model::num_parts(c);
  CM_CHECK(stages >= 1 && stages <= P,
           fmt::format("use at most {} pipeline stages (pp x chunks per rank) for this model, or add layers", P),
           "{} stages for a model of {} parts", stages, P);
  std::vector<model::PartRange> out;
  for (int s = 0; s < stages; ++s) out.push_back({s * P / stages, (s + 1) * P / stages});
  return out;
}

model::StageLayout pipeline_stage(const model::ModelConfig& config, const parallel::Schedule& schedule, int rank) {
  const std::vector<model::PartRange> parts = stage_parts(config, schedule.num_stages());
  model::StageLayout s;
  for (int c = 0; c < schedule.chunks; ++c) s.chunks.push_back(parts[size_t(schedule.stage_of(rank, c))]);
  return s;
}

parallel::Schedule pipeline_schedule(const TrainConfig& c) {
  const parallel::ParallelConfig& p = c.parallel;
  const bool interleaved = p.schedule == parallel::PipelineSchedule::interleaved;
  parallel::Schedule s = p.schedule_file.empty()
                             ? parallel::make_schedule(p.schedule, p.pp, c.grad_accum, interleaved ? p.virtual_stages : 2)
                             : parallel::load_schedule(p.schedule_file);
  CM_CHECK(s.ranks == p.pp && s.micro_batches == c.grad_accum,
           "run a schedule written for this pp and number of micro-batches (grad_accum)",
           "schedule '{}' is for pp {} and {} micro-batches, the run has pp {} and {}", s.name, s.ranks,
           s.micro_batches, p.pp, c.grad_accum);
  parallel::validate(s);
  return parallel::executed_form(s);  // textbook DualPipe: the form that is one PE's run bit for bit
}

// ---- the tied table across stages

class Pipeline::Tied final : public parallel::TiedEmbedding {
 public:
  // Micro-batch mb's embedding and head lie on the ranks of stages 0 and
  // last of its copy (DualPipe runs two copies in opposite directions).
  Tied(Pipeline& p, int signal_base) : p_(p), signal_base_(signal_base) {
    const parallel::Schedule& s = p.schedule_;
    bool remote = false;
    for (int mb = 0; mb < s.micro_batches; ++mb) {
      embedding_rank_.push_back(s.locate(mb, 0).rank);
      head_rank_.push_back(s.locate(mb, s.num_stages() - 1).rank);
      remote = remote || embedding_rank_.back() != head_rank_.back();
    }
    const model::ModelConfig& m = p.cfg_.model;
    const model::ParamLayout head = model::layout_params(m, p.stage_of(head_rank_[0]));
    const model::ParamInfo& replica = head.params[size_t(replica_index(head))];
    replica_offset_ = replica.offset;
    numel_ = replica.numel;  // this TP rank's rows of the table (all of them without vocab parallelism)
    if (remote) buffers_ = parallel::symmetric_tensor({s.micro_batches * numel_});
  }
  void head_gradient(int slot, const Tensor& grad) override {
    const int to = embedding_rank_.at(size_t(slot));
    if (to == p_.rank_) {
      local_[slot] = grad;
      return;
    }
    p_.keep_.push_back(grad);
    runtime::Stream stream = runtime::current_stream();
    shmem::put_signal_on_stream(stream, buffers_.data<float>() + slot * numel_, grad.data<float>(), size_t(numel_),
                                p_.signal(signal_base_ + slot), 1, shmem::SignalOp::add, p_.pe(to));
  }
  Tensor take_head_gradient(int slot) override {
    const int from = head_rank_.at(size_t(slot));
    if (from == p_.rank_) {
      auto it = local_.find(slot);
      CM_CHECK(it != local_.end(), "run the head's backward of a micro-batch before the embedding's",
               "micro-batch {}: no gradient of the head for the tied table", slot);
      Tensor g = it->second;
      local_.erase(it);
      return g;
    }
    p_.wait(signal_base_ + slot, fmt::format("waits for PE {}'s head gradient of the tied table, micro-batch {}",
                                             p_.pe(from), slot));
    return buffers_.slice(0, slot * numel_, (slot + 1) * numel_);
  }
  // After the optimizer: the embedding's table into the head's replica. Under
  // DualPipe every rank holds the table and a replica, and both copies of
  // the table take the same steps: the replica follows the rank's own table.
  void sync(model::Model& model) {
    const int me = p_.rank_, sig = signal_base_ + p_.schedule_.micro_batches;
    const int embedding = embedding_rank_[0], head = head_rank_[0];
    const bool both = p_.schedule_.placement == parallel::Placement::bidirectional || embedding == head;
    if (both) {
      const int r = replica_index(model.layout());
      const int64_t at = r < 0 ? 0 : model.layout().params[size_t(r)].offset;
      if (r >= 0) parallel::copy_on_stream(model.param("wte"), model.param_arena().slice(0, at, at + numel_));
    } else if (me == embedding) {
      const Tensor table = model.param("wte");
      runtime::Stream stream = runtime::current_stream();
      shmem::put_signal_on_stream(stream, model.param_data() + replica_offset_, table.data<float>(), size_t(numel_),
                                  p_.signal(sig), 1, shmem::SignalOp::add, p_.pe(head));
    } else if (me == head) {
      p_.wait(sig, fmt::format("waits for PE {}'s updated embedding table", p_.pe(embedding)));
    }
  }
  static int signals(const parallel::Schedule& s) { return s.micro_batches + 1; }

 private:
  Pipeline& p_;
  int signal_base_;
  std::vector<int> embedding_rank_, head_rank_;  // per micro-batch
  int64_t replica_offset_ = 0, numel_ = 0;
  Tensor buffers_;
  std::map<int, Tensor> local_;
};

// ---- the norm's plan: which PE computes which chunk partial of the 1-PE arena

struct Pipeline::NormPlan {
  struct Run {
    int pe;
    int64_t begin, end;  // in the 1-PE arena
    int64_t at;          // where begin lies in pe's arena
  };
  std::vector<Run> runs;                  // every PE's, by begin
  std::vector<model::ParamInfo> params;   // the 1-PE layout's
  int64_t n = 0, chunks = 0;
  std::vector<int> owner, edge;           // per chunk: its owner; its edge slot or -1
  std::vector<int> expected;              // per edge slot: puts from other PEs per round
  int signal_base = 0;
  Tensor edges, partials;
  std::unique_ptr<parallel::ShardedSum> sum;
};

// ---- construction

Pipeline::Pipeline(const TrainConfig& cfg, runtime::Device& device)
    : cfg_(cfg),
      schedule_(pipeline_schedule(cfg)),
      mesh_(cfg.parallel, cfg.parallel.world(), {cfg.model.n_routed_experts, cfg.model.n_heads, cfg.model.n_layers,
                                                 cfg.seq_len}),
      comm_(device),
      pair_(device) {
  const parallel::ParallelConfig& p = cfg.parallel;
  CM_CHECK(p.cp == 1,
           "with pp > 1 set cp to 1: pipelines combine with data, expert and tensor parallelism and ZeRO-1 only",
           "the layout asks for pp {} with cp {}", p.pp, p.cp);
  const int me = shmem::my_pe();
  rank_ = mesh_.coords(me)[Dim::pp];
  pes_ = mesh_.group(Dim::pp, me);
  if (p.ep > 1)  // the stage's MoE layers send their tokens to the experts of its ep peers
    experts_ = std::make_unique<parallel::ShmemExperts>(parallel::Group::of(mesh_.group(Dim::ep, me), me),
                                                        expert_dispatch_shape(cfg));
  if (p.tp > 1)  // the stage's row-parallel products summed over its TP group
    tensor_ = std::make_unique<parallel::ShmemTensor>(parallel::Group::of(mesh_.group(Dim::tp, me), me), tp_sizes(cfg),
                                                      false, p.tp_comm_overlap);
  // F&B's halves on two streams, unless both would use the one TP buffer or
  // the expert exchanges (whose peers must meet them in one order)
  pair_streams_ = p.tp == 1 && p.ep == 1;
  stage_parts(cfg.model, schedule_.num_stages());  // checks the stage count
  rows_ = int64_t(cfg.batch_size) * cfg.seq_len;
  // Symmetric allocations, in the same order on every PE: receive buffers per
  // (kind, chunk, micro-batch), then signals: one per buffer, the tied
  // table's, the norm's edge slots.
  const int messages = 2 * schedule_.chunks * schedule_.micro_batches;
  recv_ = parallel::symmetric_tensor({int64_t(messages) * rows_ * cfg.model.d_model});
  plan_norm(messages + Tied::signals(schedule_));
  const int signals = norm_->signal_base + int(norm_->expected.size()) + 4;  // + DualPipe's gradient sums
  signals_ = parallel::symmetric_tensor({signals}, DType::i64);
  if (cfg.model.tied_embeddings) tied_ = std::make_unique<Tied>(*this, messages);
  host_values_ = parallel::symmetric_tensor({int64_t(4 * (shmem::n_pes() + 1))}, DType::i64);  // doubles, 8 bytes each
  const int64_t E = cfg.model.n_routed_experts;
  buffers_ = parallel::symmetric_tensor({std::max<int64_t>(1, cfg.model.n_layers * E)});
  load_values_ = parallel::symmetric_tensor({std::max<int64_t>(1, 2 * cfg.model.n_layers * E)}, DType::i64);
  const int64_t loads = int64_t(cfg.model.n_layers) * (E + 1);
  load_arena_ = parallel::symmetric_tensor({std::max<int64_t>(loads, 1)}, DType::i64);
  const parallel::Group data = parallel::Group::of(mesh_.dense_grad_group(me), me);  // every token of the step
  load_sum_ = std::make_unique<parallel::ShardedSum>(load_arena_, std::vector<parallel::Group>{data},
                                                     std::vector<parallel::ShardedSum::Range>{{0, loads, 0}}, 1);
  // the report's executed schedule: asked for on any PE (the leader writes it)
  timed_ = parallel::max_over_world({int64_t(cfg.report || runtime::profiler_enabled())})[0] > 0;
  if (timed_) {
    size_t most = 0;
    for (const auto& list : schedule_.actions) most = std::max(most, list.size());
    times_buffer_ = parallel::symmetric_tensor({int64_t(2 * most) * (shmem::n_pes() + 1)}, DType::i64);
  }
  if (schedule_.placement == parallel::Placement::bidirectional) {  // the partner's gradients and loads
    const int64_t arena = model::layout_params(cfg.model, stage()).arena_size;
    copy_grads_ = parallel::symmetric_tensor({parallel::max_over_world({arena})[0]});
    copy_loads_ = parallel::symmetric_tensor({std::max<int64_t>(loads, 1)}, DType::i64);
  }
}

std::vector<model::PartRange> Pipeline::canonical_chunks(int rank) const {
  std::vector<model::PartRange> chunks = stage_of(rank).chunks;
  if (schedule_.placement == parallel::Placement::bidirectional) chunks.resize(1);  // copy 0's stage
  return chunks;
}

// Every PE's runs of the 1-PE arena, the owner of each chunk, the edge slots.
void Pipeline::plan_norm(int signal_base) {
  norm_ = std::make_unique<NormPlan>();
  NormPlan& q = *norm_;
  const model::ParamLayout whole = model::layout_params(cfg_.model);
  q.params = whole.params;
  q.n = whole.arena_size;
  q.chunks = (q.n + K - 1) / K;
  for (int pe = 0; pe < schedule_.ranks; ++pe) {
    const model::ParamLayout mine = model::layout_params(cfg_.model, stage_of(pe));
    for (const model::PartRange& r : canonical_chunks(pe)) {
      const int64_t b = whole.region_offset[size_t(r.begin)];
      const int64_t e = whole.region_offset[size_t(r.end - 1)] + whole.region_size[size_t(r.end - 1)];
      q.runs.push_back({pe, b, e, mine.region_offset[size_t(r.begin)]});
    }
  }
  std::sort(q.runs.begin(), q.runs.end(), [](const auto& a, const auto& b) { return a.begin < b.begin; });
  q.owner.assign(size_t(q.chunks), -1);
  q.edge.assign(size_t(q.chunks), -1);
  for (int64_t c = 0; c < q.chunks; ++c) {
    const int64_t b = c * K, e = std::min(q.n, b + K);
    int touching = 0, others = 0;
    for (const auto& r : q.runs) {
      if (r.end <= b || r.begin >= e) continue;
      if (q.owner[size_t(c)] < 0) q.owner[size_t(c)] = r.pe;
      ++touching;
      others += r.pe != q.owner[size_t(c)];
    }
    if (touching > 1) q.edge[size_t(c)] = int(q.expected.size()), q.expected.push_back(others);
  }
  q.signal_base = signal_base;
  q.edges = parallel::symmetric_tensor({std::max<int64_t>(1, int64_t(q.expected.size()) * K)});
  q.partials = parallel::symmetric_tensor({q.chunks});
  q.sum = std::make_unique<parallel::ShardedSum>(q.partials,
                                                 std::vector<parallel::Group>{parallel::Group::of(pes_, pe(rank_))},
                                                 std::vector<parallel::ShardedSum::Range>{{0, q.chunks, 0}}, 1);
}

Pipeline::~Pipeline() = default;

bool Pipeline::leader() const { return shmem::my_pe() == 0; }

// The layout of `rank`'s stage: under ep the experts of this PE's ep index
// (every ep index has the same layout), under tp its slices.
model::StageLayout Pipeline::stage_of(int rank) const {
  const parallel::Coords at = mesh_.coords(shmem::my_pe());
  return stage_of(rank, at[Dim::ep], at[Dim::tp]);
}

model::StageLayout Pipeline::stage_of(int rank, int ep_index, int tp_index) const {
  model::StageLayout s = pipeline_stage(cfg_.model, schedule_, rank);
  if (experts_) {
    const int local = cfg_.model.n_routed_experts / mesh_.degree(Dim::ep);
    s.expert_begin = ep_index * local, s.expert_end = s.expert_begin + local;
  }
  s.tp = mesh_.degree(Dim::tp), s.tp_rank = tp_index;
  return s;
}

parallel::Seams Pipeline::seams() {
  parallel::Seams s;
  s.tied = tied_.get();
  if (experts_) s.experts = experts_.get();
  if (tensor_) s.tensor = tensor_.get();
  return s;
}

model::Model::ArenaAllocator Pipeline::arena() const {
  return [](int64_t n) {
    const int64_t most = parallel::max_over_world({n})[0];
    return parallel::symmetric_tensor({most}).slice(0, 0, n);
  };
}

model::Model::ArenaAllocator Pipeline::state_allocator() const { return arena(); }

int Pipeline::buffer(bool grad, int chunk, int mb) const {
  return ((grad ? 1 : 0) * schedule_.chunks + chunk) * schedule_.micro_batches + mb;
}

void Pipeline::wait(int index, std::string what) {
  runtime::Stream stream = runtime::current_stream();
  parallel::wait_signal_on_stream(stream, signal(index), 1, std::move(what));
}

// Collective, the same allocations in the same order on every PE.
void Pipeline::attach(model::Model& model) {
  model_ = &model;
  const int me = shmem::my_pe();
  const model::ParamLayout& l = model.layout();
  const int64_t n = l.arena_size;
  if (experts_ || tensor_) {  // the norm's partials: chunks of the largest stage's arena
    const int64_t chunks = parallel::max_over_world({(n + K - 1) / K})[0];
    cut_partials_ = parallel::symmetric_tensor({chunks});
    std::vector<int> world(size_t(mesh_.world()));
    for (int pe = 0; pe < mesh_.world(); ++pe) world[size_t(pe)] = pe;
    cut_sum_ = std::make_unique<parallel::ShardedSum>(
        cut_partials_, std::vector<parallel::Group>{parallel::Group::of(world, me)},
        std::vector<parallel::ShardedSum::Range>{{0, chunks, 0}}, 1);
  }
  // The stage's gradients summed over its replicas: runs of parameters with
  // one group (0: dense over dp x ep, 1: routed experts over dp, 2: key/value
  // heads that several TP ranks share, over dp x ep and those ranks), the
  // head's replica of the table a run of its own (ZeRO-1 does not gather it:
  // the embedding's stage puts the table there); as many ranges on every PE
  // (the sum's buffers are symmetric).
  // A part's ranges are summed as soon as its last backward is in.
  auto group = [&](const model::ParamInfo& p) { return experts_ && p.expert() ? 1 : p.tp_partial_grad ? 2 : 0; };
  auto kind = [&](const model::ParamInfo& p) { return p.tied_replica ? 3 : group(p); };
  const int kv_sharing = model::tp_shape(cfg_.model, stage()).kv_sharing;
  std::vector<parallel::ShardedSum::Range> ranges;
  for (int part = 0; part < int(l.regions.size()); ++part) {
    const model::PartRange ps = l.regions[size_t(part)];
    for (int i = ps.begin; i < ps.end;) {
      int j = i;
      while (j < ps.end && kind(l.params[size_t(j)]) == kind(l.params[size_t(i)])) ++j;
      if (l.params[size_t(i)].tied_replica) replica_range_ = int(ranges.size());
      const int64_t b = i == ps.begin ? l.region_offset[size_t(part)] : l.params[size_t(i)].offset;
      const int64_t e = j < ps.end ? l.params[size_t(j)].offset
                                   : l.region_offset[size_t(part)] + l.region_size[size_t(part)];
      ranges.push_back({b, e, group(l.params[size_t(i)])});
      range_part_.push_back(part);
      i = j;
    }
  }
  const int64_t most = parallel::max_over_world({int64_t(ranges.size())})[0];
  while (int64_t(ranges.size()) < most) ranges.push_back({n, n, 0}), range_part_.push_back(-1);
  owned_table_ = parallel::symmetric_tensor({1 + 3 * (most + 1)}, DType::i64);  // the replica cuts one range in two
  if (data_ranks() == 1 && kv_sharing == 1) return;
  std::vector<parallel::Group> groups{parallel::Group::of(mesh_.dense_grad_group(me), me),
                                      parallel::Group::of(mesh_.expert_grad_group(me), me)};
  if (kv_sharing > 1) groups.push_back(parallel::Group::of(mesh_.tp_shared_grad_group(me, kv_sharing), me));
  grad_sum_ = std::make_unique<parallel::ShardedSum>(model.grad_arena(), groups, ranges, experts_ || tensor_ ? 16 : K);
  overlap_ = schedule_.placement != parallel::Placement::bidirectional;  // DualPipe sums its copies first
  if (overlap_) model.on_gradients_ready([this](int part) { on_part_ready(part); });
}

// A part's gradients of a micro-batch are in the arena (launched): after the
// step's last, the stage's replicas sum the part on the communication stream
// while this rank's schedule goes on.
void Pipeline::on_part_ready(int part) {
  if (part_backwards_.empty()) part_backwards_.assign(model_->layout().regions.size(), 0);
  if (++part_backwards_[size_t(part)] < schedule_.micro_batches) return;
  ++parts_summed_early_;
  runtime::Event ready;
  ready.record();  // on the compute stream: the part's gradients of the step are complete
  ready.wait(comm_);
  for (int r = 0; r < int(range_part_.size()); ++r)
    if (range_part_[size_t(r)] == part) sum_range(r, comm_);
}

void Pipeline::sum_range(int r, runtime::Stream& stream) {
  const parallel::ShardedSum::Range& x = grad_sum_->ranges()[size_t(r)];
  if (x.begin == x.end || grad_sum_->group(r).size() == 1) return;
  grad_sum_->reduce_scatter(r, stream);
  grad_sum_->all_gather(r, model_->grad_arena(), stream);  // the norm reads the whole stage (ZeRO-1 too)
}

std::vector<AdamW::Range> Pipeline::owned_ranges() const {
  const model::ParamLayout& l = model_->layout();
  std::vector<AdamW::Range> keep{{0, l.arena_size}};  // the arena, under ZeRO-1 this PE's shards of it
  if (cfg_.parallel.zero > 0 && grad_sum_) {
    keep.clear();
    for (int r = 0; r < int(grad_sum_->ranges().size()); ++r) {
      const auto s = grad_sum_->my_shard(r);
      if (s.first < s.second) keep.push_back(s);
    }
    std::sort(keep.begin(), keep.end());
  }
  std::vector<AdamW::Range> out;
  const int r = replica_index(l);
  const int64_t rb = r < 0 ? l.arena_size : l.params[size_t(r)].offset;
  const int64_t re = r < 0 ? l.arena_size : rb + l.params[size_t(r)].numel;
  for (const auto& [b, e] : keep) {  // without the head's replica of the table
    if (b < std::min(e, rb)) out.push_back({b, std::min(e, rb)});
    if (std::max(b, re) < e) out.push_back({std::max(b, re), e});
  }
  CM_CHECK(!out.empty(), "use fewer data-parallel ranks or zero 0: this stage is too small to shard",
           "PE {} keeps no optimizer state", shmem::my_pe());
  if (out.size() == 1 && out[0] == AdamW::Range{0, l.arena_size}) out.clear();  // the whole arena
  return out;
}

// ---- messages

Tensor Pipeline::receive(bool grad, int chunk, int mb) {
  const int i = buffer(grad, chunk, mb);
  const int64_t size = rows_ * cfg_.model.d_model;
  const parallel::StageRef from = schedule_.peer(rank_, {grad ? ActionKind::RecvB : ActionKind::RecvF, chunk, mb});
  wait(i, fmt::format("waits for PE {}'s {} of micro-batch {} (chunk {})", pe(from.rank),
                      grad ? "input gradient" : "activations", mb, chunk));
  // a copy of its own: the buffer is free again, the model may keep the input for its backward
  Tensor out = Tensor::empty({rows_, cfg_.model.d_model});
  parallel::copy_on_stream(recv_.slice(0, i * size, (i + 1) * size), out.view({size}));
  return out;
}

void Pipeline::send(const Tensor& data, const parallel::Action& a) {
  const bool grad = a.kind == ActionKind::SendB;
  const parallel::StageRef to = schedule_.peer(rank_, a);
  const int i = buffer(grad, to.chunk, a.micro_batch);
  const int64_t size = rows_ * cfg_.model.d_model;
  CM_ASSERT(data.defined() && data.numel() == size);
  const Tensor src = data.contiguous();
  keep_.push_back(src);  // the put reads it when the stream gets there
  runtime::Stream stream = runtime::current_stream();
  shmem::put_signal_on_stream(stream, recv_.data<float>() + i * size, src.data<float>(), size_t(size),
                              signal(i), 1, shmem::SignalOp::add, pe(to.rank));
}

// ---- the step

void Pipeline::run(const std::vector<model::MicroBatch>& batches) {
  CM_CHECK(int(batches.size()) == schedule_.micro_batches, "pass one micro-batch per scheduled micro-batch",
           "{} micro-batches for a schedule of {}", batches.size(), schedule_.micro_batches);
  keep_.clear();  // the previous step's puts are done (finish_step synchronized)
  part_backwards_.assign(model_->layout().regions.size(), 0);
  parts_summed_early_ = 0;
  model::Model& m = *model_;
  const int last = schedule_.num_stages() - 1;
  // Where a chunk's input (or output gradient) comes from: a message, or the
  // chunk of the neighbouring stage on this rank.
  auto neighbour = [&](int chunk, int mb, int step) -> parallel::StageRef {
    return schedule_.locate(mb, schedule_.stage_of(rank_, chunk) + step);
  };
  auto take = [](std::map<std::pair<int, int>, Tensor>& from, std::pair<int, int> key) {
    auto it = from.find(key);
    CM_ASSERT(it != from.end());
    Tensor t = std::move(it->second);
    from.erase(it);
    return t;
  };
  auto forward = [&](int c, int mb) {
    if (!m.slot_open(mb)) m.open_slot(mb, batches[size_t(mb)]);
    const int stage = schedule_.stage_of(rank_, c);
    Tensor in;
    if (stage > 0) {
      const parallel::StageRef prev = neighbour(c, mb, -1);
      in = prev.rank == rank_ ? take(outputs_, {prev.chunk, mb}) : take(inputs_, {c, mb});
    }
    Tensor out = m.forward_chunk(mb, c, in);
    if (stage < last) outputs_[{c, mb}] = out;
  };
  // DualPipe: a micro-batch passes one chunk of a rank; its slot closes after that backward
  std::vector<int> passes(size_t(schedule_.micro_batches), 0);
  for (int mb = 0; mb < schedule_.micro_batches; ++mb)
    for (int c = 0; c < schedule_.chunks; ++c) passes[size_t(mb)] += schedule_.passes_through(mb, c);
  auto backward = [&](int c, int mb, bool defer) {
    const int stage = schedule_.stage_of(rank_, c);
    Tensor dout;
    if (stage < last) {
      const parallel::StageRef next = neighbour(c, mb, 1);
      dout = next.rank == rank_ ? take(grads_, {next.chunk, mb}) : take(grad_inputs_, {c, mb});
    }
    Tensor din = m.backward_chunk(mb, c, dout, defer);
    if (stage > 0) grads_[{c, mb}] = din;
    if (--passes[size_t(mb)] == 0 && m.slot_open(mb)) m.close_slot(mb);
  };
  const bool traced = timed_ || runtime::profiler_enabled();
  const std::vector<parallel::Action>& actions = schedule_.actions[size_t(rank_)];
  times_.assign(actions.size(), {0, 0});
  memory_ = {};
  std::set<std::pair<int, int>> live;  // chunk slots: (chunk, micro-batch) from F to B or W
  auto note = [&](int chunk, int mb, bool taken) {
    if (!traced) return;
    if (!taken) {
      live.erase({chunk, mb});
      return;
    }
    live.insert({chunk, mb});
    int64_t bytes = 0;
    for (int i = 0; i < schedule_.micro_batches; ++i)
      if (m.slot_open(i)) bytes += m.saved_bytes(i).activations;
    memory_.peak_activation_bytes = std::max(memory_.peak_activation_bytes, bytes);
    memory_.peak_slots = std::max(memory_.peak_slots, int(live.size()));
  };
  auto backward_action = [&](int c, int mb, bool split) {
    backward(c, mb, split);
    if (!split) note(c, mb, false);
  };
  for (size_t i = 0; i < actions.size(); ++i) {
    const parallel::Action& a = actions[i];
    std::optional<StreamSpan> span;
    if (traced)
      span.emplace(schedule_.stage_of(rank_, a.chunk), parallel::to_string(a), action_category(a.kind), &times_[i]);
    switch (a.kind) {
      case ActionKind::F: forward(a.chunk, a.micro_batch), note(a.chunk, a.micro_batch, true); break;
      case ActionKind::B: backward_action(a.chunk, a.micro_batch, false); break;
      case ActionKind::I: backward_action(a.chunk, a.micro_batch, true); break;
      case ActionKind::W: m.backward_weight(a.micro_batch, a.chunk), note(a.chunk, a.micro_batch, false); break;
      case ActionKind::FB: {  // the forward's slot is taken before the backward frees its own
        const bool split = a.b_kind == ActionKind::I;
        if (pair_streams_) {
          run_pair(a, traced, [&] { forward(a.chunk, a.micro_batch), note(a.chunk, a.micro_batch, true); },
                   [&] { backward_action(a.b_chunk, a.b_micro_batch, split); });
          break;
        }
        forward(a.chunk, a.micro_batch), note(a.chunk, a.micro_batch, true);
        backward_action(a.b_chunk, a.b_micro_batch, split);
        break;
      }
      case ActionKind::SendF: send(take(outputs_, {a.chunk, a.micro_batch}), a); break;
      case ActionKind::SendB: send(take(grads_, {a.chunk, a.micro_batch}), a); break;
      case ActionKind::RecvF: inputs_[{a.chunk, a.micro_batch}] = receive(false, a.chunk, a.micro_batch); break;
      case ActionKind::RecvB: grad_inputs_[{a.chunk, a.micro_batch}] = receive(true, a.chunk, a.micro_batch); break;
      case ActionKind::SendSum: send_sums(a.chunk); break;
      case ActionKind::RecvSum: receive_sums(a.chunk); break;
    }
  }
  CM_ASSERT(outputs_.empty() && grads_.empty() && inputs_.empty() && grad_inputs_.empty());
}

// DualPipe's overlapped pair: the forward on the compute stream and the
// backward on pair_, concurrently, each stream limited to half of the
// stage's cores (at least one); the compute stream then waits for both.
// The halves touch different chunks (their own slots, parts and gradients);
// what the backward reads was made on the compute stream before the pair.
// Each half is a span on its own stage's track of the trace.
void Pipeline::run_pair(const parallel::Action& a, bool traced, const std::function<void()>& forward,
                        const std::function<void()>& backward) {
  runtime::Stream main = runtime::current_stream();
  const runtime::CoreLimits all = main.effective_limits();
  runtime::Event start;
  start.record(main);
  start.wait(pair_);
  main.set_limit(std::max(1, all.cube - all.cube / 2), std::max(1, all.vector - all.vector / 2));
  pair_.set_limit(std::max(1, all.cube / 2), std::max(1, all.vector / 2));
  {
    std::optional<StreamSpan> span;
    if (traced)
      span.emplace(schedule_.stage_of(rank_, a.chunk), parallel::to_string({ActionKind::F, a.chunk, a.micro_batch}),
                   "F", nullptr);
    forward();
  }
  main.set_limit(all.cube, all.vector);
  {
    runtime::StreamGuard on(pair_);
    std::optional<StreamSpan> span;
    if (traced)
      span.emplace(schedule_.stage_of(rank_, a.b_chunk),
                   parallel::to_string({a.b_kind, a.b_chunk, a.b_micro_batch}), action_category(a.b_kind), nullptr);
    backward();
  }
  runtime::Event done;
  done.record(pair_);
  done.wait(main);
}

// The arena range of a chunk's parts (the arena is in part order).
std::pair<int64_t, int64_t> Pipeline::chunk_range(int chunk) const {
  const model::ParamLayout& l = model_->layout();
  const model::PartRange r = model_->stage().chunks[size_t(chunk)];
  return {l.region_offset[size_t(r.begin)], l.region_offset[size_t(r.end - 1)] + l.region_size[size_t(r.end - 1)]};
}

// DualPipe, bit for bit: rank r holds stage r of copy 0 (chunk 0) and stage
// p-1-r of copy 1 (chunk 1), its partner p-1-r the same stages the other way
// round, in the same arena layout (a chunk's range here is the partner's
// other chunk's). The schedule's gradient-sum messages (schedule.hpp) carry
// a chunk's gradient sums and its MoE layers' loads (integers, E + 1 per
// layer, at layer l * (E + 1)) into the partner's symmetric buffers, a signal each, the receiving
// chunk's: sums at sum_signal(c), loads at sum_signal(c) + 1.
int Pipeline::sum_signal(int chunk) const { return norm_->signal_base + int(norm_->expected.size()) + 2 * chunk; }

// The MoE layers a chunk holds: (index in expert_load(), layer).
std::vector<std::pair<int, int>> Pipeline::chunk_layers(int chunk) const {
  std::vector<std::pair<int, int>> out;
  const model::PartRange mine = model_->stage().chunks[size_t(chunk)];
  int i = 0;
  for (int l = 0; l < cfg_.model.n_layers; ++l) {
    if (!cfg_.model.is_moe_layer(l) || !model::holds_part(model_->stage(), 2 + 2 * l)) continue;
    if (mine.begin <= 2 + 2 * l && 2 + 2 * l < mine.end) out.emplace_back(i, l);
    ++i;
  }
  return out;
}

void Pipeline::send_sums(int chunk) {
  const int partner = schedule_.ranks - 1 - rank_;
  runtime::Stream stream = runtime::current_stream();
  const auto [b, e] = chunk_range(chunk);
  shmem::put_signal_on_stream(stream, copy_grads_.data<float>() + b, model_->grad_data() + b, size_t(e - b),
                              signal(sum_signal(1 - chunk)), 1, shmem::SignalOp::add, pe(partner));
  const auto layers = chunk_layers(chunk);
  if (layers.empty()) return;
  const int64_t E = cfg_.model.n_routed_experts + 1, lb = layers.front().second * E, le = (layers.back().second + 1) * E;
  for (const auto& [i, l] : layers)
    parallel::copy_on_stream(model_->expert_load()[size_t(i)], load_arena_.slice(0, l * E, (l + 1) * E));
  shmem::put_signal_on_stream(stream, copy_loads_.data<int64_t>() + lb, load_arena_.data<int64_t>() + lb,
                              size_t(le - lb), signal(sum_signal(1 - chunk) + 1), 1, shmem::SignalOp::add,
                              pe(partner));
}

void Pipeline::receive_sums(int chunk) {
  const int partner = schedule_.ranks - 1 - rank_;
  const bool continues = chunk == 1;  // copy 1's micro-batches come after the partner's
  wait(sum_signal(chunk), fmt::format("waits for PE {}'s {}", pe(partner),
                                      continues ? "copy-0 gradient sums, which this rank's copy-1 micro-batches continue"
                                                : "finished gradient sums of this rank's copy-0 stage"));
  const auto [b, e] = chunk_range(chunk);
  const Tensor grad = model_->grad_arena();
  parallel::copy_on_stream(copy_grads_.slice(0, b, e), grad.slice(0, b, e));
  if (continues) model_->continue_gradient_sum(chunk);
  const auto layers = chunk_layers(chunk);
  if (layers.empty()) return;
  wait(sum_signal(chunk) + 1, fmt::format("waits for PE {}'s expert loads of the other model copy", pe(partner)));
  const int64_t E = cfg_.model.n_routed_experts + 1;
  for (const auto& [i, l] : layers) {  // copy 1: both copies' loads; copy 0: the partner's are the total
    const Tensor& load = model_->expert_load()[size_t(i)];
    const Tensor theirs = copy_loads_.slice(0, l * E, (l + 1) * E);
    if (continues)
      parallel::sum_in_order({load, theirs}, load);
    else
      parallel::copy_on_stream(theirs, load);
  }
}

void Pipeline::sum_over_data_ranks() {
  if (!grad_sum_) return;  // one replica, no shared key/value heads
  std::optional<StreamSpan> span;
  if (runtime::profiler_enabled()) span.emplace(schedule_.stage_of(rank_, 0), "data-parallel sum", "grad sum", nullptr);
  runtime::Stream stream = runtime::current_stream();
  // gradients: replica d holds micro-batches [d a, (d+1) a); summed in replica
  // order and gathered whole
  if (overlap_) {
    for (int r = 0; r < int(range_part_.size()); ++r)  // parts no backward wrote (sealed: zeros)
      if (range_part_[size_t(r)] >= 0 && part_backwards_.at(size_t(range_part_[size_t(r)])) < schedule_.micro_batches)
        sum_range(r, stream);
    runtime::Event done;
    done.record(comm_);
    done.wait();  // the compute stream goes on with the sums
  } else {
    for (int r = 0; r < int(grad_sum_->ranges().size()); ++r) sum_range(r, stream);
  }
  // the routers' loads: every replica updates its biases from the global load
  if (!model_->expert_load().empty() && data_ranks() > 1) load_sum_->sum_packed(model_->expert_load(), stream);
}

// Expert and tensor parallelism cut the experts' rows and the matrices over
// PEs, so no PE holds a 1-PE chunk of them: each PE takes the partials of
// what it alone counts (its experts, the dense parameters on ep rank 0; its
// TP slices, the parameters every TP rank holds on the first; data replica
// 0; copy 0's stage under DualPipe; not the head's replica) and the world
// sums them: within rounding of one PE.
Tensor Pipeline::grad_sq_sum_cut() {
  const parallel::Coords at = mesh_.coords(shmem::my_pe());
  std::vector<ops::ParamSegment> mine;
  const std::vector<model::PartRange> held = canonical_chunks(rank_);
  if (at[Dim::dp] == 0)
    for (const model::ParamInfo& p : model_->params())
      if (!p.tied_replica && p.tp_first && (p.expert() || at[Dim::ep] == 0) && model::holds_part({held}, p.part))
        mine.push_back({p.offset, p.numel, p.weight_decay});
  const Tensor P = cut_partials_;
  parallel::zero_on_stream(P);
  if (!mine.empty()) {
    const Tensor part = ops::grad_sq_partials(model_->grad_arena(), mine);
    Tensor dst = P.slice(0, 0, part.numel());
    ops::add_out(dst, part, dst);
  }
  runtime::Stream stream = runtime::current_stream();
  cut_sum_->reduce_scatter(0, stream);
  cut_sum_->all_gather(0, P, stream);
  return ops::sum_partials(P);
}

Tensor Pipeline::grad_sq_sum() {
  if (experts_ || tensor_) return grad_sq_sum_cut();
  NormPlan& q = *norm_;
  const Tensor grad = model_->grad_arena(), P = q.partials;
  parallel::zero_on_stream(P);
  runtime::Stream stream = runtime::current_stream();
  auto partials_into = [&](const Tensor& values, int64_t first_chunk, int64_t b, int64_t e) {
    const Tensor part = ops::grad_sq_partials(values, segments_in(q.params, b, e));
    Tensor dst = P.slice(0, first_chunk, first_chunk + part.numel());
    ops::add_out(dst, part, dst);  // 0 + x: the partial itself
  };
  for (const NormPlan::Run& r : q.runs) {
    if (r.pe != rank_) continue;
    // chunks wholly inside this run, in stretches; pieces of edge chunks to their owner
    int64_t c = r.begin / K;
    while (c * K < r.end) {
      if (q.edge[size_t(c)] < 0) {
        int64_t c1 = c;
        while (c1 * K < r.end && q.edge[size_t(c1)] < 0) ++c1;
        const int64_t b = c * K, e = std::min(q.n, c1 * K);
        partials_into(grad.slice(0, r.at + (b - r.begin), r.at + (e - r.begin)), c, b, e);
        c = c1;
        continue;
      }
      const int slot = q.edge[size_t(c)];
      const int64_t lo = std::max(r.begin, c * K), hi = std::min(r.end, (c + 1) * K);
      const Tensor src = grad.slice(0, r.at + (lo - r.begin), r.at + (hi - r.begin));
      const int64_t at = slot * K + (lo - c * K);
      if (q.owner[size_t(c)] == rank_) parallel::copy_on_stream(src, q.edges.slice(0, at, at + (hi - lo)));
      else
        shmem::put_signal_on_stream(stream, q.edges.data<float>() + at, src.data<float>(), size_t(hi - lo),
                                    signal(q.signal_base + slot), 1, shmem::SignalOp::add,
                                    pe(q.owner[size_t(c)]));
      ++c;
    }
  }
  for (int64_t c = 0; c < q.chunks; ++c) {
    const int slot = q.edge[size_t(c)];
    if (slot < 0 || q.owner[size_t(c)] != rank_) continue;
    for (int k = 0; k < q.expected[size_t(slot)]; ++k)
      wait(q.signal_base + slot, fmt::format("waits for the gradients of norm chunk {} from the stages around", c));
    const int64_t b = c * K, e = std::min(q.n, b + K);
    partials_into(q.edges.slice(0, slot * K, slot * K + (e - b)), c, b, e);
  }
  q.sum->reduce_scatter(0, stream);
  q.sum->all_gather(0, P, stream);
  return ops::sum_partials(P);
}

void Pipeline::sync_tied_table() {
  if (tied_) tied_->sync(*model_);
}

void Pipeline::after_optimizer() {
  if (cfg_.parallel.zero > 0 && grad_sum_) {  // each PE updated its shards: every replica gets them
    runtime::Stream stream = runtime::current_stream();
    for (int r = 0; r < int(grad_sum_->ranges().size()); ++r) {
      const parallel::ShardedSum::Range& x = grad_sum_->ranges()[size_t(r)];
      if (x.begin < x.end && grad_sum_->group(r).size() > 1 && r != replica_range_)
        grad_sum_->all_gather(r, model_->param_arena(), stream);
    }
  }
  sync_tied_table();  // after the gather: the embedding's table is whole
}

// ---- host

Tensor Pipeline::forward_only(const model::MicroBatch& batch) {
  model::Model& m = *model_;
  const int last = schedule_.num_stages() - 1, slot = 0;
  std::vector<int> order(size_t(schedule_.chunks));  // this rank's chunks in stage order
  for (int c = 0; c < schedule_.chunks; ++c) order[size_t(c)] = c;
  std::sort(order.begin(), order.end(),
            [&](int a, int b) { return schedule_.stage_of(rank_, a) < schedule_.stage_of(rank_, b); });
  m.open_slot(slot, batch);
  Tensor x, losses;
  for (int c : order) {
    if (!schedule_.passes_through(slot, c)) continue;
    const int stage = schedule_.stage_of(rank_, c);
    if (stage > 0 && schedule_.locate(slot, stage - 1).rank != rank_) x = receive(false, c, slot);
    x = m.forward_chunk(slot, c, x);
    if (stage == last) losses = m.token_losses(slot);
    else if (schedule_.locate(slot, stage + 1).rank != rank_) send(x, {ActionKind::SendF, c, slot});
  }
  runtime::current_stream().synchronize();
  m.close_slot(slot);
  keep_.clear();
  shmem::barrier();  // every buffer read before the next batch is put
  return losses;
}

int64_t Pipeline::symmetric_bytes(const TrainConfig& c) {
  const model::ModelConfig& m = c.model;
  const int64_t whole = model::layout_params(m).arena_size, table = int64_t(m.vocab_size) * m.d_model;
  const parallel::Schedule s = pipeline_schedule(c);
  const int64_t mb = c.grad_accum, chunks = s.chunks;
  const int64_t messages = 2 * chunks * mb * int64_t(c.batch_size) * c.seq_len * m.d_model;
  // weights, gradients, AdamW m and v (the largest stage, at most the whole model and a
  // replica), receive buffers, the tied table's per micro-batch, norm slots
  // the gradients' reduce-scatter (dp), the partner's gradients (DualPipe)
  const int64_t staging = (c.parallel.dp * c.parallel.ep > 1) + (s.placement == parallel::Placement::bidirectional);
  const int64_t staged = staging * (whole + table);
  const int64_t experts = c.parallel.ep > 1 ? parallel::ShmemExperts::symmetric_bytes(c.parallel.ep, expert_dispatch_shape(c)) : 0;
  const int64_t tensor = c.parallel.tp > 1 ? parallel::ShmemTensor::symmetric_bytes(c.parallel.tp, tp_sizes(c)) : 0;
  return 4 * (4 * (whole + table) + staged + messages + mb * table + (c.parallel.pp * 2 + 2) * K) + experts +
         tensor + (16 << 20);
}

}  // namespace coremesh::train
