#!/usr/bin/env bash
# Peak memory per rank as the layer count grows (FULL_SHARD, activation checkpointing, 2 CPU
# ranks): it grows with the shards, not with the whole model's gradients. Installs nothing:
# uses the venv made by scripts/setup.sh. Extra arguments go to bench/memory_bench.py (e.g.
# --compare-worker OTHER_BUILD/shardrun-worker, --layers 4 8).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
cargo build --release -p shardrun-worker -p shardrun
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)" >&2
exec "$SHARDRUN_PYTHON" bench/memory_bench.py --worker "$CARGO_TARGET_DIR/release/shardrun-worker" \
  --shardrun "$CARGO_TARGET_DIR/release/shardrun" "$@"
