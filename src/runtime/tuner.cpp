#include "coremesh/runtime/tuner.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <map>
#include <numeric>
#include <random>

#include "coremesh/core/error.hpp"
#include "coremesh/core/log.hpp"
#include "coremesh/runtime/op_registry.hpp"
#include "coremesh/runtime/profiler.hpp"

namespace coremesh::runtime {
namespace {

// Whether every run of `a` was shorter than every run of `b`: with n runs
// each and no real difference, 1 chance in C(2n, n) (n = 3: 1 in 20).
bool shorter_every_run(const std::vector<double>& a, const std::vector<double>& b) {
  return !a.empty() && !b.empty() && *std::max_element(a.begin(), a.end()) < *std::min_element(b.begin(), b.end());
}

double median(std::vector<double> v) {
  if (v.empty()) return INFINITY;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// One key's search: its candidates, their timings, and the queue of
// candidates the next runs time.
struct KeySearch {
  OpCache::Entry entry;
  std::string text;
  std::vector<Tiling> candidates;
  std::vector<std::vector<double>> timings;  // per candidate
  std::vector<bool> rejected;
  std::vector<int> survivors, queue;
  int budget = 0, evaluations = 0;
  bool exhaustive = false;
  bool agreed = false;  // searched over whole runs (search_agreed), not here
  int decided = -1;     // agreed: the candidate the whole runs chose
  int trying = 0;  // the candidate forced in the current run

  bool done() const { return queue.empty() && (exhaustive || survivors.size() <= 1 || evaluations >= budget); }
  double fitness(int c) const { return rejected[size_t(c)] ? INFINITY : median(timings[size_t(c)]); }
  int best() const {
    int b = 0;
    for (int c = 1; c < int(candidates.size()); ++c)
      if (fitness(c) < fitness(b)) b = c;
    return b;
  }
  // Successive halving: when a round is timed, the faster half is timed again.
  void next_round() {
    if (!queue.empty() || exhaustive) return;
    std::erase_if(survivors, [&](int c) { return rejected[size_t(c)]; });
    if (survivors.size() <= 1 || evaluations >= budget) return;
    std::stable_sort(survivors.begin(), survivors.end(), [&](int a, int b) { return fitness(a) < fitness(b); });
    survivors.resize((survivors.size() + 1) / 2);
    const int left = budget - evaluations;
    queue.assign(survivors.begin(), survivors.begin() + std::min<int>(int(survivors.size()), left));
    std::reverse(queue.begin(), queue.end());  // popped from the back: the best first
  }
};

class Search {
 public:
  Search(const TuneWorkload& w, const TuneOptions& o, bool exhaustive)
      : w_(w), o_(o), exhaustive_(exhaustive), start_(std::chrono::steady_clock::now()) {
    CM_CHECK(o.budget > 0 && o.repeats >= 1 && o.tolerance >= 0 && o.step_rounds >= 0,
             "budget > 0, repeats >= 1, tolerance >= 0, step_rounds >= 0",
             "invalid tuner options: budget {} repeats {} tolerance {} step_rounds {}", o.budget, o.repeats,
             o.tolerance, o.step_rounds);
    CM_CHECK(w.run && w.result, "give the workload both run and result", "the tuning workload is incomplete");
  }

  TuneReport run() {
    was_profiling_ = profiler_enabled();
    try {
      discover();
      while (!all(all_done())) {
        if (!all(elapsed() <= o_.time_limit_s)) {
          report_.time_limited = true;
          CM_LOG_WARN("tuning stopped at its time limit ({:.0f} s): the best tilings timed so far are kept",
                      o_.time_limit_s);
          break;
        }
        step();
      }
      if (!exhaustive_ && o_.step_rounds > 0) {
        search_agreed();
        check_step();
      }
    } catch (...) {
      finish();
      throw;
    }
    finish();
    for (KeySearch& k : keys_) report_.keys.push_back(summary(k));
    report_.seconds = elapsed();
    return report_;
  }

 private:
  double sum(double mine) const { return w_.sum_over_pes ? w_.sum_over_pes(mine) : mine; }
  bool all(bool mine) const { return sum(mine ? 0 : 1) == 0; }  // on every PE

  double elapsed() const { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count(); }
  bool all_done() const {
    return std::all_of(keys_.begin(), keys_.end(), [](const KeySearch& k) { return k.done(); });
  }

  // Every key at its heuristic, the agreed keys at their picks (once
  // chosen), then `forced`.
  void force(const std::map<std::string, Tiling>& forced) const {
    OpCache& cache = OpCache::global();
    cache.unforce_all();
    for (const KeySearch& k : keys_) cache.force(k.text, k.entry.heuristic);
    for (const auto& [text, t] : agreed_picks_) cache.force(text, t);
    for (const auto& [text, t] : forced) cache.force(text, t);
  }

  // One run of the workload with `forced` tilings (the rest at their
  // heuristics); true if its result equals the reference. Times every key.
  bool run_with(const std::map<std::string, Tiling>& forced, std::map<uint64_t, std::vector<double>>* times) {
    force(forced);
    profiler_clear();
    profiler_start();
    w_.run();
    profiler_stop();
    ++report_.runs;
    if (times)
      for (const KernelRecord& r : profiler_records()) (*times)[r.cache_id].push_back(1e-9 * double(r.end_ns - r.start_ns));
    return matches(w_.result());
  }

  // Every key at its heuristic, then `forced`; no profiler: wall seconds of one run.
  double timed_run(const std::map<std::string, Tiling>& forced) {
    force(forced);
    const auto t0 = std::chrono::steady_clock::now();
    w_.run();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ++report_.runs;
    return s;
  }

  // The agreed keys (OpTraits::agreed): candidate c of every such key at
  // once, on every PE, timed over whole runs (the mean over the PEs),
  // step_rounds per candidate, the order rotated each round; a candidate
  // whose run changes the result is discarded. Their picks then stay forced
  // on both sides of the step check.
  void search_agreed() {
    std::vector<KeySearch*> agreed;
    int count = 1;  // candidates of the widest agreed key
    for (KeySearch& k : keys_)
      if (k.agreed && k.candidates.size() > 1) agreed.push_back(&k), count = std::max(count, int(k.candidates.size()));
    const double pes = sum(1.0);
    CM_CHECK(sum(count) == pes * count, "tune the same layout on every PE (their collectives must match)",
             "the PEs found different agreed tilings to search (this one {} candidates)", count);
    if (count <= 1) return;
    std::vector<std::vector<double>> seconds(static_cast<size_t>(count));
    std::vector<bool> wrong(size_t(count), false);
    for (int r = 0; r < o_.step_rounds; ++r)
      for (int i = 0; i < count; ++i) {
        const int c = (i + r) % count;
        std::map<std::string, Tiling> forced;
        for (KeySearch* k : agreed)
          if (c < int(k->candidates.size())) forced[k->text] = k->candidates[size_t(c)];
        seconds[size_t(c)].push_back(sum(timed_run(forced)) / pes);
        if (!all(matches(w_.result()))) wrong[size_t(c)] = true;
        if (o_.progress) o_.progress(report_.runs, std::max(planned_, report_.runs));
      }
    for (KeySearch* k : agreed) {
      for (int c = 0; c < int(k->candidates.size()); ++c) {
        k->timings[size_t(c)] = seconds[size_t(c)];
        k->rejected[size_t(c)] = c > 0 && wrong[size_t(c)];
        k->evaluations += int(seconds[size_t(c)].size());
        if (k->rejected[size_t(c)])
          CM_LOG_INFO("tuner: {} changes the result of {}: discarded",
                      describe_tiling(k->entry.key.op, k->candidates[size_t(c)]), k->text);
      }
      const int b = k->best();
      k->decided = shorter_every_run(k->timings[size_t(b)], k->timings[0]) ? b : 0;
      agreed_picks_[k->text] = k->candidates[size_t(k->decided)];
    }
  }

  // The step decides (tuner.hpp): heuristics and picks over whole runs,
  // interleaved (H P, P H, ...: neither always runs first).
  void check_step() {
    std::map<std::string, Tiling> picks;
    for (const KeySearch& k : keys_) {
      if (k.agreed) continue;  // already decided by whole runs
      const int b = k.best();
      if (std::isfinite(k.fitness(b)) && !(k.candidates[size_t(b)] == k.entry.heuristic))
        picks[k.text] = k.candidates[size_t(b)];
    }
    if (all(picks.empty())) return;
    const double pes = sum(1.0);
    std::vector<double> heuristic_s, picked_s;
    bool exact = true;
    for (int r = 0; r < o_.step_rounds; ++r)
      for (int i = 0; i < 2; ++i) {
        const bool with_picks = (r + i) % 2 == 1;
        const double s = sum(timed_run(with_picks ? picks : std::map<std::string, Tiling>{})) / pes;
        exact = matches(w_.result()) && exact;  // each pick was exact alone; together too?
        (with_picks ? picked_s : heuristic_s).push_back(s);
        if (o_.progress) o_.progress(report_.runs, std::max(planned_, report_.runs));
      }
    report_.step_checked = true;
    report_.step_heuristic_s = median(heuristic_s);
    report_.step_tuned_s = median(picked_s);
    report_.step_kept = all(exact) && shorter_every_run(picked_s, heuristic_s);
    if (!report_.step_kept)
      CM_LOG_INFO("tuner: the step ran {:.2f} ms with the picks and {:.2f} ms with the heuristics (medians; the picks "
                  "stay only if every run with them is shorter){}: every key keeps its heuristic",
                  1e3 * report_.step_tuned_s, 1e3 * report_.step_heuristic_s,
                  all(exact) ? "" : " (and the picks together changed the result)");
  }

  bool matches(const std::vector<float>& got) const {
    if (got.size() != reference_.size()) return false;
    if (log_level() <= LogLevel::debug) {
      size_t differ = 0, first = got.size();
      for (size_t i = 0; i < got.size(); ++i)
        if (std::memcmp(&got[i], &reference_[i], sizeof(float)) != 0) differ++, first = std::min(first, i);
      if (differ) CM_LOG_DEBUG("tuner: {} of {} result values differ, the first at {}: {} vs {}", differ, got.size(), first, got[first], reference_[first]);
    }
    if (o_.tolerance == 0) return std::memcmp(got.data(), reference_.data(), got.size() * sizeof(float)) == 0;
    double scale = 0, diff = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      scale = std::max(scale, double(std::fabs(reference_[i])));
      diff = std::max(diff, double(std::fabs(got[i] - reference_[i])));
      if (std::isnan(got[i]) != std::isnan(reference_[i])) return false;
    }
    return diff <= o_.tolerance * std::max(scale, 1e-30);
  }

  void discover() {
    w_.run();  // makes the entries (and warms the caches)
    std::mt19937_64 rng(o_.seed);
    int planned_agreed = 0;
    for (OpCache::Entry& e : OpCache::global().entries()) {
      if (!o_.ops.empty() && std::find(o_.ops.begin(), o_.ops.end(), e.key.op) == o_.ops.end()) continue;
      KeySearch k;
      k.text = e.key.text();
      k.candidates = candidate_tilings(e.key, e.heuristic, e.max_blocks);
      k.entry = std::move(e);
      const int n = int(k.candidates.size());
      k.timings.resize(size_t(n));
      k.rejected.assign(size_t(n), false);
      k.exhaustive = exhaustive_;
      k.agreed = op_traits(k.entry.key.op).agreed;
      if (k.agreed) {
        planned_agreed = std::max(planned_agreed, exhaustive_ ? 0 : n * o_.step_rounds);
      } else if (exhaustive_) {
        for (int r = 0; r < o_.repeats; ++r)
          for (int c = n - 1; c >= 0; --c) k.queue.push_back(c);
        k.budget = n * o_.repeats;
      } else if (n > 1) {
        // Halving times the first pool about twice over: it gets half the budget.
        k.budget = std::max(2, int(std::ceil(o_.budget * n * o_.repeats)));
        std::vector<int> pool(static_cast<size_t>(n));
        std::iota(pool.begin(), pool.end(), 0);
        std::shuffle(pool.begin() + 1, pool.end(), rng);  // the heuristic (0) always in
        pool.resize(size_t(std::clamp(k.budget / 2, 2, n)));
        k.survivors = pool;
        k.queue.assign(pool.rbegin(), pool.rend());
      }
      keys_.push_back(std::move(k));
    }
    std::map<std::string, Tiling> none;
    std::map<uint64_t, std::vector<double>> times;
    run_with(none, &times);  // every key at its heuristic: the reference
    reference_ = w_.result();
    for (KeySearch& k : keys_) {
      auto it = times.find(k.entry.id);
      if (it != times.end()) heuristic_once_[k.entry.id] = median(it->second);
      planned_ = std::max(planned_, k.budget);
    }
    planned_ += report_.runs + planned_agreed + (exhaustive_ ? 0 : 2 * o_.step_rounds);
  }

  void step() {
    std::map<std::string, Tiling> forced;
    std::vector<KeySearch*> trying;
    for (KeySearch& k : keys_) {
      if (k.queue.empty()) {
        forced[k.text] = k.candidates[size_t(k.best())];  // settled keys run their best
        continue;
      }
      k.trying = k.queue.back();
      forced[k.text] = k.candidates[size_t(k.trying)];
      trying.push_back(&k);
    }
    std::map<uint64_t, std::vector<double>> times;
    if (!all(run_with(forced, &times))) {
      reject_culprits(trying);  // this run's timings are dropped; the innocent are timed again
    } else {
      for (KeySearch* k : trying) {
        k->queue.pop_back();
        ++k->evaluations;
        if (auto it = times.find(k->entry.id); it != times.end())
          k->timings[size_t(k->trying)].push_back(median(it->second));
      }
    }
    for (KeySearch& k : keys_) k.next_round();
    if (o_.progress) o_.progress(report_.runs, std::max(planned_, report_.runs));
  }

  // The keys of `suspects` whose candidates alone change the result. Every
  // PE halves its own list; the decisions are agreed, so all run in lockstep.
  std::vector<KeySearch*> bisect(const std::vector<KeySearch*>& suspects, bool known_bad) {
    if (!known_bad) {
      std::map<std::string, Tiling> forced;
      for (KeySearch* k : suspects) forced[k->text] = k->candidates[size_t(k->trying)];
      if (all(run_with(forced, nullptr))) return {};
    }
    if (all(suspects.size() <= 1)) return suspects;
    const auto mid = suspects.begin() + std::ptrdiff_t(suspects.size() / 2);
    std::vector<KeySearch*> bad = bisect({suspects.begin(), mid}, false), right = bisect({mid, suspects.end()}, false);
    bad.insert(bad.end(), right.begin(), right.end());
    return all(bad.empty()) ? suspects : bad;  // wrong only together: none of them is trusted
  }

  void reject_culprits(const std::vector<KeySearch*>& trying) {
    std::vector<KeySearch*> suspects;
    for (KeySearch* k : trying)
      if (!(k->candidates[size_t(k->trying)] == k->entry.heuristic)) suspects.push_back(k);
    CM_CHECK(!all(suspects.empty()), "make the workload deterministic (its result must repeat run after run)",
             "the tuning workload's result changed with every key at its heuristic tiling");
    for (KeySearch* k : bisect(suspects, true)) {
      CM_LOG_INFO("tuner: {} changes the result of {}: discarded",
                  describe_tiling(k->entry.key.op, k->candidates[size_t(k->trying)]), k->text);
      k->rejected[size_t(k->trying)] = true;
      std::erase(k->queue, k->trying);
    }
  }

  TunedKey summary(const KeySearch& k) const {
    TunedKey t;
    t.entry = k.entry;
    t.candidates = int(k.candidates.size());
    t.evaluations = k.evaluations;
    t.rejected = int(std::count(k.rejected.begin(), k.rejected.end(), true));
    const int b = k.decided >= 0 ? k.decided : k.best();
    t.best = k.candidates[size_t(b)];
    t.heuristic_s = k.timings.empty() || k.timings[0].empty() ? heuristic_once(k) : median(k.timings[0]);
    t.best_s = std::isfinite(k.fitness(b)) ? k.fitness(b) : t.heuristic_s;
    t.agreed = k.agreed;
    if (!std::isfinite(k.fitness(b)) || (!k.agreed && !report_.step_kept))
      t.best = k.entry.heuristic, t.best_s = t.heuristic_s;
    return t;
  }
  double heuristic_once(const KeySearch& k) const {
    auto it = heuristic_once_.find(k.entry.id);
    return it == heuristic_once_.end() ? 0 : it->second;
  }

  void finish() {
    OpCache::global().unforce_all();
    if (was_profiling_) profiler_start();
  }

  const TuneWorkload& w_;
  const TuneOptions& o_;
  bool exhaustive_;
  std::chrono::steady_clock::time_point start_;
  std::vector<KeySearch> keys_;
  std::vector<float> reference_;
  std::map<uint64_t, double> heuristic_once_;
  std::map<std::string, Tiling> agreed_picks_;
  TuneReport report_;
  int planned_ = 0;
  bool was_profiling_ = false;
};

}  // namespace

TuningCacheFile TuneReport::cache() const {
  TuningCacheFile f{coremesh_version(), machine_fingerprint(), {}};
  for (const TunedKey& k : keys)
    f.entries.push_back({k.entry.key.text(), k.entry.key.op, k.best, k.entry.heuristic, k.best_s, k.heuristic_s,
                         k.candidates, k.evaluations, k.rejected});
  return f;
}

TuneReport tune(const TuneWorkload& workload, const TuneOptions& options) {
  return Search(workload, options, false).run();
}

TuneReport tune_exhaustive(const TuneWorkload& workload, const TuneOptions& options) {
  return Search(workload, options, true).run();
}

}  // namespace coremesh::runtime
