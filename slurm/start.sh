#!/usr/bin/env bash
# Start a single-node Slurm cluster (munged, slurmctld, slurmd) for tests and trying shardrun.
#
#   slurm/start.sh            # idempotent: starts what is not running yet
#   . slurm/env.sh            # then sbatch/squeue/shardrun submit use this cluster
#   slurm/stop.sh             # stops exactly what start.sh started
#
# Everything (configs, keys, spool, logs, pid files, fake GPU devices) lives under one folder:
#   SHARDRUN_SLURM_DIR   state folder (default /tmp/shardrun-slurm)
#   SHARDRUN_SLURM_PORT  slurmctld port (default 6817; slurmd uses the next one)
#   SHARDRUN_SLURM_GPUS  fake GPUs on the node, exposed through gres (default 2)
#   SHARDRUN_SLURM_CPUS  CPUs Slurm may hand out (default 8; more than the cores is fine for
#                        one-thread test tasks thanks to SlurmdParameters=config_overrides)
# Installs Debian's slurm-wlm and munge if they are missing. Needs root (daemons run as root).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=env.sh
. "$here/env.sh"
dir="$SHARDRUN_SLURM_DIR"
port="${SHARDRUN_SLURM_PORT:-6817}"
gpus="${SHARDRUN_SLURM_GPUS:-2}"
cpus="${SHARDRUN_SLURM_CPUS:-8}"
host="$(hostname -s)"

say() { echo "slurm/start.sh: $*" >&2; }
die() { say "error: $*"; exit 1; }

[ "$(id -u)" -eq 0 ] || die "run as root (slurmd and munged need it); e.g. sudo $0"

if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null || ! command -v munged >/dev/null; then
    say "installing slurm-wlm and munge (Debian packages)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -q slurm-wlm munge >/dev/null 2>&1 || {
        apt-get update -q >/dev/null && apt-get install -y -q slurm-wlm munge >/dev/null
    } || die "apt-get install slurm-wlm munge failed; install them by hand and re-run"
fi

# A pid file names a live process of the expected program.
running() { # <pid file> <program name>
    local pid
    [ -s "$1" ] || return 1
    pid="$(cat "$1")"
    [ -r "/proc/$pid/cmdline" ] && tr '\0' ' ' <"/proc/$pid/cmdline" | grep -q "$2"
}

mkdir -p "$dir"/{etc,munge/run,spool/ctld,spool/d,log,pids,dev}
chmod 755 "$dir" "$dir/munge" "$dir/munge/run"

# --- munge -------------------------------------------------------------------------------
socket="$dir/munge/run/munge.socket"
if [ ! -s "$dir/munge/munge.key" ]; then
    dd if=/dev/urandom of="$dir/munge/munge.key" bs=1024 count=1 status=none
fi
chmod 400 "$dir/munge/munge.key"
if running "$dir/pids/munged.pid" munged; then
    say "munged already running"
else
    rm -f "$socket" "$socket.lock"
    munged --force --socket="$socket" --key-file="$dir/munge/munge.key" \
        --pid-file="$dir/pids/munged.pid" --log-file="$dir/log/munged.log" \
        --seed-file="$dir/munge/munge.seed"
    say "munged started"
fi
for _ in $(seq 50); do [ -S "$socket" ] && break; sleep 0.1; done
[ -S "$socket" ] || die "munged did not create $socket; see $dir/log/munged.log"

# --- fake GPUs: gres needs character devices, /dev/null's numbers will do -------------------
gres_line=""
if [ "$gpus" -gt 0 ]; then
    for i in $(seq 0 $((gpus - 1))); do
        [ -c "$dir/dev/gpu$i" ] || mknod "$dir/dev/gpu$i" c 1 3
    done
    gres_line="Gres=gpu:$gpus"
    {
        echo "AutoDetect=off"
        echo "Name=gpu File=$dir/dev/gpu[0-$((gpus - 1))]"
    } >"$dir/etc/gres.conf"
else
    echo "AutoDetect=off" >"$dir/etc/gres.conf"
fi

# --- slurm.conf ---------------------------------------------------------------------------
memory="$(slurmd -C | sed -n 's/.*RealMemory=\([0-9]*\).*/\1/p')"
cat >"$dir/etc/slurm.conf.new" <<CONF
# Written by slurm/start.sh; regenerated on every start.
ClusterName=shardrun
SlurmctldHost=$host
SlurmctldPort=$port
SlurmdPort=$((port + 1))
AuthType=auth/munge
AuthInfo=socket=$socket
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$dir/spool/ctld
SlurmdSpoolDir=$dir/spool/d
SlurmctldPidFile=$dir/pids/slurmctld.pid
SlurmdPidFile=$dir/pids/slurmd.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
SchedulerParameters=batch_sched_delay=0
SlurmdParameters=config_overrides
ReturnToService=2
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
# Keep ended jobs visible to scontrol for 10 minutes (status falls back to it without sacct).
MinJobAge=600
KillWait=5
GresTypes=gpu
NodeName=$host CPUs=$cpus RealMemory=${memory:-1000} $gres_line State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
CONF
mv "$dir/etc/slurm.conf.new" "$dir/etc/slurm.conf"

# --- daemons ------------------------------------------------------------------------------
if running "$dir/pids/slurmctld.pid" slurmctld; then
    say "slurmctld already running"
else
    slurmctld -f "$SLURM_CONF" || die "slurmctld failed to start; see $dir/log/slurmctld.log"
    say "slurmctld started"
fi
if running "$dir/pids/slurmd.pid" slurmd; then
    say "slurmd already running"
else
    slurmd -f "$SLURM_CONF" || die "slurmd failed to start; see $dir/log/slurmd.log"
    say "slurmd started"
fi

# --- wait until the node takes jobs --------------------------------------------------------
state=""
for _ in $(seq 100); do
    state="$(sinfo -h -n "$host" -o '%t' 2>/dev/null || true)"
    case "$state" in
        idle*|mix*|alloc*) break ;;
        down*|drain*) scontrol update nodename="$host" state=resume >/dev/null 2>&1 || true ;;
    esac
    sleep 0.2
done
case "$state" in
    idle*|mix*|alloc*) say "node $host is $state; run '. slurm/env.sh' to use this cluster" ;;
    *) die "node $host is '${state:-unknown}' after 20 s; see $dir/log/slurmctld.log and $dir/log/slurmd.log" ;;
esac
