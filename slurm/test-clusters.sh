#!/usr/bin/env bash
# The Slurm clusters the end-to-end tests start, from one list that the test harness
# (tests/src/lib.rs) and scripts/test.sh both read: slurm/test-clusters.txt.
#   slurm/test-clusters.sh list         # name, state folder, port and settings of each
#   slurm/test-clusters.sh start NAME   # start one (idempotent); prints its state folder
#   slurm/test-clusters.sh stop         # stop every one (slurm/stop.sh); fails if one fails
#   slurm/test-clusters.sh check        # fail, naming them, if any daemon of one is alive
# SHARDRUN_TEST_CLUSTERS names another list (to run the tests beside clusters someone else
# runs on the default ports); SHARDRUN_SLURM_DIR and SHARDRUN_SLURM_PORT move `default`.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=daemons.sh
. "$here/daemons.sh"
list="${SHARDRUN_TEST_CLUSTERS:-$here/test-clusters.txt}"

say() { echo "slurm/test-clusters.sh: $*" >&2; }
[ -r "$list" ] || { say "error: cannot read the cluster list $list"; exit 2; }

# Prints "name dir port settings..." per cluster, with the environment's overrides applied.
clusters() {
    local name dir port rest
    while read -r name dir port rest; do
        case "$name" in ''|'#'*) continue ;; esac
        if [ -z "$dir" ] || ! [ "$port" -gt 0 ] 2>/dev/null; then
            say "error: $list: '$name' needs a state folder and a port"
            exit 2
        fi
        if [ "$name" = default ]; then
            dir="${SHARDRUN_SLURM_DIR:-$dir}"
            port="${SHARDRUN_SLURM_PORT:-$port}"
        fi
        echo "$name $dir $port $rest"
    done <"$list"
}

case "${1:-}" in
    list)
        clusters
        ;;
    start)
        name="${2:?usage: slurm/test-clusters.sh start NAME}"
        line="$(clusters | awk -v n="$name" '$1 == n')"
        [ -n "$line" ] || { say "error: no cluster '$name' in $list"; exit 2; }
        read -r _ dir port rest <<<"$line"
        envs=(SHARDRUN_SLURM_DIR="$dir" SHARDRUN_SLURM_PORT="$port")
        args=()
        for word in $rest; do
            case "$word" in
                [A-Z]*=*) envs+=("$word") ;;
                *) args+=("$word") ;;
            esac
        done
        env "${envs[@]}" "$here/start.sh" "${args[@]}" >&2
        echo "$dir"
        ;;
    stop)
        status=0
        while read -r name dir port _; do
            SHARDRUN_SLURM_DIR="$dir" SHARDRUN_SLURM_PORT="$port" "$here/stop.sh" </dev/null \
                || { say "stopping '$name' ($dir) failed"; status=1; }
        done < <(clusters)
        exit "$status"
        ;;
    check)
        status=0
        while read -r name dir _; do
            left="$(cluster_daemons "$dir")"
            if [ -n "$left" ]; then
                say "error: cluster '$name' ($dir) still has daemons running (pid, program):"
                echo "$left" | sed 's/^/    /' >&2
                status=1
            fi
        done < <(clusters)
        [ "$status" = 0 ] && say "no daemon of a test cluster is running"
        exit "$status"
        ;;
    *)
        sed -n '2,9p' "$0" >&2
        exit 2
        ;;
esac
