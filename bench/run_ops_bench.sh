#!/usr/bin/env bash
# Runs the kernel benchmarks and their peers in one go: every table
# (bench_ops_kernels, then PyTorch's attention from bench/ops_attention_torch.py)
# goes to stderr, their summary (bench/ops_summary.py: one table for
# docs/performance.md, "## Kernels") to stdout. --write also puts the summary
# into its block of docs/performance.md (scripts/update_perf_section.py).
#   bench/run_ops_bench.sh [--quick] [--write] [build-dir]
set -euo pipefail
cd "$(dirname "$0")/.."
quick="" write=0 build=build
for arg in "$@"; do
  case "$arg" in
    --quick) quick=--quick ;;
    --write) write=1 ;;
    *) build="$arg" ;;
  esac
done
cmake --build "$build" --target bench_ops_kernels >/dev/null
cores=$(nproc)
# The peers share the machine with whatever else runs: wait (up to 10 min)
# until the 1-minute load average drops below 1 so the ratios mean something.
for _ in $(seq 60); do
  awk '{exit !($1 < 1.0)}' /proc/loadavg && break
  sleep 10
done
out=$(mktemp)
trap 'rm -f "$out"' EXIT
{
  echo "Load average at start: $(cut -d' ' -f1-3 /proc/loadavg)."
  echo "Every row times coremesh and its peer in the same process (median of repeated runs)."
  echo "coremesh runs on the default device under a stream limit of \`cores\` cube/vector cores,"
  echo "each GEMM tile in coremesh's single-threaded AVX2 kernel; the peer sgemm runs with \`cores\` OpenBLAS threads."
  echo
  OPENBLAS_NUM_THREADS=1 OMP_WAIT_POLICY=passive "$build/bench/bench_ops_kernels" $quick
  echo "### PyTorch 1.13 manual attention (same shapes, ${cores} OpenBLAS threads)"
  echo
  OPENBLAS_NUM_THREADS=$cores OMP_WAIT_POLICY=passive /usr/bin/python3 bench/ops_attention_torch.py $quick
  echo
} >"$out"
cat "$out" >&2
summary=$(/usr/bin/python3 bench/ops_summary.py <"$out")
echo "$summary"
if [ "$write" = 1 ]; then
  python3 scripts/update_perf_section.py Kernels "bash bench/run_ops_bench.sh$( [ -n "$quick" ] && echo " --quick")" \
    "$summary"
fi
