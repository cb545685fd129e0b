#!/usr/bin/env bash
# Runs the graph replay benchmark (bench/graph_replay.cpp) and prints its table
# for docs/performance.md, section "## Graph replay" (`make bench-graph` puts it
# there); the bench's other lines (set-up, load average) go to stderr.
set -euo pipefail
cd "$(dirname "$0")/.."
cmake --build build --target bench_graph_replay >/dev/null
out=$(./build/bench/bench_graph_replay "$@")
grep -v '^|' <<<"$out" >&2 || true
grep '^|' <<<"$out"
