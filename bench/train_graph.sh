#!/usr/bin/env bash
# Training throughput in graph mode (`coremesh train --graph`: the second
# step captured, every later one replayed) vs eager, on the `make run` demo
# model, 1 and 2 cores, in the same run. Each round runs eager then graph;
# the table gives the medians over the rounds of each side's tokens/s and of
# the per-round ratio, and what the graph passes made of the step.
# Prints a markdown table for docs/performance.md, section "## Graph mode training".
#   usage: bench/train_graph.sh [steps] [rounds]   (default 20 steps, 5 rounds)
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
bench_setup graph 20 5 "$@"
tokens() { sed -n 's/^throughput: \([0-9.]*\) tokens\/s.*/\1/p'; }
echo "| cores | eager tokens/s | graph tokens/s | ratio |"
echo "|---|---|---|---|"
for cores in 1 2; do
  demo_config cfg "$STEPS" "$cores"
  : >"$WORK/eager"; : >"$WORK/graph"; : >"$WORK/ratio"
  for _ in $(seq "$ROUNDS"); do
    eager=$("$COREMESH" train --config "$WORK/cfg.json" --overwrite --no-progress --report false | tokens)
    "$COREMESH" train --config "$WORK/cfg.json" --overwrite --no-progress --report false --graph >"$WORK/graph.log"
    graph=$(tokens <"$WORK/graph.log")
    echo "$eager" >>"$WORK/eager"; echo "$graph" >>"$WORK/graph"
    awk -v a="$graph" -v b="$eager" 'BEGIN { printf "%.4f\n", a / b }' >>"$WORK/ratio"
  done
  printf "| %s | %.0f | %.0f | %.3fx |\n" "$cores" "$(median <"$WORK/eager")" "$(median <"$WORK/graph")" \
    "$(median <"$WORK/ratio")"
done
echo
grep '^graph:' "$WORK/graph.log"
