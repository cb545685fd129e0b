#!/usr/bin/env bash
# The aux-loss-free router bias on the `make run` demo (BPE 8192, 135 steps):
# expert balance (busiest expert's selections / mean, per MoE layer and step)
# over the run for each bias step, per seed, and the balance of 10-step mean
# loads (what the bias can reach: a step's own batch content it cannot know).
# AUX_ALPHAS="0.01 0.1" adds runs of the demo's bias step (margin 0.5) with
# the sequence-wise balance loss at those weights (aux_loss_alpha; the demo's
# is 0.001) and an aux column.
#   usage: [AUX_ALPHAS=...] bench/router_bias.sh [seeds]   (default 2: seeds 1..2)
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
SEEDS=${1:-2}
COREMESH=${COREMESH:-build/coremesh}
bench_workdir router_bias
demo_data
export OPENBLAS_NUM_THREADS=1
DEMO_CONFIG_ONLY=1 DEMO_OUT="$WORK" bash scripts/run-demo.sh >/dev/null
"$COREMESH" tokenizer train --vocab 8192 --model bpe --data data/bible-kjv.txt --val-fraction 0.02 \
  --out "$WORK/bpe8192.model" >/dev/null
# one run per line: bias step, rate, aux weight (- : the demo's)
RUNS="sign 0.003 -
proportional 0.03 -
margin 0.5 -
margin 0.8 -
margin 1.0 -"
for alpha in ${AUX_ALPHAS:-}; do RUNS="$RUNS
margin 0.5 $alpha"; done
echo "$RUNS" >"$WORK/runs"
for seed in $(seq "$SEEDS"); do
  while read -r mode rate alpha; do
    name="$mode-$rate-$alpha-seed$seed"
    /usr/bin/python3 - "$WORK" "$name" "$mode" "$rate" "$alpha" "$seed" <<'PY'
import json, sys
work, name, mode, rate, alpha, seed = sys.argv[1:]
c = json.load(open(f"{work}/demo-config.json"))
c["model"]["bias_update"], c["model"]["bias_update_rate"] = mode, float(rate)
if alpha != "-":
    c["model"]["aux_loss_alpha"] = float(alpha)
c["train"].update(seed=int(seed), out_dir=f"{work}/{name}", tokenizer=f"{work}/bpe8192.model", ckpt_every=0)
json.dump(c, open(f"{work}/{name}.json", "w"))
PY
    "$COREMESH" train --config "$WORK/$name.json" --overwrite --no-progress --sample-tokens 0 --report false \
      >/dev/null </dev/null
  done <"$WORK/runs"
done
/usr/bin/python3 - "$WORK" "$SEEDS" <<'PY'
import glob, json, statistics as st, sys
work, seeds = sys.argv[1], int(sys.argv[2])
print(f"`make run`'s demo (BPE 8192, 135 steps, 8 x 128 tokens per step, 3 MoE layers of 8 experts, top-2), "
      f"seeds 1..{seeds}; balance per (layer, step)")
print()
runs = [line.split() for line in open(f"{work}/runs")]
aux = any(alpha != "-" for _, _, alpha in runs)  # the aux column only when weights were given
print("| bias step | rate |" + (" aux weight |" if aux else "") + " seed | steps 1-50 median | all steps <= 1.5 from | 51+ median | 51+ <= 1.5 | 51+ <= 1.25 "
      "| 51+ worst | 10-step mean loads, 51+ median | final loss | val bits/byte |")
print("|---|---:|" + ("---:|" if aux else "") + "---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
for seed in range(1, seeds + 1):
    for mode, rate, alpha in runs:
        rows = [json.loads(l) for l in open(f"{work}/{mode}-{rate}-{alpha}-seed{seed}/metrics.jsonl")]
        early = [b for r in rows if r["step"] <= 50 for b in r["expert_balance"]]
        late = [b for r in rows if r["step"] > 50 for b in r["expert_balance"]]
        worst = {r["step"]: max(r["expert_balance"]) for r in rows}
        settled = min((s for s in worst if all(m <= 1.5 for t, m in worst.items() if t >= s)), default=None)
        windows = []
        for w0 in range(51, rows[-1]["step"] + 1, 10):
            ws = [r for r in rows if w0 <= r["step"] < w0 + 10]
            for l in range(len(ws[0]["expert_load"])):
                mean_load = [st.fmean(r["expert_load"][l][e] for r in ws) for e in range(len(ws[0]["expert_load"][l]))]
                windows.append(max(mean_load) / st.fmean(mean_load))
        val = [r["val_bits_per_byte"] for r in rows if "val_bits_per_byte" in r]
        demo_alpha = json.load(open(f"{work}/demo-config.json"))["model"]["aux_loss_alpha"]
        print(f"| {mode} | {rate} |" + (f" {demo_alpha if alpha == '-' else alpha} |" if aux else "") + f" {seed} | {st.median(early):.2f} | {settled} | {st.median(late):.3f} | "
              f"{sum(b <= 1.5 for b in late) / len(late):.0%} | {sum(b <= 1.25 for b in late) / len(late):.0%} | "
              f"{max(late):.2f} | {st.median(windows):.3f} | {rows[-1]['loss']:.3f} | {val[-1]:.3f} |")
PY
