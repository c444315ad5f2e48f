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
    let loaded = spec_args::load(&args.spec, &args.set)?;
    spec_args::refuse_sweep(&loaded, OneJob::Render, &args.spec)?;
    let job = crate::resolve::resolve(&loaded, &Overrides::submitting())?;
    let run_dir = RunDir::planned_path(&job.run_root, &job.name)?;
    let script = render_sbatch(&job, &ScriptTarget::Single { run_dir }, &shardrun_exe()?)?;
    out!("{script}");
    Ok(())
}
