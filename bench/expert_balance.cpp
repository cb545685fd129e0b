// bench_expert_balance: how evenly the expert work of an expert-parallel
// group spreads under each balancing plan (issue 27, RFC §2.2), on the
// expert loads a real training run logged, against DeepSeek's EPLB.
//   bench_expert_balance METRICS.jsonl EP ROWS [WEIGHT_ROWS] [MAX_SHADOWS] [WINDOW]
// METRICS: a `coremesh train` metrics log (each line's expert_load: per MoE
// layer, each expert's share of the step's rows); ROWS: the rows one step
// routes per layer (tokens x top_k). Each step's rows are split over EP
// sources by sampling each source's ROWS / EP rows from the step's shares
// (the log holds the sum over sources only; seeded, so reruns agree).
// Per (step, layer), the busiest PE's rows over the mean, for
//   none           every expert on its owner (expert e on PE e / (E / EP))
//   shadow         plan_shadows from the previous step's counts, applied to
//                  this step's (how --expert-balance shadow will plan)
//   shadow-now     plan_shadows from this step's own counts (the bound)
//   static         plan_shadows from the summed counts of the last WINDOW
//                  steps, re-planned every WINDOW steps
//   eplb-r         EPLB (replicate the expert with the highest load per
//                  replica into each of r x EP redundant slots, then pack
//                  the replicas onto the PEs, heaviest first, each onto the
//                  lightest PE with a free slot; a replica takes load /
//                  replicas) from the last WINDOW steps' loads, r = 1, 2
// A PE that takes a shadow pays WEIGHT_ROWS (default 16) rows for the
// weights and the gradient; EPLB's placement moves are not charged.
// Prints per policy the median and the worst ratio over the (step, layer)
// pairs after the first WINDOW steps, and the planner's median time.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "coremesh/parallel/expert_balance.hpp"

namespace {

using coremesh::parallel::owner_work;
using coremesh::parallel::plan_shadows;
using coremesh::parallel::shadow_work;
using Counts = std::vector<std::vector<int64_t>>;

double max_over_mean(const std::vector<double>& work) {
  const double mean = std::accumulate(work.begin(), work.end(), 0.0) / double(work.size());
  return *std::max_element(work.begin(), work.end()) / mean;
}

Counts split(const std::vector<double>& shares, int ep, int64_t rows, std::mt19937& rng) {
  Counts c(static_cast<size_t>(ep), std::vector<int64_t>(shares.size(), 0));
  std::discrete_distribution<int> pick(shares.begin(), shares.end());
  for (auto& row : c)
    for (int64_t r = 0; r < rows / ep; ++r) ++row[size_t(pick(rng))];
  return c;
}

std::vector<double> expert_loads(const Counts& c) {
  std::vector<double> load(c.front().size(), 0.0);
  for (const auto& row : c)
    for (size_t e = 0; e < row.size(); ++e) load[e] += double(row[e]);
  return load;
}

// EPLB's global policy: which expert each of the E + extra slots holds and
// which PE each slot is on (slots per PE equal).
struct Placement {
  std::vector<int> expert, pe;
};

Placement eplb(const std::vector<double>& load, int ep, int extra) {
  const int E = int(load.size()), slots = E + extra;
  std::vector<int> replicas(size_t(E), 1);
  Placement p;
  for (int e = 0; e < E; ++e) p.expert.push_back(e);
  for (int i = 0; i < extra; ++i) {
    int hot = 0;
    for (int e = 1; e < E; ++e)
      if (load[size_t(e)] / replicas[size_t(e)] > load[size_t(hot)] / replicas[size_t(hot)]) hot = e;
    ++replicas[size_t(hot)];
    p.expert.push_back(hot);
  }
  std::vector<int> order(static_cast<size_t>(slots));
  std::iota(order.begin(), order.end(), 0);
  auto slot_load = [&](int s) { return load[size_t(p.expert[size_t(s)])] / replicas[size_t(p.expert[size_t(s)])]; };
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return slot_load(a) > slot_load(b); });
  std::vector<double> pe_load(size_t(ep), 0.0);
  std::vector<int> used(size_t(ep), 0);
  p.pe.assign(size_t(slots), -1);
  for (int s : order) {
    int best = -1;
    for (int q = 0; q < ep; ++q)
      if (used[size_t(q)] < slots / ep && (best < 0 || pe_load[size_t(q)] < pe_load[size_t(best)])) best = q;
    p.pe[size_t(s)] = best, pe_load[size_t(best)] += slot_load(s), ++used[size_t(best)];
  }
  return p;
}

std::vector<double> eplb_work(const Placement& p, const std::vector<double>& load, int ep) {
  std::vector<int> replicas(load.size(), 0);
  for (int e : p.expert) ++replicas[size_t(e)];
  std::vector<double> work(size_t(ep), 0.0);
  for (size_t s = 0; s < p.expert.size(); ++s)
    work[size_t(p.pe[s])] += load[size_t(p.expert[s])] / replicas[size_t(p.expert[s])];
  return work;
}

struct Series {
  std::string name;
  std::vector<double> ratios;
  void print() {
    std::sort(ratios.begin(), ratios.end());
    std::printf("%-11s median %.3f  worst %.3f  (%zu step-layers)\n", name.c_str(), ratios[ratios.size() / 2],
                ratios.back(), ratios.size());
  }
};

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: %s METRICS.jsonl EP ROWS [WEIGHT_ROWS] [MAX_SHADOWS] [WINDOW]\n", argv[0]);
    return 2;
  }
  const int ep = std::stoi(argv[2]);
  const int64_t rows = std::stoll(argv[3]);
  const double weight_rows = argc > 4 ? std::stod(argv[4]) : 16.0;
  const int window = argc > 6 ? std::stoi(argv[6]) : 10;
  std::ifstream in(argv[1]);
  if (!in) {
    std::fprintf(stderr, "cannot open %s\n", argv[1]);
    return 2;
  }
  std::vector<std::vector<std::vector<double>>> steps;  // [step][layer][expert] shares
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line);
    if (j.contains("expert_load") && !j.contains("val_loss")) steps.push_back(j["expert_load"]);
  }
  if (steps.size() <= size_t(window) + 1) {
    std::fprintf(stderr, "%s holds %zu steps with expert loads; need more than %d\n", argv[1], steps.size(), window + 1);
    return 2;
  }
  const size_t layers = steps[0].size(), E = steps[0][0].size();
  const int max_shadows = argc > 5 ? std::stoi(argv[5]) : int(E) / 2;
  if (E % size_t(ep) != 0) {
    std::fprintf(stderr, "%zu experts do not split over ep %d\n", E, ep);
    return 2;
  }
  std::mt19937 rng(1);
  std::vector<std::vector<Counts>> counts(steps.size());  // [step][layer]
  for (size_t t = 0; t < steps.size(); ++t)
    for (size_t l = 0; l < layers; ++l) counts[t].push_back(split(steps[t][l], ep, rows, rng));

  Series none{"none", {}}, shadow{"shadow", {}}, now{"shadow-now", {}}, fixed{"static", {}}, eplb1{"eplb-1", {}},
      eplb2{"eplb-2", {}};
  std::vector<double> plan_us;
  for (size_t l = 0; l < layers; ++l) {
    std::vector<int> fixed_plan;
    Placement p1, p2;
    for (size_t t = size_t(window); t < steps.size(); ++t) {
      const Counts& c = counts[t][l];
      if ((t - size_t(window)) % size_t(window) == 0) {  // re-plan the periodic ones from the window
        Counts sum(size_t(ep), std::vector<int64_t>(E, 0));
        for (size_t u = t - size_t(window); u < t; ++u)
          for (int s = 0; s < ep; ++s)
            for (size_t e = 0; e < E; ++e) sum[size_t(s)][e] += counts[u][l][size_t(s)][e];
        fixed_plan = plan_shadows(sum, max_shadows, weight_rows * window).shadowed;
        p1 = eplb(expert_loads(sum), ep, ep), p2 = eplb(expert_loads(sum), ep, 2 * ep);
      }
      none.ratios.push_back(max_over_mean(owner_work(c)));
      const auto start = std::chrono::steady_clock::now();
      const auto last = plan_shadows(counts[t - 1][l], max_shadows, weight_rows);
      plan_us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count());
      shadow.ratios.push_back(max_over_mean(shadow_work(c, last.shadowed, weight_rows)));
      now.ratios.push_back(max_over_mean(plan_shadows(c, max_shadows, weight_rows).work));
      fixed.ratios.push_back(max_over_mean(shadow_work(c, fixed_plan, weight_rows)));
      eplb1.ratios.push_back(max_over_mean(eplb_work(p1, expert_loads(c), ep)));
      eplb2.ratios.push_back(max_over_mean(eplb_work(p2, expert_loads(c), ep)));
    }
  }
  std::printf("ep %d, %zu experts, %zu MoE layers, %zu steps, %lld rows per step, weight %.0f rows, <= %d shadows, "
              "window %d\n",
              ep, E, layers, steps.size(), static_cast<long long>(rows), weight_rows, max_shadows, window);
  for (Series* s : {&none, &shadow, &now, &fixed, &eplb1, &eplb2}) s->print();
  std::sort(plan_us.begin(), plan_us.end());
  std::printf("planner    median %.1f us per layer and step\n", plan_us[plan_us.size() / 2]);
  return 0;
}
