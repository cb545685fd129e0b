#!/usr/bin/env bash
# Token-sliced MoE replicas on the network path (issue 26): 2 PEs under
# mpirun, every PE its own host (UCX over TCP on loopback), ep 2, R = 2.
# The --profile trace shows each slice's kernels on its own stream track
# ("moe slice i", "moe comm i"), and scripts/trace_overlap.py fails unless at
# least half of each PE's transfer time (its parked ep_wait intervals: rows
# on their way) overlaps compute kernels. (The exchange's own copy kernels
# use the PE's one core: nothing runs beside them; the script reports them.)
# Routing to every expert (top_k = E) keeps the PEs' loads even, so the
# waits are the exchange's, not a hot expert's.
# Usage: moe_overlap_test.sh <coremesh executable> <work dir>
set -euo pipefail
exe=$1
work=$2
here=$(cd "$(dirname "$0")" && pwd)
rm -rf "$work" && mkdir -p "$work"

python3 "$here/tiny_run.py" "$work" 7 '{"model": {"d_model": 256, "n_layers": 3, "max_seq_len": 128,
  "n_heads": 8, "n_kv_heads": 4, "dense_hidden": 512, "n_routed_experts": 4, "top_k": 4, "expert_hidden": 256},
  "train": {"batch_size": 8, "seq_len": 128, "steps": 4, "warmup_steps": 1, "val_every": 0, "val_batches": 1,
  "ckpt_every": 0}, "parallel": {"ep": 2, "moe_replicas": 2}}'

# A PE has one core: what other processes of the machine take from it shows
# up as waits. ctest runs this test alone (RUN_SERIAL); the best of three
# runs counts.
for attempt in 1 2 3; do
  rm -rf "$work/profile"
  SHMEM_SYMMETRIC_SIZE=512M "$here/../shmem/mpirun_net.sh" 2 "$exe" train --config "$work/cfg.json" --no-progress --overwrite \
    --profile "$work/profile" >"$work/log" 2>&1 || { cat "$work/log"; echo "FAIL: the ep=2 run failed"; exit 1; }
  grep -q "moe slice 1 of stream" "$work/profile/pe0/trace_pe0.json" ||
    { echo "FAIL: the trace has no track of its own for slice 1"; exit 1; }
  python3 "$here/../../scripts/trace_overlap.py" "$work/profile" --skip-ms 1000 --min-hidden 0.5 && exit 0
  echo "attempt $attempt of 3"
done
exit 1
