#!/usr/bin/env bash
# Stop the cluster started by slurm/start.sh: only the processes named in its pid files.
#   slurm/stop.sh            # stop the daemons, keep the state folder
#   slurm/stop.sh --purge    # also delete the state folder (SHARDRUN_SLURM_DIR)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=env.sh
. "$here/env.sh"
dir="$SHARDRUN_SLURM_DIR"

say() { echo "slurm/stop.sh: $*" >&2; }

[ -d "$dir" ] || { say "nothing to stop: $dir does not exist"; exit 0; }
exec 9>"$dir/lock"
flock 9

stop() { # <pid file> <program name>
    local pid
    [ -s "$1" ] || { say "$2 not running (no pid file)"; return 0; }
    pid="$(cat "$1")"
    # Only signal the pid if it still is that program (pids get reused).
    if [ -r "/proc/$pid/cmdline" ] && tr '\0' ' ' <"/proc/$pid/cmdline" | grep -q "$2"; then
        kill "$pid"
        for _ in $(seq 100); do [ -e "/proc/$pid" ] || break; sleep 0.1; done
        if [ -e "/proc/$pid" ]; then
            say "$2 ($pid) did not stop in 10 s; sending KILL"
            kill -9 "$pid" 2>/dev/null || true
        fi
        say "$2 stopped"
    else
        say "$2 not running (stale pid file)"
    fi
    rm -f "$1"
}

for pidfile in "$dir"/pids/slurmd*.pid; do
    [ -e "$pidfile" ] && stop "$pidfile" slurmd
done
stop "$dir/pids/slurmctld.pid" slurmctld
stop "$dir/pids/slurmdbd.pid" slurmdbd
stop "$dir/pids/mariadbd.pid" mariadbd
stop "$dir/pids/munged.pid" munged

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

if [ "${1:-}" = "--purge" ]; then
    rm -rf "$dir"
    say "removed $dir"
fi
