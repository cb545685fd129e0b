#!/bin/sh
# The mpi transport with the network path forced: every PE reached over
# TCP on the loopback device (ob1 + tcp BTL, osc pt2pt), as PEs on other
# hosts would be. Runs the PE gtests, the C programs, and the fault check
# (a PE killed mid-job stops the job; nothing is left in /dev/shm).
# usage: mpi_test.sh COREMESH_CC TEST_SHMEM_PE FAULT_PROG SRC_DIR OUT_DIR
set -eu
cc_wrapper=$1 pe_tests=$2 fault_prog=$3 src=$4 out=$5
mkdir -p "$out"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
mpirun_tcp() {
  mpirun --mca pml ob1 --mca btl tcp,self --mca btl_tcp_if_include lo --mca osc pt2pt \
    -x COREMESH_WAIT_TIMEOUT_S -x SHMEM_SYMMETRIC_SIZE -x COREMESH_TRANSPORT=mpi -x ASAN_OPTIONS "$@"
}
export SHMEM_SYMMETRIC_SIZE=${COREMESH_HEAP_SIZE:-64M} COREMESH_WAIT_TIMEOUT_S=${COREMESH_WAIT_TIMEOUT_S:-60}
# Under AddressSanitizer: OpenMPI keeps allocations to exit in components it
# unloads at MPI_Finalize, which LeakSanitizer cannot attribute; memory
# errors are still caught.
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
unset COREMESH_HEAP_SIZE
. "$(dirname "$0")/../shm_names.sh"
shm_names_before "$out/shm_before.txt"

mpirun_tcp -n 3 "$pe_tests" > "$out/pe.txt" 2>&1 || { cat "$out/pe.txt"; exit 1; }
grep -q 'PASSED' "$out/pe.txt" || { cat "$out/pe.txt"; exit 1; }
echo "PE tests ok with 3 PEs over TCP"

programs="ring_put globals ordering teams types contexts legacy"
pids=""
for prog in $programs; do
  "$cc_wrapper" -std=c11 -Wall -Wextra -Werror -O1 "$src/$prog.c" -o "$out/$prog" &
  pids="$pids $!"
done
for pid in $pids; do wait "$pid"; done
for n in 3; do  # a non-power of two; the shm runs cover the other counts
  for prog in $programs; do
    mpirun_tcp -n $n "$out/$prog" > "$out/$prog.$n.txt" 2>&1 || { cat "$out/$prog.$n.txt"; exit 1; }
    [ "$(grep -c ' ok (0 errors)' "$out/$prog.$n.txt")" -eq $n ] || { cat "$out/$prog.$n.txt"; exit 1; }
  done
  echo "C programs ok with $n PEs over TCP"
done

start=$(date +%s)
if mpirun_tcp -n 3 "$fault_prog" kill9 > "$out/kill9.txt" 2>&1; then
  echo "a job with a killed PE succeeded"; cat "$out/kill9.txt"; exit 1
fi
[ $(( $(date +%s) - start )) -lt 30 ] || { echo "the job took too long to stop"; exit 1; }
echo "a killed PE stops the job"
left=$(shm_names_left "$out/shm_before.txt")
[ -z "$left" ] || { echo "left in /dev/shm: $left"; exit 1; }
echo "nothing left in /dev/shm"
