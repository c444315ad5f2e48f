#!/usr/bin/env bash
# Stop the cluster started by slurm/start.sh: its jobs, then every daemon it started (slurmd,
# slurmctld with its slurmscriptd, slurmdbd, mariadbd, munged), each found by its pid file and
# signalled only if that pid still runs that program for this cluster; then whatever of this
# cluster is left without a pid file, and the --nodes namespaces.
#   slurm/stop.sh            # stop the daemons, keep the state folder
#   slurm/stop.sh --purge    # also delete the state folder (SHARDRUN_SLURM_DIR)
# Exits non-zero if a daemon of this cluster is still alive afterwards.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=env.sh
. "$here/env.sh"
dir="$SHARDRUN_SLURM_DIR"
# shellcheck source=daemons.sh
. "$here/daemons.sh"

say() { echo "slurm/stop.sh: $*" >&2; }

[ -d "$dir" ] || { say "nothing to stop: $dir does not exist"; exit 0; }
exec 9>"$dir/lock"
flock 9

# Jobs still running would outlive their cluster (slurmstepd does not stop with slurmd).
if cluster_pid slurmctld "$(cat "$dir/pids/slurmctld.pid" 2>/dev/null || true)" "$dir" >/dev/null; then
    jobs="$(squeue -h -o %A 2>/dev/null | sort -u | tr '\n' ' ' || true)"
    if [ -n "${jobs// /}" ]; then
        # shellcheck disable=SC2086
        scancel $jobs 2>/dev/null && say "cancelled the jobs still queued or running: $jobs"
    fi
fi

stop() { # <pid file> <program>
    local pid
    if [ ! -s "$1" ]; then
        say "$2: no pid file $1 (not started)"
        return 0
    fi
    pid="$(cat "$1")"
    if cluster_pid "$2" "$pid" "$dir" >/dev/null; then
        stop_pid "$pid" "$2"
    else
        say "$2 not running (pid $pid in $1 is gone or another program)"
    fi
    rm -f "$1"
}

stop_pid() { # <pid> <program>
    kill "$1" 2>/dev/null || true
    for _ in $(seq 100); do [ -e "/proc/$1" ] || break; sleep 0.1; done
    if [ -e "/proc/$1" ]; then
        say "$2 ($1) did not stop in 10 s; sending KILL"
        kill -9 "$1" 2>/dev/null || true
        for _ in $(seq 50); do [ -e "/proc/$1" ] || break; sleep 0.1; done
    fi
    say "$2 ($1) stopped"
}

shopt -s nullglob
# slurmd.pid, or slurmd-<node>.pid with --nodes: not slurmdbd.pid.
for pidfile in "$dir/pids/slurmd.pid" "$dir"/pids/slurmd-*.pid; do
    [ -e "$pidfile" ] && stop "$pidfile" slurmd
done
stop "$dir/pids/slurmctld.pid" slurmctld
stop "$dir/pids/slurmdbd.pid" slurmdbd
stop "$dir/pids/mariadbd.pid" mariadbd
stop "$dir/pids/munged.pid" munged
# What is left has no pid file: slurmscriptd (slurmctld's helper) if it outlived slurmctld,
# the slurmstepd of a job that was still ending, a daemon whose pid file was lost. They are
# this cluster's by their command line or SLURM_CONF (slurm/daemons.sh).
cluster_daemons "$dir" | while read -r pid program; do
    say "$program ($pid) had no pid file"
    stop_pid "$pid" "$program"
done

# Extra nodes of `start.sh --nodes N`: their namespaces, veth pairs and /etc/hosts lines.
port="${SHARDRUN_SLURM_PORT:-6817}"
if command -v ip >/dev/null; then
    for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep "^shardrun-$port-n" || true); do
        ip netns del "$ns" && say "removed network namespace $ns"
        rm -rf "/etc/netns/$ns"
    done
    for link in $(ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | sed 's/@.*//' | grep "^sr${port}n" || true); do
        ip link del "$link" 2>/dev/null || true
    done
fi
if grep -q -F "# shardrun-slurm $dir" /etc/hosts 2>/dev/null; then
    grep -v -F "# shardrun-slurm $dir" /etc/hosts >"$dir/hosts.new" || true
    cat "$dir/hosts.new" >/etc/hosts
    rm -f "$dir/hosts.new"
fi

left="$(cluster_daemons "$dir")"
if [ -n "$left" ]; then
    say "error: daemons of $dir are still alive (pid, program):"
    echo "$left" | sed 's/^/    /' >&2
    exit 1
fi

if [ "${1:-}" = "--purge" ]; then
    rm -rf "$dir"
    say "removed $dir"
fi
