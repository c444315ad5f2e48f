//! `shardrun cancel <run>`: scancel the run's Slurm job (every unfinished point of a sweep);
//! for a local run (`shardrun run`), SIGTERM to its controller, found by the run directory's
//! lock, which stops the ranks at their next step boundary as Ctrl-C does.

use crate::rundir::{RunLock, SignalError};
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
        anyhow::bail!("no run directory at {}\n  fix: pass the folder `shardrun submit` or `shardrun run` printed (see `shardrun status`)", args.run.display());
    }
    let mut ids = Vec::new();
    let mut stopped = Vec::new();
    let mut refused = Vec::new();
    for run in &runs {
        let manifest = run.read_manifest()?;
        let slurm_job = manifest
            .slurm_job_ids
            .last()
            .filter(|_| !manifest.state.is_terminal());
        if let Some(id) = slurm_job {
            ids.push(id.clone());
            continue;
        }
        match RunLock::signal_holder(run.path(), libc::SIGTERM) {
            Ok(pid) => stopped.push(format!(
                "Sent SIGTERM to the controller of {path} (pid {pid}): its ranks stop at their \
                 next step boundary; `shardrun status {path}` shows when it has ended",
                path = run.path().display()
            )),
            Err(SignalError::NotHeld) => {}
            Err(SignalError::OtherHost { pid, host }) => refused.push(format!(
                "{}: its controller runs on {host} (pid {pid})\n  fix: stop it there: Ctrl-C \
                 in its terminal, or `kill -TERM {pid}` on {host}",
                run.path().display()
            )),
            Err(e) => refused.push(format!("{}: {e}", run.path().display())),
        }
    }
    if !ids.is_empty() {
        slurm::cancel(&ids)?;
        outln!(
            "Cancelled Slurm job(s) {}; `shardrun status {}` shows when they have ended",
            ids.join(" "),
            args.run.display()
        );
    }
    for line in &stopped {
        outln!("{line}");
    }
    if !refused.is_empty() {
        anyhow::bail!("{}", refused.join("\n"));
    }
    if ids.is_empty() && stopped.is_empty() {
        outln!(
            "Nothing to cancel: no run under {} has an unfinished Slurm job or a running \
             controller",
            args.run.display()
        );
    }
    Ok(())
}
