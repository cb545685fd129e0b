#!/bin/bash
# SHMEM benchmarks on one host, side by side in one run (DESIGN.md section 9):
#   RMA    -- bench/shmem_rma_bench.c built with coremesh-cc and with OpenMPI's
#             oshcc, 2 PEs: 8-byte put/get latency, put/get bandwidth 4 KiB-64 MiB,
#             local memcpy; bench/shmem_mpi_bench.c: MPI_Put over osc sm
#   colls  -- bench_shmem_collectives vs bench/shmem_mpi_bench.c: allreduce (f32
#             sum), alltoall, alltoallv at 1 MiB and 64 MiB per PE, 2 and 4 PEs
# Every figure is a median (of RMA_BENCH_TRIALS runs, or of the calls). Prints
# one markdown table on stdout (docs/performance.md, "## SHMEM"). The network
# path (every PE its own host) is bench/run_shmem_net_bench.sh.
# usage: bench/run_shmem_bench.sh [BUILD_DIR]   (default: build)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-}
if [ -z "$build" ]; then
  for d in "$root/build"; do [ -x "$d/bin/coremesh-cc" ] && build=$d && break; done
fi
[ -n "$build" ] || { echo "build coremesh first (cmake --build <dir>)" >&2; exit 1; }
cmake --build "$build" --target coremesh bench_shmem_collectives coremesh_shmem >/dev/null
run=("$build/coremesh" run)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mpi=(mpirun --allow-run-as-root --oversubscribe)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

"$build/bin/coremesh-cc" -O2 "$root/bench/shmem_rma_bench.c" -o "$work/rma_coremesh"
oshcc -O2 "$root/bench/shmem_rma_bench.c" -o "$work/rma_oshmem" -Wl,--no-as-needed -lmca_common_ucx
mpicc -O2 "$root/bench/shmem_mpi_bench.c" -o "$work/mpi_bench"

"${run[@]}" -n 2 --heap 256M "$work/rma_coremesh" | sed 's/^/coremesh_/' > "$work/out.txt"
SHMEM_SYMMETRIC_SIZE=256M oshrun --allow-run-as-root --oversubscribe -np 2 "$work/rma_oshmem" 2>/dev/null \
  | grep -E '^(put|get)_' | sed 's/^/oshmem_/' >> "$work/out.txt"
"${mpi[@]}" --mca osc sm -np 2 "$work/mpi_bench" rma 2>/dev/null | grep '^mpi_' >> "$work/out.txt"
for n in 2 4; do
  "${run[@]}" -n $n --heap 512M "$build/bench/bench_shmem_collectives" >> "$work/out.txt"
  "${mpi[@]}" -np $n "$work/mpi_bench" coll 2>/dev/null | grep '^mpi_' >> "$work/out.txt"
done

python3 - "$work/out.txt" <<'PY'
import sys
v = {}
for line in open(sys.argv[1]):
    k, size, val = line.split()
    v[(k, int(size))] = float(val)
def g(k, s): return v.get((k, s), float('nan'))
def size_name(b): return f"{b >> 20} MiB" if b >= 1 << 20 else f"{b >> 10} KiB"
def cell(x, fmt): return "-" if x != x else format(x, fmt)
def speed(ours, peer, time):  # > 1: coremesh faster
    r = (peer / ours) if time else (ours / peer)
    return "-" if r != r else f"{r:.2f}x"
print("| operation | coremesh | memcpy | OSHMEM | MPI | vs memcpy | vs OSHMEM | vs MPI |")
print("|---|---:|---:|---:|---:|---:|---:|---:|")
for op in ("put", "get"):
    c, o = g(f"coremesh_{op}_lat", 8), g(f"oshmem_{op}_lat", 8)
    m = g("mpi_put_lat", 8) if op == "put" else float("nan")
    print(f"| {op} 8 B (ns) | {c:.1f} | - | {o:.1f} | {cell(m, '.1f')} | - | {speed(c, o, True)} | {speed(c, m, True)} |")
for s in (4 << 10, 64 << 10, 1 << 20, 64 << 20):
    mc = g("coremesh_memcpy_bw", s)
    for op in ("put", "get"):
        c, o = g(f"coremesh_{op}_bw", s), g(f"oshmem_{op}_bw", s)
        m = g("mpi_put_bw", s) if op == "put" else float("nan")
        print(f"| {op} {size_name(s)} (GB/s) | {c:.2f} | {mc:.2f} | {o:.2f} | {cell(m, '.2f')} | "
              f"{speed(c, mc, False)} | {speed(c, o, False)} | {speed(c, m, False)} |")
sizes = (1 << 20, 64 << 20)
for c in ("allreduce", "alltoall", "alltoallv"):
    for n in (2, 4):
        a, b = [g(f"cm_{c}_np{n}", s) for s in sizes], [g(f"mpi_{c}_np{n}", s) for s in sizes]
        print(f"| {c} {' / '.join(map(size_name, sizes))}, {n} PEs (ms) | {' / '.join(f'{x:.3f}' for x in a)} | - | - | "
              f"{' / '.join(f'{x:.3f}' for x in b)} | - | - | {' / '.join(speed(x, y, True) for x, y in zip(a, b))} |")
PY
