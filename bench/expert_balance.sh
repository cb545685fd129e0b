#!/usr/bin/env bash
# Hot-expert balancing plans (issue 27, RFC §2.2) on a real router's loads:
# the `make run` demo trained STEPS steps with the router bias held still
# (bias_update_rate 0: the loads of early training, before any balancing),
# its per-step expert loads then replayed by bench_expert_balance at ep 2
# and ep 4 (each step 1024 tokens x top_k 2 rows): the busiest PE's rows
# over the mean under none, shadow (planned from the previous step),
# shadow-now (from the step's own counts), static (a 10-step window) and
# DeepSeek's EPLB with EP or 2 x EP redundant slots, and the planner's time.
#   usage: bench/expert_balance.sh [steps]   (default 60)
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
bench_setup expert_balance 60 1 "$@"
cmake --build "$BUILD" --target coremesh bench_expert_balance >/dev/null
export OPENBLAS_NUM_THREADS=1
demo_config loads "$STEPS" 2
sed -i 's/"bias_update_rate": [0-9.e-]*/"bias_update_rate": 0/' "$WORK/loads.json"
"$COREMESH" train --config "$WORK/loads.json" --no-progress --sample-tokens 0 --report false >/dev/null 2>&1
for ep in 2 4; do "$BUILD/bench/bench_expert_balance" "$WORK/run_loads/metrics.jsonl" "$ep" 2048; done >"$WORK/raw.txt"
/usr/bin/python3 - "$WORK/raw.txt" "$STEPS" <<'PY'
import sys
raw, steps = sys.argv[1], sys.argv[2]
rows, planner, policies = {}, {}, []
for line in open(raw):
    f = line.split()
    if f[0] == "ep":
        ep = int(f[1].rstrip(","))
    elif f[0] == "planner":
        planner[ep] = float(f[2])
    else:
        rows[(f[0], ep)] = (float(f[2]), float(f[4]))
        if f[0] not in policies: policies.append(f[0])
print(f"{steps} demo steps with the router bias still, 3 MoE layers x 8 experts, 2048 rows per layer and step; "
      "busiest PE's rows / mean over the (step, layer) pairs after the first 10 steps, a shadow charged 16 rows")
print()
print("| policy | ep 2 median | ep 2 worst | ep 4 median | ep 4 worst |")
print("|---|---:|---:|---:|---:|")
for p in policies:
    print(f"| {p} | " + " | ".join(f"{rows[(p, ep)][0]:.3f} | {rows[(p, ep)][1]:.3f}" for ep in (2, 4)) + " |")
print()
print("planner: median " + ", ".join(f"{planner[ep]:.1f} us at ep {ep}" for ep in (2, 4)) + " per layer and step")
PY
