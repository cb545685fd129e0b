#!/bin/sh
# Builds the plain C OpenSHMEM programs in c/ with coremesh-cc (C11,
# warnings as errors) and runs each under the launcher at several PE counts,
# then checks that no /dev/shm name of a job survived.
# usage: c_programs_test.sh COREMESH_CC RUNNER SRC_DIR OUT_DIR
set -eu
cc_wrapper=$1 runner=$2 src=$3 out=$4
mkdir -p "$out"
ls /dev/shm | grep '^cm-' > "$out/shm_before.txt" || true
for prog in hello ring_put reduction globals; do
  "$cc_wrapper" -std=c11 -Wall -Wextra -Werror -O2 "$src/$prog.c" -o "$out/$prog"
done
for n in 1 2 3 4 8; do
  "$runner" run -n $n "$out/hello" > "$out/hello.$n.txt"
  [ "$(grep -c '^Hello from PE' "$out/hello.$n.txt")" -eq $n ] || { cat "$out/hello.$n.txt"; exit 1; }
  for prog in ring_put reduction globals; do
    "$runner" run -n $n --tag-output "$out/$prog" > "$out/$prog.$n.txt" 2>&1 || { cat "$out/$prog.$n.txt"; exit 1; }
    [ "$(grep -c ': .* ok (0 errors)' "$out/$prog.$n.txt")" -eq $n ] || { cat "$out/$prog.$n.txt"; exit 1; }
  done
  echo "C programs ok with $n PEs"
done
# Leaked names stay forever; names of jobs other tests run right now vanish
# within their init, so wait a little before calling a new name leaked.
for try in 1 2 3 4 5 6 7 8 9 10; do
  left=$(ls /dev/shm | grep '^cm-' | grep -vxF -f "$out/shm_before.txt" || true)
  [ -z "$left" ] && break
  sleep 1
done
[ -z "$left" ] || { echo "left in /dev/shm: $left"; exit 1; }
echo "nothing left in /dev/shm"
