//! `shardrun cancel <run>`: scancel the run's Slurm job (every unfinished point of a sweep);
//! for a local run (`shardrun run`), SIGTERM to its controller, found by the run directory's
//! lock, which stops the ranks at their next step boundary as Ctrl-C does.

use crate::rundir::{RunLock, RunState, SignalError};
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
    let mut requeued = Vec::new();
    let mut stopped = Vec::new();
    let mut refused = Vec::new();
    // Slurm says which jobs it still holds: a run whose manifest has its end may have been
    // requeued since.
    let (statuses, _) = slurm::refresh(&runs)?;
    for status in &statuses {
        let run = &status.run;
        let in_slurm = matches!(status.state, RunState::Submitted | RunState::Running);
        if let Some(id) = status.job_id.as_ref().filter(|_| in_slurm) {
            ids.push(id.clone());
            let manifest = run.read_manifest()?;
            // A finished run's job run again has nothing to lose: it stays finished.
            if manifest.state.is_terminal() && manifest.state != RunState::Completed {
                let again = if manifest.sweep_params.is_empty() {
                    format!(
                        "submitting it again (`shardrun submit {}`)",
                        run.path().display()
                    )
                } else {
                    "running `shardrun sweep` on the sweep's spec again".to_string()
                };
                requeued.push((run, id, again));
            }
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
        // A requeued job that has not started again has no controller to record the cancel.
        for (run, id, again) in requeued {
            run.update_manifest(|m| {
                m.state = RunState::Cancelled;
                m.error = Some(format!(
                    "cancelled (`shardrun cancel`) while its requeued Slurm job {id} waited to \
                     run again; {again} resumes it from its newest checkpoint"
                ));
            })?;
        }
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
