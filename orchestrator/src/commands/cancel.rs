//! `shardrun cancel <run>`: scancel the run's Slurm job (every unfinished point of a sweep).

use crate::slurm;
use std::path::PathBuf;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Run directory or sweep folder.
    pub run: PathBuf,
}

pub fn execute(args: Args) -> anyhow::Result<()> {
    let runs = slurm::find_runs(&args.run);
    if runs.is_empty() {
        anyhow::bail!("no run directory at {}\n  fix: pass the folder `shardrun submit` printed (see `shardrun status`)", args.run.display());
    }
    let mut ids = Vec::new();
    for run in &runs {
        let manifest = run.read_manifest()?;
        if !manifest.state.is_terminal() {
            ids.extend(manifest.slurm_job_ids.last().cloned());
        }
    }
    if ids.is_empty() {
        outln!(
            "Nothing to cancel: no run under {} has an unfinished Slurm job",
            args.run.display()
        );
        return Ok(());
    }
    slurm::cancel(&ids)?;
    outln!(
        "Cancelled Slurm job(s) {}; `shardrun status {}` shows when they have ended",
        ids.join(" "),
        args.run.display()
    );
    Ok(())
}
