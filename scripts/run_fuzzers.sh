#!/usr/bin/env bash
# Runs each libFuzzer harness of the bad-input targets (fuzz/) for SECONDS
# from the seeds of fuzz_write_seeds, keeping the grown corpus between runs
# (BUILD/fuzz/corpus/<target>) and any crashing input in BUILD/fuzz/findings/.
# Prints one line per target: runs, corpus size, coverage, and the verdict.
# usage: run_fuzzers.sh BUILD_DIR [SECONDS] [TARGET...]
set -uo pipefail
build=$1 seconds=${2:-60}
shift $(( $# >= 2 ? 2 : 1 ))
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(config schedule safetensors data)
dir=$build/fuzz
"$dir/fuzz_write_seeds" "$dir/seeds" >/dev/null || exit 1
mkdir -p "$dir/findings"
status=0
for t in "${targets[@]}"; do
  mkdir -p "$dir/corpus/$t"
  log=$dir/$t.log
  # -timeout: an input that takes over 5 s is a hang; -rss_limit_mb: one that
  # allocates over 2 GiB is a finding too.
  ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
    "$dir/fuzz_$t" -max_total_time="$seconds" -timeout=5 -rss_limit_mb=2048 -print_final_stats=1 \
      -dict="$dir/seeds/$t.dict" -artifact_prefix="$dir/findings/$t-" \
      "$dir/corpus/$t" "$dir/seeds/$t" > "$log" 2>&1
  rc=$?
  runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$')
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1)
  corpus=$(ls "$dir/corpus/$t" | wc -l)
  if [ $rc -eq 0 ]; then
    echo "$t: ${runs:-?} inputs in ${seconds} s, corpus $corpus, $cov, no finding"
  else
    echo "$t: FINDING after ${runs:-?} inputs (exit $rc); see $log and $dir/findings/"
    grep -m3 -E 'ERROR|runtime error|terminate|what\(\)' "$log"
    status=1
  fi
done
exit $status
