//! Where the project's binaries are: the job runs the very same `shardrun` that submitted
//! it, and the controller starts the `shardrun-worker` installed next to it.

use anyhow::Context;
use std::path::{Path, PathBuf};

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

/// A worker binary that cannot be executed, named as the error names it, and what to do
/// about it, in words that fit where the path came from.
pub fn unusable_worker_bin(path: &Path) -> (String, String) {
    if std::env::var_os("SHARDRUN_WORKER_BIN").is_some() {
        (
            format!("the worker binary {} (SHARDRUN_WORKER_BIN)", path.display()),
            "point SHARDRUN_WORKER_BIN at a built shardrun-worker, or unset it to use the one \
             next to shardrun"
                .into(),
        )
    } else {
        (
            format!("the worker binary {}", path.display()),
            "build it (`cargo build --release -p shardrun-worker`), or set SHARDRUN_WORKER_BIN \
             to the path of a built shardrun-worker"
                .into(),
        )
    }
}
