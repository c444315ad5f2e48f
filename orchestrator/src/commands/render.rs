//! `shardrun render job.yaml`: print the sbatch script the job would be submitted with.

use crate::binaries::shardrun_exe;
use crate::commands::spec_args::{self, OneJob, SetArgs};
use crate::resolve::Overrides;
use crate::rundir::RunDir;
use crate::sbatch::{render_sbatch, ScriptTarget};
use std::path::PathBuf;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Job spec (YAML), or a run directory (its `job.yaml` is used).
    pub spec: PathBuf,
    #[command(flatten)]
    pub set: SetArgs,
}

pub fn execute(args: Args) -> anyhow::Result<()> {
    let (_, job) = spec_args::load_one_job(&args.spec, &args.set, OneJob::Render, |_| {
        Ok(Overrides::submitting())
    })?;
    let run_dir = RunDir::planned_path(&job.run_root, &job.name)?;
    let script = render_sbatch(&job, &ScriptTarget::Single { run_dir }, &shardrun_exe()?)?;
    out!("{script}");
    Ok(())
}
