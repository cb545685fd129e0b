#!/bin/bash
# The network path for docs/performance.md ("## SHMEM", block "SHMEM network"):
# 2 PEs under mpirun, every PE its own host, TCP over loopback, coremesh's ucx
# engine. bench/run_shmem_net_compare.sh without a base, twice: RMA against
# OpenMPI OSHMEM (8-byte latency, bandwidth), then the allreduce (f32 sum)
# against MPI_Allreduce over ob1/tcp at the sizes per PE of COLL_BENCH_KIB; each
# in rotation with its peer, ROUNDS runs each, medians. Prints one markdown
# table (the speed ratio above 1: coremesh faster) and the load it ran under.
# NET_BENCH_PRIORITY and NET_BENCH_TRANSPORT pass through to the compare script.
#   usage: bench/run_shmem_net_bench.sh [BUILD_DIR] [ROUNDS]   (default: build, 3)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build} rounds=${2:-3}
rma=$(bash bench/run_shmem_net_compare.sh "$build" - "$rounds" rma)
coll=$(COLL_BENCH_KIB="${COLL_BENCH_KIB:-4 64 256 512 1024 65536}" \
  bash bench/run_shmem_net_compare.sh "$build" - "$rounds" allreduce)
python3 - "$rma" "$coll" <<'PY'
import sys
rma, coll = sys.argv[1].splitlines(), sys.argv[2].splitlines()
def rows(lines):  # the cells of a table's data rows
    return [[c.strip() for c in l.strip().strip("|").split("|")] for l in lines
            if l.startswith("|") and not l.startswith("|---")][1:]
keep = ("8 B", "4 KiB", "64 KiB", "1 MiB", "64 MiB")
print("| operation | coremesh | peer | peer's figure | coremesh speed / peer |")
print("|---|---:|---|---:|---:|")
for op, ours, peer, ratio in rows(rma):
    if any(f" {k} (" in op for k in keep):
        print(f"| {op} | {ours} | OSHMEM | {peer} | {ratio} |")
for size, ours, peer, ratio in rows(coll):
    print(f"| allreduce {size} (ms) | {ours} | MPI_Allreduce | {peer} | {ratio} |")
print(f"\nRMA: {rma[0]}; allreduce: {coll[0]}.")
PY
