#!/usr/bin/env bash
# Parallel training on one machine, coremesh vs PyTorch 1.13, peers in the
# same run (issue 14's benchmarks). Prints markdown for docs/performance.md,
# section "## Parallel training".
#   throughput of the demo model (bench/train_demo_config.json), every side
#   at the same global batch of 2 x 8 sequences x 128 tokens per step:
#     coremesh 1 PE x 1 core (grad_accum 2)  | coremesh --dp 2 (2 PEs x 1 core)
#     PyTorch DistributedDataParallel, gloo, 2 processes x 1 thread
#     coremesh --ep 2 | PyTorch expert parallel (all_to_all_single over gloo)
#   (bench/train_torch.py --ddp 2 / --ep 2). Each round runs the five in
#   turn; the tables give medians over the rounds and of per-round ratios.
#   dispatch + combine of one MoE layer for the demo's token layout:
#     bench_ep_exchange under `coremesh run -n 2` (parallel::ShmemExperts) vs
#     bench/ep_exchange_mpi.c under mpirun -np 2 (MPI_Alltoallv), alternating;
#     both must receive and return the same rows (checksums).
#   memory per PE, measured by the trainer: AdamW state and peak RSS, ZeRO-1
#     off and on.
#   usage: bench/train_parallel.sh [steps] [rounds]   (default 12 steps, 3 rounds)
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
bench_setup parallel 12 3 "$@"
cmake --build "$BUILD" --target coremesh bench_ep_exchange >/dev/null
mpicc -O2 bench/ep_exchange_mpi.c -o "$WORK/ep_exchange_mpi"
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
for _ in $(seq "$ROUNDS"); do
  "$COREMESH" run -n 2 "$BUILD/bench/bench_ep_exchange" 300 | sed 's/^checksum/cm_checksum/' >>"$RAW"
  mpirun --allow-run-as-root --oversubscribe -np 2 "$WORK/ep_exchange_mpi" 300 2>/dev/null \
    | sed 's/^checksum/mpi_checksum/' >>"$RAW"
done
for layout in "" "--dp 2" "--dp 2 --zero 1" "--ep 2" "--ep 2 --zero 1"; do
  # shellcheck disable=SC2086
  "$COREMESH" train --config "$WORK/mem.json" --no-progress --sample-tokens 0 --val-batches 1 --report false $layout | grep -E '^memory( on PE [0-9]+)?: AdamW' \
    | sed "s/^/layout ${layout:-1 PE}: /" >>"$RAW"
done

/usr/bin/python3 - "$RAW" "$STEPS" "$ROUNDS" <<'PY'
import re, statistics, sys
raw, steps, rounds = sys.argv[1], sys.argv[2], sys.argv[3]
v, sums, mem = {}, {}, []
for line in open(raw):
    if line.startswith("layout "):
        m = re.match(r"layout (.*): memory(?: on PE (\d+))?: AdamW state (.*), peak RSS (.*)", line.strip())
        mem.append((m.group(1), m.group(2) or "0", m.group(3), m.group(4)))
        continue
    k, *rest = line.split()
    if k.endswith("checksum"):
        sums.setdefault(k, set()).add(tuple(rest))
    else:
        v.setdefault(k, []).append(float(rest[0]))
med = lambda k: statistics.median(v[k])
ratio = lambda a, b: statistics.median(x / y for x, y in zip(v[a], v[b]))
loads = ", ".join("%.2f" % x for x in v["load"])
print(f"Throughput of the demo model, global batch 16 x 128 tokens per step on every side, {steps} steps, "
      f"{rounds} rounds (1-minute load average at each round's start: {loads}); tokens/s, medians:\n")
print("| run | tokens/s | vs coremesh 1 PE | coremesh / PyTorch |")
print("|---|---:|---:|---:|")
print(f"| coremesh 1 PE x 1 core (grad_accum 2) | {med('cm_1pe'):.0f} | 1.00x | |")
print(f"| coremesh dp=2, 2 PEs x 1 core | {med('cm_dp2'):.0f} | {ratio('cm_dp2', 'cm_1pe'):.2f}x | "
      f"{ratio('cm_dp2', 'torch_ddp2'):.2f}x |")
print(f"| PyTorch 1.13 DDP (gloo), 2 processes x 1 thread | {med('torch_ddp2'):.0f} | | |")
print(f"| coremesh ep=2, 2 PEs x 1 core | {med('cm_ep2'):.0f} | {ratio('cm_ep2', 'cm_1pe'):.2f}x | "
      f"{ratio('cm_ep2', 'torch_ep2'):.2f}x |")
print(f"| PyTorch 1.13 expert parallel (all_to_all_single, gloo), 2 x 1 thread | {med('torch_ep2'):.0f} | | |")
names = {"cm_1pe": "coremesh 1 PE", "cm_dp2": "dp=2", "torch_ddp2": "DDP", "cm_ep2": "ep=2", "torch_ep2": "PyTorch EP"}
print("\nPer round, tokens/s: " + "; ".join(f"{n} " + ", ".join("%.0f" % x for x in v[k]) for k, n in names.items()))
same = sums.get("cm_checksum") == sums.get("mpi_checksum") and len(sums.get("cm_checksum", ())) == 2
print("\nDispatch + combine of one MoE layer, 2 PEs x (8 x 128 tokens, top-2 of 8 experts, width 256, f32), "
      "identity experts; slowest PE per iteration, median of 300 iterations, median over the rounds (us); "
      f"received and returned rows identical on both sides (checksums): {'yes' if same else 'NO'}\n")
print("| phase | coremesh (ShmemExperts) | MPI_Alltoallv | speed-up |")
print("|---|---:|---:|---:|")
for p in ("dispatch", "combine", "total"):
    a, b = med(f"cm_{p}_us"), med(f"mpi_{p}_us")
    print(f"| {p} | {a:.0f} | {b:.0f} | {statistics.median(y / x for x, y in zip(v[f'cm_{p}_us'], v[f'mpi_{p}_us'])):.2f}x |")
print("\nMemory per PE, measured by `coremesh train` (4 steps): AdamW state it holds, peak RSS (VmHWM):\n")
print("| layout | PE | AdamW state | peak RSS |")
print("|---|---:|---:|---:|")
order = {layout: i for i, (layout, *_) in reversed(list(enumerate(mem)))}
for layout, pe, adam, rss in sorted(mem, key=lambda m: (order[m[0]], int(m[1]))):
    print(f"| {layout} | {pe} | {adam} | {rss} |")
if not same:
    sys.exit("the two sides of the exchange moved different rows")
PY
