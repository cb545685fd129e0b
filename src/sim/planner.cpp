#include "coremesh/sim/planner.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <climits>

#include "coremesh/core/error.hpp"
#include "coremesh/model/layout.hpp"
#include "coremesh/parallel/plan.hpp"

namespace coremesh::sim {

namespace {

std::vector<int> divisors(int n) {
  std::vector<int> out;
  for (int d = 1; d <= n; ++d)
    if (n % d == 0) out.push_back(d);
  return out;
}

// The layouts of one set of degrees: schedules under pp, SP under tp, the CP
// exchange under cp, ZeRO-1 where gradients are summed over replicas.
std::vector<parallel::ParallelConfig> variants(parallel::ParallelConfig base) {
  std::vector<parallel::ParallelConfig> out{base};
  auto expand = [&](auto&& each) {
    std::vector<parallel::ParallelConfig> next;
    for (const auto& p : out) each(p, next);
    out = std::move(next);
  };
  if (base.pp > 1)
    expand([](const parallel::ParallelConfig& p, auto& next) {
      for (const auto& [s, name] : parallel::pipeline_schedules()) {
        parallel::ParallelConfig q = p;
        q.schedule = s;
        q.virtual_stages = s == parallel::PipelineSchedule::interleaved ? 2 : 1;
        next.push_back(q);
      }
    });
  if (base.tp > 1)
    expand([](const parallel::ParallelConfig& p, auto& next) {
      for (bool sp : {false, true}) {
        parallel::ParallelConfig q = p;
        q.sequence_parallel = sp;
        next.push_back(q);
      }
    });
  if (base.cp > 1)
    expand([](const parallel::ParallelConfig& p, auto& next) {
      for (const auto& [comm, name] : parallel::cp_comms()) {
        parallel::ParallelConfig q = p;
        q.cp_comm = comm;
        next.push_back(q);
      }
    });
  if (base.dp * base.cp * base.ep > 1)
    expand([](const parallel::ParallelConfig& p, auto& next) {
      for (int zero : {0, 1}) {
        parallel::ParallelConfig q = p;
        q.zero = zero;
        next.push_back(q);
      }
    });
  return out;
}

std::string why(const SimResult& r, bool fits, double limit) {
  if (!fits) return fmt::format("needs {:.3g} GB per device, over the {:.3g} GB limit", r.peak_bytes / 1e9, limit / 1e9);
  std::vector<std::string> notes;
  if (r.bubble_fraction > 0.02) notes.push_back(fmt::format("bubble {:.0f}%", 100 * r.bubble_fraction));
  if (r.exposed_comm_seconds > 0.02 * r.step_seconds)
    notes.push_back(fmt::format("exposed exchange {:.0f}%", 100 * r.exposed_comm_seconds / r.step_seconds));
  notes.push_back(fmt::format("{:.3g} GB per device", r.peak_bytes / 1e9));
  std::string out;
  for (const auto& n : notes) out += (out.empty() ? "" : ", ") + n;
  return out;
}

}  // namespace

std::vector<train::TrainConfig> valid_layouts(const PlanRequest& request) {
  const train::TrainConfig& base = request.config;
  const int64_t global = request.global_batch > 0 ? request.global_batch : int64_t(base.batch_size) * base.grad_accum;
  std::vector<train::TrainConfig> out;
  const int n = request.pes;
  for (int dp : divisors(n))
    for (int cp : divisors(n / dp))
      for (int pp : divisors(n / dp / cp))
        for (int ep : divisors(n / dp / cp / pp)) {
          parallel::ParallelConfig degrees = base.parallel;  // keeps its other choices (replicas, balance)
          degrees.dp = dp, degrees.cp = cp, degrees.pp = pp, degrees.ep = ep, degrees.tp = n / dp / cp / pp / ep;
          // the global batch over the ranks that read different micro-batches
          const int64_t per_step = int64_t(dp) * ep * base.batch_size;  // 64 bits: a huge batch wrapped to 0
          if (global % per_step != 0 || global / per_step > INT_MAX) continue;
          for (const parallel::ParallelConfig& p : variants(degrees)) {
            train::TrainConfig c = base;
            c.parallel = p;
            c.grad_accum = int(global / per_step);
            if (!parallel::layout_problems(train::plan_config(c), n).empty()) continue;
            if (!model::tp_problems(c.model, p.tp).empty()) continue;
            try {
              parallel::plan_schedule(p, c.grad_accum);
            } catch (const InvalidArgument&) {
              continue;  // a schedule that cannot run these micro-batches
            }
            out.push_back(std::move(c));
          }
        }
  return out;
}

std::vector<PlannedLayout> plan_layouts(const PlanRequest& request, const Cluster& cluster) {
  const double limit = request.memory_limit > 0 ? request.memory_limit : cluster.device.memory_bytes;
  std::vector<PlannedLayout> out;
  for (train::TrainConfig& c : valid_layouts(request)) {
    PlannedLayout l;
    l.result = simulate_step({c, request.routing_skew}, cluster);
    l.config = std::move(c);
    l.fits = limit <= 0 || double(l.result.peak_bytes) <= limit;
    l.why = why(l.result, l.fits, limit);
    out.push_back(std::move(l));
  }
  std::stable_sort(out.begin(), out.end(), [](const PlannedLayout& a, const PlannedLayout& b) {
    if (a.fits != b.fits) return a.fits;
    return a.result.step_seconds < b.result.step_seconds;
  });
  return out;
}

}  // namespace coremesh::sim
