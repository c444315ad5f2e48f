//! `shardrun plan job.yaml`: check a spec and print the resolved plan.

use crate::commands::spec_args::{load_and_resolve, SetArgs};
use crate::resolve::Overrides;
use anyhow::Context;
use std::path::PathBuf;

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
