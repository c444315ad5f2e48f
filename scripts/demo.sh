#!/usr/bin/env bash
# Sets everything up (scripts/setup.sh) and runs the main job locally: a Llama fine-tuned
# from its Hugging Face folder on code (examples/llama-local.yaml: the machine's Python
# sources, tokenized with the folder's tokenizer, 2% held out for validation), FULL_SHARD on
# 2 CPU ranks, no Slurm needed. Then plots it, exports it back to a Hugging Face folder and
# loads that folder in transformers to write a few lines of Python.
# Usage: scripts/demo.sh [extra `shardrun run` arguments, e.g. --nproc 4]
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
cd "$SHARDRUN_ROOT"

"$SHARDRUN_ROOT/scripts/setup.sh" --no-slurm

step() { printf '\n==> %s\n' "$*"; }
spec="examples/llama-local.yaml"
folder="examples/models/code-llama"
run_dir="runs/llama-local"
export_dir="$run_dir/export"

step "the model folder: $SHARDRUN_PYTHON examples/make_code_llama.py $folder"
"$SHARDRUN_PYTHON" examples/make_code_llama.py "$folder"

step "shardrun plan $spec"
shardrun plan "$spec"

step "shardrun run $spec --run-dir $run_dir"
shardrun run "$spec" --run-dir "$run_dir" --force "$@"

shardrun plot "$run_dir" -o "$run_dir/metrics.png" >/dev/null
step "shardrun metrics $run_dir"
shardrun metrics "$run_dir"

step "shardrun export $run_dir --out $export_dir"
rm -rf "$export_dir"
shardrun export "$run_dir" --out "$export_dir"

step "the exported folder in transformers"
"$SHARDRUN_PYTHON" - "$export_dir" <<'PY'
import sys
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

folder = sys.argv[1]
tokenizer = AutoTokenizer.from_pretrained(folder)
model = AutoModelForCausalLM.from_pretrained(folder)
prompt = "def read_config(path):\n"
ids = tokenizer(prompt, return_tensors="pt").input_ids
torch.manual_seed(0)
out = model.generate(ids, max_new_tokens=40, do_sample=False, pad_token_id=tokenizer.eos_token_id)
print(f"{type(model).__name__} from {folder}, greedy continuation of {prompt!r}:")
print(tokenizer.decode(out[0]))
PY

cat <<TXT

The run directory is $run_dir:
  train.log       every rank's log lines    (shardrun logs -f $run_dir, or tail -f $run_dir/train.log)
  metrics.jsonl   one JSON record per step  (shardrun metrics $run_dir; eval loss every 50 steps)
  metrics.png     loss, throughput, memory  (shardrun plot $run_dir -o curves.svg)
  checkpoints/    sharded checkpoints       (shardrun export $run_dir: a Hugging Face folder)

The same command again continues this run (the demo passes --force to start over each time):
  shardrun run $spec --run-dir $run_dir
      it is finished: says so and trains nothing
  shardrun run $spec --run-dir $run_dir --set training.steps=400
      trains on from its last checkpoint to step 400
  after a Ctrl-C or a failure, the same command resumes from the last checkpoint
On a cluster, examples/llama-finetune.yaml is the same job for a CodeLlama-7B folder on GPUs:
  shardrun submit examples/llama-finetune.yaml
TXT
