#!/usr/bin/env bash
# The tiling tuner (runtime/tuner.hpp): (1) bench_tuner, the tuner's pick
# against an exhaustive search on GEMM shapes of the demo model and of a
# d 1024 config (bench/tuner.cpp says how); (2) `coremesh tune` on the demo
# config, then the demo's training step with and without its tuning cache,
# alternating, ROUNDS rounds of STEPS steps; medians. Prints one markdown
# table per part for docs/performance.md, section "## Tiling auto-tuner".
#   usage: bench/tuner.sh [steps] [rounds]   (default 20 steps, 5 rounds)
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
bench_setup tuner 20 5 "$@"
cmake --build "$BUILD" --target coremesh bench_tuner >/dev/null
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive
RAW=$WORK/raw.txt
"$BUILD/bench/bench_tuner" >"$RAW"
demo_config demo "$STEPS" 2
"$COREMESH" tune --config "$WORK/demo.json" --tune-cache "$WORK/tuning.json" --no-progress | tee "$WORK/tune.txt" >&2
for _ in $(seq "$ROUNDS"); do
  echo "train heuristic $(train_tokens demo)" >>"$RAW"
  echo "train tuned $(train_tokens demo --tune-cache "$WORK/tuning.json")" >>"$RAW"
done
/usr/bin/python3 - "$RAW" "$WORK/tune.txt" <<'PY'
import collections, statistics, sys
train = collections.defaultdict(list)
print("| GEMM M x K x N | tilings | evaluations: tuner / exhaustive | heuristic ms | exhaustive best ms | tuner's pick ms | pick / best |")
print("|---|---|---|---|---|---|---|")
for line in open(sys.argv[1]):
    f = line.split()
    if f[0] == "shape":
        v = dict(zip(f[4::2], f[5::2]))
        pick, best = float(v["tuned_ms"]), float(v["best_ms"])
        print(f"| {f[1]} x {f[2]} x {f[3]} | {v['candidates']} | {v['evals_tuner']} / {v['evals_exhaustive']} "
              f"({int(v['evals_tuner']) / int(v['evals_exhaustive']):.0%}) | {float(v['heuristic_ms']):.3f} | {best:.3f} | "
              f"{pick:.3f} | {pick / best:.3f} |")
    elif f[0] == "train" and len(f) == 3:
        train[f[1]].append(float(f[2]))
print()
print("".join(l for l in open(sys.argv[2]) if l.startswith("tuned")))
h, t = statistics.median(train["heuristic"]), statistics.median(train["tuned"])
print("| demo training step (2 threads) | heuristic tilings | tuned tilings | ratio |")
print("|---|---|---|---|")
print(f"| tokens/s, median of {len(train['tuned'])} | {h:.0f} | {t:.0f} | {t / h:.3f}x |")
PY
