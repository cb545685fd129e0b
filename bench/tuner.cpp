// The tiling tuner's search against an exhaustive one, per GEMM shape: the
// exhaustive search times every tiling `repeats` times (median); the tuner
// spends a quarter of those evaluations (successive halving). The three
// tilings (heuristic, exhaustive best, tuner's pick) are then timed again
// side by side, interleaved, `retime` rounds each, so that the ratio compares
// them under the same noise.
//   usage: bench_tuner [retime]   (default 31)
// Prints one line per shape:
//   shape M K N candidates C evals_tuner T evals_exhaustive E heuristic_ms H best_ms B tuned_ms P
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <vector>

#include "coremesh/ops/gemm.hpp"
#include "coremesh/runtime/device.hpp"
#include "coremesh/runtime/stream.hpp"
#include "coremesh/runtime/tuner.hpp"

using namespace coremesh;

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

Tensor filled(int64_t rows, int64_t cols, int seed) {
  std::vector<float> v(size_t(rows * cols));
  for (size_t i = 0; i < v.size(); ++i) v[i] = float(int((i * 2654435761u + unsigned(seed)) % 255) - 127) / 128.0f;
  return Tensor::from_vector(v, {rows, cols});
}

}  // namespace

int main(int argc, char** argv) {
  const int retime = argc > 1 ? std::atoi(argv[1]) : 31;
  runtime::Stream stream = runtime::current_stream();
  // the demo model's GEMMs (1024 tokens, d 256, expert hidden 384, dense 768) and a d 1024 config's
  const std::vector<std::array<int64_t, 3>> shapes = {
      {1024, 256, 768}, {1024, 256, 1536}, {1024, 768, 256}, {1024, 256, 256}, {1024, 1024, 4096}, {1024, 4096, 1024}};
  for (const auto& [m, k, n] : shapes) {
    const Tensor a = filled(m, k, 1), b = filled(k, n, 2);
    Tensor c;
    const runtime::TuneWorkload w{[&] {
                                    c = ops::matmul(a, b);
                                    stream.synchronize();
                                  },
                                  [&] { return c.to_float_vector(); }};
    runtime::OpCache::global().clear();
    runtime::TuneOptions o;
    const runtime::TuneReport ex = runtime::tune_exhaustive(w, o);
    runtime::OpCache::global().clear();
    const runtime::TuneReport tu = runtime::tune(w, o);
    const runtime::TunedKey &e = ex.keys.at(0), &t = tu.keys.at(0);
    // the three side by side
    const std::vector<runtime::Tiling> picks = {e.entry.heuristic, e.best, t.best};
    std::vector<std::vector<double>> ms(picks.size());
    for (int r = 0; r < retime; ++r)
      for (size_t p = 0; p < picks.size(); ++p) {
        runtime::OpCache::global().force(e.entry.key.text(), picks[p]);
        const auto t0 = std::chrono::steady_clock::now();
        w.run();
        ms[p].push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
      }
    runtime::OpCache::global().unforce_all();
    int evals_ex = 0;
    for (const auto& k : ex.keys) evals_ex += k.evaluations;
    fmt::print("shape {} {} {} candidates {} evals_tuner {} evals_exhaustive {} heuristic_ms {:.4f} best_ms {:.4f} "
               "tuned_ms {:.4f}\n",
               m, k, n, e.candidates, t.evaluations, evals_ex, median(ms[0]), median(ms[1]), median(ms[2]));
    std::fflush(stdout);
  }
}
