#!/usr/bin/env bash
# Runs the graph replay benchmark and writes its section of docs/performance.md.
set -euo pipefail
cd "$(dirname "$0")/.."
cmake --build build --target bench_graph_replay >/dev/null
out=$(./build/bench/bench_graph_replay "$@")
echo "$out"
python3 scripts/update_perf_section.py "Graph replay" "bash bench/run_graph_bench.sh" "$out"
