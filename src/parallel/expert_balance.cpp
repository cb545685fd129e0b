#include "coremesh/parallel/expert_balance.hpp"

#include <algorithm>
#include <numeric>

#include "coremesh/core/error.hpp"

namespace coremesh::parallel {
namespace {

struct Score {
  double max = 0, squares = 0;
  bool operator<(const Score& o) const { return max < o.max || (max == o.max && squares < o.squares); }
};

Score score(const std::vector<double>& work) {
  Score s;
  for (double w : work) s.max = std::max(s.max, w), s.squares += w * w;
  return s;
}

// work after shadowing expert e (sign +1) or undoing it (-1): its owner
// keeps only its own rows of e, every other source with rows of e computes
// them and pays for the weights.
void shadow(std::vector<double>& work, const std::vector<std::vector<int64_t>>& counts, int e, int local,
            double weight_rows, double sign = 1.0) {
  const int owner = e / local;
  for (size_t s = 0; s < counts.size(); ++s) {
    const double rows = double(counts[s][size_t(e)]);
    if (int(s) == owner || rows == 0) continue;
    work[size_t(owner)] -= sign * rows;
    work[s] += sign * (rows + weight_rows);
  }
}

int experts_per_pe(const std::vector<std::vector<int64_t>>& counts) {
  CM_CHECK(!counts.empty() && !counts.front().empty(), "pass one row of expert counts per source",
           "no expert counts to plan from");
  const size_t E = counts.front().size(), g = counts.size();
  for (const auto& row : counts)
    CM_CHECK(row.size() == E, "give every source a count for every expert", "a source has {} counts, another {}",
             row.size(), E);
  CM_CHECK(E % g == 0, "choose ep among the divisors of the routed experts", "{} experts over {} PEs", E, g);
  return int(E / g);
}

}  // namespace

const std::vector<std::pair<ExpertBalance, std::string>>& expert_balances() {
  static const std::vector<std::pair<ExpertBalance, std::string>> names{
      {ExpertBalance::none, "none"}, {ExpertBalance::shadow, "shadow"}, {ExpertBalance::static_window, "static"}};
  return names;
}

double ShadowPlan::max_work() const { return work.empty() ? 0.0 : *std::max_element(work.begin(), work.end()); }

double ShadowPlan::mean_work() const {
  return work.empty() ? 0.0 : std::accumulate(work.begin(), work.end(), 0.0) / double(work.size());
}

std::vector<double> owner_work(const std::vector<std::vector<int64_t>>& counts) {
  const int local = experts_per_pe(counts);
  std::vector<double> work(counts.size(), 0.0);
  for (const auto& row : counts)
    for (size_t e = 0; e < row.size(); ++e) work[e / size_t(local)] += double(row[e]);
  return work;
}

namespace {

struct Search {
  const std::vector<std::vector<int64_t>>& counts;
  int local, experts, max_shadows;
  double weight_rows;

  void toggle(ShadowPlan& p, int e, double sign) const { shadow(p.work, counts, e, local, weight_rows, sign); }

  // Adds the shadow that lowers the score most while one does and there is
  // room, then swaps one shadow for another while a swap helps (the greedy
  // order can lock in a shadow that a later one makes the wrong choice).
  void improve(ShadowPlan& p, std::vector<bool>& taken) const {
    while (int(p.shadowed.size()) < max_shadows) {
      Score best = score(p.work);
      int pick = -1;
      for (int e = 0; e < experts; ++e) {
        if (taken[size_t(e)]) continue;
        toggle(p, e, 1.0);
        if (const Score s = score(p.work); s < best) best = s, pick = e;
        toggle(p, e, -1.0);
      }
      if (pick < 0) break;
      toggle(p, pick, 1.0);
      taken[size_t(pick)] = true;
      p.shadowed.push_back(pick);
    }
    for (bool better = true; better;) {
      better = false;
      const Score best = score(p.work);
      for (size_t i = 0; i < p.shadowed.size() && !better; ++i) {
        const int out = p.shadowed[i];
        toggle(p, out, -1.0);
        for (int in = 0; in < experts && !better; ++in) {
          if (taken[size_t(in)]) continue;
          toggle(p, in, 1.0);
          if (score(p.work) < best)
            taken[size_t(out)] = false, taken[size_t(in)] = true, p.shadowed[i] = in, better = true;
          else
            toggle(p, in, -1.0);
        }
        if (!better) toggle(p, out, 1.0);
      }
    }
  }
};

}  // namespace

std::vector<double> shadow_work(const std::vector<std::vector<int64_t>>& counts, const std::vector<int>& shadowed,
                                double weight_rows) {
  const int local = experts_per_pe(counts), E = int(counts.front().size());
  std::vector<double> work = owner_work(counts);
  for (int e : shadowed) {
    CM_CHECK(e >= 0 && e < E, "shadow experts in [0, E)", "expert {} of {}", e, E);
    shadow(work, counts, e, local, weight_rows);
  }
  return work;
}

ShadowPlan plan_shadows(const std::vector<std::vector<int64_t>>& counts, int max_shadows, double weight_rows) {
  const Search search{counts, experts_per_pe(counts), int(counts.front().size()), max_shadows, weight_rows};
  ShadowPlan best;
  best.work = owner_work(counts);
  // From no shadow and from each single one (a first step the greedy would
  // not take can lead further); the best end wins, the first on ties.
  for (int first = -1; first < (max_shadows > 0 ? search.experts : 0); ++first) {
    ShadowPlan p;
    p.work = owner_work(counts);
    std::vector<bool> taken(size_t(search.experts), false);
    if (first >= 0) search.toggle(p, first, 1.0), taken[size_t(first)] = true, p.shadowed.push_back(first);
    search.improve(p, taken);
    if (score(p.work) < score(best.work)) best = std::move(p);
  }
  std::sort(best.shadowed.begin(), best.shadowed.end());
  return best;
}

}  // namespace coremesh::parallel
