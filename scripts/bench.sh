#!/usr/bin/env bash
# Runs every benchmark after setting up (scripts/setup.sh). Each prints its own table; the
# README's "Benchmarks" section holds the figures from one run on the machine it names.
# Benchmarks are never timed assertions: run them on an idle machine before quoting them.
# Usage: scripts/bench.sh [fsdp|memory|collectives|checkpoint|ingest|diagnostics|render|sweep|data ...]   (default: all)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
cd "$SHARDRUN_ROOT"
"$SHARDRUN_ROOT/scripts/setup.sh" --no-slurm >/dev/null

which=("$@")
(( ${#which[@]} )) || which=(render sweep ingest diagnostics collectives checkpoint data fsdp memory)
for bench in "${which[@]}"; do
  printf '\n==> %s\n' "$bench"
  case "$bench" in
    render)      cargo bench -q -p shardrun --bench render_sweep ;;
    sweep)       bench/sweep_submit.sh ;;
    ingest)      cargo bench -q -p shardrun-e2e --bench ingest ;;
    diagnostics) cargo bench -q -p shardrun-e2e --bench diagnostics ;;
    collectives) bench/collectives.sh ;;
    checkpoint)  bench/checkpoint.sh ;;
    data)        bench/data.sh ;;
    fsdp)        bench/fsdp.sh ;;
    memory)      bench/memory.sh ;;
    gpu)         echo "needs an NVIDIA GPU with PyTorch installed: bench/gpu.sh BIN_DIR" ;;
    *) echo "unknown benchmark $bench: choose from render sweep ingest diagnostics collectives checkpoint data fsdp memory" >&2; exit 2 ;;
  esac
done
