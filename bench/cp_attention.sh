#!/usr/bin/env bash
# Context parallelism's traffic and memory on the demo model's layers at one
# long sequence: bench_cp_attention (bench/cp_attention.cpp says what it
# measures) under `coremesh run -n CP` for cp 1, ring at cp 2 and 4, Ulysses at
# cp 2 and 4. Prints one markdown table for docs/performance.md, section
# "## Context parallel": the bytes each PE puts per step against the formula,
# the activations saved for the backward against cp 1, the CP buffers. The
# bench's own lines (with the step time, slowest PE) go to stderr; the
# throughput of CP against one PE is bench/train_tp_cp.sh's.
#   usage: bench/cp_attention.sh [T] [iterations]   (default 4096 tokens, 3)
set -euo pipefail
cd "$(dirname "$0")/.."
T=${1:-4096}
ITERS=${2:-3}
COREMESH=${COREMESH:-build/coremesh}
BUILD=$(dirname "$COREMESH")
cmake --build "$BUILD" --target coremesh bench_cp_attention >/dev/null
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive
raw=$(for l in "1 ring" "2 ring" "4 ring" "2 ulysses" "4 ulysses"; do
  set -- $l
  "$COREMESH" run -n "$1" "$BUILD/bench/bench_cp_attention" "$2" "$T" "$ITERS"
done)
echo "$raw" >&2
/usr/bin/python3 - "$raw" <<'PY'
import re, sys
pat = re.compile(r"cp (\d+) (\w+) T \d+: step .*?; bytes put per step per PE (\d+), formula (\d+) \((\w+)\); "
                 r"saved activations ([\d.]+) MiB; CP buffers ([\d.]+) MiB")
rows = [m.groups() for m in map(pat.search, sys.argv[1].splitlines()) if m]
one = next((float(r[5]) for r in rows if r[0] == "1"), None)
mib = lambda b: f"{int(b) / (1 << 20):.1f} MiB"
print("| layout | bytes put / step / PE | formula | saved activations | vs cp 1 | CP buffers |")
print("|---|---:|---:|---:|---:|---:|")
for cp, comm, put, formula, check, act, buf in rows:
    name = "cp 1" if cp == "1" else f"cp {cp} {comm}"
    vs = "1" if cp == "1" else (f"1/{one / float(act):.2f}" if one else "-")
    print(f"| {name} | {mib(put)} | {mib(formula)}{'' if check == 'equal' else ' (MISMATCH)'} | {float(act):.1f} MiB | "
          f"{vs} | {float(buf):.1f} MiB |")
PY
