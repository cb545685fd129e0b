#!/usr/bin/env bash
# The fused all-reduce's chunk count (parallel/fused_comm.hpp, the tiling the
# tuner searches as an agreed key): bench_fused_comm's matmul_allreduce on
# the demo model's MLP shapes (C 256, H 768, 1024 rows) at 2 PEs x 1 core, on
# shared memory and under mpirun on the network path, with 1, 2, 4 and 8
# chunks. ROUNDS rounds, the chunk counts interleaved; medians. Prints the
# table for docs/performance.md, section "## Fused all-reduce chunks".
#   usage: bench/fused_chunks.sh [rounds]   (default 3)
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
ROUNDS=${1:-3}
COREMESH=${COREMESH:-build/coremesh}
BUILD=$(dirname "$COREMESH")
bench_workdir fused_chunks
cmake --build "$BUILD" --target coremesh bench_fused_comm >/dev/null
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive COREMESH_HEAP_SIZE=1G
RAW=$WORK/raw.txt
for _ in $(seq "$ROUNDS"); do
  for chunks in 1 2 4 8; do
    for where in shm network; do
      if [ $where = shm ]; then launch=("$COREMESH" run -n 2); else launch=(tests/shmem/mpirun_net.sh 2); fi
      "${launch[@]}" "$BUILD/bench/bench_fused_comm" 256 768 1024 20 "$chunks" |
        awk -v w=$where -v c="$chunks" '$1 == "matmul_allreduce" { print w, c, $2, $3; exit }' >>"$RAW"
    done
  done
done
/usr/bin/python3 - "$RAW" <<'PY'
import collections, statistics, sys
runs = collections.defaultdict(list)
for line in open(sys.argv[1]):
    where, chunks, unfused, fused = line.split()
    runs[(where, int(chunks))].append((float(unfused), float(fused)))
counts = sorted({c for _, c in runs})
print("| matmul_allreduce, demo, 2 PEs x 1 core | unfused (us) | " +
      " | ".join(f"{c} chunk{'s' if c > 1 else ''}{' (heuristic)' if c == 2 else ''}: us (unfused / fused)" for c in counts) + " |")
print("|---|---:|" + "---:|" * len(counts))
for where in ("shm", "network"):
    unfused = statistics.median(u for c in counts for u, _ in runs[(where, c)])
    fused = [statistics.median(f for _, f in runs[(where, c)]) for c in counts]
    print(f"| {where} | {unfused:.0f} | " + " | ".join(f"{f:.0f} ({unfused / f:.2f}x)" for f in fused) + " |")
PY
