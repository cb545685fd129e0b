// Timeline, bubble and activation slots of a schedule (schedule_simulator.hpp).
#include "coremesh/parallel/schedule_simulator.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "coremesh/core/error.hpp"
#include "schedule_run.hpp"

namespace coremesh::parallel {

const ComputeCost& Costs::of(int chunk, int rank) const {
  if (!per_rank.empty() && rank >= 0) return per_rank.at(static_cast<size_t>(rank)).at(static_cast<size_t>(chunk));
  return per_chunk.empty() ? uniform : per_chunk.at(static_cast<size_t>(chunk));
}

double Costs::duration(const Action& a, int rank) const {
  switch (a.kind) {
    case ActionKind::F: return of(a.chunk, rank).f;
    case ActionKind::B: return of(a.chunk, rank).b;
    case ActionKind::I: return of(a.chunk, rank).b - of(a.chunk, rank).w;
    case ActionKind::W: return of(a.chunk, rank).w;
    case ActionKind::FB: {  // a pair with a split backward leaves out the W
      const double w = a.b_kind == ActionKind::I ? of(a.b_chunk, rank).w : 0;
      const double pair = !fb_pairs.empty() && rank >= 0
                              ? fb_pairs.at(size_t(rank)).at(size_t(a.chunk)).at(size_t(a.b_chunk))
                              : fb >= 0 ? fb : of(a.chunk, rank).f + of(a.b_chunk, rank).b;
      return pair - w;
    }
    case ActionKind::SendSum:
    case ActionKind::RecvSum: return sum;
    default: return 0;
  }
}

void Costs::check(int chunks) const {
  CM_CHECK(per_chunk.empty() || static_cast<int>(per_chunk.size()) == chunks,
           "give one cost per chunk, or none to use the uniform costs",
           "{} per-chunk costs for {} chunks", per_chunk.size(), chunks);
  auto one = [](const ComputeCost& c) {
    CM_CHECK(c.f >= 0 && c.b >= 0 && c.w >= 0 && c.w <= c.b,
             "costs are times >= 0, and W is the weight-gradient part of B (W <= B)",
             "bad costs F={} B={} W={}", c.f, c.b, c.w);
  };
  one(uniform);
  for (const auto& c : per_chunk) one(c);
  for (const auto& row : per_rank) {
    CM_CHECK(static_cast<int>(row.size()) == chunks, "give each rank one cost per chunk",
             "{} costs of a rank for {} chunks", row.size(), chunks);
    for (const auto& c : row) one(c);
  }
  CM_CHECK(p2p >= 0 && std::isfinite(p2p) && std::isfinite(fb) && sum >= 0 && std::isfinite(sum),
           "P2P is a latency >= 0, a gradient-sum copy a time >= 0", "bad costs P2P={} F&B={} sum={}",
           p2p, fb, sum);
  // a pair whose backward is split leaves its W out: the pair holds at least that W
  double most_w = uniform.w;
  for (const auto& c : per_chunk) most_w = std::max(most_w, c.w);
  for (const auto& row : per_rank)
    for (const auto& c : row) most_w = std::max(most_w, c.w);
  CM_CHECK(fb < 0 || fb >= most_w, "an overlapped F&B pair takes at least the W of its backward (give F&B >= W)",
           "bad costs F&B={} below W={}", fb, most_w);
  for (size_t r = 0; r < fb_pairs.size(); ++r)
    for (size_t f = 0; f < fb_pairs[r].size(); ++f)
      for (size_t b = 0; b < fb_pairs[r][f].size(); ++b) {
        const double pair = fb_pairs[r][f][b], w = of(int(b), per_rank.empty() ? -1 : int(r)).w;
        CM_CHECK(std::isfinite(pair) && pair >= w, "an overlapped F&B pair takes at least the W of its backward",
                 "bad F&B pair cost {} (rank {}, chunks {} and {}; W {})", pair, r, f, b, w);
      }
}

namespace detail {

Run run_actions(const Schedule& s, const Costs& costs) {
  const int p = s.ranks, v = s.chunks, m = s.micro_batches;
  // arrival[direction][rank][chunk][mb]: when the message for the receiver is there (< 0: not
  // sent).
  // sums[rank][chunk]: the same for the gradient sums for (rank, chunk).
  std::vector<double> arrival(static_cast<size_t>(2 * p * v * m), -1.0), sums(static_cast<size_t>(p * v), -1.0);
  auto slot = [&](bool backward, int rank, int chunk, int mb) -> double& {
    return arrival[static_cast<size_t>(((backward * p + rank) * v + chunk) * m + mb)];
  };
  auto sum_slot = [&](int rank, int chunk) -> double& { return sums[static_cast<size_t>(rank * v + chunk)]; };
  Run run;
  run.timeline.resize(static_cast<size_t>(p));
  run.next.assign(static_cast<size_t>(p), 0);
  std::vector<double> clock(static_cast<size_t>(p), 0.0);
  for (bool moved = true; moved;) {
    moved = false;
    for (int r = 0; r < p; ++r) {
      const auto& list = s.actions[static_cast<size_t>(r)];
      size_t& next = run.next[static_cast<size_t>(r)];
      double& now = clock[static_cast<size_t>(r)];
      while (next < list.size()) {
        const Action& a = list[next];
        double start = now, end = now;
        const double cost = costs.per_action.empty() ? costs.duration(a, r)
                                                     : costs.per_action[static_cast<size_t>(r)][next];
        if (a.kind == ActionKind::RecvF || a.kind == ActionKind::RecvB) {
          const double t = slot(a.kind == ActionKind::RecvB, r, a.chunk, a.micro_batch);
          if (t < 0) break;  // not sent yet
          start = end = std::max(now, t);
        } else if (a.kind == ActionKind::SendF || a.kind == ActionKind::SendB) {
          const StageRef to = s.peer(r, a);
          slot(a.kind == ActionKind::SendB, to.rank, to.chunk, a.micro_batch) = now + costs.p2p;
        } else if (a.kind == ActionKind::RecvSum) {  // the wait, then the copy out of the buffer
          const double t = sum_slot(r, a.chunk);
          if (t < 0) break;
          start = std::max(now, t);
          end = start + cost;
        } else if (a.kind == ActionKind::SendSum) {  // the put, on the rank's stream
          end = start + cost;
          const StageRef to = s.peer(r, a);
          sum_slot(to.rank, to.chunk) = end + costs.p2p;
        } else {
          end = start + cost;
        }
        run.timeline[static_cast<size_t>(r)].push_back({a, start, end});
        now = end;
        ++next;
        moved = true;
      }
    }
  }
  run.complete = true;
  for (int r = 0; r < p; ++r)
    run.complete &= run.next[static_cast<size_t>(r)] == s.actions[static_cast<size_t>(r)].size();
  return run;
}

}  // namespace detail

Simulation simulate(const Schedule& schedule, const Costs& costs) {
  validate(schedule);
  costs.check(schedule.chunks);
  CM_CHECK(costs.per_rank.empty() || static_cast<int>(costs.per_rank.size()) == schedule.ranks,
           "give costs for every rank, or none", "costs of {} ranks for a schedule of {}", costs.per_rank.size(),
           schedule.ranks);
  bool per_action = costs.per_action.empty() || costs.per_action.size() == schedule.actions.size();
  for (size_t r = 0; per_action && r < costs.per_action.size(); ++r)
    per_action = costs.per_action[r].size() == schedule.actions[r].size();
  CM_CHECK(per_action, "give a duration for every action of every rank, or none",
           "per-action costs do not match the schedule's {} ranks' actions", schedule.ranks);
  detail::Run run = detail::run_actions(schedule, costs);
  CM_ASSERT(run.complete);  // validate() proved it deadlock-free
  const size_t p = static_cast<size_t>(schedule.ranks);
  Simulation sim;
  sim.timeline = std::move(run.timeline);
  sim.busy.assign(p, 0.0);
  sim.peak_slots.assign(p, 0);
  for (size_t r = 0; r < p; ++r) {
    int live = 0;
    for (const TimedAction& t : sim.timeline[r]) {
      sim.step_time = std::max(sim.step_time, t.end);
      sim.busy[r] += t.end - t.start;  // compute, gradient-sum copies (a wait has start = end)
      const ActionKind k = t.action.kind;
      if (k == ActionKind::F || k == ActionKind::FB)
        sim.peak_slots[r] = std::max(sim.peak_slots[r], ++live);
      if (k == ActionKind::B || k == ActionKind::W || (k == ActionKind::FB && t.action.b_kind == ActionKind::B))
        --live;
    }
  }
  double total = 0;
  for (size_t r = 0; r < p; ++r) {
    sim.bubble.push_back(sim.step_time - sim.busy[r]);
    sim.bubble_fraction.push_back(sim.step_time > 0 ? sim.bubble[r] / sim.step_time : 0.0);
    total += sim.bubble[r];
  }
  sim.total_bubble_fraction = sim.step_time > 0 ? total / (double(p) * sim.step_time) : 0.0;
  return sim;
}

namespace {

// A chart cell's label: F3 / f3 (chunk 0 / chunk 1) when a rank has at most two
// chunks, else the token ("2F3"); a pair is its halves joined by '&'.
std::string cell_label(const Action& a, bool short_labels) {
  if (!short_labels) return to_string(a);
  auto half = [](ActionKind kind, int chunk, int mb) {
    const char letter = "FBIW"[static_cast<int>(kind)];
    return fmt::format("{}{}", chunk == 0 ? letter : static_cast<char>(letter - 'A' + 'a'), mb);
  };
  if (a.kind == ActionKind::FB)
    return half(ActionKind::F, a.chunk, a.micro_batch) + "&" +
           half(a.b_kind, a.b_chunk, a.b_micro_batch);
  if (is_sum(a.kind)) return a.kind == ActionKind::SendSum ? "S>" : "S<";
  return half(a.kind, a.chunk, a.micro_batch);
}

}  // namespace

std::string draw_timeline(const Simulation& sim, int width) {
  const std::string prefix_format = "rank {:<3}|";
  const int prefix = static_cast<int>(fmt::format(fmt::runtime(prefix_format), 0).size());
  const int room = std::max(20, width - prefix - 1);
  if (sim.step_time <= 0) return {};
  bool short_labels = true;
  for (const auto& rank : sim.timeline)
    for (const TimedAction& t : rank)
      short_labels &=
          t.action.chunk < 2 && (t.action.kind != ActionKind::FB || t.action.b_chunk < 2);
  // Columns per time unit: enough for every label and a blank, within the width.
  double scale = 0;
  for (const auto& rank : sim.timeline)
    for (const TimedAction& t : rank)
      if (is_compute(t.action.kind) && t.end > t.start)
        scale = std::max(scale,
                         double(cell_label(t.action, short_labels).size() + 1) / (t.end - t.start));
  scale = std::min(scale, room / sim.step_time);
  const int columns = std::max(1, static_cast<int>(std::lround(sim.step_time * scale)));
  std::string out;
  for (size_t r = 0; r < sim.timeline.size(); ++r) {
    std::string row(static_cast<size_t>(columns), '.');
    for (const TimedAction& t : sim.timeline[r]) {
      if (!is_compute(t.action.kind) && !(is_sum(t.action.kind) && t.end > t.start)) continue;
      const int c0 = static_cast<int>(std::lround(t.start * scale));
      const int c1 =
          std::min(columns, std::max(c0 + 1, static_cast<int>(std::lround(t.end * scale))));
      const std::string label = cell_label(t.action, short_labels);
      for (int c = c0; c < c1; ++c)
        row[static_cast<size_t>(c)] =
            c - c0 < static_cast<int>(label.size()) ? label[static_cast<size_t>(c - c0)] : ' ';
    }
    out += fmt::format(fmt::runtime(prefix_format), r) + row + "|\n";
  }
  // Time axis: a tick every `step` time units, at least 10 columns apart.
  double step = std::pow(10.0, std::floor(std::log10(sim.step_time)) - 3);
  for (int k = 0; step * scale < 10; ++k) step *= k % 3 == 1 ? 2.5 : 2;  // 1, 2, 5, 10, 20, ...
  std::string axis(static_cast<size_t>(columns + 12), ' ');
  for (double t = 0; t <= sim.step_time * (1 + 1e-9); t += step) {  // relative: costs may be nanoseconds
    const std::string label = fmt::format("{:g}", t);
    const size_t c = static_cast<size_t>(std::lround(t * scale));
    if (c + label.size() <= axis.size()) axis.replace(c, label.size(), label);
  }
  while (!axis.empty() && axis.back() == ' ') axis.pop_back();
  out += std::string(static_cast<size_t>(prefix), ' ') + axis + "\n";
  return out;
}

}  // namespace coremesh::parallel
