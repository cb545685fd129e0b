#!/usr/bin/env bash
# Python launch overhead (bench/python_launch.py with its C++ peer
# bench_launch_overhead): prints the table for docs/performance.md, section
# "## Python" (`make bench-python` puts it there); the set-up and the ratio
# against torch go to stderr.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHONPATH=build/python /usr/bin/python3 bench/python_launch.py --build build "$@"
