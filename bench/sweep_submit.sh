#!/usr/bin/env bash
# Submitting sweeps of 1,000 and 10,000 points to a real Slurm: time and disk per point.
#
#   bench/sweep_submit.sh              # 1000 and 10000 points
#   bench/sweep_submit.sh 2500         # other sizes
#
# Starts its own cluster (slurm/start.sh: MaxJobCount raised so 10,000 tasks fit, Slurm's
# default MaxArraySize=1001, so 10,000 points are 10 arrays) with its node drained, so the
# arrays stay pending and only submission is measured, then cancels everything and stops
# the cluster. Per size it prints the wall time of `shardrun sweep --dry-run` (expand, plan,
# read the limits, no writes), of the submitting `shardrun sweep` (run directories, array
# files, sbatch --hold + scontrol release per array), and of the re-run that finds every
# point pending (reads every manifest, one squeue); disk per point is `du` of the sweep
# folder over the points, with files per point (the array files included).
# Each size runs SHARDRUN_BENCH_ROUNDS times (default 3, each a new sweep); times are medians
# with the submit's range. Bytes per point count file contents, disk counts blocks used.
# Settings: SHARDRUN_BENCH_SLURM_DIR (default /tmp/shardrun-slurm-bench),
# SHARDRUN_BENCH_SLURM_PORT (default 6880). It runs the release build of this clone.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
sizes=("$@")
(( ${#sizes[@]} )) || sizes=(1000 10000)
rounds="${SHARDRUN_BENCH_ROUNDS:-3}"
export SHARDRUN_SLURM_DIR="${SHARDRUN_BENCH_SLURM_DIR:-/tmp/shardrun-slurm-bench}"
export SHARDRUN_SLURM_PORT="${SHARDRUN_BENCH_SLURM_PORT:-6880}"
export SHARDRUN_SLURM_MAX_JOB_COUNT=100000
# shellcheck source=../slurm/env.sh
. "$here/slurm/env.sh"   # every Slurm command below talks to the bench cluster only
# shellcheck source=../scripts/env.sh
. "$here/scripts/env.sh"  # the release build of this clone
shardrun="$SHARDRUN_BIN/shardrun"
[ -x "$shardrun" ] || { echo "no $shardrun: build it (cargo build --release -p shardrun)" >&2; exit 1; }

work="$(mktemp -d /tmp/shardrun-sweep-bench-XXXXXX)"
cleanup() {
    scancel --user="$(id -un)" >/dev/null 2>&1 || true
    "$here/slurm/stop.sh" --purge >/dev/null 2>&1 || true
    rm -rf "$work"
}
trap cleanup EXIT
"$here/slurm/start.sh" >/dev/null 2>&1
node="$(sinfo -h -o %n | head -1)"
scontrol update nodename="$node" state=drain reason=sweep-bench

seconds() { # <command...>: wall seconds of the command, its output kept in $work/out
    local start end
    start=$(date +%s.%N)
    "$@" >"$work/out" 2>&1 || { cat "$work/out" >&2; return 1; }
    end=$(date +%s.%N)
    echo "$end - $start" | bc -l
}

median() { sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
range() { sort -g | awk 'NR==1 {lo=$1} {hi=$1} END {printf "%.2f-%.2f", lo, hi}'; }
printf '%-7s %-7s %-10s %-18s %-12s %-10s %-12s %-10s %s\n' points arrays "dry-run s" "submit s (range)" "submit ms/pt" "re-run s" "disk KiB/pt" "bytes/pt" "files/pt"
for n in "${sizes[@]}"; do
    lrs=$(( (n + 99) / 100 ))
    : >"$work/dry"; : >"$work/submit"; : >"$work/rerun"
    for round in $(seq 1 "$rounds"); do
        name="bench$n-$round"
        spec="$work/$name.yaml"
        {
            sed "s/^name: .*/name: $name/" "$here/examples/demo.yaml"
            echo "run_root: $work/runs"
            echo "sweep:"
            echo "  grid:"
            printf '    training.optimizer.lr: ['; for i in $(seq 1 "$lrs"); do printf '%s%se-5' "$([ "$i" = 1 ] || echo ', ')" "$i"; done; echo ']'
            printf '    training.seed: ['; for i in $(seq 0 99); do printf '%s%s' "$([ "$i" = 0 ] || echo ', ')" "$i"; done; echo ']'
        } >"$spec"
        sync
        seconds "$shardrun" sweep --dry-run "$spec" >>"$work/dry"
        seconds "$shardrun" sweep "$spec" >>"$work/submit"
        arrays=$(grep -o 'as [0-9]* job array' "$work/out" | grep -o '[0-9]*')
        points=$(grep -o 'Submitted [0-9]* point' "$work/out" | grep -o '[0-9]*')
        seconds "$shardrun" sweep "$spec" >>"$work/rerun"
        grep -q "Nothing to submit" "$work/out" || { cat "$work/out" >&2; exit 1; }
        folder="$work/runs/$name"
        kib=$(du -sk "$folder" | cut -f1)
        bytes=$(find "$folder" -type f -printf '%s\n' | awk '{s+=$1} END {print s}')
        files=$(find "$folder" -type f | wc -l)
        scancel --user="$(id -un)" >/dev/null 2>&1 || true
    done
    submit=$(median <"$work/submit")
    printf '%-7s %-7s %-10.2f %-18s %-12.3f %-10.2f %-12.1f %-10.0f %.2f\n' "$points" "$arrays" "$(median <"$work/dry")" \
        "$(printf '%.2f' "$submit") ($(range <"$work/submit"))" "$(echo "$submit * 1000 / $points" | bc -l)" \
        "$(median <"$work/rerun")" "$(echo "$kib / $points" | bc -l)" "$(echo "$bytes / $points" | bc -l)" \
        "$(echo "$files / $points" | bc -l)"
done
