#!/usr/bin/env bash
# The whole GPU check of shardrun, in one command, on a machine with NVIDIA GPUs and PyTorch
# 2.11 (`python3 -c 'import torch'` works there):
#   1. NCCL and the device: `shardrun-worker --check-gpu` (which NCCL loads, which GPU a rank
#      gets, its memory);
#   2. the NCCL communicator: every collective, exact, on its own stream (world size 1, and N
#      ranks on N GPUs), then its bandwidth;
#   3. the worker's unit tests that take the CUDA branches (devices, runtime, NCCL);
#   4. training through `shardrun run --device cuda`: every strategy at world size 1 in bf16
#      and in fp16 with loss scaling (and FULL_SHARD / HYBRID_SHARD on all N GPUs); fp32
#      FULL_SHARD against the unsharded single-process reference;
#   5. checkpoint save -> resume equals an uninterrupted run (fp32); export -> PyTorch reproduces
#      the worker's next loss from the exported weights;
#   6. bench/gpu-bench.yaml (270 M parameters, bf16) next to PyTorch FSDP2 on the same model,
#      data, dtype and optimizer: step time, tokens/s, MFU, peak memory;
#   7. the Llama architecture (GQA, RoPE, SwiGLU) as users fine-tune it: bf16 training (on
#      all N GPUs too), fp32 against the unsharded reference, a Hugging Face folder
#      fine-tuned, exported, and its next loss reproduced by `transformers`; then
#      bench/gpu-bench-llama.yaml next to PyTorch FSDP2 on `transformers`' LlamaForCausalLM;
#   8. that Llama on packed fine-tuning documents, with and without the per-document mask.
# Prints ok/FAIL per check (n/a, with the reason, where this machine's Python lacks
# `transformers`) and the benchmark tables; exits 1 if any check failed.
#
# Usage:
#   bench/gpu.sh [BIN_DIR] [OUT_DIR]    run everything (BIN_DIR: shardrun, shardrun-worker,
#                                       shardrun-collective-bench and tests/, as `stage` makes;
#                                       default: build here with cargo, else .device-bin;
#                                       OUT_DIR: default /tmp/shardrun-gpu)
#   GPU_CHECKS=nccl,train bench/gpu.sh  only these parts (of nccl, train, checkpoints, bench,
#                                       llama, packed; default all), to split the whole into shorter
#                                       commands
#   CHECK_DEVICE=cpu bench/gpu.sh       the same checks on 2 CPU ranks with small models: tries
#                                       the script itself where there is no GPU (its figures
#                                       then say nothing about GPUs)
# With $OUT set (a folder whose files are copied elsewhere when the command ends) the logs,
# metrics and table, without checkpoints or weights, are also packed into
# $OUT/gpu-results.tar.gz after each part, and the table and check list copied beside it.
#   bench/gpu.sh stage [DIR]            on the build machine: copy the release binaries and
#                                       the worker's test executable into DIR (.device-bin)
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

if [[ "${1:-}" == "stage" ]]; then
  set -e
  dest="${2:-.device-bin}"
  source scripts/env.sh
  cargo build --release --workspace --bins
  mkdir -p "$dest/tests"
  cp "$CARGO_TARGET_DIR"/release/{shardrun,shardrun-worker,shardrun-collective-bench} "$dest/"
  exe=$(cargo test --release -p shardrun-worker --lib --no-run --message-format=json 2>/dev/null \
    | python3 -c 'import json,sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["kind"] == ["lib"]:
        print(m["executable"])')
  cp "$exe" "$dest/tests/shardrun-worker-unit-tests"
  # Without debug info the four fit in ~38 MB (a lent GPU machine takes 64 MiB of files).
  strip -g "$dest"/{shardrun,shardrun-worker,shardrun-collective-bench} "$dest/tests/shardrun-worker-unit-tests"
  echo "staged into $dest ($(du -sh "$dest" | cut -f1))"
  exit 0
fi

out="${2:-/tmp/shardrun-gpu}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
wanted() { [[ ",${GPU_CHECKS:-nccl,train,checkpoints,bench,llama,packed}," == *",$1,"* ]]; }
device="${CHECK_DEVICE:-cuda}"
[[ "$device" == cuda || "$device" == cpu ]] || { echo "CHECK_DEVICE is cuda or cpu, not $device"; exit 1; }
# The evidence in a few files: logs, specs, metrics and the table; no checkpoints or weights.
bundle() {
  [[ -n "${OUT:-}" && -d "$OUT" && "$(cd "$OUT" && pwd)" != "$out" ]] || return 0
  tar czf "$OUT/gpu-results.tar.gz" -C "$out" --exclude='*checkpoints*' --exclude=export \
    --exclude='*.safetensors' --exclude=bin --exclude=nccl-link --exclude='*.bin' --exclude=documents .
  for f in checks.txt table.md table-llama.md table-packed.md gpu.txt; do [[ -f "$out/$f" ]] && cp "$out/$f" "$OUT/"; done
  return 0
}
if [[ -n "${1:-}" ]]; then
  bin="$(cd "$1" && pwd)"
elif command -v cargo >/dev/null && bench/gpu.sh stage "$out/bin" >"$out/build.txt" 2>&1; then
  bin="$out/bin"
elif [[ -d .device-bin ]]; then
  # No cargo, or no build environment here (scripts/setup.sh not run): staged binaries.
  bin="$(cd .device-bin && pwd)"
  echo "WARNING: not built here (no cargo, or the build failed: $out/build.txt); every result"
  echo "         below is of the binaries staged in $bin on $(date -r "$bin/shardrun-worker" '+%F %T')"
else
  [[ -s "$out/build.txt" ]] && tail -30 "$out/build.txt"
  echo "no binaries: run scripts/setup.sh here, or stage them elsewhere with \`bench/gpu.sh stage\`"
  exit 1
fi
python="${SHARDRUN_GPU_PYTHON:-python3}"
torch_dir=$("$python" -c 'import torch, os; print(os.path.dirname(torch.__file__))')
# libtorch for the binaries. A worker built against another libtorch finds NCCL and the CUDA
# runtime as `libnccl.so` and `libcudart.so` on the loader path: links to this torch's own.
mkdir -p "$out/nccl-link"
ln -sf "$torch_dir/../nvidia/nccl/lib/libnccl.so.2" "$out/nccl-link/libnccl.so"
for cudart in "$torch_dir"/../nvidia/cu13/lib/libcudart.so.13 "$torch_dir"/../nvidia/cuda_runtime/lib/libcudart.so.12; do
  if [[ -f "$cudart" ]]; then ln -sf "$cudart" "$out/nccl-link/libcudart.so"; break; fi
done
export LD_LIBRARY_PATH="$torch_dir/lib:$out/nccl-link${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export SHARDRUN_WORKER_BIN="$bin/shardrun-worker"
# The checks start their own ranks: run inside a Slurm job or step, its rank variables would
# make every process here a task of that step instead (they win over RANK/WORLD_SIZE).
unset SLURM_PROCID SLURM_NTASKS SLURM_LOCALID SLURM_STEP_ID
# What the check names call a rank and the communicator.
rank_word=GPU comm=NCCL
[[ "$device" == cpu ]] && rank_word="CPU rank" comm="socket-ring"
if [[ "$device" == cuda ]]; then
  # The GPUs this process may use (CUDA_VISIBLE_DEVICES, a Slurm allocation), not the node's.
  gpus=$("$python" -c 'import torch; print(torch.cuda.device_count())' 2>/dev/null || echo 0)
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$out/gpu.txt"
else
  gpus=2 # CPU ranks standing in for GPUs
  echo "CHECK_DEVICE=cpu: every check on the CPU, with small models" | tee "$out/gpu.txt"
fi
echo "binaries: $bin; torch: $torch_dir; $gpus $device rank(s); output: $out"

failures=()
not_run=()
# Exit status of a check that could not run here (not a failure of shardrun): it says why.
NOT_RUN=3
# check NAME COMMAND...: runs it, keeps its output in $out/logs/NAME.txt, says ok, n/a or FAIL.
check() {
  local name="$1"; shift
  mkdir -p "$out/logs"
  local log="$out/logs/${name//[^A-Za-z0-9.,=+-]/_}.txt"
  local started=$SECONDS rc=0
  "$@" >"$log" 2>&1 || rc=$?
  if (( rc == 0 )); then
    printf 'ok    %-58s %4ds\n' "$name" $((SECONDS - started)) | tee -a "$out/checks.txt"
  elif (( rc == NOT_RUN )); then
    printf 'n/a   %-58s       (%s)\n' "$name" "$(tail -1 "$log")" | tee -a "$out/checks.txt"
    not_run+=("$name")
  else
    printf 'FAIL  %-58s %4ds  (%s)\n' "$name" $((SECONDS - started)) "$log" | tee -a "$out/checks.txt"
    tail -15 "$log" | sed 's/^/      | /'
    failures+=("$name")
  fi
}
# needs_two NAME: a check of several ranks on a machine with one GPU: said, not run. At world
# size 1 training uses no communicator, so NCCL's hand-off with the FSDP engine (streams,
# events, buffer lifetimes) is first exercised by these.
needs_two() {
  printf 'skip  %-58s       (needs 2 or more GPUs; this machine has %s)\n' "$1" "$gpus" | tee -a "$out/checks.txt"
  not_run+=("$1")
}

# The model of the correctness runs (seconds each); the Llama part sets its own.
model_line="{ kind: transformer, vocab_size: 2048, dim: 256, n_layers: 4, n_heads: 4, max_seq_len: 128 }"
spec() { # spec NAME STRATEGY DTYPE STEPS [extra training lines]
  local f="$out/specs/$1.yaml"
  mkdir -p "$out/specs"
  local reduce=f32
  [[ "$3" == f16 ]] && reduce=f16
  cat >"$f" <<EOF
name: $1
resources: { nodes: 1, gpus_per_node: 1 }
training:
  model: $model_line
  data: { kind: synthetic, seq_len: 128 }
  steps: $4
  seed: 3
  total_batch_size: 8
  batch_size_per_device: 8
  optimizer: { lr: 1.0e-3, grad_clip: 1.0 }
  schedule: { warmup_steps: 2, decay: constant }
  fsdp:
    strategy: $2
    shard_group_size: 1
    mixed_precision: { param_dtype: $3, reduce_dtype: $reduce }
${5:-}
EOF
  echo "$f"
}

shardrun_run() { # shardrun_run SPEC NPROC RUN_DIR: a fresh run; libtorch stays quiet in its log
  "$bin/shardrun" run "$1" --device "$device" --nproc "$2" --run-dir "$3" --force --no-progress \
    && quiet "$3/train.log"
}
run_only() { # run_only NAME SPEC NPROC: shardrun_run into $out/runs/NAME
  shardrun_run "$2" "$3" "$out/runs/$1"
}
run_job() { # run_job NAME SPEC NPROC: run_only, then the loss must fall
  run_only "$@" && "$python" bench/gpu_checks.py trains "$out/runs/$1/metrics.jsonl"
}
quiet() { # quiet LOG: no libtorch warning ("[W1128 16:34:45.61 Memory.cpp:46] Warning: ...", the
           # date as month·100 + day, so "[W105 ..." on 5 January)
  [[ -f "$1" ]] || { echo "no $1"; return 1; }
  if grep -m5 -E '\[W[0-9]{3,4} [0-9:.]+ [^]]+\] Warning:' "$1"; then
    echo "libtorch warned (above) in $1"
    return 1
  fi
}

# reference_check NAME: fp32 FULL_SHARD against the unsharded reference in one process, both
# on the GPU.
reference_check() {
  local f; f=$(spec "$1" FULL_SHARD f32 10)
  run_job "$1" "$f" 1 || return 1
  "$bin/shardrun-worker" --config "$out/runs/$1/train_config.json" --reference \
    --metrics-file "$out/runs/$1-reference.jsonl" || return 1
  "$python" bench/gpu_checks.py same "$out/runs/$1/metrics.jsonl" "$out/runs/$1-reference.jsonl" --rtol 1e-4
}

if wanted nccl; then
echo "== 1-3: NCCL, the device, the communicator"
if [[ "$device" == cuda ]]; then
  check "check-gpu (NCCL loads, rank 0 gets its GPU)" "$bin/shardrun-worker" --check-gpu
fi
check "$comm collectives, 1 rank" "$bin/shardrun-collective-bench" --device "$device" check
# on_every_gpu ARGS...: shardrun-collective-bench ARGS as one rank per GPU.
on_every_gpu() {
  local port=$((29500 + RANDOM % 1000)) pids=() rc=0 r
  for ((r = 0; r < gpus; r++)); do
    RANK=$r WORLD_SIZE=$gpus LOCAL_RANK=$r MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
      "$bin/shardrun-collective-bench" --device "$device" "$@" & pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p" || rc=1; done
  return $rc
}
if (( gpus >= 2 )); then
  check "$comm collectives and HYBRID groups, $gpus ranks" on_every_gpu check
  # One rank would time a local copy: bandwidth needs every GPU (rank 0 prints).
  bandwidth() { on_every_gpu bench --mib 256 | tee "$out/nccl-bench.jsonl"; }
  check "$comm bandwidth, 256 MiB, $gpus ranks" bandwidth
else
  needs_two "$comm collectives, HYBRID groups and bandwidth on every GPU"
fi
if [[ "$device" == cpu ]]; then
  echo "(CHECK_DEVICE=cpu: the worker's unit tests run in scripts/test.sh)"
elif [[ -x "$bin/tests/shardrun-worker-unit-tests" ]]; then
  check "worker unit tests on CUDA" "$bin/tests/shardrun-worker-unit-tests" --test-threads 1 --include-ignored
else
  # Not run, and counted so: the GPU-only unit tests run nowhere else.
  printf 'skip  %-58s       (no %s: stage with `bench/gpu.sh stage`)\n' "worker unit tests on CUDA" \
    "$bin/tests/shardrun-worker-unit-tests" | tee -a "$out/checks.txt"
  not_run+=("worker unit tests on CUDA")
fi
bundle
fi

if wanted train; then
echo "== 4: training on the GPU"
for strategy in FULL_SHARD SHARD_GRAD_OP NO_SHARD HYBRID_SHARD; do
  for dtype in bf16 f16; do
    name="${strategy,,}-$dtype"
    check "$strategy $dtype, 1 $rank_word" run_job "$name" "$(spec "$name" "$strategy" "$dtype" 20)" 1
  done
done
if (( gpus >= 2 )); then
  for strategy in FULL_SHARD HYBRID_SHARD; do
    name="${strategy,,}-bf16-x$gpus"
    f=$(spec "$name" "$strategy" bf16 20)
    sed -i "s/total_batch_size: 8/total_batch_size: $((8 * gpus))/; s/shard_group_size: 1/shard_group_size: $(( gpus / 2 > 0 ? gpus / 2 : 1 ))/" "$f"
    check "$strategy bf16, $gpus ${rank_word}s" run_job "$name" "$f" "$gpus"
  done
else
  needs_two "FULL_SHARD and HYBRID_SHARD bf16 over NCCL"
fi
check "fp32 FULL_SHARD = unsharded reference" reference_check fp32
bundle
fi

if wanted checkpoints; then
echo "== 5: checkpoints"
# Train 6 steps saving at 3, then the same job for 10 steps resumes from step 6 (a re-run
# continues the newest checkpoint of its folder); it must match 10 uninterrupted steps.
resume_check() {
  local ck="$out/runs/resume-checkpoints"
  rm -rf "$ck" "$out/runs/straight" "$out/runs/first" "$out/runs/second"
  local more="  checkpoint: { dir: $ck, interval_steps: 3, keep: 3 }"
  # fp32: two bf16 runs on a GPU differ by more than a resume may (the attention backward
  # adds with atomics, in any order), so bf16 could fail a correct resume.
  run_job straight "$(spec straight FULL_SHARD f32 10)" 1 || return 1
  # 6 steps need not lower the loss (2 of warm-up): these runs are compared, not judged.
  run_only first "$(spec first FULL_SHARD f32 6 "$more")" 1 || return 1
  run_only second "$(spec second FULL_SHARD f32 10 "$more")" 1 || return 1
  grep -q "resumed from checkpoint" "$out/runs/second/train.log" || { echo "no resume"; return 1; }
  "$python" bench/gpu_checks.py same "$out/runs/second/metrics.jsonl" "$out/runs/straight/metrics.jsonl" --after 6 --rtol 1e-4
}
check "save -> resume equals an uninterrupted run" resume_check
export_check() {
  local ck="$out/runs/export-checkpoints"
  rm -rf "$ck"
  run_only exported "$(spec exported FULL_SHARD f32 6 "  checkpoint: { dir: $ck, interval_steps: 5, keep: 2 }")" 1 || return 1
  "$bin/shardrun" export "$ck/step-5" --out "$out/runs/export" || return 1
  "$python" bench/gpu_checks.py exported "$out/runs/export/step-5" "$out/runs/exported/train_config.json" \
    "$out/runs/exported/metrics.jsonl" --rtol 1e-3
}
check "export -> PyTorch reproduces the next loss" export_check
bundle
fi

# Benchmark sizes: as the YAML files say on GPUs; tiny on CPU ranks (the script, not figures).
shrink() { # shrink FILE: the benchmark spec FILE, as run here
  if [[ "$device" == cpu ]]; then
    sed 's/vocab_size: 32768/vocab_size: 2048/; s/dim: 1024/dim: 128/; s/dim: 2048/dim: 128/;
         s/n_layers: 16/n_layers: 2/; s/n_heads: 16/n_heads: 4/; s/n_heads: 32/n_heads: 4/;
         s/n_kv_heads: 8/n_kv_heads: 2/; s/ffn_dim: 8192/ffn_dim: 256/;
         s/max_seq_len: 1024/max_seq_len: 128/; s/max_position_embeddings: 2048/max_position_embeddings: 128/;
         s/seq_len: 1024/seq_len: 128/; s/seq_len: 2048/seq_len: 128/; s/steps: 30/steps: 10/' "$1"
  else
    cat "$1"
  fi
}
# bench_spec YAML SEQUENCES: the benchmark YAML as run here, SEQUENCES per GPU on every GPU.
bench_spec() {
  shrink "$1" | sed "s/total_batch_size: $2/total_batch_size: $(($2 * n))/"
}
# bench_ours NAME YAML SEQUENCES: shardrun on the benchmark YAML, SEQUENCES per GPU.
bench_ours() {
  bench_spec "$2" "$3" >"$out/specs/$1.yaml"
  bench_ours_spec "$1"
}
# bench_ours_spec NAME: shardrun on $out/specs/NAME.yaml, into $out/NAME.
bench_ours_spec() {
  local rc=0
  shardrun_run "$out/specs/$1.yaml" "$n" "$out/$1" || rc=$?
  # The final checkpoint of a benchmark is not read: 13 GB for the 1.1 B Llama, on a disk
  # several benchmarks share.
  rm -rf "$out/$1/checkpoints"
  return $rc
}
# bench_ref JSON SCRIPT ARGS...: the PyTorch FSDP2 side, one process per GPU.
bench_ref() {
  local json="$1" script="$2"; shift 2
  PYTHONUNBUFFERED=1 "$python" -m torch.distributed.run --standalone --nproc_per_node "$n" \
    "$script" --device "$device" "$@" | tee "$out/$json"
}
n=$(( gpus > 0 ? gpus : 1 ))
mkdir -p "$out/specs"

if wanted bench; then
echo "== 6: benchmark (bench/gpu-bench.yaml) vs PyTorch FSDP2"
if [[ "$device" == cuda ]]; then
  sizes=(--vocab 32768 --dim 1024 --n-layers 16 --n-heads 16 --seq 1024 --batch 8 --steps 30)
else
  sizes=(--vocab 2048 --dim 128 --n-layers 2 --n-heads 4 --seq 128 --batch 8 --steps 10)
fi
check "shardrun on bench/gpu-bench.yaml, $n $rank_word(s)" bench_ours bench bench/gpu-bench.yaml 8
check "PyTorch FSDP2, same model, $n $rank_word(s)" bench_ref pytorch.json bench/fsdp2_reference.py \
  "${sizes[@]}" --param-dtype bf16 --warmup 5
if [[ -f "$out/bench/metrics.jsonl" && -s "$out/pytorch.json" ]]; then
  grep -m1 "MFU is" "$out/bench/train.log" | sed 's/^.*\] //'
  "$python" bench/gpu_checks.py table "$out" | tee "$out/table.md"
fi
bundle
fi

if wanted llama; then
echo "== 7: the Llama architecture, from scratch and from a Hugging Face folder"
model_line="{ kind: llama, vocab_size: 2048, dim: 256, n_layers: 4, n_heads: 8, n_kv_heads: 2, ffn_dim: 688, max_position_embeddings: 128 }"
check "Llama FULL_SHARD bf16, 1 $rank_word" run_job llama-bf16 "$(spec llama-bf16 FULL_SHARD bf16 20)" 1
if (( gpus >= 2 )); then
  f=$(spec "llama-bf16-x$gpus" FULL_SHARD bf16 20)
  sed -i "s/total_batch_size: 8/total_batch_size: $((8 * gpus))/" "$f"
  check "Llama FULL_SHARD bf16, $gpus ${rank_word}s" run_job "llama-bf16-x$gpus" "$f" "$gpus"
else
  needs_two "Llama FULL_SHARD bf16 over NCCL"
fi
check "Llama fp32 FULL_SHARD = unsharded reference" reference_check llama-fp32
# The fp32 run's final weights as a Hugging Face folder; fine-tuned from it (`kind: hf`) 6
# steps, its step-5 checkpoint exported again must give the worker's step-6 loss in
# `transformers`.
hf_check() {
  local folder="$out/runs/llama-folder" tuned="$out/runs/llama-hf"
  rm -rf "$folder" "$tuned" "$out/runs/llama-hf-export"
  "$bin/shardrun" export "$out/runs/llama-fp32" --out "$folder" || return 1
  local model_line="{ kind: hf, path: $folder }"
  run_only llama-hf "$(spec llama-hf FULL_SHARD f32 6 "  checkpoint: { interval_steps: 5, keep: 2 }")" 1 || return 1
  "$bin/shardrun" export "$tuned/checkpoints/step-5" --format hf --out "$out/runs/llama-hf-export" || return 1
  "$python" bench/gpu_checks.py hf-exported "$out/runs/llama-hf-export" "$tuned/train_config.json" \
    "$tuned/metrics.jsonl" --step 5 --rtol 1e-3
}
check "Llama HF folder: fine-tune, export -> transformers' next loss" hf_check
echo "-- benchmark (bench/gpu-bench-llama.yaml) vs PyTorch FSDP2 on transformers' Llama"
if [[ "$device" == cuda ]]; then
  sizes=(--vocab 32768 --dim 2048 --n-layers 16 --n-heads 32 --n-kv-heads 8 --ffn-dim 8192 --seq 2048 --batch 4 --steps 30)
else
  sizes=(--vocab 2048 --dim 128 --n-layers 2 --n-heads 4 --n-kv-heads 2 --ffn-dim 256 --seq 128 --batch 4 --steps 10)
fi
llama_ref() {
  "$python" -c 'import transformers' 2>/dev/null \
    || { echo "transformers is not installed for $python"; return $NOT_RUN; }
  bench_ref pytorch-llama.json bench/fsdp2_llama.py "${sizes[@]}" --param-dtype bf16 --warmup 5
}
check "shardrun on bench/gpu-bench-llama.yaml, $n $rank_word(s)" bench_ours bench-llama bench/gpu-bench-llama.yaml 4
check "PyTorch FSDP2, transformers' LlamaForCausalLM, $n $rank_word(s)" llama_ref
if [[ -f "$out/bench-llama/metrics.jsonl" && -s "$out/pytorch-llama.json" ]]; then
  grep -m1 "MFU is" "$out/bench-llama/train.log" | sed 's/^.*\] //'
  "$python" bench/gpu_checks.py table "$out" llama | tee "$out/table-llama.md"
fi
bundle
fi

if wanted packed; then
echo "== 8: packed fine-tuning documents, each attending only to itself (document_mask)"
# bench/gpu-bench-llama.yaml on documents of 32..2048 random ids packed whole into sequences,
# each attending only to itself (the default with whole_documents: on a GPU in bf16, flash
# attention's variable-length kernel) and to everything before it in its sequence (plain
# causal attention): what keeping documents apart costs, or saves.
packed_run() { # packed_run NAME DOCUMENT_MASK
  bench_spec bench/gpu-bench-llama.yaml 4 \
    | "$python" bench/gpu_checks.py packed-spec "$out/documents" "$2" >"$out/specs/$1.yaml" || return 1
  bench_ours_spec "$1" || return 1
  # bf16 on a GPU: flash attention's variable-length kernel, not the dense mask it falls to.
  if [[ "$device" == cuda && "$2" == true ]]; then
    grep -q "attend within themselves through flash attention" "$out/$1/train.log" \
      || { grep -m1 "variable-length" "$out/$1/train.log"; echo "no flash variable-length attention"; return 1; }
  fi
}
documents() { "$python" bench/gpu_checks.py documents "$out/documents" 1500 32768 2048; }
[[ "$device" == cpu ]] && documents() { "$python" bench/gpu_checks.py documents "$out/documents" 300 2048 128; }
check "documents for packing" documents
check "shardrun, packed documents, document_mask true, $n $rank_word(s)" packed_run packed-masked true
check "shardrun, packed documents, document_mask false, $n $rank_word(s)" packed_run packed-unmasked false
if [[ -f "$out/packed-masked/metrics.jsonl" && -f "$out/packed-unmasked/metrics.jsonl" ]]; then
  "$python" bench/gpu_checks.py packed-table "$out" | tee "$out/table-packed.md"
fi
bundle
fi

echo
if (( ${#not_run[@]} )); then
  echo "${#not_run[@]} check(s) could not run here (n/a or skip above, with the reason): ${not_run[*]}"
fi
if (( ${#failures[@]} )); then
  echo "${#failures[@]} check(s) failed: ${failures[*]}"
  exit 1
fi
echo "every check that ran passed; figures in $out/table*.md and $out/summary*.json"
