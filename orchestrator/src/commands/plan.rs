//! `shardrun plan job.yaml`: check a spec and print the resolved plan.

use crate::plan::{self, Overrides, ResolvedJob};
use crate::spec::{self, LoadedSpec};
use anyhow::Context;
use std::path::{Path, PathBuf};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Job spec (YAML), or a run directory (its `job.yaml` is used).
    pub spec: PathBuf,
    /// Plan for N local ranks on this machine, as `shardrun run --nproc N` would.
    #[arg(long)]
    pub nproc: Option<u64>,
    /// Print the resolved job as JSON instead of the human summary.
    #[arg(long)]
    pub json: bool,
    /// Plan the job even when its peak memory per rank exceeds the GPU's.
    #[arg(long)]
    pub force: bool,
}

pub fn execute(args: Args) -> anyhow::Result<()> {
    let overrides = Overrides {
        world_size: args.nproc,
        force: args.force,
        ..Overrides::submitting()
    };
    let (_, job) = load_and_resolve(&args.spec, &overrides)?;
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&job).context("serializing the plan")?
        );
    } else {
        print!("{}", job.summary());
    }
    Ok(())
}

/// The spec file behind a path that may also be a run directory.
pub fn spec_path(path: &Path) -> PathBuf {
    if path.is_dir() {
        path.join("job.yaml")
    } else {
        path.to_path_buf()
    }
}

/// Load and resolve in one step; errors already carry file, line, field and fix.
pub fn load_and_resolve(
    path: &Path,
    overrides: &Overrides,
) -> anyhow::Result<(LoadedSpec, ResolvedJob)> {
    let loaded = spec::load(&spec_path(path))?;
    let job = plan::resolve(&loaded, overrides)?;
    Ok((loaded, job))
}
