#!/bin/sh
# Builds the plain C OpenSHMEM programs in c/ with coremesh-cc (C11,
# warnings as errors) and runs each under the launcher at several PE counts
# (non-powers of two included), on the shm transport and on shm-rma (no
# load/store between PEs), then checks the standard environment variables
# and that no /dev/shm name of a job survived.
# usage: c_programs_test.sh COREMESH_CC RUNNER SRC_DIR OUT_DIR
set -eu
cc_wrapper=$1 runner=$2 src=$3 out=$4
mkdir -p "$out"
. "$(dirname "$0")/../shm_names.sh"
shm_names_before "$out/shm_before.txt"
programs="ring_put reduction globals ordering teams types contexts legacy collect alloc team_limits symbols generics profiling wait_sets"
pids=""
for prog in hello heap $programs; do
  "$cc_wrapper" -std=c11 -Wall -Wextra -Werror -O1 "$src/$prog.c" -o "$out/$prog" &
  pids="$pids $!"
done
for pid in $pids; do wait "$pid"; done  # set -e: a failed build fails the test
# Runs PROG on N PEs and expects one "ok (0 errors)" line per PE.
expect_ok() {
  n=$1 prog=$2
  shift 2
  "$@" "$runner" run -n "$n" --tag-output "$out/$prog" > "$out/$prog.$n.txt" 2>&1 || { cat "$out/$prog.$n.txt"; exit 1; }
  [ "$(grep -c ': .* ok (0 errors)' "$out/$prog.$n.txt")" -eq "$n" ] || { cat "$out/$prog.$n.txt"; exit 1; }
}
for n in 1 2 3 4 5 8; do
  "$runner" run -n $n "$out/hello" > "$out/hello.$n.txt"
  [ "$(grep -c '^Hello from PE' "$out/hello.$n.txt")" -eq $n ] || { cat "$out/hello.$n.txt"; exit 1; }
  for prog in $programs; do expect_ok $n $prog; done
  echo "C programs ok with $n PEs"
done
for n in 2 3 8; do
  for prog in $programs; do expect_ok $n $prog env COREMESH_TRANSPORT=shm-rma; done
  echo "C programs ok with $n PEs on shm-rma"
done
# The standard environment: SHMEM_SYMMETRIC_SIZE sizes the heap (2 x 64 MiB
# need more than 128 MiB), and the default heap holds them too.
expect_ok 3 heap env -u COREMESH_HEAP_SIZE SHMEM_SYMMETRIC_SIZE=160M
expect_ok 2 heap env -u COREMESH_HEAP_SIZE -u SHMEM_SYMMETRIC_SIZE
if env -u COREMESH_HEAP_SIZE SHMEM_SYMMETRIC_SIZE=100M "$runner" run -n 2 "$out/heap" > "$out/heap.small.txt" 2>&1; then
  echo "a 100 MiB heap held 128 MiB"; exit 1
fi
grep -q "symmetric heap exhausted" "$out/heap.small.txt" || { cat "$out/heap.small.txt"; exit 1; }
SHMEM_VERSION=1 "$runner" run -n 2 "$out/hello" > "$out/version.txt"
[ "$(grep -c 'OpenSHMEM 1.5' "$out/version.txt")" -ge 1 ] || { cat "$out/version.txt"; exit 1; }
SHMEM_INFO=1 "$runner" run -n 2 "$out/hello" > "$out/info.txt"
grep -q 'SHMEM_SYMMETRIC_SIZE' "$out/info.txt" || { cat "$out/info.txt"; exit 1; }
SHMEM_DEBUG=1 "$runner" run -n 2 "$out/hello" > "$out/debug.txt" 2>&1
[ "$(grep -c 'shmem debug\] PE' "$out/debug.txt")" -eq 2 ] || { cat "$out/debug.txt"; exit 1; }
echo "environment variables ok"
left=$(shm_names_left "$out/shm_before.txt")
[ -z "$left" ] || { echo "left in /dev/shm: $left"; exit 1; }
echo "nothing left in /dev/shm"
