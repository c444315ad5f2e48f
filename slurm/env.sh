# Source this to point Slurm clients (sbatch, squeue, ...) at the project's local cluster:
#   . slurm/env.sh
# Settings (environment): SHARDRUN_SLURM_DIR (state folder, default /tmp/shardrun-slurm).
SHARDRUN_SLURM_DIR="${SHARDRUN_SLURM_DIR:-/tmp/shardrun-slurm}"
export SHARDRUN_SLURM_DIR
export SLURM_CONF="$SHARDRUN_SLURM_DIR/etc/slurm.conf"
