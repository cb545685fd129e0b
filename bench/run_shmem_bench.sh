#!/bin/bash
# SHMEM benchmarks, side by side in one run (DESIGN.md section 9):
#   RMA    -- bench/shmem_rma_bench.c built with coremesh-cc and with OpenMPI's
#             oshcc, 2 PEs: 8-byte put/get latency, put/get bandwidth 4 KiB-64 MiB,
#             local memcpy; bench/shmem_mpi_bench.c: MPI_Put over osc sm
#   colls  -- bench_shmem_collectives vs bench/shmem_mpi_bench.c: allreduce (f32
#             sum), alltoall, alltoallv at 1 MiB and 64 MiB per PE, 2 and 4 PEs
#   net    -- the network path: 2 PEs under mpirun, each its own host
#             (COREMESH_PES_PER_HOST=1), TCP over loopback. coremesh's two engines,
#             ucx (UCX_TLS=tcp,self) and mpi (MPI-3 RMA over ob1/tcp, osc pt2pt), vs
#             OpenMPI OSHMEM (spml ucx, the same UCX restriction); allreduce on the
#             ucx engine vs MPI_Allreduce over ob1/tcp. Fewer iterations (RMA_BENCH_*).
# Every figure is a median (of RMA_BENCH_TRIALS runs, or of the calls).
# Prints markdown tables on stdout.
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

# Network path: every PE its own host, reached over TCP on the loopback device.
net=(-x RMA_BENCH_LAT_ITERS=2000 -x RMA_BENCH_MIB=16 -x RMA_BENCH_TRIALS=3 -x SHMEM_SYMMETRIC_SIZE=512M)
ob1_tcp=(--mca pml ob1 --mca btl tcp,self --mca btl_tcp_if_include lo --mca osc pt2pt)
ucx_tcp=(-x UCX_TLS=tcp,self -x UCX_NET_DEVICES=lo)
engine() { echo -x COREMESH_PES_PER_HOST=1 -x COREMESH_TRANSPORT="$1"; }
for e in ucx mpi; do
  "${mpi[@]}" "${ob1_tcp[@]}" "${ucx_tcp[@]}" $(engine $e) "${net[@]}" -np 2 "$work/rma_coremesh" \
    2>/dev/null | grep -E '^(put|get)_' | sed "s/^/net_cm_${e}_/" >> "$work/out.txt"
done
oshrun --allow-run-as-root --oversubscribe --mca pml ucx --mca pml_ucx_tls any --mca pml_ucx_devices any \
  "${ucx_tcp[@]}" --mca spml ucx "${net[@]}" -np 2 "$work/rma_oshmem" 2>/dev/null \
  | grep -E '^(put|get)_' | sed 's/^/net_oshmem_/' >> "$work/out.txt"
"${mpi[@]}" "${ob1_tcp[@]}" "${ucx_tcp[@]}" $(engine ucx) -x SHMEM_SYMMETRIC_SIZE=512M -np 2 \
  "$build/bench/bench_shmem_collectives" 2>/dev/null | grep '^cm_' | sed 's/^/net_/' >> "$work/out.txt"
"${mpi[@]}" "${ob1_tcp[@]}" -np 2 "$work/mpi_bench" coll 2>/dev/null | grep '^mpi_' \
  | sed 's/^/net_/' >> "$work/out.txt"

python3 - "$work/out.txt" <<'PY'
import sys
v = {}
for line in open(sys.argv[1]):
    k, size, val = line.split()
    v[(k, int(size))] = float(val)
def g(k, s): return v.get((k, s), float('nan'))
def size_name(b): return f"{b >> 20} MiB" if b >= 1 << 20 else f"{b >> 10} KiB"
print("### Latency, 8 bytes, PE 0 -> PE 1 (ns per operation; put = put + quiet)\n")
print("| operation | coremesh | OpenMPI OSHMEM | MPI_Put (osc sm) + flush |")
print("|---|---:|---:|---:|")
print(f"| put | {g('coremesh_put_lat', 8):.1f} | {g('oshmem_put_lat', 8):.1f} | {g('mpi_put_lat', 8):.1f} |")
print(f"| get | {g('coremesh_get_lat', 8):.1f} | {g('oshmem_get_lat', 8):.1f} | - |")
print("\n### Bandwidth, PE 0 -> PE 1 (GB/s, median of 3 trials)\n")
print("| size | memcpy | coremesh put | put / memcpy | coremesh get | OSHMEM put | OSHMEM get | MPI_Put |")
print("|---|---:|---:|---:|---:|---:|---:|---:|")
s = 4096
while s <= 64 << 20:
    m, p = g('coremesh_memcpy_bw', s), g('coremesh_put_bw', s)
    print(f"| {size_name(s)} | {m:.2f} | {p:.2f} | {p / m:.2f} | {g('coremesh_get_bw', s):.2f} | "
          f"{g('oshmem_put_bw', s):.2f} | {g('oshmem_get_bw', s):.2f} | {g('mpi_put_bw', s):.2f} |")
    s *= 4
print("\n### Collectives (ms per call, slowest PE, bytes per PE)\n")
print("| collective | PEs | size | coremesh | OpenMPI | speed-up |")
print("|---|---:|---:|---:|---:|---:|")
for c in ("allreduce", "alltoall", "alltoallv"):
    for n in (2, 4):
        for s in (1 << 20, 64 << 20):
            a, b = g(f"cm_{c}_np{n}", s), g(f"mpi_{c}_np{n}", s)
            print(f"| {c} | {n} | {size_name(s)} | {a:.3f} | {b:.3f} | {b / a:.1f}x |")
print("\n### Network path: 2 PEs, mpirun, every PE its own host, TCP over loopback\n")
print("Latency, 8 bytes (us per operation; put = put + quiet):\n")
print("| operation | coremesh ucx | coremesh mpi (ob1/tcp, osc pt2pt) | OSHMEM (UCX tcp) | ucx / OSHMEM (speed) |")
print("|---|---:|---:|---:|---:|")
for op in ("put", "get"):
    u, m, o = (g(f"net_{k}_{op}_lat", 8) / 1e3 for k in ("cm_ucx", "cm_mpi", "oshmem"))
    print(f"| {op} | {u:.1f} | {m:.1f} | {o:.1f} | {o / u:.2f}x |")
print("\nBandwidth (GB/s, PE 0 -> PE 1):\n")
print("| size | cm put (ucx) | cm get (ucx) | cm put (mpi) | cm get (mpi) | OSHMEM put | OSHMEM get | put ucx/OSHMEM | get ucx/OSHMEM |")
print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
s = 4096
while s <= 64 << 20:
    row = [g(f"net_{k}_bw", s) for k in ("cm_ucx_put", "cm_ucx_get", "cm_mpi_put", "cm_mpi_get", "oshmem_put", "oshmem_get")]
    print(f"| {size_name(s)} | " + " | ".join(f"{x:.3f}" for x in row) + f" | {row[0] / row[4]:.2f}x | {row[1] / row[5]:.2f}x |")
    s *= 4
print("\nallreduce (f32 sum, ms per call), ucx engine vs MPI_Allreduce (ob1/tcp):\n")
print("| size | coremesh | MPI_Allreduce | speed-up |")
print("|---|---:|---:|---:|")
for s in (1 << 20, 64 << 20):
    a, b = g("net_cm_allreduce_np2", s), g("net_mpi_allreduce_np2", s)
    print(f"| {size_name(s)} | {a:.3f} | {b:.3f} | {b / a:.1f}x |")
PY
