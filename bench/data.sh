#!/usr/bin/env bash
# Training data, side by side in one run:
#  1. Tokenization throughput of a >= 100 MB corpus (the venv's and the system's Python
#     sources): `shardrun prepare` (reading the files, tokenizing on every core, writing and
#     fsyncing the cache: the whole command, wall clock) against Hugging Face `tokenizers`'
#     `encode_batch` and `encode_batch_fast` from Python with the same tokenizer
#     (bench/tokenize_reference.py; its file reading timed apart and left out). Rounds
#     alternate the three; medians are reported.
#  2. Data loading cost per training step once tokenized: the README demo's model (dim 64,
#     4 layers, vocab 1024, seq 64, batch 8 per rank, 2 CPU ranks) trained on the Python
#     sources with the byte tokenizer; the median of the worker's `data_time_s` (making the
#     step's batches) over its `step_time_s`, from metrics.jsonl.
#
#   bench/data.sh [--rounds 3] [--vocab 32000] [--steps 60]
#
# Needs the venv of scripts/setup.sh (tokenizers, transformers); builds the binaries.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../scripts/env.sh"
cd "$SHARDRUN_ROOT"

ROUNDS=3 VOCAB=32000 STEPS=60
while [[ $# -gt 0 ]]; do
  case "$1" in
    --rounds) ROUNDS=$2; shift 2 ;;
    --vocab) VOCAB=$2; shift 2 ;;
    --steps) STEPS=$2; shift 2 ;;
    *) echo "unknown argument $1 (see the header of $0)" >&2; exit 2 ;;
  esac
done
[[ -x $SHARDRUN_PYTHON ]] || { echo "no venv at $SHARDRUN_VENV: run scripts/setup.sh first" >&2; exit 1; }
cargo build --release -q -p shardrun --bin shardrun -p shardrun-worker --bin shardrun-worker
SHARDRUN="$SHARDRUN_BIN/shardrun"

WORK=$(mktemp -d "${TMPDIR:-/tmp}/shardrun-data-bench.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
CORPUS=("$SHARDRUN_SITE_PACKAGES/**/*.py" "/usr/lib/python3*/**/*.py")
THREADS=$(nproc)

echo "tokenizer: byte-level BPE, $VOCAB ids, trained on the system's Python sources"
"$SHARDRUN_PYTHON" examples/make_python_tokenizer.py "$WORK/tokenizer" --vocab-size "$VOCAB" >/dev/null

cat > "$WORK/tokenize.yaml" <<YAML
name: tokenize-bench
training:
  model: { kind: transformer, vocab_size: $VOCAB, dim: 8, n_layers: 1, n_heads: 1, max_seq_len: 1024 }
  data:
    kind: text
    files: ["${CORPUS[0]}", "${CORPUS[1]}"]
    tokenizer: { path: "$WORK/tokenizer" }
    on_bad_record: skip
    cache_dir: "$WORK/cache"
  steps: 1
  total_batch_size: 1
  batch_size_per_device: 1
YAML

now() { date +%s.%N; }
field() { "$SHARDRUN_PYTHON" -c 'import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])' "$1" "$2"; }
ours=() batch=() fast=()
for round in $(seq "$ROUNDS"); do
  rm -rf "$WORK/cache"
  start=$(now)
  "$SHARDRUN" prepare "$WORK/tokenize.yaml" --threads "$THREADS" > "$WORK/prepare.log"
  ours+=("$(awk -v a="$(now)" -v b="$start" 'BEGIN { print a - b }')")
  "$SHARDRUN_PYTHON" bench/tokenize_reference.py --tokenizer "$WORK/tokenizer" "${CORPUS[@]}" > "$WORK/python.json"
  batch+=("$(field "$WORK/python.json" encode_s)")
  "$SHARDRUN_PYTHON" bench/tokenize_reference.py --fast --tokenizer "$WORK/tokenizer" "${CORPUS[@]}" > "$WORK/python-fast.json"
  fast+=("$(field "$WORK/python-fast.json" encode_s)")
  echo "round $round: shardrun prepare ${ours[-1]} s, encode_batch ${batch[-1]} s, encode_batch_fast ${fast[-1]} s (+ $(field "$WORK/python.json" read_s) s reading each)"
done
MANIFEST=$(ls "$WORK"/cache/text-*/manifest.json)
"$SHARDRUN_PYTHON" - "$MANIFEST" "$WORK/python.json" "${ours[*]}" "${batch[*]}" "${fast[*]}" "$THREADS" <<'PY'
import json, statistics, sys
manifest, python = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
ours, batch, fast = (statistics.median(map(float, a.split())) for a in sys.argv[3:6])
mb = python["bytes"] / 1e6
# Our documents each end with the end-of-document token; Python's encodings do not.
same = manifest["tokens"] - manifest["documents"] == python["tokens"]
print(f"\ncorpus: {mb:.1f} MB, {python['documents']} files, {python['tokens']:,} tokens "
      f"({'the same number of ids on both sides' if same else 'TOKEN COUNTS DIFFER'}), {sys.argv[6]} threads")
print("| side | seconds (median) | MB/s | shardrun's speed-up |")
print("| --- | --- | --- | --- |")
print(f"| shardrun prepare (read + tokenize + write cache) | {ours:.2f} | {mb / ours:.1f} | |")
print(f"| tokenizers encode_batch (encoding only) | {batch:.2f} | {mb / batch:.1f} | {batch / ours:.2f}x |")
print(f"| tokenizers encode_batch_fast (encoding only) | {fast:.2f} | {mb / fast:.1f} | {fast / ours:.2f}x |")
print("target: >= 1.0x against encode_batch")
PY
echo
echo "data loading cost per step, $STEPS steps of the demo model on 2 CPU ranks"
cat > "$WORK/loading.yaml" <<YAML
name: loading-bench
resources: { tasks_per_node: 2 }
training:
  model: { kind: transformer, vocab_size: 1024, dim: 64, n_layers: 4, n_heads: 4, max_seq_len: 64 }
  data:
    kind: text
    files: ["/usr/lib/python3*/**/*.py"]
    tokenizer: { kind: bytes }
    on_bad_record: skip
    cache_dir: "$WORK/cache-loading"
    validation: { fraction: 0.01 }
  steps: $STEPS
  total_batch_size: 16
  batch_size_per_device: 8
YAML
"$SHARDRUN" prepare "$WORK/loading.yaml" > /dev/null
"$SHARDRUN" run "$WORK/loading.yaml" --run-dir "$WORK/run" --no-progress > "$WORK/run.log" 2>&1
# Each rank's own records (metrics.jsonl holds the job's, folded over the ranks).
"$SHARDRUN_PYTHON" - "$WORK/run/logs/rank-0.metrics.jsonl" <<'PY'
import json, statistics, sys
steps = [json.loads(l) for l in open(sys.argv[1]) if '"data_time_s"' in l]
steps = [s for s in steps if s["step"] > 5]  # after warm-up
data = statistics.median(s["data_time_s"] for s in steps)
step = statistics.median(s["step_time_s"] for s in steps)
print(f"median step {step * 1e3:.2f} ms, of which making the batches {data * 1e6:.0f} us: "
      f"{100 * data / step:.2f}% (target < 1%)")
PY
