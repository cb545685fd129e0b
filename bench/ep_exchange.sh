#!/usr/bin/env bash
# Dispatch + combine of one MoE layer for the demo's token layout: coremesh
# (bench_ep_exchange under `coremesh run -n 2`, parallel::ShmemExperts) vs
# MPI (bench/ep_exchange_mpi.c under mpirun -np 2, MPI_Alltoallv), alternating
# for ROUNDS rounds of ITERS iterations each; medians over the rounds of each
# side's per-round median and of the per-round ratios. Both sides must
# receive and return the same rows (checksums; the script fails otherwise).
# Prints one markdown table for docs/performance.md ("## Parallel training",
# block "EP exchange"); the checksum verdict goes to stderr.
#   usage: bench/ep_exchange.sh [rounds] [iterations]   (default 5 rounds, 300)
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-5}
ITERS=${2:-300}
COREMESH=${COREMESH:-build/coremesh}
BUILD=$(dirname "$COREMESH")
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
cmake --build "$BUILD" --target coremesh bench_ep_exchange >/dev/null
mpicc -O2 bench/ep_exchange_mpi.c -o "$WORK/ep_exchange_mpi"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
RAW=$WORK/raw.txt
for r in $(seq "$ROUNDS"); do
  "$COREMESH" run -n 2 "$BUILD/bench/bench_ep_exchange" "$ITERS" | sed "s/^checksum/cm_checksum/; s/^/$r /" >>"$RAW"
  mpirun --allow-run-as-root --oversubscribe -np 2 "$WORK/ep_exchange_mpi" "$ITERS" 2>/dev/null \
    | sed "s/^checksum/mpi_checksum/; s/^/$r /" >>"$RAW"
done
/usr/bin/python3 - "$RAW" <<'PY'
import collections, statistics, sys
v = collections.defaultdict(dict)
sums = collections.defaultdict(set)
for line in open(sys.argv[1]):
    r, k, *rest = line.split()
    if k.endswith("checksum"):
        sums[k].add(tuple(rest))
    else:
        v[k][r] = float(rest[0])
same = sums["cm_checksum"] == sums["mpi_checksum"] and len(sums["cm_checksum"]) == 2
print(f"rows received and returned identical on both sides (checksums): {'yes' if same else 'NO'}", file=sys.stderr)
print("| phase | coremesh (us) | MPI_Alltoallv (us) | speed-up |")
print("|---|---:|---:|---:|")
for p in ("dispatch", "combine", "total"):
    cm, mpi = v[f"cm_{p}_us"], v[f"mpi_{p}_us"]
    ratio = statistics.median(mpi[r] / cm[r] for r in cm)
    print(f"| {p} | {statistics.median(cm.values()):.0f} | {statistics.median(mpi.values()):.0f} | {ratio:.2f}x |")
sys.exit(0 if same else 1)
PY
