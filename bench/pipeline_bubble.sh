#!/usr/bin/env bash
# The bubble of each pipeline schedule as it runs, against the simulator fed
# with the F/B/W costs measured in the same run and the textbook formula, and
# each rank's peak activation memory against the schedule's slots (issue 16;
# bench/pipeline_bubble.cpp says what is measured). Prints one markdown table
# for docs/performance.md, section "## Pipeline parallelism" (per run its
# bubbles, then its ranks' memory as "rank 0 / rank 1 / ...", the slots
# followed by the simulator's where they differ), and to stderr the load
# average before and after (the machine is shared: read the ratios with it).
#   usage: bench/pipeline_bubble.sh [steps] [rounds]   (default 6 steps, 3 rounds)
# Each round runs every (schedule, pp, m) in turn; the table gives medians
# over the rounds of each run's median over its steps. Single runs:
#   build/coremesh run -n 2 build/bench/bench_pipeline_bubble data/bible-kjv.txt zb-h1 8 6
# (COREMESH_BENCH_VERBOSE=1: per step; COREMESH_BENCH_TIMELINE=1: action by action).
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=${1:-6}
ROUNDS=${2:-3}
COREMESH=${COREMESH:-build/coremesh}
BUILD=$(dirname "$COREMESH")
. bench/lib.sh
bench_workdir pipeline
demo_data
cmake --build "$BUILD" --target coremesh bench_pipeline_bubble >/dev/null
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive
RAW=$WORK/raw.txt
RUNS=("gpipe 2 8" "1f1b 2 8" "interleaved 2 8" "zb-h1 2 8" "zbv 2 8" "dualpipev 2 8" "dualpipe 2 8"
      "gpipe 4 8" "1f1b 4 8" "zb-h1 4 8")
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
for round in $(seq "$ROUNDS"); do
  for run in "${RUNS[@]}"; do
    set -- $run
    "$COREMESH" run -n "$2" "$BUILD/bench/bench_pipeline_bubble" data/bible-kjv.txt "$1" "$3" "$STEPS" 2 |
      sed "s/^/$1 $2 $3 /" >>"$RAW"
  done
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
echo "| schedule | pp | m | measured bubble | simulated (median costs) | measured / simulated | replayed (own durations) | measured / replayed | formula | chunk slots held, per rank | peak activations (MiB), per rank |"
echo "|---|---|---|---|---|---|---|---|---|---|---|"
join() { local IFS=/; echo "$*" | sed 's|/| / |g'; }
for run in "${RUNS[@]}"; do
  set -- $run
  rows=$(awk -v s="$1" -v p="$2" -v m="$3" '$1 == s && $2 == p && $3 == m && $4 == "bubble"' "$RAW")
  meas=$(echo "$rows" | awk '{ print $8 }' | median)
  sim=$(echo "$rows" | awk '{ print $9 }' | median)
  ratio=$(echo "$rows" | awk '{ print $8 / $9 }' | median)
  form=$(echo "$rows" | awk '{ print $10 == "-" ? "-" : sprintf("%.3f", $10) }' | head -1)
  replay=$(echo "$rows" | awk '{ print $11 }' | median)
  replay_ratio=$(echo "$rows" | awk '{ print $8 / $11 }' | median)
  held=() simslots=() mib=()
  for r in $(seq 0 $(($2 - 1))); do
    rows=$(awk -v s="$1" -v p="$2" -v m="$3" -v r="$r" '$1 == s && $2 == p && $3 == m && $4 == "memory" && $5 == r' "$RAW")
    held+=("$(echo "$rows" | awk '{ print $6 }' | median)")
    simslots+=("$(echo "$rows" | awk '{ print $7 }' | head -1)")
    mib+=("$(printf "%.1f" "$(echo "$rows" | awk '{ print $8 }' | median)")")
  done
  slots=$(join "${held[@]}")
  [ "$slots" = "$(join "${simslots[@]}")" ] || slots="$slots (simulated $(join "${simslots[@]}"))"
  printf "| %s | %s | %s | %.3f | %.3f | %.2f | %.3f | %.2f | %s | %s | %s |\n" "$1" "$2" "$3" "$meas" "$sim" "$ratio" \
    "$replay" "$replay_ratio" "$form" "$slots" "$(join "${mib[@]}")"
done
