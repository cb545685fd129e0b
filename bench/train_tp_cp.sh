#!/usr/bin/env bash
# Tensor and context parallelism against one PE with the same cores (issue
# 15's throughput figures). The demo model (bench/train_demo_config.json,
# without the sequence-wise balance loss, which CP refuses) at the same global
# batch of 8 x 128 tokens per step on every side:
#   1 PE x 2 cores | --tp 2 (2 PEs x 1 core) | --tp 2 --sequence-parallel
#   | --cp 2 ring (2 PEs x 1 core)
# Each round runs them in turn; the table gives medians of tokens/s and of
# the per-round ratios against the 1-PE run. Then one profiled run per
# parallel layout: bench/dp_overlap.py measures, per PE, how much of the comm
# stream's time (its puts, sums and parked signal waits) falls while a compute
# kernel runs.
#   usage: bench/train_tp_cp.sh [steps] [rounds]   (default 12 steps, 3 rounds)
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
bench_setup tp_cp 12 3 "$@"
cmake --build "$BUILD" --target coremesh >/dev/null
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive
RAW=$WORK/raw.txt
for c in one:2 two:1; do
  demo_config "${c%%:*}" "$STEPS" "${c##*:}"
  sed -i 's/"aux_loss_alpha": [0-9.e-]*/"aux_loss_alpha": 0/' "$WORK/${c%%:*}.json"
done

for _ in $(seq "$ROUNDS"); do
  {
    echo "load $(cut -d' ' -f1 /proc/loadavg)"
    echo "one $(train_tokens one)"
    echo "tp2 $(train_tokens two --tp 2)"
    echo "tp2sp $(train_tokens two --tp 2 --sequence-parallel)"
    echo "cp2 $(train_tokens two --cp 2)"
  } >>"$RAW"
done
/usr/bin/python3 - "$RAW" "$STEPS" "$ROUNDS" <<'PY'
import statistics, sys
raw, steps, rounds = sys.argv[1:4]
v = {}
for line in open(raw):
    k, x = line.split()
    v.setdefault(k, []).append(float(x))
loads = ", ".join("%.2f" % x for x in v["load"])
print(f"Demo model, global batch 8 x 128 tokens per step, {steps} steps, {rounds} rounds "
      f"(1-minute load average at each round's start: {loads}); tokens/s, medians:\n")
print("| run | tokens/s | vs 1 PE x 2 cores (median of per-round ratios) | per round |")
print("|---|---:|---:|---|")
names = {"one": "1 PE x 2 cores", "tp2": "--tp 2, 2 PEs x 1 core", "tp2sp": "--tp 2 --sequence-parallel",
         "cp2": "--cp 2 (ring), 2 PEs x 1 core"}
for k, n in names.items():
    if k not in v:
        continue
    r = statistics.median(a / b for a, b in zip(v[k], v["one"]))
    print(f"| {n} | {statistics.median(v[k]):.0f} | {r:.2f}x | {', '.join('%.0f' % x for x in v[k])} |")
PY

for layout in "--tp 2" "--tp 2 --sequence-parallel" "--cp 2"; do
  dir="$WORK/profile_${layout//[ -]/}"
  # shellcheck disable=SC2086
  train_tokens two $layout --profile "$dir" >/dev/null
  echo
  echo "Communication hidden behind compute, $layout (bench/dp_overlap.py):"
  /usr/bin/python3 bench/dp_overlap.py "$dir" || true
done
