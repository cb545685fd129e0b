#!/bin/bash
# The network allreduce (f32 sum) of run_shmem_bench.sh (2 PEs under mpirun,
# every PE its own host, TCP over loopback, the ucx engine) for comparing a
# change: bench_shmem_collectives from BUILD_DIR, the same benchmark of BASE (a
# build dir, or a copy of its bench_shmem_collectives) and MPI_Allreduce (ob1
# over TCP), run in rotation ROUNDS times so that all three see the same load.
# Prints a markdown table of medians (ms per call, slowest PE) and ratios.
#   COLL_BENCH_KIB        the sizes per PE in KiB (default "4 64 1024 65536")
#   NET_BENCH_PRIORITY=1  as in run_shmem_net_compare.sh
# usage: bench/run_shmem_net_allreduce.sh BUILD_DIR BASE [ROUNDS]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=$1 base=$2 rounds=${3:-3}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cp "$build/bench/bench_shmem_collectives" "$work/coll_new"
if [ -d "$base" ]; then cp "$base/bench/bench_shmem_collectives" "$work/coll_base"
else cp "$base" "$work/coll_base"; fi
mpicc -O2 "$root/bench/shmem_mpi_bench.c" -o "$work/coll_mpi"

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
prio=()
[ "${NET_BENCH_PRIORITY:-0}" = 1 ] &&
  prio=(setsid bash -c 'echo -19 > /proc/self/autogroup && exec nice -n -19 "$@"' prio)
sizes=(-x COLL_BENCH_KIB="${COLL_BENCH_KIB:-4 64 1024 65536}" -x COLL_BENCH_ALLREDUCE_ONLY=1)
ob1_tcp=(--mca pml ob1 --mca btl tcp,self --mca btl_tcp_if_include lo --mca osc pt2pt)
ucx_tcp=(-x UCX_TLS=tcp,self -x UCX_NET_DEVICES=lo)
for _ in $(seq "$rounds"); do
  for v in base new; do
    echo "load $(cut -d' ' -f1 /proc/loadavg)" >> "$work/out.txt"
    "${prio[@]}" mpirun --allow-run-as-root --oversubscribe "${ob1_tcp[@]}" "${ucx_tcp[@]}" \
      -x COREMESH_PES_PER_HOST=1 -x COREMESH_TRANSPORT=ucx -x SHMEM_SYMMETRIC_SIZE=512M \
      "${sizes[@]}" -np 2 "$work/coll_$v" 2>/dev/null | grep '^cm_allreduce' | sed "s/^/$v /" \
      >> "$work/out.txt"
  done
  echo "load $(cut -d' ' -f1 /proc/loadavg)" >> "$work/out.txt"
  "${prio[@]}" mpirun --allow-run-as-root --oversubscribe "${ob1_tcp[@]}" "${sizes[@]}" -np 2 \
    "$work/coll_mpi" coll 2>/dev/null | grep '^mpi_allreduce' | sed 's/^/mpi /' >> "$work/out.txt"
done

python3 - "$work/out.txt" <<'PY'
import statistics, sys
v, loads = {}, []
for line in open(sys.argv[1]):
    w = line.split()
    if w[0] == "load":
        loads.append(float(w[1]))
        continue
    v.setdefault((w[0], int(w[2])), []).append(float(w[3]))
def m(who, s):
    x = v.get((who, s))
    return statistics.median(x) if x else float("nan")
sizes = sorted({s for _, s in v})
print(f"{len(v.get(('new', sizes[0]), []))} runs each, load average {min(loads):.1f}-{max(loads):.1f}\n")
print("| allreduce f32 sum | base (ms) | coremesh (ms) | MPI_Allreduce (ms) | MPI / coremesh | base / coremesh |")
print("|---|---:|---:|---:|---:|---:|")
for s in sizes:
    name = f"{s >> 20} MiB" if s >= 1 << 20 else f"{s >> 10} KiB"
    b, n, o = m("base", s), m("new", s), m("mpi", s)
    print(f"| {name} | {b:.3f} | {n:.3f} | {o:.3f} | {o / n:.2f}x | {b / n:.2f}x |")
PY
