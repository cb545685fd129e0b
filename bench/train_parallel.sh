#!/usr/bin/env bash
# Parallel training on one machine, coremesh vs PyTorch 1.13, peers in the
# same run (issue 14's benchmarks). Prints one markdown table for
# docs/performance.md, section "## Parallel training":
#   throughput of the demo model (bench/train_demo_config.json), every side
#   at the same global batch of 2 x 8 sequences x 128 tokens per step:
#     coremesh 1 PE x 1 core (grad_accum 2)  | coremesh --dp 2 (2 PEs x 1 core)
#     PyTorch DistributedDataParallel, gloo, 2 processes x 1 thread
#     coremesh --ep 2 | PyTorch expert parallel (all_to_all_single over gloo)
#   (bench/train_torch.py --ddp 2 / --ep 2). Each round runs the five in
#   turn; the table gives medians over the rounds and of per-round ratios
#   (the per-round figures go to stderr).
#   memory per PE, measured by the trainer in a 4-step run: AdamW state and
#     peak RSS, ZeRO-1 off and on.
# The dispatch + combine of one MoE layer against MPI_Alltoallv is
# bench/ep_exchange.sh.
#   usage: bench/train_parallel.sh [steps] [rounds]   (default 12 steps, 3 rounds)
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
bench_setup parallel 12 3 "$@"
cmake --build "$BUILD" --target coremesh >/dev/null
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive
RAW=$WORK/raw.txt

torch() { /usr/bin/python3 bench/train_torch.py "$WORK/run_two/config.json" "$STEPS" "$@"; }
demo_config one "$STEPS" 1 2
demo_config two "$STEPS" 1 1
demo_config mem 4 1 1

for _ in $(seq "$ROUNDS"); do
  {
    echo "load $(cut -d' ' -f1 /proc/loadavg)"
    echo "cm_1pe $(train_tokens one)"
    echo "cm_dp2 $(train_tokens two --dp 2)"
    echo "torch_ddp2 $(torch --ddp 2)"
    echo "cm_ep2 $(train_tokens two --ep 2)"
    echo "torch_ep2 $(torch --ep 2)"
  } >>"$RAW"
done
for layout in "" "--dp 2" "--dp 2 --zero 1" "--ep 2" "--ep 2 --zero 1"; do
  # shellcheck disable=SC2086
  "$COREMESH" train --config "$WORK/mem.json" --overwrite --no-progress --sample-tokens 0 --val-batches 1 --report false $layout | grep -E '^memory( on PE [0-9]+)?: AdamW' \
    | sed "s/^/layout ${layout:-1 PE}: /" >>"$RAW"
done

/usr/bin/python3 - "$RAW" "$STEPS" "$ROUNDS" <<'PY'
import re, statistics, sys
raw, steps, rounds = sys.argv[1], sys.argv[2], sys.argv[3]
v, mem = {}, {}
for line in open(raw):
    if line.startswith("layout "):
        m = re.match(r"layout (.*): memory(?: on PE (\d+))?: AdamW state (.*), peak RSS (.*)", line.strip())
        mem.setdefault(m.group(1), {})[int(m.group(2) or 0)] = (m.group(3), m.group(4))
        continue
    k, *rest = line.split()
    v.setdefault(k, []).append(float(rest[0]))
med = lambda k: statistics.median(v[k])
ratio = lambda a, b: statistics.median(x / y for x, y in zip(v[a], v[b]))
def memory(layout):  # AdamW state per PE, peak RSS PE 0 / PE 1
    pes = mem.get(layout, {})
    if not pes:
        return " | "
    adam = list(dict.fromkeys(a for a, _ in pes.values()))
    rss = [pes[p][1] for p in sorted(pes)]
    return f"{' / '.join(adam)} | {' / '.join(rss)}"
names = {"cm_1pe": "coremesh 1 PE", "cm_dp2": "dp=2", "torch_ddp2": "DDP", "cm_ep2": "ep=2", "torch_ep2": "PyTorch EP"}
print(f"{steps} steps, {rounds} rounds, 1-minute load average at each round's start: "
      + ", ".join("%.2f" % x for x in v["load"]) + "; per round, tokens/s: "
      + "; ".join(f"{n} " + ", ".join("%.0f" % x for x in v[k]) for k, n in names.items()), file=sys.stderr)
print("| run | tokens/s | vs coremesh 1 PE | coremesh / PyTorch | AdamW state per PE | peak RSS, PE 0 / PE 1 |")
print("|---|---:|---:|---:|---:|---:|")
print(f"| coremesh 1 PE x 1 core (grad_accum 2) | {med('cm_1pe'):.0f} | 1.00x | | {memory('1 PE')} |")
print(f"| coremesh dp=2, 2 PEs x 1 core | {med('cm_dp2'):.0f} | {ratio('cm_dp2', 'cm_1pe'):.2f}x | "
      f"{ratio('cm_dp2', 'torch_ddp2'):.2f}x | {memory('--dp 2')} |")
print(f"| coremesh dp=2, ZeRO-1 | | | | {memory('--dp 2 --zero 1')} |")
print(f"| coremesh ep=2, 2 PEs x 1 core | {med('cm_ep2'):.0f} | {ratio('cm_ep2', 'cm_1pe'):.2f}x | "
      f"{ratio('cm_ep2', 'torch_ep2'):.2f}x | {memory('--ep 2')} |")
print(f"| coremesh ep=2, ZeRO-1 | | | | {memory('--ep 2 --zero 1')} |")
print(f"| PyTorch 1.13 DDP (gloo), 2 processes x 1 thread | {med('torch_ddp2'):.0f} | | | | |")
print(f"| PyTorch 1.13 expert parallel (all_to_all_single, gloo), 2 x 1 thread | {med('torch_ep2'):.0f} | | | | |")
PY
