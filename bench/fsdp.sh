#!/usr/bin/env bash
# shardrun-worker vs PyTorch FSDP2, side by side on this machine (2 ranks × 1 thread, CPU).
# Installs nothing: uses the venv made by scripts/setup.sh. Extra arguments go to
# bench/fsdp_bench.py (e.g. --only dim64, --steps 12).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${SHARDRUN_VENV:-$HOME/.cache/shardrun/venv}"
export LIBTORCH="${LIBTORCH:-$(echo "$VENV"/lib/python3*/site-packages/torch)}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/shardrun/target}"
cargo build --release -p shardrun-worker
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)" >&2
exec "$VENV/bin/python" bench/fsdp_bench.py --worker "$CARGO_TARGET_DIR/release/shardrun-worker" "$@"
