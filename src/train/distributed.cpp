#include "coremesh/train/distributed.hpp"

#include <algorithm>
#include <cstring>
#include <map>

#include "coremesh/core/error.hpp"
#include "coremesh/ops/elementwise.hpp"
#include "coremesh/ops/optimizer.hpp"
#include "coremesh/parallel/tensor_parallel.hpp"
#include "coremesh/shmem/collectives.hpp"
#include "coremesh/shmem/rma.hpp"
#include "coremesh/shmem/session.hpp"
#include "coremesh/shmem/team.hpp"
#include "coremesh/train/trainer.hpp"

namespace coremesh::train {
namespace {

parallel::SplitSizes split_sizes(const TrainConfig& c) {
  return {c.model.n_routed_experts, c.model.n_heads, c.model.n_layers, c.seq_len, c.model.n_kv_heads};
}

int64_t round_up(int64_t x, int64_t unit, int64_t cap) { return std::min(cap, (x + unit - 1) / unit * unit); }

// The stage of TP rank `tp_rank` (all experts unless ep_index >= 0).
model::StageLayout tp_stage(const TrainConfig& c, int tp_rank, int ep_index = -1) {
  model::StageLayout s;
  s.tp = c.parallel.tp, s.tp_rank = tp_rank;
  s.sequence_parallel = c.parallel.sequence_parallel && c.parallel.tp > 1;
  if (ep_index >= 0 && c.parallel.ep > 1) {
    const int local = c.model.n_routed_experts / c.parallel.ep;
    s.expert_begin = ep_index * local, s.expert_end = s.expert_begin + local;
  }
  return s;
}

// The attention shapes of one CP rank's micro-batch (this TP rank's heads).
parallel::ShmemContext::Sizes context_shape(const TrainConfig& c) {
  const model::ModelConfig& m = c.model;
  const model::TpShape t = model::tp_shape(m, tp_stage(c, 0));
  return {c.batch_size, c.seq_len / c.parallel.cp, int(t.heads), int(t.kv_heads), m.head_dim()};
}

bool zigzag(const parallel::ParallelConfig& p) { return p.cp_zigzag && p.cp_comm == parallel::CpComm::ring; }

}  // namespace

std::vector<int64_t> tp_sizes(const TrainConfig& c) {
  const int64_t tokens = int64_t(c.batch_size) * (c.seq_len / c.parallel.cp);
  std::vector<int64_t> sizes{tokens * c.model.d_model, (c.parallel.tp + 1) * tokens};
  if (c.model.n_moe_layers() > 0) sizes.push_back(tokens * c.model.top_k);
  return sizes;
}

parallel::ShmemExperts::Shape expert_dispatch_shape(const TrainConfig& c) {
  const model::ModelConfig& m = c.model;
  std::vector<int> layers;
  for (int l = 0; l < m.n_layers; ++l)
    if (m.is_moe_layer(l)) layers.push_back(l);
  const int64_t tokens = int64_t(c.batch_size) * c.seq_len;
  return {m.n_routed_experts, m.d_model, tokens * m.top_k, m.expert_capacity(tokens), layers};
}

Distributed::Distributed(const TrainConfig& cfg, runtime::Device& device)
    : cfg_(cfg), mesh_(cfg.parallel, shmem::n_pes(), split_sizes(cfg)), rank_(shmem::my_pe()), comm_(device) {
  const parallel::ParallelConfig& p = cfg.parallel;
  CM_CHECK(p.pp == 1, "set pp to 1: pipelines train through train::Pipeline", "the layout asks for pp {}", p.pp);
  CM_CHECK(p.cp == 1 || cfg.model.aux_loss_alpha == 0.0f,
           "set model.aux_loss_alpha to 0 or cp to 1: the sequence-wise balance loss needs whole sequences",
           "cp {} with aux_loss_alpha {}", p.cp, cfg.model.aux_loss_alpha);
  CM_CHECK(p.cp == 1 || !cfg.graph, "drop --graph or set cp to 1: graph mode does not capture context parallelism yet",
           "cp {} with graph mode", p.cp);
  groups_ = {parallel::Group::of(mesh_.dense_grad_group(rank_), rank_),
             parallel::Group::of(mesh_.expert_grad_group(rank_), rank_)};
  // groups 2, ...: parameters whose gradient several TP ranks compute parts of
  const int kv_sharing = model::tp_shape(cfg.model, stage()).kv_sharing;
  if (kv_sharing > 1) tp_sharing_.push_back(kv_sharing);                 // key/value heads
  if (stage().sequence_parallel && kv_sharing != p.tp) tp_sharing_.push_back(p.tp);  // norms, routers
  for (int sharing : tp_sharing_)
    groups_.push_back(parallel::Group::of(mesh_.tp_shared_grad_group(rank_, sharing), rank_));
  if (p.tp > 1)
    tensor_ = std::make_unique<parallel::ShmemTensor>(parallel::Group::of(mesh_.group(parallel::Dim::tp, rank_), rank_),
                                                      tp_sizes(cfg), p.sequence_parallel,
                                                      p.tp_comm_overlap);
  if (p.cp > 1)
    context_ = std::make_unique<parallel::ShmemContext>(parallel::Group::of(mesh_.group(parallel::Dim::cp, rank_), rank_),
                                                        p.cp_comm, zigzag(p), context_shape(cfg));
  if (p.ep > 1)
    experts_ = std::make_unique<parallel::ShmemExperts>(parallel::Group::of(mesh_.group(parallel::Dim::ep, rank_), rank_),
                                                        expert_dispatch_shape(cfg));
}

Distributed::~Distributed() = default;

model::StageLayout Distributed::stage() const {
  model::StageLayout s = tp_stage(cfg_, mesh_.coords(rank_)[parallel::Dim::tp]);
  if (experts_) s.expert_begin = experts_->first_expert(), s.expert_end = s.expert_begin + experts_->local_experts();
  return s;
}

parallel::Seams Distributed::seams() {
  parallel::Seams s;
  if (experts_) s.experts = experts_.get();
  if (context_) s.context = context_.get();
  if (tensor_) s.tensor = tensor_.get();
  return s;
}

model::Model::ArenaAllocator Distributed::arena() const {
  return [](int64_t n) { return parallel::symmetric_tensor({n}); };
}

void Distributed::attach(model::Model& model) {
  model_ = &model;
  const model::ParamLayout& l = model.layout();
  const int64_t n = l.arena_size;
  const int parts = model::num_parts(cfg_.model);
  // Without expert parallelism every parameter is summed over the same group:
  // buckets follow the parts, cut at norm-chunk boundaries so that the norm's
  // per-chunk partials are each computed whole on one PE.
  exact_norm_ = cfg_.parallel.ep == 1 && cfg_.parallel.tp == 1;
  std::vector<parallel::ShardedSum::Range> ranges;
  for (int part = parts - 1; part >= 0; --part) {
    const int64_t b = l.region_offset[size_t(part)], e = b + l.region_size[size_t(part)];
    if (exact_norm_) {
      const int64_t k = ops::kOptimizerChunk;
      ranges.push_back({round_up(b, k, n), part == parts - 1 ? n : round_up(e, k, n), 0});
      ready_part_.push_back(part);
      continue;
    }
    // runs of parameters with one reduction group: 0 dense, 1 routed
    // experts, 2... parameters whose gradient TP ranks compute parts of
    const model::PartRange ps = l.regions[size_t(part)];
    auto group_of_param = [&](int i) {
      const model::ParamInfo& q = l.params[size_t(i)];
      if (q.expert()) return 1;
      if (!q.tp_partial_grad) return 0;
      const auto it = std::find(tp_sharing_.begin(), tp_sharing_.end(), q.tp_copies);
      CM_CHECK(it != tp_sharing_.end(), "report this: a parameter's gradient parts have no reduction group",
               "{} is shared by {} TP ranks", q.name, q.tp_copies);
      return 2 + int(it - tp_sharing_.begin());
    };
    for (int i = ps.begin; i < ps.end;) {
      const int group = group_of_param(i);
      int j = i;
      while (j < ps.end && group_of_param(j) == group) ++j;
      const int64_t rb = l.params[size_t(i)].offset, re = j < ps.end ? l.params[size_t(j)].offset : e;
      ranges.push_back({rb, re, group});
      ready_part_.push_back(part);
      i = j;
    }
  }
  grads_ = std::make_unique<parallel::ShardedSum>(model.grad_arena(), groups_, ranges,
                                                  exact_norm_ ? ops::kOptimizerChunk : 16);
  std::vector<int> world;
  for (int pe = 0; pe < mesh_.world(); ++pe) world.push_back(pe);
  const int64_t chunks = (n + ops::kOptimizerChunk - 1) / ops::kOptimizerChunk + 1;
  partial_arena_ = parallel::symmetric_tensor({chunks});
  partials_ = std::make_unique<parallel::ShardedSum>(partial_arena_, std::vector<parallel::Group>{parallel::Group::of(world, rank_)},
                                                     std::vector<parallel::ShardedSum::Range>{{0, chunks, 0}}, 1);
  const int64_t loads = int64_t(cfg_.model.n_moe_layers()) * (cfg_.model.n_routed_experts + 1);
  load_arena_ = parallel::symmetric_tensor({std::max<int64_t>(loads, 1)}, DType::i64);
  load_ = std::make_unique<parallel::ShardedSum>(load_arena_, std::vector<parallel::Group>{groups_[0]},
                                                 std::vector<parallel::ShardedSum::Range>{{0, loads, 0}}, 1);
  host_values_ = parallel::symmetric_tensor({1 + mesh_.world()}, DType::i64);  // doubles, 8 bytes each
  model.on_gradients_ready([this](int part) { on_part_ready(part); });
}

std::vector<AdamW::Range> Distributed::owned_ranges() const {
  std::vector<AdamW::Range> out;
  if (cfg_.parallel.zero == 0) return out;
  for (int r = 0; r < int(grads_->ranges().size()); ++r) {
    const auto s = grads_->my_shard(r);
    if (s.first < s.second) out.push_back(s);
  }
  std::sort(out.begin(), out.end());
  return out;
}

void Distributed::arm() { armed_ = true; }

void Distributed::on_part_ready(int part) {
  if (!armed_) return;
  runtime::Event ready;
  ready.record();  // on the compute stream: the part's gradients of the step are complete
  ready.wait(comm_);
  for (int r = 0; r < int(ready_part_.size()); ++r) {
    if (ready_part_[size_t(r)] != part) continue;
    grads_->reduce_scatter(r, comm_);
    if (cfg_.parallel.zero == 0) grads_->all_gather(r, model_->grad_arena(), comm_);
  }
}

void Distributed::finish_backward() {
  armed_ = false;
  runtime::Event done;
  done.record(comm_);
  done.wait();  // the compute stream goes on with the summed gradients
}

Tensor Distributed::grad_sq_sum() {
  const Tensor P = partial_arena_, grad = model_->grad_arena();
  parallel::zero_on_stream(P);
  const model::ParamLayout& l = model_->layout();
  for (int r = 0; r < int(grads_->ranges().size()); ++r) {
    const auto [b, e] = grads_->my_shard(r);
    if (b == e) continue;
    std::vector<ops::ParamSegment> seg;  // the parameters' pieces in the shard, relative to it
    for (const auto& p : l.params) {
      // a copy that other TP ranks hold too counts on the first of them; kv
      // heads shared by TP ranks are summed over them, whose shards part them
      if (!p.tp_first && !p.tp_partial_grad) continue;
      const int64_t lo = std::max(b, p.offset), hi = std::min(e, p.offset + p.numel);
      if (lo < hi) seg.push_back({lo - b, hi - lo, p.weight_decay});
    }
    const Tensor part = ops::grad_sq_partials(grad.slice(0, b, e), seg);
    const int64_t at = b / ops::kOptimizerChunk;
    Tensor dst = P.slice(0, at, at + part.numel());
    ops::add_out(dst, part, dst);
  }
  runtime::Stream s = runtime::current_stream();
  partials_->reduce_scatter(0, s);
  partials_->all_gather(0, P, s);
  return ops::sum_partials(P);
}

void Distributed::after_optimizer() {
  if (cfg_.parallel.zero == 0) return;
  runtime::Stream s = runtime::current_stream();
  for (int r = 0; r < int(grads_->ranges().size()); ++r) grads_->all_gather(r, model_->param_arena(), s);
}

void Distributed::sum_expert_load() {
  if (model_->expert_load().empty()) return;
  runtime::Stream s = runtime::current_stream();
  load_->sum_packed(model_->expert_load(), s);
}

model::Model::ArenaAllocator Distributed::state_allocator() const {
  return [](int64_t n) {
    const int64_t most = parallel::max_over_world({n})[0];
    return parallel::symmetric_tensor({most}).slice(0, 0, n);
  };
}

parallel::Group Distributed::group_of(int r, int pe) const {
  const int kind = grads_->ranges()[size_t(r)].group;
  return parallel::Group::of(kind == 0   ? mesh_.dense_grad_group(pe)
                             : kind == 1 ? mesh_.expert_grad_group(pe)
                                         : mesh_.tp_shared_grad_group(pe, tp_sharing_[size_t(kind - 2)]),
                             pe);
}

int64_t Distributed::state_offset(int pe, int r) const {
  // pe's owned ranges, sorted by start (as owned_ranges() gives them to AdamW)
  const auto mine = grads_->shard(r, group_of(r, pe).me);
  int64_t offset = 0;
  for (int q = 0; q < int(grads_->ranges().size()); ++q) {
    const auto s = grads_->shard(q, group_of(q, pe).me);
    if (s.first < s.second && s.first < mine.first) offset += s.second - s.first;
  }
  return offset;
}

std::vector<Distributed::Piece> Distributed::locate(int ep_index, int tp_index, int64_t b, int64_t e,
                                                    bool state) const {
  parallel::Coords c;
  c[parallel::Dim::ep] = ep_index, c[parallel::Dim::tp] = tp_index;
  const int holder = mesh_.rank(c);  // dp 0 of that expert shard: every PE has the full weights
  if (!state || cfg_.parallel.zero == 0) return {{holder, b, e - b, 0}};
  std::vector<Piece> out;
  for (int r = 0; r < int(grads_->ranges().size()); ++r) {
    const parallel::Group g = group_of(r, holder);
    for (int m = 0; m < g.size(); ++m) {
      const auto [sb, se] = grads_->shard(r, m);
      const int64_t lo = std::max(b, sb), hi = std::min(e, se);
      if (lo >= hi) continue;
      const int pe = g.pes[size_t(m)];
      out.push_back({pe, state_offset(pe, r) + (lo - sb), hi - lo, lo - b});
    }
  }
  return out;
}

void Distributed::gather_state(model::Model& model, AdamW& opt, NamedTensors& params, NamedTensors& adam_m,
                               NamedTensors& adam_v) {
  shmem::barrier();  // every PE's step is done: their arenas hold the state to save
  if (leader()) {
    const int ep = cfg_.parallel.ep, tp = cfg_.parallel.tp;
    // the layouts of every (ep, tp) index: where each one's share of a tensor sits
    std::vector<std::vector<model::ParamLayout>> layouts(static_cast<size_t>(ep));
    for (int j = 0; j < ep; ++j)
      for (int t = 0; t < tp; ++t) layouts[size_t(j)].push_back(model::layout_params(cfg_.model, tp_stage(cfg_, t, j)));
    for (const model::ParamInfo& w : model::layout_params(cfg_.model).params) {
      Tensor x = Tensor::empty(w.shape), m = Tensor::empty(w.shape), v = Tensor::empty(w.shape);
      for (int j = 0; j < (w.expert() ? ep : 1); ++j)
        for (int t = 0; t < tp; ++t) {
          const model::ParamLayout& l = layouts[size_t(j)][size_t(t)];
          const model::ParamInfo& p = l.params[size_t(l.index_of(w.name))];
          if (!p.tp_first) continue;  // a copy: the first holder's is read
          Tensor px = Tensor::empty(p.shape), pm = Tensor::empty(p.shape), pv = Tensor::empty(p.shape);
          for (const Piece& q : locate(j, t, p.offset, p.offset + p.numel, false))
            shmem::get(px.data<float>() + q.at, model.param_data() + q.offset, size_t(q.length), q.pe);
          for (const Piece& q : locate(j, t, p.offset, p.offset + p.numel, true)) {
            shmem::get(pm.data<float>() + q.at, opt.m().data<float>() + q.offset, size_t(q.length), q.pe);
            shmem::get(pv.data<float>() + q.at, opt.v().data<float>() + q.offset, size_t(q.length), q.pe);
          }
          model::place_part(p, px, x), model::place_part(p, pm, m), model::place_part(p, pv, v);
        }
      params.emplace_back(w.name, x), adam_m.emplace_back(w.name, m), adam_v.emplace_back(w.name, v);
    }
  }
  shmem::barrier();  // nobody changes its arenas before the leader has read them
}

double Distributed::sum_over_data_ranks(double local) {
  auto* v = reinterpret_cast<double*>(host_values_.raw_data());
  v[0] = local;
  shmem::allgather(shmem::Team::world(), v + 1, v, 1);
  double sum = 0;
  for (int r : mesh_.dense_grad_group(rank_)) sum += v[1 + r];  // dp x cp x ep: every token of the step
  return sum;
}

std::vector<int32_t> Distributed::my_tokens(const std::vector<int32_t>& tokens, int B, int T) const {
  if (!context_) return tokens;
  const parallel::SequenceSplit& split = context_->split();
  const int Tl = T / split.cp;
  std::vector<int32_t> out(size_t(B) * Tl);
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < Tl; ++t) out[size_t(b * Tl + t)] = tokens[size_t(b * T + split.global(split.rank, t, Tl))];
  return out;
}

int64_t Distributed::symmetric_bytes(const TrainConfig& c, int world) {
  if (c.parallel.pp > 1) return Pipeline::symmetric_bytes(c);
  const parallel::Mesh mesh(c.parallel, world, split_sizes(c));
  const int ep = c.parallel.ep;
  const int64_t arena = model::layout_params(c.model, tp_stage(c, 0, 0)).arena_size;
  int64_t bytes = 4 * 3 * arena + (16 << 20);  // weights, gradients, staging; small buffers and alignment
  if (c.parallel.tp > 1) bytes += parallel::ShmemTensor::symmetric_bytes(c.parallel.tp, tp_sizes(c));
  if (c.parallel.cp > 1)
    bytes += parallel::ShmemContext::symmetric_bytes(c.parallel.cp_comm, c.parallel.cp, context_shape(c));
  if (ep > 1) bytes += parallel::ShmemExperts::symmetric_bytes(ep, expert_dispatch_shape(c));
  return bytes;
}

}  // namespace coremesh::train
