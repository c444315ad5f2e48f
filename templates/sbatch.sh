#!/bin/bash
# Rendered by shardrun {{ version }} for job `{{ name }}`; edit the job spec, not this file.
#SBATCH --job-name={{ name }}
#SBATCH --nodes={{ s.nodes }}
#SBATCH --ntasks-per-node={{ s.ntasks_per_node }}
#SBATCH --cpus-per-task={{ s.cpus_per_task }}
{%- if s.gpus_per_node > 0 %}
{%- if let Some(kind) = s.gpu_type %}
#SBATCH --gres=gpu:{{ kind }}:{{ s.gpus_per_node }}
{%- else %}
#SBATCH --gres=gpu:{{ s.gpus_per_node }}
{%- endif %}
{%- endif %}
{%- if let Some(mem) = s.mem %}
#SBATCH --mem={{ mem }}
{%- endif %}
{%- if let Some(time) = s.time %}
#SBATCH --time={{ time }}
{%- endif %}
{%- if let Some(partition) = s.partition %}
#SBATCH --partition={{ partition }}
{%- endif %}
{%- if let Some(account) = s.account %}
#SBATCH --account={{ account }}
{%- endif %}
{%- if let Some(qos) = s.qos %}
#SBATCH --qos={{ qos }}
{%- endif %}
{%- if let Some(reservation) = s.reservation %}
#SBATCH --reservation={{ reservation }}
{%- endif %}
{%- if let Some(constraint) = s.constraint %}
#SBATCH --constraint={{ constraint }}
{%- endif %}
{%- if s.exclusive %}
#SBATCH --exclusive
{%- endif %}
{%- if let Some(array) = array %}
#SBATCH --array={{ array }}
{%- endif %}
#SBATCH --output={{ output }}
#SBATCH --error={{ error }}
{#- A requeued job keeps its id, so its files: append, or the attempt before is lost. #}
#SBATCH --open-mode=append
{#- USR2, not USR1: NCCL installs its own USR1 handler. B: sends it to the batch shell,
    which `exec` below turns into the controller. #}
#SBATCH --signal=B:USR2@{{ preemption.signal_seconds }}
{%- if preemption.requeue %}
#SBATCH --requeue
{%- else %}
#SBATCH --no-requeue
{%- endif %}
{%- for line in s.extra_sbatch %}
#SBATCH {{ line }}
{%- endfor %}

set -eo pipefail
{#- Where this attempt's lines begin in the error file, which a requeued job appends to. #}
{%- if points_file.is_some() %}
echo "{{ attempt_start }}${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID} on $(hostname), attempt $((${SLURM_RESTART_COUNT:-0} + 1))" >&2
{%- else %}
echo "{{ attempt_start }}${SLURM_JOB_ID} on $(hostname), attempt $((${SLURM_RESTART_COUNT:-0} + 1))" >&2
{%- endif %}
{% if let Some(points) = points_file %}
# Array task N runs the run directory on line N+1 of the points file.
SHARDRUN_RUN_DIR="$(sed -n "$((SLURM_ARRAY_TASK_ID + 1))p" {{ points }})"
if [ -z "$SHARDRUN_RUN_DIR" ]; then
    echo "shardrun: no run directory for array task ${SLURM_ARRAY_TASK_ID} in "{{ points }} >&2
    exit 2
fi
export SHARDRUN_RUN_DIR
{%- else %}
export SHARDRUN_RUN_DIR={{ run_dir }}
{%- endif %}
export OMP_NUM_THREADS={{ s.cpus_per_task }}
{#- Tells the controller a SIGUSR2 this close to the time limit is the limit's. #}
export SHARDRUN_NOTICE_SECONDS={{ preemption.signal_seconds }}
{%- if preemption.requeue %}
export SHARDRUN_MAX_REQUEUES={{ preemption.max_requeues }}
{%- else %}
{#- Slurm refuses `scontrol requeue` of a --no-requeue job: a preempted run just ends. #}
export SHARDRUN_MAX_REQUEUES=0
{%- endif %}
cd "$SHARDRUN_RUN_DIR"
{%- if points_file.is_some() %}
{#- Named as squeue and `shardrun status` name an array task. #}
echo "shardrun: job ${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID} on $(hostname) in ${SHARDRUN_RUN_DIR}"
{%- else %}
echo "shardrun: job ${SLURM_JOB_ID} on $(hostname) in ${SHARDRUN_RUN_DIR}"
{%- endif %}
{%- if !s.setup.is_empty() %}

# Set-up from resources.setup. A line that fails ends the job and says which in the error
# file; one not found (127) is often a command only login shells define. So does a line
# that ends the job itself (`exit 3`), which is no failed command to trap.
trap 'rc=$?; setup_failure_said=1; why="exit $rc"; [ "$rc" != 127 ] || why="exit 127, not found: module and conda are defined by login shells, load their set-up first, e.g. source /etc/profile"; echo "shardrun: a resources.setup line failed ($why): $BASH_COMMAND" >&2' ERR
# (`exit 0` too, which Slurm calls COMPLETED; a signal's EXIT sees a stale $?, 0 after a
# line that succeeded, so a 0 is said only of an `exit`.)
trap 'rc=$?; [ -n "${setup_failure_said:-}" ] || case "$rc:$BASH_COMMAND" in 0:exit|0:exit\ *) echo "shardrun: a resources.setup line ended the job before training (exit 0): $BASH_COMMAND" >&2 ;; 0:*) ;; *) echo "shardrun: a resources.setup line ended the job (exit $rc): $BASH_COMMAND" >&2 ;; esac' EXIT
# A preemption or time-limit notice (USR2) would end the shell here without a word: the
# controller takes it over once it starts, and requeues the job without starting ranks.
trap 'export SHARDRUN_NOTICE_IN_SETUP=1; echo "shardrun: SIGUSR2 (preemption or the time limit near) during the set-up: once it is done, no rank is started and the controller says whether the job is requeued" >&2' USR2
{%- for line in s.setup %}
{{ line }}
{%- endfor %}
trap - ERR USR2 EXIT
{%- endif %}

# The controller starts the ranks and watches them (their logs and metrics go to the run
# directory), as:
#   srun {{ ranks_srun }} shardrun-worker
exec {{ shardrun }} controller --run-dir "$SHARDRUN_RUN_DIR"
