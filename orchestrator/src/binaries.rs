//! Where the project's binaries are: the job runs the very same `shardrun` that submitted
//! it, and the controller starts the `shardrun-worker` installed next to it.

use anyhow::Context;
use std::path::PathBuf;

/// Absolute path of this binary.
pub fn shardrun_exe() -> anyhow::Result<PathBuf> {
    let exe =
        std::env::current_exe().context("cannot find the path of the running shardrun binary")?;
    Ok(std::fs::canonicalize(&exe).unwrap_or(exe))
}

/// `$SHARDRUN_WORKER_BIN`, else `shardrun-worker` next to this executable.
pub fn worker_bin() -> anyhow::Result<PathBuf> {
    if let Some(path) = std::env::var_os("SHARDRUN_WORKER_BIN") {
        return Ok(PathBuf::from(path));
    }
    let bin = shardrun_exe()?.with_file_name("shardrun-worker");
    if !bin.is_file() {
        anyhow::bail!(
            "no worker binary at {}: build it (`cargo build --release -p shardrun-worker`) or set \
             SHARDRUN_WORKER_BIN to its path",
            bin.display()
        );
    }
    Ok(bin)
}
