#!/usr/bin/env bash
# Step throughput of every parallel layout that fits this machine, two builds
# of coremesh side by side in the same run (a change's before and after).
# Each round runs every layout with BASE then NEW, alternating; the table
# gives per layout the median tokens/s of each and the median of the
# per-round ratios NEW / BASE (1.00: the same speed; the machine is shared,
# read the ratios, not the absolute figures).
#   usage: bench/compare_builds.sh BASE_COREMESH NEW_COREMESH [steps] [rounds]
#   e.g.   bench/compare_builds.sh /work/base/build/coremesh build/coremesh 12 3
set -euo pipefail
cd "$(dirname "$0")/.."
BASE=$1
NEW=$2
. bench/lib.sh
bench_setup compare 12 3 "${@:3}"
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive
RAW=$WORK/raw.txt
# The demo model at a global batch of 2 x 8 x 128 tokens: one PE accumulates 2 micro-batches.
demo_config one "$STEPS" 1 2
demo_config two "$STEPS" 1 1
demo_config four "$STEPS" 1 4
LAYOUTS=("1 PE|one|"
         "dp 2|two|--dp 2"
         "dp 2 ZeRO-1|two|--dp 2 --zero 1"
         "ep 2|two|--ep 2"
         "tp 2|one|--tp 2"
         "tp 2 SP|one|--tp 2 --sequence-parallel true"
         "cp 2 ring|one|--cp 2 --aux-alpha 0"
         "pp 2 1f1b m 4|four|--pp 2 --schedule 1f1b"
         "pp 2 zb-h1 m 4|four|--pp 2 --schedule zb-h1"
         "pp 2 dualpipe m 4|four|--pp 2 --schedule dualpipe")
for round in $(seq "$ROUNDS"); do
  for i in "${!LAYOUTS[@]}"; do
    IFS='|' read -r name config flags <<<"${LAYOUTS[$i]}"
    # shellcheck disable=SC2086
    b=$(COREMESH=$BASE train_tokens "$config" $flags)
    # shellcheck disable=SC2086
    n=$(COREMESH=$NEW train_tokens "$config" $flags)
    echo "$i $b $n" >>"$RAW"
    echo "round $round: $name base $b new $n" >&2
  done
done
echo "| layout | base tokens/s | new tokens/s | new / base (median of rounds) |"
echo "|---|---:|---:|---:|"
for i in "${!LAYOUTS[@]}"; do
  IFS='|' read -r name _ _ <<<"${LAYOUTS[$i]}"
  b=$(awk -v i="$i" '$1 == i { print $2 }' "$RAW" | median)
  n=$(awk -v i="$i" '$1 == i { print $3 }' "$RAW" | median)
  r=$(awk -v i="$i" '$1 == i && $2 > 0 { print $3 / $2 }' "$RAW" | median)
  printf "| %s | %.0f | %.0f | %.2f |\n" "$name" "$b" "$n" "$r"
done
