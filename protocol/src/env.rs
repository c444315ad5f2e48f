//! Environment variables set by the controller for each worker. Slurm (`SLURM_PROCID`, ...)
//! and torchrun (`RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `MASTER_ADDR`, `MASTER_PORT`) variables
//! are read as well; see the worker's `launch` module for the precedence.

/// `host:port` of the controller's TCP endpoint.
pub const CONTROLLER_ADDR: &str = "SHARDRUN_CONTROLLER";
/// Path of the file holding the per-job secret (mode 0600 in the run directory).
pub const SECRET_FILE: &str = "SHARDRUN_SECRET_FILE";
/// The per-job secret itself (alternative to the file, used in local mode). Ranks started
/// without the controller present it to rank 0's rendezvous; unset, they present none.
pub const SECRET: &str = "SHARDRUN_SECRET";
/// Path of the resolved `TrainConfig` as JSON (`train_config.json` in the run directory).
pub const CONFIG_FILE: &str = "SHARDRUN_CONFIG";
/// Explicit rank / world size / local rank set by the controller in local mode.
pub const RANK: &str = "SHARDRUN_RANK";
pub const WORLD_SIZE: &str = "SHARDRUN_WORLD_SIZE";
pub const LOCAL_RANK: &str = "SHARDRUN_LOCAL_RANK";
/// Run directory (checkpoints default to `<run dir>/checkpoints`).
pub const RUN_DIR: &str = "SHARDRUN_RUN_DIR";
/// Seconds a worker keeps retrying to reach the controller before giving up (default 30).
pub const CONNECT_TIMEOUT: &str = "SHARDRUN_CONNECT_TIMEOUT";

/// Where a rank started by the controller writes its diagnostics (`tracing` events, shown
/// when `RUST_LOG` asks for them): `<run dir>/logs/rank-<rank>.debug.log`, never train.log.
pub fn rank_debug_log(run_dir: &std::path::Path, rank: u64) -> std::path::PathBuf {
    run_dir.join("logs").join(format!("rank-{rank}.debug.log"))
}
