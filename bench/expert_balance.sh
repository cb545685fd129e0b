#!/usr/bin/env bash
# Hot-expert balancing (issue 27, RFC §2.2), two tables.
# Placement: the `make run` demo trained 60 steps with the router bias held
# still (bias_update_rate 0: the loads of early training, before any
# balancing); its per-step expert loads replayed by bench_expert_balance at
# ep 2 and ep 4 (each step 1024 tokens x top_k 2 rows): the busiest PE's rows
# over the mean under none, shadow (planned from the previous step),
# shadow-now (from the step's own counts, what --expert-balance shadow
# does), static (a 10-step window) and DeepSeek's EPLB with EP or 2 x EP
# redundant slots, and the planner's time.
# Step time: the same skewed router (bias still: top-2 routing collapses onto
# two experts within a few steps) trained STEPS steps at ep 2 and ep 4, one
# thread per PE, with --expert-balance none, shadow and static (window 2),
# ROUNDS rounds: tokens/s, medians.
#   usage: bench/expert_balance.sh [steps] [rounds]   (default 8 steps, 3 rounds)
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
bench_setup expert_balance 8 3 "$@"
cmake --build "$BUILD" --target coremesh bench_expert_balance >/dev/null
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 COREMESH_HEAP_SIZE=1G
demo_config loads 60 2
sed -i 's/"bias_update_rate": [0-9.e-]*/"bias_update_rate": 0/' "$WORK/loads.json"
"$COREMESH" train --config "$WORK/loads.json" --overwrite --no-progress --sample-tokens 0 --report false >/dev/null 2>&1
for ep in 2 4; do "$BUILD/bench/bench_expert_balance" "$WORK/run_loads/metrics.jsonl" "$ep" 2048; done >"$WORK/raw.txt"
demo_config skewed "$STEPS" 1
sed -i 's/"bias_update_rate": [0-9.e-]*/"bias_update_rate": 0/' "$WORK/skewed.json"
tokens() {
  "$COREMESH" train --config "$WORK/skewed.json" --overwrite --no-progress --sample-tokens 0 --val-batches 1 --report false "$@" 2>&1 |
    sed -n 's/^throughput: \([0-9.]*\) tokens\/s.*/\1/p' | head -1
}
for _ in $(seq "$ROUNDS"); do
  for ep in 2 4; do
    for b in none shadow static; do
      echo "time ep$ep $b $(tokens --ep "$ep" --expert-balance "$b" --balance-window 2)" >>"$WORK/raw.txt"
    done
  done
done
/usr/bin/python3 - "$WORK/raw.txt" "$STEPS" "$ROUNDS" <<'PY'
import statistics, sys
raw, steps, rounds = sys.argv[1], sys.argv[2], sys.argv[3]
rows, planner, policies, times = {}, {}, [], {}
for line in open(raw):
    f = line.split()
    if f[0] == "time":
        times.setdefault((f[1], f[2]), []).append(float(f[3]))
    elif f[0] == "ep":
        ep = int(f[1].rstrip(","))
    elif f[0] == "planner":
        planner[ep] = float(f[2])
    else:
        rows[(f[0], ep)] = (float(f[2]), float(f[4]))
        if f[0] not in policies: policies.append(f[0])
print("Placement: 60 demo steps with the router bias still, 3 MoE layers x 8 experts, 2048 rows per layer and "
      "step; busiest PE's rows / mean over the (step, layer) pairs after the first 10 steps, a shadow charged 16 rows")
print()
print("| policy | ep 2 median | ep 2 worst | ep 4 median | ep 4 worst |")
print("|---|---:|---:|---:|---:|")
for p in policies:
    print(f"| {p} | " + " | ".join(f"{rows[(p, ep)][0]:.3f} | {rows[(p, ep)][1]:.3f}" for ep in (2, 4)) + " |")
print()
print("planner: median " + ", ".join(f"{planner[ep]:.1f} us at ep {ep}" for ep in (2, 4)) + " per layer and step")
print()
print(f"Step time: the demo model, router bias still, {steps} steps, one thread per PE, {rounds} rounds "
      "(per round tokens/s: " + "; ".join(f"{k[0]} {k[1]} " + ", ".join(f"{x:.0f}" for x in v) for k, v in times.items())
      + ")")
print()
print("| layout | expert_balance | tokens/s (median) | step time vs none |")
print("|---|---|---:|---:|")
for ep in ("ep2", "ep4"):
    base = statistics.median(times[(ep, "none")])
    for b in ("none", "shadow", "static"):
        t = statistics.median(times[(ep, b)])
        print(f"| {ep[:2]} {ep[2:]} | {b} | {t:.0f} | {base / t:.2f}x |")
PY
