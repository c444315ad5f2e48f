//! `shardrun render job.yaml`: print the sbatch script the job would be submitted with.

use crate::binaries::shardrun_exe;
use crate::commands::run::{continues_run, resumes_from_checkpoint, run_path};
use crate::commands::spec_args::{self, OneJob, SetArgs};
use crate::resolve::Overrides;
use crate::sbatch::{render_sbatch, ScriptTarget};
use std::path::PathBuf;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Job spec (YAML), or a run directory (its `job.yaml` is used).
    pub spec: PathBuf,
    #[command(flatten)]
    pub set: SetArgs,
}

/// The script `shardrun submit` would write for the same arguments: for a run directory,
/// the one that runs in that directory.
pub fn execute(args: Args) -> anyhow::Result<()> {
    let mut run_dir = std::path::PathBuf::new();
    let (_, job) = spec_args::load_one_job(&args.spec, &args.set, OneJob::Render, |loaded| {
        run_dir = run_path(&args.spec, &loaded.spec)?;
        Ok(Overrides {
            continues_run: continues_run(&run_dir, false),
            resumes_from_checkpoint: resumes_from_checkpoint(&run_dir, false),
            ..Overrides::submitting()
        })
    })?;
    let script = render_sbatch(&job, &ScriptTarget::Single { run_dir }, &shardrun_exe()?)?;
    out!("{script}");
    Ok(())
}
