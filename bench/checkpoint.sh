#!/usr/bin/env bash
# Checkpoint write/load throughput per rank against the disk's own sequential write speed
# (dd), see bench/checkpoint.rs. Usage: bench/checkpoint.sh [--dir DIR] [--ranks N]
# [--mb-per-rank MB] [--units U]. DIR defaults to a folder under $TMPDIR: point it at the
# file system checkpoints go to.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
cargo run --release -q -p shardrun-checkpoint --example checkpoint_bench -- "$@"
