#!/usr/bin/env bash
# shardrun-worker vs PyTorch FSDP2, side by side on this machine (2 ranks × 1 thread, CPU).
# Installs nothing: uses the venv made by scripts/setup.sh. Extra arguments go to
# bench/fsdp_bench.py (e.g. --only dim64, --steps 12).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
cargo build --release -p shardrun-worker
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)" >&2
exec "$SHARDRUN_PYTHON" bench/fsdp_bench.py --worker "$CARGO_TARGET_DIR/release/shardrun-worker" "$@"
