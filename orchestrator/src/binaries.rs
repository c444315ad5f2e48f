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
    match std::env::var_os("SHARDRUN_WORKER_BIN") {
        Some(path) => Ok(PathBuf::from(path)),
        None => worker_bin_beside(&shardrun_exe()?),
    }
}

/// The `shardrun-worker` next to `shardrun`, when it is there.
fn worker_bin_beside(shardrun: &Path) -> anyhow::Result<PathBuf> {
    let bin = shardrun.with_file_name("shardrun-worker");
    if !bin.is_file() {
        anyhow::bail!(
            "no worker binary at {}: {}",
            bin.display(),
            worker_fix(false)
        );
    }
    Ok(bin)
}

/// A worker binary that cannot be executed, named as the error names it, and what to do
/// about it, in words that fit where the path came from.
pub fn unusable_worker_bin(path: &Path) -> (String, String) {
    let from_env = std::env::var_os("SHARDRUN_WORKER_BIN").is_some();
    let named = if from_env {
        format!("the worker binary {} (SHARDRUN_WORKER_BIN)", path.display())
    } else {
        format!("the worker binary {}", path.display())
    };
    (named, worker_fix(from_env).to_string())
}

/// What to do about a worker binary that is missing or cannot be executed; `from_env`: its
/// path came from SHARDRUN_WORKER_BIN.
fn worker_fix(from_env: bool) -> &'static str {
    if from_env {
        "point SHARDRUN_WORKER_BIN at a built shardrun-worker, or unset it to use the one next \
         to shardrun"
    } else {
        "build it (`cargo build --release -p shardrun-worker`), or set SHARDRUN_WORKER_BIN to \
         the path of a built shardrun-worker"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_worker_binary_says_how_to_build_it_as_an_unusable_one_does() {
        let dir = tempfile::tempdir().unwrap();
        let shardrun = dir.path().join("shardrun");
        let error = worker_bin_beside(&shardrun).unwrap_err().to_string();
        let worker = dir.path().join("shardrun-worker");
        assert_eq!(
            error,
            format!(
                "no worker binary at {}: build it (`cargo build --release -p \
                 shardrun-worker`), or set SHARDRUN_WORKER_BIN to the path of a built \
                 shardrun-worker",
                worker.display()
            )
        );
        assert!(error.ends_with(worker_fix(false)));
        std::fs::write(&worker, "").unwrap();
        assert_eq!(worker_bin_beside(&shardrun).unwrap(), worker);
    }
}
