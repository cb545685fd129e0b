#!/bin/bash
# The network path of run_shmem_bench.sh (2 PEs under mpirun, every PE its own
# host, TCP over loopback, the ucx engine; the same flags and sizes), for
# comparing a change: coremesh built from BUILD_DIR, from BASE (a build dir of
# the code to compare with, say main's, or bench/shmem_rma_bench.c already
# built by its coremesh-cc) and OpenMPI OSHMEM (spml ucx, the same UCX
# restriction), run in rotation ROUNDS times so that all three see the same
# load. Prints a markdown table of medians and ratios. BASE "-": no base, only
# this code against its peer (the base columns are left out).
# With MODE allreduce: the network allreduce (f32 sum) of run_shmem_bench.sh
# instead, bench_shmem_collectives of BUILD_DIR and of BASE (a build dir or a
# copy of that benchmark) against MPI_Allreduce (ob1 over TCP), at the sizes
# per PE of COLL_BENCH_KIB (default "4 64 1024 65536").
#   NET_BENCH_PRIORITY=1  run every job in its own session at autogroup and nice
#                         -19 (root): on a machine loaded by other work this comes
#                         near a quiet machine's figures, alike for all three
#   NET_BENCH_OSHMEM_ENV  extra -x options for OSHMEM only (e.g. its UCX settings)
#   NET_BENCH_TRANSPORT   coremesh's engine, ucx (default) or mpi (MPI-3 RMA over
#                         ob1/tcp, osc pt2pt)
# usage: bench/run_shmem_net_compare.sh BUILD_DIR BASE [ROUNDS] [rma|allreduce]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=$1 base=$2 rounds=${3:-3} mode=${4:-rma}
variants=(base new)
[ "$base" = - ] && variants=(new)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
if [ "$mode" = rma ]; then
  "$build/bin/coremesh-cc" -O2 "$root/bench/shmem_rma_bench.c" -o "$work/rma_new"
  if [ "$base" = - ]; then
    :
  elif [ -d "$base" ]; then
    "$base/bin/coremesh-cc" -O2 "$root/bench/shmem_rma_bench.c" -o "$work/rma_base"
  else
    cp "$base" "$work/rma_base"
  fi
  oshcc -O2 "$root/bench/shmem_rma_bench.c" -o "$work/rma_osh" -Wl,--no-as-needed -lmca_common_ucx
else
  cp "$build/bench/bench_shmem_collectives" "$work/rma_new"
  if [ "$base" = - ]; then :
  elif [ -d "$base" ]; then cp "$base/bench/bench_shmem_collectives" "$work/rma_base"
  else cp "$base" "$work/rma_base"; fi
  mpicc -O2 "$root/bench/shmem_mpi_bench.c" -o "$work/coll_mpi"
fi

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
prio=()
[ "${NET_BENCH_PRIORITY:-0}" = 1 ] &&
  prio=(setsid bash -c 'echo -19 > /proc/self/autogroup && exec nice -n -19 "$@"' prio)
net=(-x RMA_BENCH_LAT_ITERS=2000 -x RMA_BENCH_MIB=16 -x RMA_BENCH_TRIALS=3 -x SHMEM_SYMMETRIC_SIZE=512M)
[ "$mode" = rma ] ||
  net=(-x COLL_BENCH_KIB="${COLL_BENCH_KIB:-4 64 1024 65536}" -x COLL_BENCH_ALLREDUCE_ONLY=1 -x SHMEM_SYMMETRIC_SIZE=512M)
ob1_tcp=(--mca pml ob1 --mca btl tcp,self --mca btl_tcp_if_include lo --mca osc pt2pt)
ucx_tcp=(-x UCX_TLS=tcp,self -x UCX_NET_DEVICES=lo)
read -r -a osh_env <<< "${NET_BENCH_OSHMEM_ENV:-}"
for _ in $(seq "$rounds"); do
  for v in "${variants[@]}"; do
    echo "load $(cut -d' ' -f1 /proc/loadavg)" >> "$work/out.txt"
    "${prio[@]}" mpirun --allow-run-as-root --oversubscribe "${ob1_tcp[@]}" "${ucx_tcp[@]}" \
      -x COREMESH_PES_PER_HOST=1 -x COREMESH_TRANSPORT="${NET_BENCH_TRANSPORT:-ucx}" "${net[@]}" -np 2 "$work/rma_$v" \
      2>/dev/null | grep -E '^(put_|get_|cm_allreduce)' | sed "s/^cm_//; s/^/$v /" >> "$work/out.txt"
  done
  echo "load $(cut -d' ' -f1 /proc/loadavg)" >> "$work/out.txt"
  if [ "$mode" = rma ]; then
    "${prio[@]}" oshrun --allow-run-as-root --oversubscribe --mca pml ucx --mca pml_ucx_tls any \
      --mca pml_ucx_devices any "${ucx_tcp[@]}" "${osh_env[@]}" --mca spml ucx "${net[@]}" -np 2 \
      "$work/rma_osh" 2>/dev/null | grep -E '^(put|get)_' | sed 's/^/osh /' >> "$work/out.txt"
  else
    "${prio[@]}" mpirun --allow-run-as-root --oversubscribe "${ob1_tcp[@]}" "${net[@]}" -np 2 \
      "$work/coll_mpi" coll 2>/dev/null | grep '^mpi_allreduce' | sed 's/^mpi_/osh /' \
      >> "$work/out.txt"
  fi
done

python3 - "$work/out.txt" "$mode" <<'PY'
import statistics, sys
v, loads = {}, []
for line in open(sys.argv[1]):
    w = line.split()
    if w[0] == "load":
        loads.append(float(w[1]))
        continue
    v.setdefault((w[0], w[1], int(w[2])), []).append(float(w[3]))
def m(who, k, s):
    x = v.get((who, k, s))
    return statistics.median(x) if x else float("nan")
runs = max(len(x) for k, x in v.items() if k[0] == "new")
has_base = any(k[0] == "base" for k in v)
def row(label, values, ratios):  # values: base (if any), coremesh, peer; ratios: vs peer, vs base
    cells = (values if has_base else values[1:]) + (ratios if has_base else ratios[:1])
    print(f"| {label} | " + " | ".join(cells) + " |")
print(f"{runs} runs each, load average {min(loads):.1f}-{max(loads):.1f}\n")
if sys.argv[2] == "allreduce":  # "osh" holds MPI_Allreduce here
    head = ["allreduce f32 sum", "base (ms)", "coremesh (ms)", "MPI_Allreduce (ms)", "MPI / coremesh", "base / coremesh"]
    if not has_base:
        head = [h for h in head if not h.startswith("base")]
    print("| " + " | ".join(head) + " |\n|---" + "|---:" * (len(head) - 1) + "|")
    for s in sorted({k[2] for k in v if k[0] == "new"}):
        name = f"{s >> 20} MiB" if s >= 1 << 20 else f"{s >> 10} KiB"
        b, n, o = (m(w, "allreduce_np2", s) for w in ("base", "new", "osh"))
        row(name, [f"{b:.3f}", f"{n:.3f}", f"{o:.3f}"], [f"{o / n:.2f}x", f"{b / n:.2f}x"])
    sys.exit(0)
head = ["operation", "base", "coremesh", "OSHMEM", "coremesh / OSHMEM", "coremesh / base"]
if not has_base:
    head = [h for h in head if "base" not in h]
print("| " + " | ".join(head) + " |\n|---" + "|---:" * (len(head) - 1) + "|")
for op in ("put", "get"):
    b, n, o = (m(w, f"{op}_lat", 8) / 1e3 for w in ("base", "new", "osh"))
    row(f"{op} 8 B (us)", [f"{b:.1f}", f"{n:.1f}", f"{o:.1f}"], [f"{o / n:.2f}x", f"{b / n:.2f}x"])
s = 4096
while s <= 64 << 20:
    name = f"{s >> 20} MiB" if s >= 1 << 20 else f"{s >> 10} KiB"
    for op in ("put", "get"):
        b, n, o = (m(w, f"{op}_bw", s) for w in ("base", "new", "osh"))
        row(f"{op} {name} (GB/s)", [f"{b:.3f}", f"{n:.3f}", f"{o:.3f}"], [f"{n / o:.2f}x", f"{n / b:.2f}x"])
    s *= 4
PY
