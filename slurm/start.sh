#!/usr/bin/env bash
# Start a single-node Slurm cluster (munged, slurmctld, slurmd) for tests and trying shardrun.
#
#   slurm/start.sh            # idempotent: starts what is not running yet
#   slurm/start.sh --with-accounting   # also MariaDB + slurmdbd, so `sacct` works
#   slurm/start.sh --with-preemption  # partitions `debug` (default, preemptable: requeued,
#                               with a grace time and the job's --signal sent at preemption)
#                               and `urgent`, whose jobs preempt debug's
#   slurm/start.sh --nodes 2  # this host plus a node in a network (and UTS) namespace
#                               named <host>-n2, behind a veth pair: jobs span real
#                               separate network stacks (multi-node tests)
#   . slurm/env.sh            # then sbatch/squeue/shardrun submit use this cluster
#   slurm/stop.sh             # stops exactly what start.sh started
#
# Everything (configs, keys, spool, logs, pid files, fake GPU devices) lives under one folder:
#   SHARDRUN_SLURM_DIR   state folder (default /tmp/shardrun-slurm)
#   SHARDRUN_SLURM_PORT  slurmctld port (default 6817; slurmd uses the next one)
#   SHARDRUN_SLURM_GPUS  fake GPUs on the node, exposed through gres as type `fake` (default 2)
#   SHARDRUN_SLURM_MIN_JOB_AGE  seconds slurmctld keeps ended jobs (default 600)
#   SHARDRUN_SLURM_CPUS  CPUs Slurm may hand out (default 8; more than the cores is fine for
#                        one-thread test tasks thanks to SlurmdParameters=config_overrides)
#   SHARDRUN_SLURM_SUBNET  first three octets of the --nodes network (default 10.99.<port mod 250>)
#   SHARDRUN_SLURM_MAX_ARRAY_SIZE  Slurm's MaxArraySize: array indices stay below it (default
#                        1001, Slurm's own)
#   SHARDRUN_SLURM_MAX_JOB_COUNT   Slurm's MaxJobCount: jobs (array tasks count one each)
#                        slurmctld holds at once (default 10000, Slurm's own)
#   SHARDRUN_SLURM_GRACE_TIME  with --with-preemption: seconds a preempted job of `debug` gets
#                        between its signal and the kill (default 120)
# Installs Debian's slurm-wlm and munge (and slurmdbd, mariadb-server for accounting) if they
# are missing. Needs root (daemons run as root).
set -euo pipefail

accounting=0
preemption=0
nodes=1
while [ $# -gt 0 ]; do
    case "$1" in
        --with-accounting) accounting=1 ;;
        --with-preemption) preemption=1 ;;
        --nodes) nodes="${2:-}"; shift ;;
        -h|--help) sed -n '2,30p' "$0"; exit 0 ;;
        *) echo "slurm/start.sh: unknown option $1 (try --help)" >&2; exit 2 ;;
    esac
    shift
done
case "$nodes" in
    [1-9]) ;;
    *) echo "slurm/start.sh: --nodes takes 1 to 9, not '$nodes'" >&2; exit 2 ;;
esac

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=env.sh
. "$here/env.sh"
dir="$SHARDRUN_SLURM_DIR"
port="${SHARDRUN_SLURM_PORT:-6817}"
gpus="${SHARDRUN_SLURM_GPUS:-2}"
cpus="${SHARDRUN_SLURM_CPUS:-8}"
min_job_age="${SHARDRUN_SLURM_MIN_JOB_AGE:-600}"
max_array_size="${SHARDRUN_SLURM_MAX_ARRAY_SIZE:-1001}"
max_job_count="${SHARDRUN_SLURM_MAX_JOB_COUNT:-10000}"
grace_time="${SHARDRUN_SLURM_GRACE_TIME:-120}"
host="$(hostname -s)"
# One /24 per cluster port, so clusters on different ports do not clash.
subnet="${SHARDRUN_SLURM_SUBNET:-10.99.$((port % 250))}"

say() { echo "slurm/start.sh: $*" >&2; }
die() { say "error: $*"; exit 1; }

for setting in "max_array_size=$max_array_size" "max_job_count=$max_job_count" "grace_time=$grace_time"; do
    case "${setting#*=}" in
        ''|*[!0-9]*|0) die "SHARDRUN_SLURM_$(echo "${setting%%=*}" | tr a-z A-Z) must be a whole number above 0, not '${setting#*=}'" ;;
    esac
done

[ "$(id -u)" -eq 0 ] || die "run as root (slurmd and munged need it); e.g. sudo $0"

if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null || ! command -v munged >/dev/null; then
    say "installing slurm-wlm and munge (Debian packages)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -q slurm-wlm munge >/dev/null 2>&1 || {
        apt-get update -q >/dev/null && apt-get install -y -q slurm-wlm munge >/dev/null
    } || die "apt-get install slurm-wlm munge failed; install them by hand and re-run"
fi

if [ "$accounting" = 1 ] && { ! command -v slurmdbd >/dev/null || ! command -v mariadbd >/dev/null; }; then
    say "installing slurmdbd and mariadb-server (Debian packages)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q slurmdbd mariadb-server >/dev/null 2>&1 \
        || die "apt-get install slurmdbd mariadb-server failed; install them by hand and re-run"
fi

# shellcheck source=daemons.sh
. "$here/daemons.sh"
# A pid file names a live process of the expected program, of this cluster.
running() { # <pid file> <program name>
    [ -s "$1" ] && cluster_pid "$2" "$(cat "$1")" "$dir"
}

mkdir -p "$dir"/{etc,munge/run,spool/ctld,spool/d,log,pids,dev}
# One start or stop at a time (tests start the cluster from several processes at once).
exec 9>"$dir/lock"
flock 9
chmod 755 "$dir" "$dir/munge" "$dir/munge/run"

# The running daemons were configured with or without accounting, with their nodes and
# limits; switching needs a restart. Limits left at Slurm's defaults are not named.
mode="accounting=$accounting nodes=$nodes"
[ "$max_array_size" = 1001 ] || mode="$mode max_array_size=$max_array_size"
[ "$max_job_count" = 10000 ] || mode="$mode max_job_count=$max_job_count"
old_mode="$(cat "$dir/mode" 2>/dev/null || true)"
case "$old_mode" in *nodes=*|"") ;; *) old_mode="$old_mode nodes=1" ;; esac # older start.sh
if [ -n "$old_mode" ] && [ "$old_mode" != "$mode" ] && running "$dir/pids/slurmctld.pid" slurmctld; then
    die "the cluster in $dir runs with $old_mode; run slurm/stop.sh first to switch"
fi
echo "$mode" >"$dir/mode"

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
    # 9>&-: daemons must not inherit (and hold) the lock.
    munged 9>&- --force --socket="$socket" --key-file="$dir/munge/munge.key" \
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
    # Typed, as GPUs on real sites are: jobs may ask `gpu:N` or `gpu:fake:N`.
    gres_line="Gres=gpu:fake:$gpus"
    {
        echo "AutoDetect=off"
        echo "Name=gpu Type=fake File=$dir/dev/gpu[0-$((gpus - 1))]"
    } >"$dir/etc/gres.conf"
else
    echo "AutoDetect=off" >"$dir/etc/gres.conf"
fi

# --- accounting: MariaDB and slurmdbd (optional) -------------------------------------------
dbd_port=$((port + 2))
db_port=$((port + 3))
accounting_lines="AccountingStorageType=accounting_storage/none"
if [ "$accounting" = 1 ]; then
    db="$dir/mysql"
    mkdir -p "$db"
    if [ ! -d "$db/data/mysql" ]; then
        mariadb-install-db --user=root --datadir="$db/data" --auth-root-authentication-method=socket \
            >"$dir/log/mariadb-install.log" 2>&1 || die "mariadb-install-db failed; see $dir/log/mariadb-install.log"
    fi
    if running "$dir/pids/mariadbd.pid" mariadbd; then
        say "mariadbd already running"
    else
        # Started in its own session so it outlives this script; its pid file is what stop.sh uses.
        setsid mariadbd 9>&- --no-defaults --user=root --datadir="$db/data" --socket="$db/mysqld.sock" \
            --port="$db_port" --bind-address=127.0.0.1 --pid-file="$dir/pids/mariadbd.pid" \
            --log-error="$dir/log/mariadbd.log" </dev/null >/dev/null 2>&1 &
        say "mariadbd started"
    fi
    for _ in $(seq 100); do
        mariadb --no-defaults -S "$db/mysqld.sock" -u root -e 'select 1' >/dev/null 2>&1 && break
        sleep 0.2
    done
    mariadb --no-defaults -S "$db/mysqld.sock" -u root -e \
        "CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY 'shardrun'; GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';" \
        || die "MariaDB did not come up; see $dir/log/mariadbd.log"
    cat >"$dir/etc/slurmdbd.conf" <<DBD
AuthType=auth/munge
AuthInfo=socket=$socket
DbdHost=localhost
DbdPort=$dbd_port
SlurmUser=root
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$db_port
StorageUser=slurm
StoragePass=shardrun
StorageLoc=slurm_acct_db
PidFile=$dir/pids/slurmdbd.pid
LogFile=$dir/log/slurmdbd.log
DBD
    chmod 600 "$dir/etc/slurmdbd.conf"
    if running "$dir/pids/slurmdbd.pid" slurmdbd; then
        say "slurmdbd already running"
    else
        # slurmdbd reads slurmdbd.conf from the folder of $SLURM_CONF.
        slurmdbd 9>&- || die "slurmdbd failed to start; see $dir/log/slurmdbd.log"
        say "slurmdbd started"
    fi
    for _ in $(seq 100); do
        (exec 3<>"/dev/tcp/127.0.0.1/$dbd_port") 2>/dev/null && break
        sleep 0.2
    done
    (exec 3<>"/dev/tcp/127.0.0.1/$dbd_port") 2>/dev/null \
        || die "slurmdbd does not listen on port $dbd_port; see $dir/log/slurmdbd.log"
    # slurmctld authenticates to slurmdbd through munge: the password field names the socket.
    # Association limits (sacctmgr ... set MaxSubmitJobs=N) are enforced, as on real sites.
    accounting_lines="AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStoragePort=$dbd_port
AccountingStoragePass=$socket
AccountingStorageEnforce=associations,limits"
fi

# --- extra nodes: network + UTS namespaces behind veth pairs (--nodes N) -------------------
# Node 1 is this host at $subnet.1; node k is namespace shardrun-<port>-n<k> at $subnet.k,
# with hostname <host>-n<k>. Names resolve both ways: /etc/netns/<ns>/hosts inside (ip netns
# exec mounts it over /etc/hosts), marked lines appended to /etc/hosts outside.
netns_of() { echo "shardrun-$port-n$1"; }
node_name() { if [ "$1" = 1 ]; then echo "$host"; else echo "$host-n$1"; fi; }
hosts_mark="# shardrun-slurm $dir"
if [ "$nodes" -gt 1 ]; then
    command -v ip >/dev/null || die "--nodes needs iproute2 (ip); apt-get install iproute2"
    command -v unshare >/dev/null && command -v nsenter >/dev/null \
        || die "--nodes needs unshare and nsenter (util-linux)"
    for k in $(seq 2 "$nodes"); do
        ns="$(netns_of "$k")"
        outer="sr${port}n${k}o"; inner="sr${port}n${k}i"
        if ! ip netns list | grep -qw "$ns"; then
            ip netns add "$ns" || die "cannot create network namespace $ns (needs CAP_NET_ADMIN)"
            ip link add "$outer" type veth peer name "$inner"
            ip link set "$inner" netns "$ns"
            ip netns exec "$ns" ip addr add "$subnet.$k/24" dev "$inner"
            ip netns exec "$ns" ip link set "$inner" up
            ip netns exec "$ns" ip link set lo up
            # The first pair carries this host's address; the others route through it.
            if [ "$k" = 2 ]; then
                ip addr add "$subnet.1/24" dev "$outer"
                ip link set "$outer" up
            else
                ip link set "$outer" up
                ip route replace "$subnet.$k/32" dev "$outer"
            fi
            say "node $(node_name "$k") is namespace $ns at $subnet.$k"
        fi
        mkdir -p "/etc/netns/$ns"
        {
            echo "127.0.0.1 localhost"
            for j in $(seq 1 "$nodes"); do echo "$subnet.$j $(node_name "$j")"; done
        } >"/etc/netns/$ns/hosts"
    done
    grep -v -F "$hosts_mark" /etc/hosts >"$dir/hosts.new" || true
    for j in $(seq 2 "$nodes"); do echo "$subnet.$j $(node_name "$j") $hosts_mark"; done >>"$dir/hosts.new"
    cat "$dir/hosts.new" >/etc/hosts
fi

# --- slurm.conf ---------------------------------------------------------------------------
memory="$(slurmd -C | sed -n 's/.*RealMemory=\([0-9]*\).*/\1/p')"
if [ "$nodes" = 1 ]; then
    ctld_host="$host"
    node_suffix=""
    node_lines="NodeName=$host CPUs=$cpus RealMemory=${memory:-1000} $gres_line State=UNKNOWN"
else
    # Every daemon and step reaches slurmctld and the nodes through the veth network.
    ctld_host="$host($subnet.1)"
    node_suffix="-%n"
    node_lines=""
    for k in $(seq 1 "$nodes"); do
        node_lines="$node_lines
NodeName=$(node_name "$k") NodeAddr=$subnet.$k CPUs=$cpus RealMemory=${memory:-1000} $gres_line State=UNKNOWN"
    done
fi
partition_lines="PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP"
scheduler_parameters="batch_sched_delay=0"
if [ "$preemption" = 1 ]; then
    # As sites that lend idle GPUs to preemptable jobs do: a higher partition's job takes the
    # nodes, the preempted job is requeued after its grace time, and send_user_signal hands it
    # its own --signal (shardrun's USR2) at the start of the grace time instead of SIGTERM.
    # (Slurm 23.02 moved the option from SchedulerParameters to PreemptParameters.)
    preempt_parameters=""
    if [ "$(slurmctld -V | sed -n 's/^slurm[-a-z]* \([0-9]*\)\..*/\1/p')" -ge 23 ]; then
        preempt_parameters="PreemptParameters=send_user_signal"
    else
        scheduler_parameters="$scheduler_parameters,preempt_send_user_signal"
    fi
    partition_lines="PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
$preempt_parameters
$partition_lines PriorityTier=1 GraceTime=$grace_time
PartitionName=urgent Nodes=ALL MaxTime=INFINITE State=UP PriorityTier=2"
fi
cat >"$dir/etc/slurm.conf.new" <<CONF
# Written by slurm/start.sh; regenerated on every start.
ClusterName=shardrun
SlurmctldHost=$ctld_host
SlurmctldPort=$port
SlurmdPort=$((port + 1))
AuthType=auth/munge
AuthInfo=socket=$socket
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$dir/spool/ctld
SlurmdSpoolDir=$dir/spool/d$node_suffix
SlurmctldPidFile=$dir/pids/slurmctld.pid
SlurmdPidFile=$dir/pids/slurmd$node_suffix.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd$node_suffix.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
SchedulerParameters=$scheduler_parameters
SlurmdParameters=config_overrides
ReturnToService=2
JobAcctGatherType=jobacct_gather/none
$accounting_lines
# How long ended jobs stay visible to squeue/scontrol (status relies on them without sacct).
MinJobAge=$min_job_age
MaxArraySize=$max_array_size
MaxJobCount=$max_job_count
KillWait=5
GresTypes=gpu
$node_lines
$partition_lines
CONF
changed=1
cmp -s "$dir/etc/slurm.conf.new" "$dir/etc/slurm.conf" 2>/dev/null && changed=0
mv "$dir/etc/slurm.conf.new" "$dir/etc/slurm.conf"

# --- daemons ------------------------------------------------------------------------------
if [ "$accounting" = 1 ]; then
    # The cluster (with its root account and user) must be in the database before slurmctld
    # registers: it enforces associations from its first job on.
    for _ in $(seq 50); do
        sacctmgr -n -P show cluster format=Cluster 2>/dev/null | grep -qx shardrun && break
        sacctmgr -i add cluster shardrun >/dev/null 2>&1 || sleep 0.2
    done
    sacctmgr -n -P show cluster format=Cluster 2>/dev/null | grep -qx shardrun \
        || die "sacctmgr cannot add the cluster to the database; see $dir/log/slurmdbd.log"
fi
if running "$dir/pids/slurmctld.pid" slurmctld; then
    if [ "$changed" = 1 ]; then
        scontrol reconfigure && say "slurmctld already running; told it to re-read slurm.conf"
    else
        say "slurmctld already running"
    fi
else
    slurmctld 9>&- -f "$SLURM_CONF" || die "slurmctld failed to start; see $dir/log/slurmctld.log"
    say "slurmctld started"
fi
if [ "$nodes" = 1 ]; then
    if running "$dir/pids/slurmd.pid" slurmd; then
        say "slurmd already running"
    else
        slurmd 9>&- -f "$SLURM_CONF" || die "slurmd failed to start; see $dir/log/slurmd.log"
        say "slurmd started"
    fi
else
    for k in $(seq 1 "$nodes"); do
        name="$(node_name "$k")"
        if running "$dir/pids/slurmd-$name.pid" slurmd; then
            say "slurmd of $name already running"
        elif [ "$k" = 1 ]; then
            mkdir -p "$dir/spool/d-$name"
            slurmd 9>&- -N "$name" -f "$SLURM_CONF" || die "slurmd failed to start; see $dir/log/slurmd-$name.log"
            say "slurmd of $name started"
        else
            # Its own network stack, hostname and /etc/hosts; the same files, cgroups, munge
            # socket and binaries (nsenter, not `ip netns exec`, which remounts /sys).
            ns="$(netns_of "$k")"
            mkdir -p "$dir/spool/d-$name"
            nsenter --net="/run/netns/$ns" unshare --uts --mount sh -c \
                "mount --bind '/etc/netns/$ns/hosts' /etc/hosts && hostname '$name' && exec slurmd -N '$name' -f '$SLURM_CONF'" 9>&- \
                || die "slurmd of $name failed to start; see $dir/log/slurmd-$name.log"
            say "slurmd of $name started"
        fi
    done
fi

# --- wait until every node takes jobs ------------------------------------------------------
for k in $(seq 1 "$nodes"); do
    name="$(node_name "$k")"
    state=""
    for _ in $(seq 100); do
        state="$(sinfo -h -n "$name" -o '%t' 2>/dev/null || true)"
        # `plnd`: up and idle, held by the backfill scheduler for a job left in the saved state.
        case "$state" in
            idle*|mix*|alloc*|plnd*) break ;;
            down*|drain*) scontrol update nodename="$name" state=resume >/dev/null 2>&1 || true ;;
        esac
        sleep 0.2
    done
    case "$state" in
        idle*|mix*|alloc*|plnd*)
            # env.sh picks the cluster by its folder: name it unless it is the default one.
            use=". slurm/env.sh"
            [ "$dir" = /tmp/shardrun-slurm ] || use="SHARDRUN_SLURM_DIR=$dir . slurm/env.sh"
            say "node $name is $state; run '$use' to use this cluster" ;;
        *) die "node $name is '${state:-unknown}' after 20 s; see $dir/log/slurmctld.log and $dir/log/slurmd*.log" ;;
    esac
done

if [ "$accounting" = 1 ]; then
    for _ in $(seq 50); do
        sacct -n -X -j 1 >/dev/null 2>&1 && break
        sleep 0.2
    done
    sacct -n -X >/dev/null 2>&1 && say "accounting is on: sacct works" \
        || die "sacct does not answer; see $dir/log/slurmdbd.log and $dir/log/slurmctld.log"
fi
