#!/usr/bin/env bash
# Sets everything up (scripts/setup.sh) and runs the main job locally: the transformer of
# examples/demo.yaml trained with FULL_SHARD on 2 CPU ranks, no Slurm needed. Then shows
# where its log, metrics and plot are.
# Usage: scripts/demo.sh [extra `shardrun run` arguments, e.g. --nproc 4]
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
cd "$SHARDRUN_ROOT"

"$SHARDRUN_ROOT/scripts/setup.sh" --no-slurm

run_dir="runs/demo"
printf '\n==> shardrun plan examples/demo.yaml\n'
shardrun plan examples/demo.yaml
printf '\n==> shardrun run examples/demo.yaml --run-dir %s\n' "$run_dir"
shardrun run examples/demo.yaml --run-dir "$run_dir" --force "$@"

shardrun plot "$run_dir" -o "$run_dir/metrics.svg" >/dev/null
printf '\n==> latest metrics\n'
shardrun metrics "$run_dir"
cat <<TXT

The run directory is $run_dir:
  train.log       every rank's log lines   (shardrun logs $run_dir, or tail -f $run_dir/train.log)
  metrics.jsonl   one JSON record per step (shardrun metrics $run_dir)
  metrics.svg     loss and throughput       (shardrun plot $run_dir -o curve.png)
  checkpoints/    sharded checkpoints       (shardrun export $run_dir: one model.safetensors)

The same command again continues this run (the demo passes --force to start over each time):
  shardrun run examples/demo.yaml --run-dir $run_dir
      it is finished: says so and trains nothing
  shardrun run examples/demo.yaml --run-dir $run_dir --set training.steps=400
      trains on from its last checkpoint (step 200) to step 400
  after a Ctrl-C or a failure, the same command resumes from the last checkpoint
TXT
