#!/usr/bin/env bash
# CPU collective bandwidth: shardrun's socket backend vs PyTorch gloo, side by side.
#
#   bench/collectives.sh [--world 2] [--mib 64] [--rounds 3] [--dtype f32]
#
# Each round runs `shardrun-collective-bench bench` and `bench/collectives_gloo.py` with the
# same world size (processes × 1 thread), buffer size, warm-up and iterations, alternating
# so both see the same machine load. Prints a table of median algorithm bandwidth over the
# rounds (nccl-tests' algbw: buffer bytes / time; the buffer is the all-gather output and the
# reduce-scatter input) and the ratio shardrun / gloo. Raw JSON lines go to $OUT (default
# bench/results/collectives-<date>.jsonl). Installs nothing: it needs the venv made by
# scripts/setup.sh and builds the bench binary with cargo.
set -euo pipefail
cd "$(dirname "$0")/.."

WORLD=2 MIB=64 ROUNDS=3 DTYPE=f32
while [[ $# -gt 0 ]]; do
  case "$1" in
    --world) WORLD=$2; shift 2 ;;
    --mib) MIB=$2; shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    --dtype) DTYPE=$2; shift 2 ;;
    *) echo "unknown argument $1 (see the header of $0)" >&2; exit 2 ;;
  esac
done

source scripts/env.sh
PY=$SHARDRUN_PYTHON
[[ -x $PY ]] || { echo "no venv at $SHARDRUN_VENV: run scripts/setup.sh first" >&2; exit 1; }
cargo build --release -q -p shardrun-worker --bin shardrun-collective-bench
BIN=$CARGO_TARGET_DIR/release/shardrun-collective-bench

OUT=${OUT:-bench/results/collectives-$(date -u +%Y%m%dT%H%M%SZ).jsonl}
mkdir -p "$(dirname "$OUT")"
: > "$OUT"

free_port() { "$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# Runs one command as $WORLD ranks; rank 0's stdout (JSON lines) is appended to $OUT.
launch() {
  local port pids=() status=0
  port=$(free_port)
  for ((r = 0; r < WORLD; r++)); do
    if ((r == 0)); then
      MASTER_ADDR=127.0.0.1 MASTER_PORT=$port RANK=$r WORLD_SIZE=$WORLD LOCAL_RANK=$r \
        OMP_NUM_THREADS=1 "$@" >> "$OUT" &
    else
      MASTER_ADDR=127.0.0.1 MASTER_PORT=$port RANK=$r WORLD_SIZE=$WORLD LOCAL_RANK=$r \
        OMP_NUM_THREADS=1 "$@" > /dev/null &
    fi
    pids+=($!)
  done
  for pid in "${pids[@]}"; do wait "$pid" || status=$?; done
  return $status
}

for ((round = 1; round <= ROUNDS; round++)); do
  echo "round $round/$ROUNDS: shardrun" >&2
  launch "$BIN" bench --mib "$MIB" --dtype "$DTYPE"
  echo "round $round/$ROUNDS: gloo" >&2
  launch "$PY" bench/collectives_gloo.py --mib "$MIB" --dtype "$DTYPE"
done

"$PY" - "$OUT" <<'PY'
import json, statistics, subprocess, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
cpu = subprocess.run(["sh", "-c", "lscpu | sed -n 's/^Model name: *//p'"], capture_output=True, text=True).stdout.strip()
cores = subprocess.run(["nproc"], capture_output=True, text=True).stdout.strip()
first = rows[0]
print(f"\n{first['world_size']} ranks x 1 thread, {first['bytes'] >> 20} MiB buffers, {first['dtype']}, "
      f"{cpu} ({cores} cores); median algbw over rounds, GB/s\n")
print("| op | shardrun | gloo | shardrun / gloo |")
print("| --- | ---: | ---: | ---: |")
for op in ["all_gather", "reduce_scatter", "all_reduce"]:
    ours = statistics.median(r["algbw_gbps"] for r in rows if r["backend"] == "shardrun" and r["op"] == op)
    gloo = statistics.median(r["algbw_gbps"] for r in rows if r["backend"] == "gloo" and r["op"] == op)
    print(f"| {op} | {ours:.2f} | {gloo:.2f} | {ours / gloo:.2f}x |")
print(f"\nraw results: {sys.argv[1]}")
PY
