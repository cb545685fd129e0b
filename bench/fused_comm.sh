#!/usr/bin/env bash
# The fused TP comm+GEMM operators (parallel/fused_comm.hpp) against their
# unfused sequences: bench_fused_comm (bench/fused_comm.cpp says what it
# times) on the demo model's MLP shapes (C 256, H 768, 1024 rows) at 2 and 4
# PEs on shared memory, at 2 PEs under mpirun on the network path (every PE
# its own host, UCX over loopback TCP), and on a d 1024 config's (C 1024, H
# 4096) at 2 PEs; then the demo model's training step with and without
# --fused-comm at tp 2, tp 2 + SP, ep 2 and ep 2 in fp8 (2 PEs x 1 core). ROUNDS rounds each,
# medians. Prints one markdown table for docs/performance.md, section "## Fused
# communication"; every fused result equals the unfused one bit for bit (the
# bench exits 1 otherwise).
#   usage: bench/fused_comm.sh [steps] [rounds]   (default 12 steps, 3 rounds)
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
bench_setup fused_comm 12 3 "$@"
cmake --build "$BUILD" --target coremesh bench_fused_comm >/dev/null
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive COREMESH_HEAP_SIZE=1G
RAW=$WORK/raw.txt
demo_config two "$STEPS" 1
ops() {  # label, then the launcher and its arguments
  local label=$1
  shift
  "$@" "$BUILD/bench/bench_fused_comm" $ARGS | sed -n "s/^\([a-z_]* [0-9]\)/$label \1/p"
}
for _ in $(seq "$ROUNDS"); do
  ARGS="256 768 1024 20 2" ops "shm_2_demo" "$COREMESH" run -n 2 >>"$RAW"
  ARGS="256 768 1024 20 2" ops "shm_4_demo" "$COREMESH" run -n 4 >>"$RAW"
  ARGS="256 768 1024 20 2" ops "net_2_demo" tests/shmem/mpirun_net.sh 2 >>"$RAW"
  ARGS="1024 4096 1024 5 2" ops "shm_2_d1024" "$COREMESH" run -n 2 >>"$RAW"
  for layout in "tp2:--tp 2" "tp2_sp:--tp 2 --sequence-parallel" "ep2:--ep 2" "ep2_fp8:--ep 2 --precision fp8"; do
    name=${layout%%:*}
    echo "train $name unfused $(train_tokens two ${layout#*:} --fused-comm false)" >>"$RAW"
    echo "train $name fused $(train_tokens two ${layout#*:} --fused-comm true)" >>"$RAW"
  done
done
/usr/bin/python3 - "$RAW" <<'PY'
import collections, statistics, sys
ops, train = collections.defaultdict(list), collections.defaultdict(list)
for line in open(sys.argv[1]):
    f = line.split()
    if f[0] == "train":
        train[(f[1], f[2])].append(float(f[3]))
    else:
        ops[(f[0], f[1])].append([float(x) for x in f[2:6]])
print("| where | operator | unfused (us) | fused (us) | speed-up | GEMM alone (us) | exchange alone (us) | exchange share | hidden |")
print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
for (where, op), runs in ops.items():
    u, f, c, x = (statistics.median(r[i] for r in runs) for i in range(4))
    transport, pes, shapes = where.split("_")
    label = f"{'shm' if transport == 'shm' else 'network'}, {pes} PEs, {'demo' if shapes == 'demo' else 'd 1024'}"
    hidden = 1 - (f - c) / x if x > 0 else 0
    print(f"| {label} | {op} | {u:.0f} | {f:.0f} | {u / f:.2f}x | {c:.0f} | {x:.0f} | {x / u * 100:.0f}% | "
          f"{hidden * 100:.0f}% |")
print()
print("| training (demo model, 2 PEs x 1 core) | --fused-comm false (tokens/s) | --fused-comm true (tokens/s) | ratio |")
print("|---|---:|---:|---:|")
for name, label in (("tp2", "tp 2"), ("tp2_sp", "tp 2 + SP"), ("ep2", "ep 2 (both expert GEMMs fused with dispatch / combine)"),
                    ("ep2_fp8", "ep 2, fp8 (and its rows quantized at the source: a quarter of the bytes)")):
    u, f = statistics.median(train[(name, "unfused")]), statistics.median(train[(name, "fused")])
    print(f"| {label} | {u:.0f} | {f:.0f} | {f / u:.2f}x |")
PY
