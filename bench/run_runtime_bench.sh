#!/usr/bin/env bash
# Runs the runtime benchmarks and writes their section of docs/performance.md.
set -euo pipefail
cd "$(dirname "$0")/.."
out=$(./build/bench/bench_runtime_bench "$@")
echo "$out"
python3 scripts/update_perf_section.py "Runtime" "bash bench/run_runtime_bench.sh" "$out"
