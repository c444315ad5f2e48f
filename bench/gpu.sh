#!/usr/bin/env bash
# GPU check and benchmark on a machine with one NVIDIA GPU and PyTorch 2.11 installed
# (`python3 -c 'import torch'` works). Runs from a folder holding the release binaries
# (default .device-bin: shardrun, shardrun-worker, shardrun-collective-bench):
#   1. NCCL self-test of the collectives at world size 1;
#   2. bench/gpu-bench.yaml through `shardrun run --device cuda` (controller + worker);
#   3. PyTorch FSDP2 on the same model, data and dtype (bench/fsdp2_reference.py, NCCL).
# Usage: bench/gpu.sh [BIN_DIR] [OUT_DIR]
set -euo pipefail
bin="$(cd "${1:-.device-bin}" && pwd)"
out="${2:-${OUT:-/tmp/shardrun-gpu}}"
mkdir -p "$out"
torch_dir=$(python3 -c 'import torch, os; print(os.path.dirname(torch.__file__))')
# libtorch for the binaries; cudarc opens NCCL as `libnccl.so`, pip ships `libnccl.so.2`.
mkdir -p /tmp/shardrun-nccl
ln -sf "$torch_dir/../nvidia/nccl/lib/libnccl.so.2" /tmp/shardrun-nccl/libnccl.so
export LD_LIBRARY_PATH="$torch_dir/lib:/tmp/shardrun-nccl${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$out/gpu.txt"

echo "== NCCL self-test (world size 1)"
"$bin/shardrun-collective-bench" --device cuda check 2>&1 | tail -3
"$bin/shardrun-collective-bench" --device cuda bench --mib 256 2>&1 | tee "$out/nccl-bench.jsonl"

echo "== shardrun run --device cuda"
"$bin/shardrun" run bench/gpu-bench.yaml --nproc 1 --device cuda --run-dir "$out/run" --force --no-progress \
  > "$out/shardrun-run.txt" 2>&1 || { tail -40 "$out/shardrun-run.txt"; exit 1; }
tail -14 "$out/shardrun-run.txt"
cp "$out/run/metrics.jsonl" "$out/metrics.jsonl"

echo "== PyTorch FSDP2 reference"
PYTHONUNBUFFERED=1 torchrun --standalone --nproc_per_node 1 bench/fsdp2_reference.py --device cuda \
  --vocab 32768 --dim 1024 --n-layers 16 --n-heads 16 --seq 1024 --batch 8 --param-dtype bf16 \
  --steps 30 --warmup 5 2>&1 | grep '^{' | tee "$out/pytorch.json"

python3 - "$out" <<'PY'
import json, statistics, sys
out = sys.argv[1]
ours = [json.loads(l) for l in open(f"{out}/metrics.jsonl")]
steady = [m for m in ours if m["step"] > 5]
step = statistics.median(m["step_time_s"] for m in steady)
tps = statistics.median(m["tokens_per_s"] for m in steady)
mfu = statistics.median((m.get("mfu") or 0) for m in steady)
peak = max(m["peak_memory_bytes"] for m in ours)
ref = json.loads(open(f"{out}/pytorch.json").read().strip().splitlines()[-1])
print(f"shardrun: step {step:.4f} s, {tps:,.0f} tok/s, MFU {mfu:.1%}, peak {peak/2**30:.2f} GiB")
print(f"FSDP2:    step {ref['step_time_s']:.4f} s, {ref['tokens_per_s']:,.0f} tok/s, peak {ref['peak_rss_bytes'][0]/2**30:.2f} GiB")
print(f"ratio (ours / FSDP2): step {step/ref['step_time_s']:.2f}, memory {peak/ref['peak_rss_bytes'][0]:.2f}")
PY
