#include "coremesh/parallel/gradient_sync.hpp"

#include <algorithm>

#include "coremesh/core/error.hpp"
#include "coremesh/ops/elementwise.hpp"
#include "coremesh/ops/optimizer.hpp"

namespace coremesh::parallel {
namespace {

constexpr int64_t K = ops::kOptimizerChunk;

int64_t round_up(int64_t x, int64_t unit, int64_t cap) { return std::min(cap, (x + unit - 1) / unit * unit); }

// A tensor every PE allocates alike: symmetric when others read or write it.
Tensor shared_zeros(int world, const Shape& shape, DType dtype = DType::f32) {
  return world > 1 ? symmetric_tensor(shape, dtype) : Tensor::zeros(shape, dtype);
}

Group world_group(int world, int me) {
  std::vector<int> all(size_t(world), 0);
  for (int pe = 0; pe < world; ++pe) all[size_t(pe)] = pe;
  return Group::of(all, me);
}

// The parameters of `params` inside [b, e), clipped, relative to b.
std::vector<ops::ParamSegment> segments_in(const std::vector<ParamSpan>& params, int64_t b, int64_t e) {
  std::vector<ops::ParamSegment> out;
  for (const ParamSpan& p : params) {
    const int64_t lo = std::max(b, p.offset), hi = std::min(e, p.offset + p.numel);
    if (lo < hi) out.push_back({lo - b, hi - lo, p.weight_decay});
  }
  return out;
}

void add_into(const Tensor& P, int64_t at, const Tensor& part) {
  Tensor dst = P.slice(0, at, at + part.numel());
  ops::add_out(dst, part, dst);  // 0 + x: the partial itself
}

}  // namespace

// The 1-PE norm's chunks (exact mode): every PE's runs of the whole model's
// arena, the owner of each chunk, and the slots where chunks that straddle
// PEs are assembled.
struct GradientSync::NormPlan {
  struct Run {
    int pe;
    int64_t begin, end;  // in the whole model's arena
    int64_t at;          // where begin lies in pe's arena
  };
  std::vector<Run> runs;            // every PE's, by begin
  std::vector<ParamSpan> params;    // the whole model's
  int64_t n = 0, chunks = 0;
  std::vector<int> owner, edge;     // per chunk: its owner; its edge slot or -1
  std::vector<int> expected;        // per edge slot: puts from other PEs per step
  Tensor edges, signals, partials;
  std::unique_ptr<ShardedSum> sum;  // of the partials over the world
};

GradientSync::GradientSync(const Setup& setup, StageModel& model, runtime::Device& device)
    : setup_(setup), mesh_(*setup.mesh), me_(setup.me), model_(model), comm_(device) {
  CM_ASSERT(setup_.mesh && setup_.stage_of && setup_.params_of && setup_.counted_chunks);
  const int world = mesh_.world();
  const bool cut = mesh_.degree(Dim::ep) > 1 || mesh_.degree(Dim::tp) > 1;
  exact_norm_ = !cut;
  norm_chunk_buckets_ = exact_norm_ && mesh_.degree(Dim::pp) == 1;
  align_ = exact_norm_ ? K : 16;
  StageLayout every_part = setup_.stage_of(me_);  // TP sharing as every stage of this layout has it
  every_part.chunks.clear();
  parts_ = int(setup_.params_of(every_part).region_offset.size());
  part_backwards_.assign(size_t(parts_), 0);
  for (const ParamSpan& p : setup_.params_of(every_part).params)
    if (p.group == ReduceGroup::tp_shared && std::find(sharings_.begin(), sharings_.end(), p.tp_sharing) == sharings_.end())
      sharings_.push_back(p.tp_sharing);
  std::sort(sharings_.begin(), sharings_.end());
  // as many buckets on every PE (the sum's staging is symmetric)
  size_t most = 0;
  for (int pe = 0; pe < world; ++pe) most = std::max(most, buckets_of(pe).size());
  buckets_ = buckets_of(me_);
  const int64_t n = model.grad_arena().numel();
  while (buckets_.size() < most) buckets_.push_back({n, n, 0, -1, false});
  summed_.assign(buckets_.size(), false);
  const bool shared = mesh_.dense_grad_group(me_).size() > 1 || !sharings_.empty();
  if (shared) {
    std::vector<Group> groups;
    for (int g = 0; g < 2 + int(sharings_.size()); ++g) groups.push_back(Group::of(group_members(me_, g), me_));
    std::vector<ShardedSum::Range> ranges;
    for (const Bucket& b : buckets_) ranges.push_back({b.begin, b.end, b.group});
    grads_ = std::make_unique<ShardedSum>(model.grad_arena(), groups, ranges, align_);
  }
  if (mesh_.dense_grad_group(me_).size() > 1) {  // every MoE layer's (E + 1) counts, packed
    int64_t loads = 1;
    for (const Tensor& t : model.expert_load()) loads += t.numel();
    Tensor arena = symmetric_tensor({max_over_world({loads})[0]}, DType::i64);
    loads_ = std::make_unique<ShardedSum>(arena, std::vector<Group>{Group::of(mesh_.dense_grad_group(me_), me_)},
                                          std::vector<ShardedSum::Range>{{0, arena.numel(), 0}}, 1);
  }
  plan_norm();
  model.on_gradients_ready([this](int part) { on_part_ready(part); });
}

GradientSync::~GradientSync() = default;

int64_t GradientSync::symmetric_bytes_bound(int64_t arena, int64_t loads) {
  const int64_t chunks = arena / K + 1;
  // staging: every range's member slots (a range's size plus a chunk of alignment
  // per member); the norm's partials and edges (at most two per chunk); the loads twice
  return 4 * (arena + 2 * chunks * K) + 4 * 4 * chunks + 8 * 4 * (loads + 16) + (1 << 20);
}

std::vector<int> GradientSync::group_members(int pe, int group) const {
  if (group == 0) return mesh_.dense_grad_group(pe);
  if (group == 1) return mesh_.expert_grad_group(pe);
  return mesh_.tp_shared_grad_group(pe, sharings_.at(size_t(group - 2)));
}

int GradientSync::member_index(int pe, int group) const {
  const std::vector<int> m = group_members(pe, group);
  return int(std::find(m.begin(), m.end(), pe) - m.begin());
}

// 0 dense, 1 routed experts (dense without expert parallelism: the same
// ranks), 2 + i parameters whose gradient sharings_[i] TP ranks compute parts of.
int GradientSync::group_index(ReduceGroup group, int tp_sharing) const {
  if (group == ReduceGroup::expert) return mesh_.degree(Dim::ep) > 1 ? 1 : 0;
  if (group == ReduceGroup::dense) return 0;
  const auto it = std::find(sharings_.begin(), sharings_.end(), tp_sharing);
  CM_CHECK(it != sharings_.end(), "report this: a parameter's gradient parts have no reduction group",
           "a parameter is shared by {} TP ranks", tp_sharing);
  return 2 + int(it - sharings_.begin());
}

// PE pe's shard of bucket b (ShardedSum's cut; all of it in a group of one).
std::pair<int64_t, int64_t> GradientSync::shard_of(int pe, const Bucket& b) const {
  const int members = int(group_members(pe, b.group).size());
  if (members <= 1) return {b.begin, b.end};
  return shard_bounds(b.begin, b.end, members, member_index(pe, b.group), align_);
}

// Per part (in model order), runs of parameters with one reduction group;
// or, with one stage and one group, the parts cut at norm-chunk boundaries.
std::vector<GradientSync::Bucket> GradientSync::buckets_of(int pe) const {
  const StageParams sp = setup_.params_of(setup_.stage_of(pe));
  const int64_t n = sp.arena_size;
  const int parts = int(sp.region_offset.size());
  std::vector<Bucket> out;
  if (norm_chunk_buckets_) {
    for (int part = 0; part < parts; ++part) {
      const int64_t b = sp.region_offset[size_t(part)], e = b + sp.region_size[size_t(part)];
      out.push_back({round_up(b, K, n), part == parts - 1 ? n : round_up(e, K, n), 0, part, false});
    }
    return out;
  }
  auto group_of = [&](const ParamSpan& p) { return group_index(p.group, p.tp_sharing); };
  for (int part = 0; part < parts; ++part) {
    if (sp.region_size[size_t(part)] == 0) continue;
    const int64_t region_end = sp.region_offset[size_t(part)] + sp.region_size[size_t(part)];
    std::vector<const ParamSpan*> mine;
    for (const ParamSpan& p : sp.params)
      if (p.part == part) mine.push_back(&p);
    for (size_t i = 0; i < mine.size();) {
      size_t j = i;
      while (j < mine.size() && group_of(*mine[j]) == group_of(*mine[i]) &&
             mine[j]->tied_replica == mine[i]->tied_replica)
        ++j;
      const int64_t b = i == 0 ? sp.region_offset[size_t(part)] : mine[i]->offset;
      const int64_t e = j < mine.size() ? mine[j]->offset : region_end;
      out.push_back({b, e, group_of(*mine[i]), part, mine[i]->tied_replica});
      i = j;
    }
  }
  return out;
}

std::vector<GradientSync::Range> GradientSync::owned_ranges(int pe) const {
  const StageParams sp = setup_.params_of(setup_.stage_of(pe));
  const int64_t n = sp.arena_size;
  std::vector<Range> keep{{0, n}};
  if (setup_.zero > 0 && grads_) {
    keep.clear();
    const std::vector<Bucket> buckets = pe == me_ ? buckets_ : buckets_of(pe);
    for (const Bucket& b : buckets) {
      if (b.part < 0) continue;
      const auto s = shard_of(pe, b);
      if (s.first < s.second) keep.push_back(s);
    }
    std::sort(keep.begin(), keep.end());
  }
  std::vector<Range> out;
  for (const auto& [b, e] : keep) {  // without the head's replica of a tied table
    int64_t at = b;
    for (const ParamSpan& p : sp.params) {
      if (!p.tied_replica || p.offset + p.numel <= at || p.offset >= e) continue;
      if (at < p.offset) out.push_back({at, p.offset});
      at = p.offset + p.numel;
    }
    if (at < e) out.push_back({at, e});
  }
  CM_CHECK(!out.empty(), "use fewer data-parallel ranks or zero 0: this stage is too small to shard",
           "PE {} keeps no optimizer state", pe);
  if (out.size() == 1 && out[0] == Range{0, n}) out.clear();  // the whole arena
  return out;
}

std::vector<GradientSync::StatePiece> GradientSync::locate_state(int holder, ReduceGroup group, int tp_sharing,
                                                                 int64_t b, int64_t e) const {
  std::vector<int> owners{holder};
  if (setup_.zero > 0 && grads_) owners = group_members(holder, group_index(group, tp_sharing));
  std::vector<StatePiece> out;
  for (int pe : owners) {
    std::vector<Range> owned = owned_ranges(pe);
    if (owned.empty()) owned.push_back({0, setup_.params_of(setup_.stage_of(pe)).arena_size});
    int64_t offset = 0;
    for (const auto& [ob, oe] : owned) {
      const int64_t lo = std::max(b, ob), hi = std::min(e, oe);
      if (lo < hi) out.push_back({pe, offset + (lo - ob), hi - lo, lo - b});
      offset += oe - ob;
    }
  }
  return out;
}

// ---- the step

void GradientSync::begin_step() {
  part_backwards_.assign(size_t(parts_), 0);
  std::fill(summed_.begin(), summed_.end(), false);
  parts_summed_early_ = 0;
}

void GradientSync::on_part_ready(int part) {
  if (!grads_ || !setup_.overlap) return;
  if (++part_backwards_[size_t(part)] != setup_.backwards_per_part) return;
  ++parts_summed_early_;
  runtime::Event ready;
  ready.record();  // on the compute stream: the part's gradients of the step are complete
  ready.wait(comm_);
  for (int i = 0; i < int(buckets_.size()); ++i)
    if (buckets_[size_t(i)].part == part) sum_bucket(i, comm_);
}

void GradientSync::sum_bucket(int i, runtime::Stream& stream) {
  summed_[size_t(i)] = true;
  const Bucket& b = buckets_[size_t(i)];
  if (b.begin == b.end || grads_->group(i).size() == 1) return;
  grads_->reduce_scatter(i, stream);
  if (setup_.zero == 0) grads_->all_gather(i, model_.grad_arena(), stream);
}

void GradientSync::finish() {
  if (!grads_) return;
  runtime::Stream stream = runtime::current_stream();
  for (int i = 0; i < int(buckets_.size()); ++i)  // without overlap all; else parts no backward wrote
    if (!summed_[size_t(i)] && buckets_[size_t(i)].part >= 0) sum_bucket(i, stream);
  if (!setup_.overlap) return;
  runtime::Event done;
  done.record(comm_);
  done.wait();  // the compute stream goes on with the sums
}

void GradientSync::gather_parameters() {
  if (setup_.zero == 0 || !grads_) return;
  runtime::Stream stream = runtime::current_stream();
  for (int i = 0; i < int(buckets_.size()); ++i) {
    const Bucket& b = buckets_[size_t(i)];
    if (b.begin < b.end && !b.replica && grads_->group(i).size() > 1)
      grads_->all_gather(i, model_.param_arena(), stream);
  }
}

void GradientSync::sum_expert_load() {
  if (!loads_ || model_.expert_load().empty()) return;
  runtime::Stream stream = runtime::current_stream();
  loads_->sum_packed(model_.expert_load(), stream);
}

// ---- the norm

void GradientSync::plan_norm() {
  norm_ = std::make_unique<NormPlan>();
  NormPlan& q = *norm_;
  const int world = mesh_.world();
  if (!exact_norm_) {  // each PE's partials of what it alone counts, by chunk of the largest arena
    int64_t chunks = (model_.grad_arena().numel() + K - 1) / K;
    if (world > 1) chunks = max_over_world({chunks})[0];
    q.chunks = chunks;
  } else {
    const StageParams whole = setup_.params_of(StageLayout{});
    q.params = whole.params;
    q.n = whole.arena_size;
    q.chunks = (q.n + K - 1) / K;
    for (int pe = 0; pe < world; ++pe) {
      const StageLayout stage = setup_.stage_of(pe);
      const StageParams sp = setup_.params_of(stage);
      const std::vector<PartRange> counted = setup_.counted_chunks(pe);
      for (const Bucket& b : buckets_of(pe)) {
        const auto [sb, se] = shard_of(pe, b);
        for (const ParamSpan& p : sp.params) {
          if (!p.counted || !holds_part({counted}, p.part)) continue;
          const int64_t lo = std::max(sb, p.offset), hi = std::min(se, p.offset + p.numel);
          if (lo >= hi) continue;
          const int64_t shift = whole.region_offset[size_t(p.part)] - sp.region_offset[size_t(p.part)];
          q.runs.push_back({pe, lo + shift, hi + shift, lo});  // a piece of pe's shard
        }
      }
    }
    // runs: a PE's pieces that follow each other in the whole arena (no other
    // PE's piece between them) and in its own, merged
    std::sort(q.runs.begin(), q.runs.end(), [](const auto& a, const auto& b) { return a.begin < b.begin; });
    std::vector<NormPlan::Run> runs;
    for (const NormPlan::Run& r : q.runs) {
      if (!runs.empty() && runs.back().pe == r.pe && runs.back().begin - runs.back().at == r.begin - r.at)
        runs.back().end = r.end;
      else
        runs.push_back(r);
    }
    q.runs = std::move(runs);
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
    q.edges = shared_zeros(world, {std::max<int64_t>(1, int64_t(q.expected.size()) * K)});
    q.signals = shared_zeros(world, {std::max<int64_t>(1, int64_t(q.expected.size()))}, DType::i64);
  }
  q.partials = shared_zeros(world, {std::max<int64_t>(1, q.chunks)});
  if (world > 1)
    q.sum = std::make_unique<ShardedSum>(q.partials, std::vector<Group>{world_group(world, me_)},
                                         std::vector<ShardedSum::Range>{{0, q.partials.numel(), 0}}, 1);
}

Tensor GradientSync::grad_sq_sum() {
  NormPlan& q = *norm_;
  const Tensor grad = model_.grad_arena(), P = q.partials;
  zero_on_stream(P);
  runtime::Stream stream = runtime::current_stream();
  if (!exact_norm_) {
    std::vector<ops::ParamSegment> mine;  // the counted pieces of this PE's shards
    const std::vector<PartRange> counted = setup_.counted_chunks(me_);
    const StageParams sp = setup_.params_of(setup_.stage_of(me_));
    for (int i = 0; i < int(buckets_.size()); ++i) {
      const Bucket& b = buckets_[size_t(i)];
      if (b.part < 0) continue;
      const auto [sb, se] = shard_of(me_, b);
      for (const ParamSpan& p : sp.params) {
        const int64_t lo = std::max(sb, p.offset), hi = std::min(se, p.offset + p.numel);
        if (lo < hi && p.counted && holds_part({counted}, p.part)) mine.push_back({lo, hi - lo, p.weight_decay});
      }
    }
    std::sort(mine.begin(), mine.end(), [](const auto& a, const auto& b) { return a.offset < b.offset; });
    if (!mine.empty()) add_into(P, 0, ops::grad_sq_partials(grad, mine));
  } else {
    auto signal = [&](int slot) { return static_cast<uint64_t*>(q.signals.raw_data()) + slot; };
    for (const NormPlan::Run& r : q.runs) {
      if (r.pe != me_) continue;
      // chunks wholly inside this run, in stretches; pieces of edge chunks to their owner
      int64_t c = r.begin / K;
      while (c * K < r.end) {
        if (q.edge[size_t(c)] < 0) {
          int64_t c1 = c;
          while (c1 * K < r.end && q.edge[size_t(c1)] < 0) ++c1;
          const int64_t b = c * K, e = std::min(q.n, c1 * K);
          add_into(P, c, ops::grad_sq_partials(grad.slice(0, r.at + (b - r.begin), r.at + (e - r.begin)),
                                               segments_in(q.params, b, e)));
          c = c1;
          continue;
        }
        const int slot = q.edge[size_t(c)];
        const int64_t lo = std::max(r.begin, c * K), hi = std::min(r.end, (c + 1) * K);
        const Tensor src = grad.slice(0, r.at + (lo - r.begin), r.at + (hi - r.begin));
        const int64_t at = slot * K + (lo - c * K);
        if (q.owner[size_t(c)] == me_)
          copy_on_stream(src, q.edges.slice(0, at, at + (hi - lo)));
        else
          put_on_stream(stream, q.edges, at, src, signal(slot), q.owner[size_t(c)]);
        ++c;
      }
    }
    for (int64_t c = 0; c < q.chunks; ++c) {
      const int slot = q.edge[size_t(c)];
      if (slot < 0 || q.owner[size_t(c)] != me_) continue;
      if (q.expected[size_t(slot)] > 0)
        wait_signal_on_stream(stream, signal(slot), uint64_t(q.expected[size_t(slot)]),
                              fmt::format("waits for the gradients of norm chunk {} from the PEs around", c));
      const int64_t b = c * K, e = std::min(q.n, b + K);
      add_into(P, c, ops::grad_sq_partials(q.edges.slice(0, slot * K, slot * K + (e - b)), segments_in(q.params, b, e)));
    }
  }
  if (q.sum) {
    q.sum->reduce_scatter(0, stream);
    q.sum->all_gather(0, P, stream);
  }
  return ops::sum_partials(P);
}

}  // namespace coremesh::parallel
