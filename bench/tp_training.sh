#!/usr/bin/env bash
# Tensor parallelism's traffic and memory on the demo model's shapes:
# bench_tp_training (bench/tp_training.cpp says what it measures) under
# `coremesh run -n N`: one PE with 2 cores, then tp 2 and tp 4 (one core per
# PE), each without and with sequence parallelism. Prints one markdown table
# for docs/performance.md, section "## Tensor parallel": the bytes each PE puts
# per step against the formula, the activations a micro-batch saves for its
# backward against estimate_memory's figure. The bench's own lines (with step
# times and tokens/s of forward + backward) go to stderr; throughput against
# one PE is bench/train_tp_cp.sh's.
#   usage: bench/tp_training.sh [B] [T] [iterations]   (default 8 x 128 tokens, 3)
set -euo pipefail
cd "$(dirname "$0")/.."
B=${1:-8}
T=${2:-128}
ITERS=${3:-3}
COREMESH=${COREMESH:-build/coremesh}
BUILD=$(dirname "$COREMESH")
cmake --build "$BUILD" --target coremesh bench_tp_training >/dev/null
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive
raw=$("$COREMESH" run -n 1 "$BUILD/bench/bench_tp_training" "$B" "$T" "$ITERS" 2
      for n in 2 4; do "$COREMESH" run -n "$n" "$BUILD/bench/bench_tp_training" "$B" "$T" "$ITERS"; done)
echo "$raw" >&2
/usr/bin/python3 - "$raw" <<'PY'
import re, sys
pat = re.compile(r"tp (\d+)( \+ SP)? \(.*?\) B \d+ T \d+: .*?bytes put per step per PE (\d+), formula (\d+) "
                 r"\((\w+)\); saved activations per PE ([\d.]+) MiB \(estimate ([\d.]+)\)")
rows = [m.groups() for m in map(pat.search, sys.argv[1].splitlines()) if m]
plain = {tp: float(act) for tp, sp, _, _, _, act, _ in rows if not sp}
print("| layout | bytes put / step / PE | formula | saved activations / PE | estimate |")
print("|---|---:|---:|---:|---:|")
for tp, sp, put, formula, check, act, est in rows:
    name = "1 PE" if tp == "1" else f"tp {tp}{' + SP' if sp else ''}"
    saved = f"{float(act):.2f} MiB"
    if sp and plain.get(tp):
        saved += f" ({(float(act) / plain[tp] - 1) * 100:+.1f}%)".replace("-", "−")
    print(f"| {name} | {int(put):,} | {int(formula):,}{'' if check == 'equal' else ' (MISMATCH)'} | {saved} | "
          f"{float(est):.2f} MiB |")
PY
