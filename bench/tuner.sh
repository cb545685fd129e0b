#!/usr/bin/env bash
# The tiling tuner (runtime/tuner.hpp): (1) bench_tuner, the tuner's pick
# against an exhaustive search on GEMM shapes of the demo model and of a
# d 1024 config (bench/tuner.cpp says how); (2) end to end, the demo model's
# training step with and without the tuning cache that `coremesh tune` made
# for that layout, and with and without --fused-comm: 1 PE x 2 threads, tp 2
# (its fused all-reduce's chunk count tuned), tp 2 + SP, ep 2 and dp 2 x ep 2
# x tp 2 + SP (1 core per PE: 2 and 8 PEs share the machine's 2). ROUNDS rounds of STEPS steps, alternating; medians.
# Prints the tables for docs/performance.md, section "## Tiling auto-tuner".
#   usage: bench/tuner.sh [steps] [rounds]   (default 12 steps, 3 rounds)
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
bench_setup tuner 12 3 "$@"
cmake --build "$BUILD" --target coremesh bench_tuner >/dev/null
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive
RAW=$WORK/raw.txt
"$BUILD/bench/bench_tuner" >"$RAW"
demo_config one "$STEPS" 2
demo_config pes "$STEPS" 1
LAYOUTS=("one|1 PE x 2 threads|" "pes|tp 2|--tp 2" "pes|tp 2 + SP|--tp 2 --sequence-parallel" "pes|ep 2|--ep 2"
         "pes|dp 2 x ep 2 x tp 2 + SP, ZeRO-1|--dp 2 --ep 2 --tp 2 --sequence-parallel --zero 1")
for i in "${!LAYOUTS[@]}"; do
  IFS='|' read -r cfg name flags <<<"${LAYOUTS[$i]}"
  for fused in false true; do  # one cache with the keys of both (the fused edges run other GEMMs)
    [ "$cfg" = one ] && [ $fused = true ] && continue
    # shellcheck disable=SC2086
    "$COREMESH" tune --config "$WORK/$cfg.json" --tune-cache "$WORK/tuning_$i.json" --no-progress $flags \
      --fused-comm $fused | awk -v i="$i" -v f=$fused '/tuned [0-9]* op keys/ && !n++ { print "tune " i " " f " " $0 }' \
      >>"$WORK/tune.txt"
  done
done
for _ in $(seq "$ROUNDS"); do
  for i in "${!LAYOUTS[@]}"; do
    IFS='|' read -r cfg name flags <<<"${LAYOUTS[$i]}"
    for fused in false true; do
      [ "$cfg" = one ] && [ $fused = true ] && continue  # no TP: nothing to fuse
      # shellcheck disable=SC2086
      echo "train $i $fused heuristic $(train_tokens "$cfg" $flags --fused-comm $fused)" >>"$RAW"
      # shellcheck disable=SC2086
      echo "train $i $fused tuned $(train_tokens "$cfg" $flags --fused-comm $fused --tune-cache "$WORK/tuning_$i.json")" >>"$RAW"
    done
  done
done
printf '%s\n' "${LAYOUTS[@]}" >"$WORK/layouts.txt"
/usr/bin/python3 - "$RAW" "$WORK/tune.txt" "$WORK/layouts.txt" <<'PY'
import collections, statistics, sys
train = collections.defaultdict(list)
print("| GEMM M x K x N | tilings | evaluations: tuner / exhaustive | heuristic ms | exhaustive best ms | tuner's pick ms | pick / best |")
print("|---|---|---|---|---|---|---|")
for line in open(sys.argv[1]):
    f = line.split()
    if f[0] == "shape":
        v = dict(zip(f[4::2], f[5::2]))
        pick, best = float(v["tuned_ms"]), float(v["best_ms"])
        print(f"| {f[1]} x {f[2]} x {f[3]} | {v['candidates']} | {v['evals_tuner']} / {v['evals_exhaustive']} "
              f"({int(v['evals_tuner']) / int(v['evals_exhaustive']):.0%}) | {float(v['heuristic_ms']):.3f} | {best:.3f} | "
              f"{pick:.3f} | {pick / best:.3f} |")
    elif f[0] == "train" and len(f) == 5:
        train[(int(f[1]), f[2], f[3])].append(float(f[4]))
layouts = [l.split("|")[1] for l in open(sys.argv[3]).read().splitlines()]
print()
for l in open(sys.argv[2]):
    i, fused, text = l.split(" ", 3)[1:]
    print(f"- `coremesh tune`, {layouts[int(i)]}{', --fused-comm' if fused == 'true' else ''}: {text.strip()}")
print()
print("| layout (tokens/s, median) | unfused, heuristic | unfused, tuned | fused, heuristic | fused, tuned | tuned / heuristic | fused / unfused |")
print("|---|---:|---:|---:|---:|---:|---:|")
med = lambda k: statistics.median(train[k]) if train[k] else float("nan")
for i, name in enumerate(layouts):
    uh, ut, fh, ft = (med((i, f, t)) for f in ("false", "true") for t in ("heuristic", "tuned"))
    if i == 0:
        print(f"| {name} | {uh:.0f} | {ut:.0f} | | | {ut / uh:.3f}x | |")
    else:
        print(f"| {name} | {uh:.0f} | {ut:.0f} | {fh:.0f} | {ft:.0f} | {ut / uh:.3f}x, {ft / fh:.3f}x | {fh / uh:.3f}x, {ft / ut:.3f}x |")
PY
