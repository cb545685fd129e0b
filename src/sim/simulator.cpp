#include "coremesh/sim/simulator.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <nlohmann/json.hpp>

#include "coremesh/core/error.hpp"
#include "coremesh/model/layout.hpp"
#include "coremesh/parallel/mesh.hpp"
#include "coremesh/parallel/plan.hpp"
#include "coremesh/sim/workload.hpp"

namespace coremesh::sim {

namespace {

using parallel::Dim;

// Where the PEs of `pe`'s groups sit: how many, and whether they span hosts.
struct Groups {
  const parallel::Mesh& mesh;
  const Cluster& cluster;
  int pe;
  std::vector<int> of(Group g) const {
    switch (g) {
      case Group::tp: return mesh.group(Dim::tp, pe);
      case Group::cp: return mesh.group(Dim::cp, pe);
      case Group::ep: return mesh.group(Dim::ep, pe);
      case Group::pp: return mesh.group(Dim::pp, pe);
      case Group::dense_grad: return mesh.dense_grad_group(pe);
      case Group::expert_grad: return mesh.expert_grad_group(pe);
    }
    return {pe};
  }
  double seconds(const Exchange& x, double sharing) const {
    const std::vector<int> members = of(x.group);
    bool spans = false;
    for (int m : members) spans |= m / cluster.host_devices != members.front() / cluster.host_devices;
    const int pes = x.group == Group::pp ? 2 : int(members.size());  // a pipeline message: one neighbour
    const bool seam = x.group == Group::tp || x.group == Group::ep;  // the seams' own exchanges, where calibrated
    double t = cluster.exchange_seconds(x.collective, pes, x.bytes, spans, seam);
    if (spans && x.across_hosts < 1)  // its share between hosts, the rest forwarded inside them meanwhile
      t = std::max(cluster.exchange_seconds(x.collective, pes, x.bytes * x.across_hosts, true, seam),
                   cluster.exchange_seconds(x.collective, pes, x.bytes, false, seam));
    return sharing * t;
  }
};

// Host sharing of one PE: the PEs on its host and their cores each.
struct Sharing {
  int pes_on_host = 1, threads = 1;
  double wait = 0;  // the partners' pace: compute takes this fraction longer
};

// How many PEs of the job share `pe`'s host.
int pes_on_host(int world, int host_devices, int pe) {
  const int first = pe / host_devices * host_devices;
  return std::min(world, first + host_devices) - first;
}

// A CPU host's PE computes on its share of the cores (the trainer's
// take_core_share), --cores at most.
int pe_threads(const Cluster& cluster, int world, int pe, int cores) {
  const int on_host = pes_on_host(world, cluster.host_devices, pe);
  const int my_cores = cluster.cpu_cores > 0 ? std::max(1, cluster.cpu_cores / on_host) : 1;
  return cores > 0 ? std::min(cores, my_cores) : my_cores;
}

// The peak of a PE: the device's, or, in a calibrated CPU cluster (peak
// measured at c.threads cores), scaled to the PE's cores as its ops are.
double pe_peak(const Cluster& c, const std::string& dtype, int threads) {
  const double peak = c.peak(dtype);
  return c.threads > 0 && c.cpu_cores > 0 ? peak * threads / c.threads : peak;
}

double ops_seconds(const std::vector<Op>& ops, const Cluster& c, Sharing s) {
  double t = 0;
  for (const Op& op : ops) t += c.sharing(s.pes_on_host, s.threads, op.kind) * c.op_seconds(op);
  // measured at c.threads cores per PE: other core counts scale ideally (docs/simulator.md)
  if (c.threads > 0 && c.cpu_cores > 0) t = t * c.threads / s.threads;
  return t * (1 + s.wait);
}

struct ChunkCost {
  parallel::ComputeCost cost;  // F, B, W of one micro-batch
  double compute = 0, exchange = 0;
  double forward_compute = 0, backward_compute = 0;
};

ChunkCost chunk_cost(const WorkloadShape& w, const parallel::PartRange& parts, const Cluster& c, const Groups& g,
                     Sharing share) {
  const double sharing = c.sharing(share.pes_on_host, share.threads, OpKind::elementwise);  // copies
  ChunkCost out;
  out.cost = {0, 0, 0};
  for (int part = parts.begin; part < parts.end; ++part) {
    const PartWork pw = part_work(w, part);
    const double f = ops_seconds(pw.forward, c, share), i = ops_seconds(pw.input_grad, c, share),
                 wg = ops_seconds(pw.weight_grad, c, share);
    double fx = 0, bx = 0, hidden = 0;
    for (const Exchange& x : pw.forward_exchanges) fx += g.seconds(x, sharing);
    for (const Exchange& x : pw.backward_exchanges)
      (x.hidden_by_weight_grad ? hidden : bx) += g.seconds(x, sharing);
    // a shared host's copies take the cores the weight gradients compute on: nothing is hidden there
    const double exposed_hidden = c.cpu_cores > 0 ? hidden : std::max(0.0, hidden - wg);
    out.cost.f += f + fx;
    out.cost.b += i + wg + bx + exposed_hidden;
    out.cost.w += wg;
    out.compute += f + i + wg;
    out.forward_compute += f, out.backward_compute += i + wg;
    out.exchange += fx + bx + exposed_hidden;
  }
  return out;
}

}  // namespace

SimResult simulate_step(const SimInput& in, const Cluster& cluster) {
  const train::TrainConfig& cfg = in.config;
  cfg.model.validate();
  const parallel::ParallelConfig& par = cfg.parallel;
  const int world = par.world();
  CM_CHECK(world <= cluster.devices, "choose degrees whose product fits the cluster, or a larger cluster file",
           "the layout needs {} PEs, the cluster '{}' has {} devices", world, cluster.name, cluster.devices);
  const parallel::PlanConfig plan = train::plan_config(cfg);
  {
    const auto problems = parallel::layout_problems(plan, world);
    std::string all;
    for (const auto& p : problems) all += "\n  " + p;
    CM_CHECK(problems.empty(), "change the layout's degrees as listed", "the layout cannot run:{}", all);
  }
  cfg.validate(/*need_data=*/false);  // batch, seq_len, micro-batches: what the step is made of
  const parallel::Mesh mesh(par, world, parallel::split_sizes(plan.shape));
  const parallel::Schedule schedule = parallel::plan_schedule(par, cfg.grad_accum);
  const WorkloadShape shape{cfg, in.routing_skew};

  SimResult r;
  r.pes = world;
  r.layout = parallel::Mesh(par, world, parallel::split_sizes(plan.shape)).describe();
  if (par.pp > 1) r.layout += fmt::format(", {} with {} micro-batches", schedule.name, cfg.grad_accum);
  parallel::Costs costs;
  costs.per_rank.resize(size_t(par.pp));
  r.ranks.resize(size_t(par.pp));
  std::vector<std::vector<ChunkCost>> rank_chunks(size_t(par.pp));
  double p2p = 0;
  for (int rank = 0; rank < par.pp; ++rank) {
    parallel::Coords at;
    at[Dim::pp] = rank;
    const int pe = mesh.rank(at);
    const model::StageLayout stage = parallel::stage_of_pe(plan, world, pe);
    const int on_host = pes_on_host(world, cluster.host_devices, pe);
    Sharing share{on_host, pe_threads(cluster, world, pe, cfg.cores)};
    if (world > 1)
      share.wait = cluster.cpu_cores > 0 && on_host * share.threads > cluster.cpu_cores ? cluster.crowded_partner_wait
                                                                                         : cluster.partner_wait;
    const double sharing = cluster.sharing(share.pes_on_host, share.threads, OpKind::elementwise);  // copies
    const Groups groups{mesh, cluster, pe};
    std::vector<parallel::PartRange> chunks = stage.chunks;
    if (chunks.empty()) chunks.push_back({0, model::num_parts(cfg.model)});
    // the micro-batches through each chunk: all of them under 1F1B or
    // interleaving, one direction's under DualPipe (each passes one of the two)
    std::vector<int> passes(chunks.size(), 0);
    if (size_t(rank) < schedule.actions.size())
      for (const parallel::Action& a : schedule.actions[size_t(rank)])
        if ((a.kind == parallel::ActionKind::F || a.kind == parallel::ActionKind::FB) && a.chunk >= 0 &&
            size_t(a.chunk) < passes.size())
          ++passes[size_t(a.chunk)];
    const bool counted = std::any_of(passes.begin(), passes.end(), [](int n) { return n > 0; });
    for (size_t k = 0; k < chunks.size(); ++k) {
      const ChunkCost c = chunk_cost(shape, chunks[k], cluster, groups, share);
      rank_chunks[size_t(rank)].push_back(c);
      costs.per_rank[size_t(rank)].push_back(c.cost);
      r.ranks[size_t(rank)].compute += c.compute * (counted ? passes[k] : cfg.grad_accum);
    }
    if (par.pp > 1) {
      const Exchange message{"pp activation", Collective::put, Group::pp,
                             4.0 * double(cfg.batch_size) * (cfg.seq_len / par.cp) * cfg.model.d_model};
      p2p = std::max(p2p, groups.seconds(message, sharing));
    }
    // after the pipeline: the gradient sums of what this PE holds, the optimizer on its share
    const model::ParamCount held = model::count_params(cfg.model, stage);
    const double dense = double(held.total - held.expert), expert = double(held.expert);
    const auto dense_group = mesh.dense_grad_group(pe), expert_group = mesh.expert_grad_group(pe);
    double sync = 0;
    for (const auto& [params, group, g] : {std::tuple{dense, dense_group, Group::dense_grad},
                                          std::tuple{expert, expert_group, Group::expert_grad}}) {
      if (group.size() < 2 || params <= 0) continue;
      const double bytes = 4.0 * params;
      if (par.zero)
        sync += groups.seconds({"zero-1 reduce-scatter", Collective::reduce_scatter, g, bytes}, sharing) +
                groups.seconds({"zero-1 all-gather", Collective::all_gather, g, bytes}, sharing);
      else
        sync += groups.seconds({"gradient all-reduce", Collective::all_reduce, g, bytes}, sharing);
    }
    // the global norm's sum over every PE: one small all-reduce
    sync += groups.seconds({"norm", Collective::all_reduce, Group::dense_grad, 8.0}, sharing);
    const double owned = par.zero ? dense / double(dense_group.size()) + expert / double(expert_group.size())
                                  : dense + expert;
    r.ranks[size_t(rank)].gradient_sync = sync;
    r.ranks[size_t(rank)].optimizer = ops_seconds({optimizer_op(owned)}, cluster, share);
    const model::MemoryEstimate mem = model::estimate_memory(cfg.model, cfg.batch_size, cfg.seq_len / par.cp, stage);
    r.ranks[size_t(rank)].peak_bytes = mem.weights + mem.gradients + int64_t(8 * owned) +
                                       train::rank_step_bytes(cfg, pe);
  }
  costs.p2p = p2p;
  // DualPipe's pairs: one micro-batch's exchanges run while the other computes,
  // on a device with its own copy engines (not on a CPU host's shared cores):
  // each pair of a rank's chunks takes the longer of the two
  if (cluster.cpu_cores <= 0)
    for (const auto& mine : rank_chunks) {
      auto& pairs = costs.fb_pairs.emplace_back();
      for (const ChunkCost& a : mine) {
        auto& row = pairs.emplace_back();
        for (const ChunkCost& b : mine)
          row.push_back(std::max(a.forward_compute + b.backward_compute,
                                 a.cost.f + b.cost.b - a.forward_compute - b.backward_compute));
      }
    }
  r.pipeline = parallel::simulate(schedule, costs);
  r.pipeline_seconds = r.pipeline.step_time;
  r.bubble_fraction = par.pp > 1 ? r.pipeline.total_bubble_fraction : 0.0;
  double tail = 0;
  for (const RankCost& c : r.ranks) {
    tail = std::max(tail, c.gradient_sync + c.optimizer);
    r.peak_bytes = std::max(r.peak_bytes, c.peak_bytes);
  }
  r.step_seconds = r.pipeline_seconds + tail;
  // a rank's exchanges on its critical path: its actions' time beyond their kernels
  // (what DualPipe's pairs hide is not counted), messages waited for, the sums after
  for (size_t rank = 0; rank < r.ranks.size(); ++rank) {
    RankCost& c = r.ranks[rank];
    c.exposed_exchange = std::max(0.0, r.pipeline.busy[rank] - c.compute);
    r.exposed_comm_seconds = std::max(r.exposed_comm_seconds, c.exposed_exchange + c.gradient_sync);
  }
  const double tokens = double(cfg.tokens_per_step()) * mesh.data_ranks();
  r.model_flops = model::flops_per_token(cfg.model, cfg.seq_len) * tokens;
  r.tokens_per_second = tokens / r.step_seconds;
  const std::string dtype = model::precision_name(cfg.model.precision);
  double peak = 0;
  for (int pe = 0; pe < world; ++pe) peak += pe_peak(cluster, dtype, pe_threads(cluster, world, pe, cfg.cores));
  r.mfu = r.model_flops / (r.step_seconds * peak);
  return r;
}

nlohmann::json simulated_trace(const SimResult& r) {
  nlohmann::json events = nlohmann::json::array();
  const double us = 1e6;
  for (size_t rank = 0; rank < r.pipeline.timeline.size(); ++rank) {
    events.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", rank},
                      {"args", {{"name", fmt::format("pipeline rank {} (simulated)", rank)}}}});
    for (const parallel::TimedAction& t : r.pipeline.timeline[rank]) {
      if (t.end <= t.start) continue;
      events.push_back({{"name", parallel::to_string(t.action)}, {"cat", "simulated"}, {"ph", "X"}, {"pid", rank},
                        {"tid", 0}, {"ts", t.start * us}, {"dur", (t.end - t.start) * us}});
    }
    const RankCost& c = r.ranks[rank];
    double at = r.pipeline_seconds;
    for (const auto& [name, seconds] : {std::pair{"gradient sums", c.gradient_sync}, std::pair{"optimizer", c.optimizer}}) {
      if (seconds <= 0) continue;
      events.push_back({{"name", name}, {"cat", "simulated"}, {"ph", "X"}, {"pid", rank}, {"tid", 0},
                        {"ts", at * us}, {"dur", seconds * us}});
      at += seconds;
    }
  }
  return {{"traceEvents", events}, {"displayTimeUnit", "ms"}};
}

}  // namespace coremesh::sim
