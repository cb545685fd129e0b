#!/usr/bin/env bash
# Token-sliced MoE replicas (moe_replicas, RFC §2.1): step throughput with the
# micro-batch's tokens in R = 1, 2, 4 slices, on ep 2 and ep 4, on shared
# memory (the launcher) and on the network path (mpirun, every PE its own
# host, UCX over TCP on loopback: tests/shmem/mpirun_net.sh). Peers in the
# same run: R = 1 and PyTorch expert parallelism (all_to_all_single over
# gloo) with its batch split the same way. Per layout, a profiled run gives
# the exchange's share of the step and the share of its transfers (signal
# waits) hidden behind compute (scripts/trace_overlap.py, median over the PEs). Then the comm-core sweep:
# ep 2 with 2 cores per PE, R = 2, comm_cores 1, 2 and 0 (no limit).
# The model: the demo's (bench/train_demo_config.json) with top_k 4, so the
# exchange carries twice the demo's rows.
#   usage: bench/moe_replicas.sh [steps] [rounds]   (default 8 steps, 3 rounds)
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
bench_setup moe_replicas 8 3 "$@"
cmake --build "$BUILD" --target coremesh >/dev/null
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive COREMESH_HEAP_SIZE=1G
RAW=$WORK/raw.txt
demo_config moe "$STEPS" 1 1
sed -i 's/"top_k": 2/"top_k": 4/' "$WORK/moe.json"
demo_config wide "$STEPS" 2 1
sed -i 's/"top_k": 2/"top_k": 4/' "$WORK/wide.json"

# tokens/s of one run: PATH (shm | net), CONFIG, then flags
run() {
  local path=$1 config=$2
  shift 2
  if [ "$path" = net ]; then
    local n
    n=$(( $(echo "$@" | sed -n 's/.*--ep \([0-9]*\).*/\1/p') ))
    SHMEM_SYMMETRIC_SIZE=1G tests/shmem/mpirun_net.sh "$n" "$COREMESH" train --config "$WORK/$config.json" --overwrite \
      --no-progress --sample-tokens 0 --val-batches 1 --report false "$@" 2>&1
  else
    "$COREMESH" train --config "$WORK/$config.json" --overwrite --no-progress --sample-tokens 0 --val-batches 1 --report false "$@" 2>&1
  fi
}
tokens() { run "$@" | sed -n 's/^throughput: \([0-9.]*\) tokens\/s.*/\1/p' | head -1; }
# "exchange-share transfer-share hidden-share" of a profiled 4-step run (medians over the PEs)
hidden() {
  rm -rf "$WORK/prof"
  run "$@" --steps 4 --profile "$WORK/prof" >/dev/null
  /usr/bin/python3 scripts/trace_overlap.py "$WORK/prof" --skip-ms 1500 \
    | sed -n 's/.*ms (\([0-9.]*\)% of it): transfers .*(\([0-9.]*\)% of it), .*hidden (\([0-9.]*\)%).*/\1 \2 \3/p' \
    | sort -n | awk '{ a[NR] = $1; b[NR] = $2; c[NR] = $3 } END { m = int((NR + 1) / 2); print a[m], b[m], c[m] }'
}

for _ in $(seq "$ROUNDS"); do
  echo "load $(cut -d' ' -f1 /proc/loadavg)" >>"$RAW"
  for path in shm net; do
    for ep in 2 4; do
      for r in 1 2 4; do echo "cm_${path}_ep${ep}_r$r $(tokens $path moe --ep $ep --moe-replicas $r)" >>"$RAW"; done
    done
  done
  for r in 1 2 4; do
    echo "torch_ep2_r$r $(/usr/bin/python3 bench/train_torch.py "$WORK/run_moe/config.json" "$STEPS" --ep 2 --slices $r)" >>"$RAW"
  done
  for c in 1 2 0; do echo "cores_c$c $(tokens shm wide --ep 2 --moe-replicas 2 --comm-cores $c)" >>"$RAW"; done
done
for path in shm net; do
  for ep in 2 4; do
    for r in 1 2 4; do echo "trace_${path}_ep${ep}_r$r $(hidden $path moe --ep $ep --moe-replicas $r)" >>"$RAW"; done
  done
done

/usr/bin/python3 - "$RAW" "$STEPS" "$ROUNDS" <<'PY'
import statistics, sys
raw, steps, rounds = sys.argv[1], sys.argv[2], sys.argv[3]
v, trace = {}, {}
for line in open(raw):
    k, *rest = line.split()
    if k.startswith("trace_"):
        trace[k[6:]] = [float(x) for x in rest] if len(rest) == 3 else None
    elif rest:
        v.setdefault(k, []).append(float(rest[0]))
med = lambda k: statistics.median(v[k])
ratio = lambda a, b: statistics.median(x / y for x, y in zip(v[a], v[b]))
print(f"{steps} steps, {rounds} rounds, 1-minute load average at each round's start: "
      + ", ".join("%.2f" % x for x in v["load"]) + "; per round, tokens/s: "
      + "; ".join(f"{k} " + ", ".join("%.0f" % x for x in xs) for k, xs in v.items() if k != "load"), file=sys.stderr)
print("| path | layout | slices R | tokens/s | step time vs R = 1 | exchange share of the step | its transfers (waits) | transfers hidden |")
print("|---|---|---:|---:|---:|---:|---:|---:|")
for path, name in (("shm", "shared memory"), ("net", "network (mpirun, TCP)")):
    for ep in (2, 4):
        for r in (1, 2, 4):
            k = f"{path}_ep{ep}_r{r}"
            t = trace.get(k)
            share, transfer, hid = (f"{x:.0f}%" for x in t) if t else ("n/a",) * 3
            print(f"| {name} | ep {ep}, 1 core per PE | {r} | {med('cm_' + k):.0f} | "
                  f"{ratio('cm_' + k.replace(f'_r{r}', '_r1'), 'cm_' + k):.2f}x | {share} | {transfer} | {hid} |")
for r in (1, 2, 4):
    print(f"| PyTorch EP, gloo | ep 2, 1 thread per process | {r} | {med(f'torch_ep2_r{r}'):.0f} | "
          f"{ratio('torch_ep2_r1', f'torch_ep2_r{r}'):.2f}x | | | |")
best = max((1, 2, 0), key=lambda c: med(f"cores_c{c}"))
print()
print("| comm_cores (ep 2, 2 cores per PE, R = 2) | tokens/s |")
print("|---|---:|")
for c in (1, 2, 0):
    print(f"| {c if c else 'no limit'}{' (best)' if c == best else ''} | {med(f'cores_c{c}'):.0f} |")
PY
