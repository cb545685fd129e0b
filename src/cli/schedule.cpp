// `coremesh schedule`: prints a pipeline schedule, its simulated timeline, the
// bubble and the peak activation slots, without training.
//
//   coremesh schedule --pp 4 --microbatches 8 --schedule zbv
//   coremesh schedule --pp 4 --microbatches 8 --schedule interleaved --virtual-stages 2
//   coremesh schedule --schedule dualpipe --costs 1,2,1,0,2.5     # F,B,W,P2P[,F&B[,SUM]]
//   coremesh schedule --schedule dualpipe --executed             # what training runs
//   coremesh schedule --schedule zbv --text-only > mine.txt      # edit, then:
//   coremesh schedule --load mine.txt
#include <cmath>
#include <fmt/format.h>

#include <algorithm>
#include <memory>
#include <optional>
#include <sstream>
#include <vector>

#include "commands.hpp"
#include "coremesh/core/error.hpp"
#include "coremesh/parallel/schedule.hpp"
#include "coremesh/parallel/schedule_generators.hpp"
#include "coremesh/parallel/schedule_simulator.hpp"

namespace coremesh::cli {
namespace {

using parallel::Costs;
using parallel::Schedule;
using parallel::Simulation;

struct ScheduleFlags {
  int pp = 4, micro_batches = 8, virtual_stages = 2, width = 160;
  std::string schedule, load, costs = "1,2,1,0";
  bool no_p2p = false, text_only = false, executed = false;
};

Costs parse_costs(const std::string& text) {
  const char* hint =
      "give --costs F,B,W,P2P, F,B,W,P2P,F&B or F,B,W,P2P,F&B,SUM: times of one chunk's "
      "forward, full backward, weight-gradient half, message latency, an overlapped pair "
      "(-1: F+B) and a gradient-sum message's copy, e.g. 1,2,1,0";
  std::vector<double> values;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');) {
    const std::optional<double> value = finite_number(item);
    CM_CHECK(value.has_value(), hint, "--costs: '{}' is not a finite number", item);
    values.push_back(*value);
  }
  CM_CHECK(values.size() >= 4 && values.size() <= 6, hint, "--costs: {} values in '{}'",
           values.size(), text);
  Costs costs;
  costs.uniform = {values[0], values[1], values[2]};
  costs.p2p = values[3];
  if (values.size() >= 5) costs.fb = values[4];
  if (values.size() == 6) costs.sum = values[5];
  return costs;
}

// The textbook figure for a generated schedule, with the conditions it assumes.
std::optional<std::string> textbook(const Schedule& s, const Costs& c) {
  const double p = s.ranks, m = s.micro_batches, v = s.chunks;
  const double f = c.uniform.f, b = c.uniform.b, w = c.uniform.w, fb = c.fb >= 0 ? c.fb : f + b;
  if (s.name == "gpipe" || s.name == "1f1b")
    return fmt::format("bubble (p-1)/(m+p-1) = {:.4f} of the step", (p - 1) / (m + p - 1));
  if (s.name == "interleaved")
    return fmt::format("bubble (p-1)/(v*m+p-1) = {:.4f} of the step", (p - 1) / (v * m + p - 1));
  if (s.name == "zb-h1")
    return fmt::format("bubble (p-1)(F+B-2W) = {:g} per rank (when W <= F, W <= B-W and m >= p)",
                       (p - 1) * (f + b - 2 * w));
  if (s.name == "zbv")
    return fmt::format("bubble (p-1)F = {:g} per rank (when F = B-W = W and m >= 2p)", (p - 1) * f);
  if (s.name == "dualpipe")
    return fmt::format(
        "bubble (p/2-1)(F&B+B-3W) = {:g} on the middle ranks (when B-W = F, W <= F and m >= 2p)",
        (p / 2 - 1) * (fb + b - 3 * w));
  if (s.name == "dualpipev")
    return fmt::format("bubble (p-1)(F&B+B-3W) = {:g} on the last ranks (when B-W = F, W <= F and m >= 2p)",
                       (p - 1) * (fb + b - 3 * w));
  return std::nullopt;
}

void print_schedule(const Schedule& s, const Costs& costs, const ScheduleFlags& f, bool formula) {
  const Simulation sim = parallel::simulate(s, costs);  // validates first
  CM_CHECK(std::isfinite(sim.step_time), "give smaller --costs (a time unit in which they are small numbers)",
           "--costs: the schedule's step time overflows ({:g})", sim.step_time);
  fmt::print(
      "schedule {}: placement {}, pp {}, {} chunk(s) per rank, {} micro-batches, {} stages\n",
      s.name, parallel::placement_name(s.placement), s.ranks, s.chunks, s.micro_batches,
      s.num_stages());
  fmt::print("costs per chunk action: F={:g} B={:g} (I={:g} W={:g}) F&B={:g} P2P={:g} SUM={:g}\n\n",
             costs.uniform.f, costs.uniform.b, costs.uniform.b - costs.uniform.w, costs.uniform.w,
             costs.fb >= 0 ? costs.fb : costs.uniform.f + costs.uniform.b, costs.p2p, costs.sum);
  fmt::print("actions (one line per rank; --load reads this text back):\n{}\n",
             parallel::to_text(s, !f.no_p2p));
  fmt::print("timeline (each cell starts with its action, '.' is idle):\n{}\n",
             parallel::draw_timeline(sim, f.width));
  fmt::print("rank  busy      bubble    bubble%  peak slots\n");
  for (int r = 0; r < s.ranks; ++r)
    fmt::print("{:<5} {:<9g} {:<9g} {:>6.2f}%  {}\n", r, sim.busy[r], sim.bubble[r],
               100 * sim.bubble_fraction[r], sim.peak_slots[r]);
  const int peak = *std::max_element(sim.peak_slots.begin(), sim.peak_slots.end());
  fmt::print(
      "step {:g}, bubble {:.2f}% of all ranks' time; peak {} activation slots "
      "(= {:g} 1F1B stages of activations)\n",
      sim.step_time, 100 * sim.total_bubble_fraction, peak,
      double(peak) * s.ranks / s.num_stages());
  if (formula)
    if (const auto text = textbook(s, costs)) fmt::print("textbook (P2P = 0): {}\n", *text);
}

void run_schedule(const ScheduleFlags& f) {
  CM_CHECK(!f.load.empty() || !f.schedule.empty(), "give --schedule NAME, or --load FILE",
           "no schedule to show");
  Schedule s =
      f.load.empty() ? parallel::make_schedule(f.schedule, f.pp, f.micro_batches, f.virtual_stages)
                     : parallel::load_schedule(f.load);
  const Costs costs = parse_costs(f.costs);
  parallel::validate(s);
  const Schedule executed = parallel::executed_form(s);
  if (f.executed) s = executed;
  if (f.text_only) {
    fmt::print("{}", parallel::to_text(s, !f.no_p2p));
    return;
  }
  print_schedule(s, costs, f, f.load.empty());
  if (executed.actions == s.actions) return;
  // The textbook DualPipe trains as its bit-identical form: show that too.
  fmt::print(
      "\ntraining runs it as {} (one PE's gradient sums bit for bit: copy 1's backwards as I, "
      "their W after the partner's copy-0 sums; --executed shows it alone):\n\n",
      executed.name);
  print_schedule(executed, costs, f, false);
}

}  // namespace

void register_schedule_command(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "schedule",
      "Print a pipeline schedule, its simulated timeline, bubble and peak activation slots");
  auto f = std::make_shared<ScheduleFlags>();
  auto* name = cmd->add_option("--schedule", f->schedule,
                               "the schedule to generate (no default: give it or --load)")
                   ->check(CLI::IsMember(parallel::schedule_names()));
  auto* pp = cmd->add_option("--pp", f->pp, "pipeline ranks")->capture_default_str();
  auto* mb = cmd->add_option("--microbatches", f->micro_batches, "micro-batches per step")
                 ->capture_default_str();
  auto* vs = cmd->add_option("--virtual-stages", f->virtual_stages, "chunks per rank (interleaved)")
                 ->capture_default_str();
  cmd->add_option("--costs", f->costs,
                  "F,B,W,P2P[,F&B[,SUM]]: times of one chunk's action (F&B: an overlapped "
                  "pair, default F+B; SUM: a gradient-sum message's copy, default 0)")
      ->capture_default_str();
  cmd->add_option("--load", f->load,
                  "read the schedule from this text file instead of generating it")
      ->excludes(name)
      ->excludes(pp)
      ->excludes(mb)
      ->excludes(vs);
  cmd->add_option("--width", f->width, "columns of the timeline")
      ->capture_default_str()
      ->check(CLI::Range(40, 10000));
  cmd->add_flag("--no-p2p", f->no_p2p, "print the actions without sends and receives");
  cmd->add_flag("--text-only", f->text_only, "print only the text form (to edit and --load)");
  cmd->add_flag("--executed", f->executed,
                "show only the form training runs (DualPipe: with its gradient sums, dualpipe-exact)");
  cmd->callback([f] { run_schedule(*f); });
}

}  // namespace coremesh::cli
