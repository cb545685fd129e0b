#!/usr/bin/env bash
# Python launch overhead (bench/python_launch.py with its C++ peer
# bench_launch_overhead) and its section of docs/performance.md.
set -euo pipefail
cd "$(dirname "$0")/.."
out=$(PYTHONPATH=build/python /usr/bin/python3 bench/python_launch.py --build build "$@")
echo "$out"
python3 scripts/update_perf_section.py "Python" "bash bench/run_python_bench.sh" "$out"
