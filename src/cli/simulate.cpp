// `coremesh simulate` and `coremesh plan`: one training step of a layout on a
// cluster file, predicted; every layout of a model on a cluster, ranked.
//
//   coremesh calibrate --config run.json --output here.json     # this machine
//   coremesh simulate --config run.json --cluster here.json --ep 2 --trace sim.json
//   coremesh plan --config clusters/models/deepseek-v3.json --cluster clusters/h800-deepseek-v3.json --pes 2048
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>

#include "commands.hpp"
#include "config_flags.hpp"
#include "coremesh/sim/planner.hpp"
#include "coremesh/sim/simulator.hpp"

namespace coremesh::cli {
namespace {

struct SimulateFlags {
  ConfigFlags flags;
  std::string cluster, trace;
  int pes_per_host = 0;
  double skew = 1.0;
  bool json = false;
};

struct PlanFlags {
  ConfigFlags flags;
  std::string cluster;
  int pes = 0, top = 10, global_batch = 0, pes_per_host = 0;
  double memory_gb = 0, skew = 1.0;
};

// The cluster file, with --pes-per-host in place of its host.devices.
sim::Cluster cluster_of(const std::string& path, int pes_per_host) {
  sim::Cluster c = sim::load_cluster(path);
  if (pes_per_host > 0) c.host_devices = pes_per_host;
  return c;
}

void add_pes_per_host(CLI::App& cmd, int& value) {
  cmd.add_option("--pes-per-host", value,
                 "devices per host instead of the file's host.devices (1: every PE on its own host, as "
                 "COREMESH_PES_PER_HOST=1 under mpirun)")
      ->check(CLI::Range(1, 1 << 20));
}

std::string gb(int64_t bytes) { return fmt::format("{:.3g} GB", double(bytes) / 1e9); }

// Seconds to 3 significant digits, trailing zeros kept and no exponent: 0.990, 1.00,
// 17.8, 1234 ({:.4g} printed a step of 0.99996 s as "1"); under a nanosecond
// (the sums' rounding noise) is 0.
std::string seconds3(double s) {
  if (!std::isfinite(s)) return fmt::format("{}", s);
  if (std::abs(s) < 1e-9) return "0";
  int exponent = int(std::floor(std::log10(std::abs(s))));
  if (std::abs(s) >= 0.9995 * std::pow(10.0, exponent + 1)) ++exponent;  // rounds up to 10^(e+1)
  return fmt::format("{:.{}f}", s, std::max(0, 2 - exponent));
}

nlohmann::json result_json(const sim::SimResult& r) {
  nlohmann::json ranks = nlohmann::json::array();
  for (const sim::RankCost& c : r.ranks)
    ranks.push_back({{"compute_seconds", c.compute}, {"exposed_exchange_seconds", c.exposed_exchange},
                     {"gradient_sync_seconds", c.gradient_sync}, {"optimizer_seconds", c.optimizer},
                     {"peak_bytes", c.peak_bytes}});
  return {{"layout", r.layout},           {"pes", r.pes},
          {"step_seconds", r.step_seconds}, {"tokens_per_second", r.tokens_per_second},
          {"mfu", r.mfu},                 {"bubble_fraction", r.bubble_fraction},
          {"exposed_comm_seconds", r.exposed_comm_seconds}, {"peak_bytes", r.peak_bytes},
          {"model_flops", r.model_flops}, {"pipeline_ranks", ranks}};
}

void run_simulate(const SimulateFlags& f) {
  const sim::Cluster cluster = cluster_of(f.cluster, f.pes_per_host);
  const sim::SimResult r = sim::simulate_step({f.flags.read(), f.skew}, cluster);
  if (!f.trace.empty()) {
    std::ofstream out(f.trace);
    CM_CHECK(out.good(), "check that the directory exists and is writable", "cannot write '{}'", f.trace);
    out << sim::simulated_trace(r).dump() << "\n";
  }
  if (f.json) {
    fmt::print("{}\n", result_json(r).dump(2));
    return;
  }
  fmt::print("cluster: {} ({} devices)\nlayout: {}\n", cluster.name, cluster.devices, r.layout);
  fmt::print("step {} s, {:.4g} tokens/s, MFU {:.1f}%, bubble {:.1f}%, exposed exchange {} s ({:.1f}%), "
             "peak memory {} per device\n",
             seconds3(r.step_seconds), r.tokens_per_second, 100 * r.mfu, 100 * r.bubble_fraction,
             seconds3(r.exposed_comm_seconds), 100 * r.exposed_comm_seconds / r.step_seconds, gb(r.peak_bytes));
  fmt::print("pipeline rank  compute s  exposed exchange s  gradient sums s  optimizer s  peak memory\n");
  for (size_t i = 0; i < r.ranks.size(); ++i) {
    const sim::RankCost& c = r.ranks[i];
    fmt::print("{:>13}  {:>9.4g}  {:>18.4g}  {:>15.4g}  {:>11.4g}  {}\n", i, c.compute, c.exposed_exchange,
               c.gradient_sync, c.optimizer, gb(c.peak_bytes));
  }
  if (!f.trace.empty()) fmt::print("trace: {} (open in ui.perfetto.dev beside a measured one)\n", f.trace);
  if (cluster.device.memory_bytes > 0 && double(r.peak_bytes) > cluster.device.memory_bytes)
    fmt::print("does not fit: {} per device at the peak, the device holds {} (more pp, tp or ep, ZeRO-1, smaller "
               "micro-batches; `coremesh plan` ranks the layouts that fit)\n",
               gb(r.peak_bytes), gb(int64_t(cluster.device.memory_bytes)));
}

void run_plan(const PlanFlags& f) {
  const sim::Cluster cluster = cluster_of(f.cluster, f.pes_per_host);
  sim::PlanRequest req;
  req.config = f.flags.read();
  req.pes = f.pes > 0 ? f.pes : cluster.devices;
  CM_CHECK(req.pes <= cluster.devices, "give --pes at most the cluster's devices", "--pes {} on a cluster of {}",
           req.pes, cluster.devices);
  req.global_batch = f.global_batch;
  req.memory_limit = f.memory_gb * 1e9;
  req.routing_skew = f.skew;
  const auto layouts = sim::plan_layouts(req, cluster);
  CM_CHECK(!layouts.empty(),
           "choose --pes and --global-batch so that some dp x ep divides the global batch in micro-batches of "
           "batch_size, and the model splits over the degrees",
           "no layout of {} PEs runs this model", req.pes);
  const int64_t global = req.global_batch > 0 ? req.global_batch : int64_t(req.config.batch_size) * req.config.grad_accum;
  fmt::print("{} layouts of {} PEs on {}, global batch {} sequences of {} tokens; fastest first:\n", layouts.size(),
             req.pes, cluster.name, global, req.config.seq_len);
  fmt::print("{:>4}  {:<64} {:>10} {:>12} {:>6}  {}\n", "rank", "layout", "step s", "tokens/s", "MFU", "why");
  if (!layouts.front().fits)
    fmt::print("no layout fits the memory limit: each needs more than {} per device (see why below); raise "
               "--memory-gb, add PEs or shrink the micro-batches\n",
               gb(int64_t(req.memory_limit > 0 ? req.memory_limit : cluster.device.memory_bytes)));
  for (size_t i = 0; i < layouts.size() && int(i) < f.top; ++i) {
    const auto& l = layouts[i];
    std::string name = l.result.layout;
    const auto& p = l.config.parallel;
    if (p.tp > 1 && p.sequence_parallel) name += ", SP";
    if (p.cp > 1) name += p.cp_comm == parallel::CpComm::ring ? ", ring" : ", Ulysses";
    if (p.zero) name += ", ZeRO-1";
    fmt::print("{:>4}  {:<64} {:>10} {:>12.4g} {:>5.1f}%  {}\n", i + 1, name, seconds3(l.result.step_seconds),
               l.result.tokens_per_second, 100 * l.result.mfu, l.why);
  }
}

}  // namespace

void register_simulate_commands(CLI::App& app) {
  {
    auto f = std::make_shared<SimulateFlags>();
    auto* cmd = app.add_subcommand("simulate", "Predict one training step of a layout on a cluster file");
    cmd->add_option("--cluster", f->cluster, "cluster file (clusters/*.json, or `coremesh calibrate`'s)")->required();
    cmd->add_option("--skew", f->skew, "EP: the busiest rank's routed rows over the mean (1: balanced)")
        ->capture_default_str()
        ->check(finite_in(1.0, 1e6));
    cmd->add_option("--trace", f->trace, "write the simulated timeline here (Chrome/Perfetto JSON)");
    cmd->add_flag("--json", f->json, "print the result as JSON");
    add_pes_per_host(*cmd, f->pes_per_host);
    f->flags.add(*cmd);
    cmd->callback([f] { run_simulate(*f); });
  }
  {
    auto f = std::make_shared<PlanFlags>();
    auto* cmd = app.add_subcommand("plan", "Rank every layout of a model on a cluster file by simulated step time");
    cmd->add_option("--cluster", f->cluster, "cluster file (clusters/*.json, or `coremesh calibrate`'s)")->required();
    cmd->add_option("--pes", f->pes, "devices to use (default: the cluster's)")->check(CLI::Range(1, 1 << 24));
    cmd->add_option("--global-batch", f->global_batch,
                    "sequences per step, kept by every layout (default: batch_size x grad_accum)")
        ->check(CLI::Range(1, 1 << 30));
    cmd->add_option("--memory-gb", f->memory_gb, "memory per device in GB (default: the cluster's device memory)")
        ->check(finite_in(0.0, 1e9));
    cmd->add_option("--skew", f->skew, "EP: the busiest rank's routed rows over the mean (1: balanced)")
        ->capture_default_str()
        ->check(finite_in(1.0, 1e6));
    add_pes_per_host(*cmd, f->pes_per_host);
    cmd->add_option("--top", f->top, "layouts to print")->capture_default_str()->check(CLI::Range(1, 1 << 20));
    f->flags.add(*cmd);
    cmd->callback([f] { run_plan(*f); });
  }
}

}  // namespace coremesh::cli
