#!/usr/bin/env bash
# Tensor and context parallelism against one PE with the same cores (issue
# 15's throughput figures). The demo model (bench/train_demo_config.json,
# without the sequence-wise balance loss, which CP refuses) at the same global
# batch of 8 x 128 tokens per step on every side:
#   1 PE x 2 cores | --tp 2 (2 PEs x 1 core) | --tp 2 --sequence-parallel
#   | --cp 2 ring (2 PEs x 1 core)
# Each round runs them in turn; the table gives medians of tokens/s and of
# the per-round ratios against the 1-PE run. Then one profiled run per
# parallel layout: bench/dp_overlap.py measures, per PE, the communication
# time (comm kernels, parked signal waits, the collectives' sums, on any
# stream) and how much of it falls while a compute kernel runs (its full
# output goes to stderr). Prints one markdown table for docs/performance.md,
# section "## Tensor parallel" (the --cp 2 row is read in "## Context parallel").
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
for layout in tp2:"--tp 2" tp2sp:"--tp 2 --sequence-parallel" cp2:"--cp 2"; do
  # shellcheck disable=SC2086
  train_tokens two ${layout#*:} --profile "$WORK/profile_${layout%%:*}" >/dev/null
  /usr/bin/python3 bench/dp_overlap.py "$WORK/profile_${layout%%:*}" >"$WORK/overlap_${layout%%:*}.txt" || true
  { echo "Communication hidden behind compute, ${layout#*:} (bench/dp_overlap.py):"
    cat "$WORK/overlap_${layout%%:*}.txt"; } >&2
done
/usr/bin/python3 - "$RAW" "$WORK" <<'PY'
import os, re, statistics, sys
raw, work = sys.argv[1:3]
v = {}
for line in open(raw):
    k, x = line.split()
    v.setdefault(k, []).append(float(x))
print("1-minute load average at each round's start: " + ", ".join("%.2f" % x for x in v["load"]), file=sys.stderr)
def overlap(k):  # communication per PE, share hidden (all PEs)
    path = os.path.join(work, f"overlap_{k}.txt")
    if not os.path.exists(path):
        return "-", "-"
    text = open(path).read()
    comm = re.findall(r"^trace_pe\d+\.json: comm ([\d.]+) ms", text, re.M)
    total = re.search(r"^total: .*= ([\d.]+)%", text, re.M)
    return (" / ".join("%.0f" % float(c) for c in comm) + " ms" if comm else "-",
            f"{float(total.group(1)):.1f}%" if total else "-")
print("| run | tokens/s | vs 1 PE x 2 cores | per round | communication / PE | hidden behind compute |")
print("|---|---:|---:|---|---|---:|")
names = {"one": "1 PE x 2 cores", "tp2": "--tp 2, 2 PEs x 1 core", "tp2sp": "--tp 2 --sequence-parallel",
         "cp2": "--cp 2 (ring), 2 PEs x 1 core"}
for k, n in names.items():
    if k not in v:
        continue
    r = statistics.median(a / b for a, b in zip(v[k], v["one"]))
    comm, hidden = overlap(k) if k != "one" else ("-", "-")
    print(f"| {n} | {statistics.median(v[k]):.0f} | {r:.2f}x | {', '.join('%.0f' % x for x in v[k])} | "
          f"{comm} | {hidden} |")
PY
