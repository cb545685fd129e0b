#!/bin/sh
# SHMEM under mpirun on one machine (tests/shmem/mpirun_net.sh: TCP over
# loopback), in one of three layouts:
#   net    every PE its own host, the ucx engine between all: the PE gtests
#          and the C programs at 3 PEs, a killed PE stopping the job, and
#          operations to a stopped PE timing out
#   hosts  4 PEs on two simulated hosts of 2 (shared memory within a host,
#          the ucx engine between): the PE gtests
#   mpi    every PE its own host, the mpi engine (MPI-3 RMA): the PE gtests
# and checks that nothing is left in /dev/shm.
# usage: mpi_test.sh MODE COREMESH_CC TEST_SHMEM_PE FAULT_PROG SRC_DIR OUT_DIR
set -eu
mode=$1 cc_wrapper=$2 pe_tests=$3 fault_prog=$4 src=$5 out=$6
run=$(dirname "$0")/mpirun_net.sh
mkdir -p "$out"
. "$(dirname "$0")/../shm_names.sh"
shm_names_before "$out/shm_before.txt"
case $mode in
  net) n=3 ;;
  hosts) n=4 COREMESH_PES_PER_HOST=2 ;;
  mpi) n=3 COREMESH_TRANSPORT=mpi ;;
  *) echo "unknown mode $mode"; exit 2 ;;
esac
export COREMESH_PES_PER_HOST=${COREMESH_PES_PER_HOST:-1} COREMESH_TRANSPORT=${COREMESH_TRANSPORT:-ucx}

"$run" $n "$pe_tests" > "$out/pe.txt" 2>&1 || { cat "$out/pe.txt"; exit 1; }
grep -q 'PASSED' "$out/pe.txt" || { cat "$out/pe.txt"; exit 1; }
echo "PE tests ok with $n PEs ($mode)"

if [ "$mode" = net ]; then  # compiling them costs a minute under ASan: once
  programs="ring_put reduction globals ordering teams types contexts legacy collect alloc team_limits generics"
  pids=""
  for prog in $programs; do
    "$cc_wrapper" -std=c11 -Wall -Wextra -Werror -O1 "$src/$prog.c" -o "$out/$prog" &
    pids="$pids $!"
  done
  for pid in $pids; do wait "$pid"; done
  for prog in $programs; do
    "$run" $n "$out/$prog" > "$out/$prog.txt" 2>&1 || { cat "$out/$prog.txt"; exit 1; }
    [ "$(grep -c ' ok (0 errors)' "$out/$prog.txt")" -eq $n ] || { cat "$out/$prog.txt"; exit 1; }
  done
  echo "C programs ok with $n PEs ($mode)"
fi

if [ "$mode" = net ]; then
  start=$(date +%s)
  if "$run" 3 "$fault_prog" kill9 > "$out/kill9.txt" 2>&1; then
    echo "a job with a killed PE succeeded"; cat "$out/kill9.txt"; exit 1
  fi
  [ $(( $(date +%s) - start )) -lt 30 ] || { echo "the job took too long to stop"; exit 1; }
  echo "a killed PE stops the job"
  COREMESH_WAIT_TIMEOUT_S=1 "$run" 2 "$fault_prog" stalled_peer > "$out/stalled.txt" 2>&1 &&
    grep -q 'stalled peer ok' "$out/stalled.txt" || { cat "$out/stalled.txt"; exit 1; }
  echo "late answers to timed-out operations write nothing of the caller's"
fi
left=$(shm_names_left "$out/shm_before.txt")
[ -z "$left" ] || { echo "left in /dev/shm: $left"; exit 1; }
echo "nothing left in /dev/shm"
