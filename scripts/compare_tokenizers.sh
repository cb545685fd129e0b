#!/usr/bin/env bash
# Bytes against BPE vocabularies for the `make run` demo at equal training
# time: held-out bits per byte (docs/performance.md, "Tokenizer").
#
# Each candidate's step time is the median of ROUNDS interleaved probes of
# PROBE_STEPS steps (a shared machine drifts: the candidates take turns).
# Bytes train STEPS steps; each BPE vocabulary trains the steps that take
# the same time at its measured step time (its full LR schedule over them).
# Every model is then scored by `coremesh eval` on the whole held-out text
# (the corpus's last 2%, the demo's val_fraction), so all see the same bytes.
#
# Environment: VOCABS (default "2048 4096"), STEPS (200), PROBE_STEPS (8),
# ROUNDS (3), COREMESH (build/coremesh), OUT (out/tokenizer-compare).
set -euo pipefail
cd "$(dirname "$0")/.."

COREMESH=${COREMESH:-build/coremesh}
VOCABS=${VOCABS:-"2048 4096"}
STEPS=${STEPS:-200}
PROBE_STEPS=${PROBE_STEPS:-8}
ROUNDS=${ROUNDS:-3}
OUT=${OUT:-out/tokenizer-compare}
mkdir -p "$OUT"

DEMO_OUT="$OUT/demo" DEMO_CONFIG_ONLY=1 DEMO_TOKENIZER=bytes bash scripts/run-demo.sh >/dev/null
CONFIG="$OUT/demo/demo-config.json"
size=$(wc -c <data/bible-kjv.txt)
# as TextDataset splits: the last floor(size x 0.02) bytes
tail -c "$(awk -v s="$size" 'BEGIN { printf "%d", s * 0.02 }')" data/bible-kjv.txt >"$OUT/heldout.txt"

candidates="bytes"
for v in $VOCABS; do
  start=$(date +%s.%N)
  "$COREMESH" tokenizer train --vocab "$v" --model bpe --data data/bible-kjv.txt --val-fraction 0.02 \
    --out "$OUT/bpe$v.model" | sed 's/^/compare: /'
  echo "compare: bpe$v tokenizer trained and written in $(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }') s"
  candidates="$candidates bpe$v"
done

flags() {  # the candidate's train flags
  case "$1" in
    bytes) echo "--vocab-size 256" ;;
    bpe*) echo "--tokenizer $OUT/$1.model --vocab-size ${1#bpe}" ;;
  esac
}

declare -A probes
for r in $(seq "$ROUNDS"); do
  for c in $candidates; do
    # shellcheck disable=SC2046
    s=$("$COREMESH" train --config "$CONFIG" $(flags "$c") --steps "$PROBE_STEPS" --warmup 2 --val-every 0 \
          --ckpt-every 0 --sample-tokens 0 --report false --no-progress --out "$OUT/probe-$c" 2>/dev/null |
        sed -n 's/^throughput: \([0-9.]*\) tokens\/s.*/\1/p')
    probes[$c]="${probes[$c]:-} $(awk -v t="$s" 'BEGIN { printf "%.5f", 1024 / t }')"  # seconds per step
    rm -rf "$OUT/probe-$c"
  done
done
median() { tr ' ' '\n' | grep . | sort -g | awk '{ a[NR] = $1 } END { print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }
t_bytes=$(echo "${probes[bytes]}" | median)

printf '| candidate | s/step (median of %s) | steps | training s | held-out tokens | held-out bits/byte |\n|---|---|---|---|---|---|\n' "$ROUNDS" >"$OUT/table.md"
for c in $candidates; do
  t=$(echo "${probes[$c]}" | median)
  steps=$(awk -v b="$t_bytes" -v t="$t" -v n="$STEPS" 'BEGIN { printf "%d", n * b / t + 0.5 }')
  start=$(date +%s.%N)
  # shellcheck disable=SC2046
  "$COREMESH" train --config "$CONFIG" $(flags "$c") --steps "$steps" --warmup 20 --val-every 0 --ckpt-every 0 \
    --sample-tokens 0 --report false --no-progress --overwrite --out "$OUT/run-$c" >"$OUT/run-$c.log" 2>&1
  secs=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.0f", b - a }')
  line=$("$COREMESH" eval --checkpoint "$OUT/run-$c" --data "$OUT/heldout.txt" | tail -1)
  bpb=$(echo "$line" | sed -n 's/.* = \([0-9.]*\) bits\/byte.*/\1/p')
  tokens=$(echo "$line" | sed -n 's/^eval: \([0-9]*\) tokens.*/\1/p')
  echo "compare: $c: $steps steps in $secs s; held-out $line"
  echo "| $c | $t (${probes[$c]# }) | $steps | $secs | $tokens | $bpb |" >>"$OUT/table.md"
done
cat "$OUT/table.md"
