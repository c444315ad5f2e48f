//! `shardrun render job.yaml`: print the sbatch script the job would be submitted with.

use crate::commands::plan::{load_and_resolve, SetArgs};
use crate::plan::Overrides;
use crate::render::{render_sbatch, ScriptTarget};
use crate::rundir::RunDir;
use anyhow::Context;
use std::path::{Path, PathBuf};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Job spec (YAML), or a run directory (its `job.yaml` is used).
    pub spec: PathBuf,
    #[command(flatten)]
    pub set: SetArgs,
}

pub fn execute(args: Args) -> anyhow::Result<()> {
    let (_, job) = load_and_resolve(&args.spec, &Overrides::submitting(), &args.set)?;
    let run_dir = RunDir::planned_path(&job)?;
    let script = render_sbatch(&job, &ScriptTarget::Single { run_dir }, &shardrun_exe()?)?;
    print!("{script}");
    Ok(())
}

/// Absolute path of this binary: the job runs the very same `shardrun` as its controller.
pub fn shardrun_exe() -> anyhow::Result<PathBuf> {
    let exe =
        std::env::current_exe().context("cannot find the path of the running shardrun binary")?;
    Ok(std::fs::canonicalize(&exe).unwrap_or(exe))
}

/// Same as [`shardrun_exe`] but for a specific path, for tests.
pub fn exe_or(path: Option<&Path>) -> anyhow::Result<PathBuf> {
    match path {
        Some(p) => Ok(p.to_path_buf()),
        None => shardrun_exe(),
    }
}
