#include "coremesh/train/tuning.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <filesystem>
#include <memory>

#include "coremesh/core/error.hpp"
#include "coremesh/runtime/op_registry.hpp"
#include "coremesh/runtime/tuning_cache.hpp"
#include "coremesh/train/trainer.hpp"

namespace coremesh::train {

std::string StepTuning::summary() const {
  return fmt::format("{}tuned {} op keys ({} with a choice) in {} runs, {:.1f} s{}: {} tilings replace the heuristic's, "
                     "{} candidates changed the result and were discarded; the tuned keys' median launch times, "
                     "summed, {:.3f} -> {:.3f} ms ({:.3f}x)",
                     pes > 1 ? fmt::format("PE {}: ", pe) : "", keys, with_choice, report.runs,
                     report.seconds, report.time_limited ? " (stopped at the time limit)" : "", replaced, rejected,
                     1e3 * heuristic_s, 1e3 * tuned_s, tuned_s > 0 ? heuristic_s / tuned_s : 1.0) +
         (!report.step_checked ? std::string()
          : fmt::format("; the whole step {:.1f} ms with the heuristics, {:.1f} ms with the picks: {}",
                        1e3 * report.step_heuristic_s, 1e3 * report.step_tuned_s,
                        report.step_kept ? "the picks stay" : "every key keeps its heuristic")) +
         (agreed.empty() ? std::string() : fmt::format("; agreed by every PE: {}", fmt::join(agreed, ", ")));
}

StepTuning tune_step_tilings(const TrainConfig& config, runtime::Device& device, const runtime::TuneOptions& options,
                             const std::string& cache_path) {
  CM_CHECK(!cache_path.empty(), "name the tuning cache to write", "no tuning cache path");
  // A file there is added to only if it is a tuning cache: never overwrite what the user saved.
  if (std::filesystem::exists(cache_path)) {
    std::string stale;
    try {
      stale = runtime::stale_reason(runtime::read_tuning_cache(cache_path));
    } catch (const Error& e) {
      CM_THROW(InvalidArgument,
               "pass the path of a tuning cache, or of a file that does not exist yet (delete this one if it is "
               "a damaged cache)",
               "'{}' exists and is not a tuning cache this coremesh can add to ({}); it was left as it is",
               cache_path, e.message());
    }
    // Its tilings belong to another machine or coremesh: adding ours would drop them.
    CM_CHECK(stale.empty(),
             "pass another --tune-cache for this machine, or delete the file to replace it",
             "the tuning cache '{}' holds another machine's or coremesh's tilings ({}); it was left as it is",
             cache_path, stale);
  }
  TrainConfig quiet = config;
  quiet.progress = quiet.report = false;
  auto trainer = std::make_unique<Trainer>(quiet, device);
  const runtime::TuneWorkload w = trainer->tuning_workload();
  StepTuning t;
  t.report = runtime::tune(w, options);
  for (const runtime::TunedKey& k : t.report.keys) {
    if (k.agreed) {  // timed by whole runs: not a launch time
      if (k.candidates > 1)
        t.agreed.push_back(fmt::format("{} {} ({:.1f} ms a run, {:.1f} ms at its heuristic)", k.entry.key.op,
                                       runtime::describe_tiling(k.entry.key.op, k.best), 1e3 * k.best_s,
                                       1e3 * k.heuristic_s));
      continue;
    }
    ++t.keys;
    t.with_choice += k.candidates > 1;
    t.replaced += !(k.best == k.entry.heuristic);
    t.rejected += k.rejected;
    t.heuristic_s += k.heuristic_s, t.tuned_s += k.best_s;
  }
  t.pes = w.sum_over_pes ? int(w.sum_over_pes(1)) : 1;
  const int me = t.pe = trainer->plan().pe();
  for (int pe = 0; pe < t.pes; ++pe) {  // one writer at a time
    if (pe == me) {
      runtime::TuningCacheFile file = t.report.cache();
      // the other PEs' keys, written since, and the older entries
      if (std::filesystem::exists(cache_path)) file = runtime::merge(runtime::read_tuning_cache(cache_path), file);
      runtime::write_tuning_cache(cache_path, file);
    }
    if (w.sum_over_pes) w.sum_over_pes(0);  // the trainer's plan: alive until here
  }
  return t;
}

}  // namespace coremesh::train
