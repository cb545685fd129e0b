#!/usr/bin/env bash
# Runs the runtime benchmarks (bench/runtime_bench.cpp: each row coremesh and
# its peer in the same process, interleaved, medians) and prints their table
# for docs/performance.md, section "## Runtime" (`make bench-runtime` puts it there).
set -euo pipefail
cd "$(dirname "$0")/.."
./build/bench/bench_runtime_bench "$@"
