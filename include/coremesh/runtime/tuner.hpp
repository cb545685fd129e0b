// The tiling auto-tuner: measures the tilings of every op a workload runs
// instead of trusting the ops' heuristics.
//
// The workload is real work (a training step's forward and backward, one op
// on its shapes): tune() runs it, finds its op keys in OpCache, and asks each
// op for its search space (OpTraits::tilings: block sizes, tile grids). Every
// run then tries one candidate per key at once (OpCache::force) and the
// profiler times each launch, so all keys are searched in parallel, each in
// its real context. The search per key is successive halving on a budget:
// the candidates (all, or a seeded sample when the budget is short) are timed
// once, the faster half timed again, and so on; fitness is the median of a
// candidate's timings. A run whose result differs from the heuristic run's
// (bit for bit, or beyond `tolerance`) is bisected over the keys it tried
// until the candidates that changed it are found; those are discarded.
//
// The search times launches; the step decides (TuneOptions::step_rounds): a
// tiling can shorten its own launches and lengthen the run (on cores that
// are all busy, the cores it frees were busy anyway; a wider grid holds
// cores another stream needed). So whole runs with every key at its
// heuristic and at its pick are timed, interleaved, and the picks stay only
// if every run with them was shorter than every run without (with 3 runs a
// side, pure noise does that 1 time in 20); else every key keeps its
// heuristic. The timings of a machine shared by PEs and streams move by more
// than most picks gain, and the heuristic is the safe side of a doubt.
//
// A key whose op's tiling is a protocol between PEs (OpTraits::agreed: the
// fused TP exchanges' chunk count and comm cores) is not searched launch by
// launch: each of its candidates is timed over step_rounds whole runs, every
// PE trying the same one at once; the exact one with the shortest median
// replaces the heuristic if its every run beat the heuristic's every run
// (with step_rounds 0 the heuristic stays).
//
// Under several PEs each tunes its own keys; the runs, the stop, the
// bisection's decisions and the step's verdict are agreed
// (TuneWorkload::sum_over_pes).
//
// tune_exhaustive() times every candidate `repeats` times: the reference the
// budgeted search is measured against (bench/tuner.cpp).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "coremesh/runtime/op_cache.hpp"
#include "coremesh/runtime/tuning_cache.hpp"

namespace coremesh::runtime {

struct TuneWorkload {
  std::function<void()> run;                   // launches the work and waits for it
  std::function<std::vector<float>()> result;  // what no tiling may change (read after run)
  // A workload run by several PEs in lockstep (its runs are collective): the
  // sum of `mine` over them, so that they agree on every decision that sets
  // how many runs follow. Unset: one process.
  std::function<double(double mine)> sum_over_pes;
};

struct TuneOptions {
  double budget = 0.25;       // timed evaluations per key, as a fraction of the exhaustive search's
  int repeats = 5;            // timings per candidate in the exhaustive search (its median)
  double time_limit_s = 300;  // then the best so far is taken
  double tolerance = 0;       // max |result - reference| / max |reference|; 0: bit-identical
  uint64_t seed = 1;
  int step_rounds = 3;  // whole runs per side of the step check (0: the launches' timings decide)
  std::vector<std::string> ops;                        // tune only these ops (empty: every op)
  std::function<void(int runs, int planned)> progress;  // after each run
};

struct TunedKey {
  OpCache::Entry entry;  // key, kind, max_blocks, heuristic
  Tiling best;
  double best_s = 0, heuristic_s = 0;  // median seconds per launch (agreed: per whole run)
  bool agreed = false;                 // OpTraits::agreed: chosen over whole runs
  int candidates = 0, evaluations = 0, rejected = 0;
};

struct TuneReport {
  std::vector<TunedKey> keys;
  int runs = 0;  // workload runs, the bisections' included
  double seconds = 0;
  bool time_limited = false;
  // The step check (tune() only): median seconds of a whole run with every
  // key at its heuristic and at its pick (the mean over the PEs), and
  // whether the picks stayed (if not, every key's best is its heuristic).
  bool step_checked = false, step_kept = true;
  double step_heuristic_s = 0, step_tuned_s = 0;
  TuningCacheFile cache() const;  // this machine's and this version's
};

TuneReport tune(const TuneWorkload& workload, const TuneOptions& options = {});
TuneReport tune_exhaustive(const TuneWorkload& workload, const TuneOptions& options = {});

}  // namespace coremesh::runtime
