//! `shardrun plan job.yaml`: check a spec and print the resolved plan.

use crate::plan::{self, Overrides, ResolvedJob};
use crate::spec::{self, overrides, LoadedSpec, Override};
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
    #[command(flatten)]
    pub set: SetArgs,
}

/// `--set`, shared by `plan`, `render`, `submit` and `run`.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct SetArgs {
    /// Replace a value of the spec: a dotted path as in sweeps and a YAML value
    /// (`--set training.steps=20000`); repeatable, later ones win. Recorded in the run's
    /// job.yaml and resolved.json.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub set: Vec<String>,
}

impl SetArgs {
    pub fn parsed(&self) -> Result<Vec<Override>, crate::spec::SpecError> {
        self.set.iter().map(|arg| overrides::parse(arg)).collect()
    }
}

pub fn execute(args: Args) -> anyhow::Result<()> {
    let overrides = Overrides {
        world_size: args.nproc,
        force: args.force,
        ..Overrides::submitting()
    };
    let (_, job) = load_and_resolve(&args.spec, &overrides, &args.set)?;
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

/// Load, apply `--set` and resolve in one step; errors already carry file (or flag), line,
/// field and fix. The resolved job records the `--set` arguments.
pub fn load_and_resolve(
    path: &Path,
    overrides: &Overrides,
    set: &SetArgs,
) -> anyhow::Result<(LoadedSpec, ResolvedJob)> {
    let loaded = spec::load_with(&spec_path(path), &set.parsed()?)?;
    let job = plan::resolve(&loaded, overrides)?;
    Ok((loaded, job))
}
