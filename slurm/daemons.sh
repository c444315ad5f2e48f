# Which processes are the daemons of one cluster of slurm/start.sh; sourced by stop.sh and
# test-clusters.sh. A process belongs to the cluster in <dir> when its command line names a
# file under <dir> (munged, slurmctld, slurmd, mariadbd) or its SLURM_CONF is <dir>'s
# (slurmdbd, slurmscriptd, slurmstepd): never by program name alone, since other clusters
# may run on the same machine.

# The programs a cluster of slurm/start.sh runs (as /proc/<pid>/comm names them).
cluster_programs="munged slurmctld slurmscriptd slurmd slurmstepd slurmdbd mariadbd"

# Succeeds if <pid> is alive, runs <program> and belongs to the cluster in <dir>.
cluster_pid() { # <program> <pid> <dir>
    local comm
    case "$2" in ''|*[!0-9]*) return 1 ;; esac
    comm="$(cat "/proc/$2/comm" 2>/dev/null)" || return 1
    [ "$comm" = "$1" ] || return 1
    # 2>/dev/null first: redirections apply left to right, and a process that ended since
    # makes the `<` fail.
    tr '\0' '\n' 2>/dev/null <"/proc/$2/cmdline" | grep -q -F -- "$3/" && return 0
    tr '\0' '\n' 2>/dev/null <"/proc/$2/environ" | grep -q -x -F -- "SLURM_CONF=$3/etc/slurm.conf"
}

# Prints "<pid> <program>" for every live daemon of the cluster in <dir>.
cluster_daemons() { # <dir>
    local proc pid comm
    for proc in /proc/[0-9]*; do
        pid="${proc#/proc/}"
        comm="$(cat "$proc/comm" 2>/dev/null)" || continue
        case " $cluster_programs " in
            *" $comm "*) cluster_pid "$comm" "$pid" "$1" && echo "$pid $comm" ;;
        esac
    done
    return 0
}
