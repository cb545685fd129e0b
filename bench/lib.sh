# Shell helpers of the training benchmarks (sourced, not run).
#   bench_setup NAME STEPS ROUNDS "$@"
#                            STEPS / ROUNDS from the script's arguments (else these
#                            defaults), COREMESH (build/coremesh unless set) and its
#                            BUILD dir, bench_workdir NAME, demo_data
#   train_tokens CONFIG [FLAGS...]
#                            tokens/s of `coremesh train` on $WORK/CONFIG.json
#   bench_workdir NAME       WORK=/tmp/coremesh_bench_NAME.XXXXXX, removed at exit
#   demo_data                data/bible-kjv.txt from Debian's bible-kjv, if missing
#   demo_config OUT STEPS THREADS [GRAD_ACCUM]
#                            the `make run` demo config (bench/train_demo_config.json)
#                            with no validation or checkpoints, its run in $WORK/run_<OUT>
#   median                   the median of the numbers on stdin, one per line

bench_setup() {
  STEPS=${4:-$2}
  ROUNDS=${5:-$3}
  COREMESH=${COREMESH:-build/coremesh}
  BUILD=$(dirname "$COREMESH")
  bench_workdir "$1"
  demo_data
}

bench_workdir() {
  WORK=$(mktemp -d "/tmp/coremesh_bench_$1.XXXXXX")
  trap 'rm -rf "$WORK"' EXIT
}

demo_data() {
  [ -s data/bible-kjv.txt ] || { mkdir -p data; bible "gen1:1-rev22:21" </dev/null >data/bible-kjv.txt; }
}

demo_config() {
  sed -e "s/\"steps\": [0-9]*/\"steps\": $2/" -e "s/\"threads\": [0-9]*/\"threads\": $3/" \
      -e "s/\"grad_accum\": [0-9]*/\"grad_accum\": ${4:-1}/" \
      -e "s/\"val_every\": [0-9]*/\"val_every\": 0/" -e "s/\"ckpt_every\": [0-9]*/\"ckpt_every\": 0/" \
      -e "s|\"out_dir\": \"[^\"]*\"|\"out_dir\": \"$WORK/run_$1\"|" bench/train_demo_config.json >"$WORK/$1.json"
}

median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

train_tokens() {
  "$COREMESH" train --config "$WORK/$1.json" --overwrite --no-progress --sample-tokens 0 --val-batches 1 --report false "${@:2}" \
    | sed -n 's/^throughput: \([0-9.]*\) tokens\/s.*/\1/p'
}
