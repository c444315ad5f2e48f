//! `shardrun cancel <run>`: scancel the run's Slurm job (every unfinished point of a sweep),
//! whose running ranks checkpoint at their next step boundary before Slurm's kill; for a
//! local run (`shardrun run`), SIGTERM to its controller, found by the run directory's lock,
//! which stops the ranks at their next step boundary as Ctrl-C does.

use crate::rundir::{RunDir, RunLock, RunState, SignalError};
use crate::slurm::{self, RunStatus};
use crate::sweeps::journal::Journal;
use std::path::{Path, PathBuf};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Run directory or sweep folder (every unfinished point); a folder of runs (a run root)
    /// needs --all when more than one of its runs is still going.
    pub run: PathBuf,
    /// Cancel every run still going under a folder of runs.
    #[arg(long)]
    pub all: bool,
}

/// Whether a run is still going: its Slurm job unfinished, or its controller alive here.
fn going(status: &RunStatus) -> bool {
    let in_slurm = matches!(status.state, RunState::Submitted | RunState::Running);
    (in_slurm && status.job_id.is_some()) || RunLock::holder(status.run.path()).is_some()
}

/// A folder of unrelated runs (neither a run directory nor a sweep folder) with more than
/// one still going is cancelled whole only when asked: a mistyped path would stop them all.
fn refuse_many(path: &Path, statuses: &[RunStatus], all: bool) -> anyhow::Result<()> {
    let is_sweep = |dir: &Path| Journal::new(dir).dir().is_dir();
    if all || RunDir::open(path).is_ok() || is_sweep(path) {
        return Ok(());
    }
    // What the user would cancel one by one: a run, or a sweep folder for all its points.
    let mut going_points: std::collections::BTreeMap<PathBuf, usize> = Default::default();
    for status in statuses.iter().filter(|s| going(s)) {
        let run = status.run.path();
        let target = match run.parent().filter(|folder| is_sweep(folder)) {
            Some(sweep) => sweep,
            None => run,
        };
        *going_points.entry(target.to_path_buf()).or_default() += 1;
    }
    if going_points.len() < 2 {
        return Ok(());
    }
    let listed: Vec<String> = going_points
        .iter()
        .map(|(target, points)| match is_sweep(target) {
            true => format!("  {} (a sweep: {points} point(s) going)", target.display()),
            false => format!("  {}", target.display()),
        })
        .collect();
    anyhow::bail!(
        "{} holds {} runs or sweeps still going:\n{}\n  fix: cancel one by its run directory or sweep folder, or add --all to cancel every one of them",
        path.display(),
        going_points.len(),
        listed.join("\n")
    )
}

/// The Slurm jobs the runs' manifests record, `12 (name), 14 (name)`, at most a few named.
fn recorded_jobs(runs: &[RunDir]) -> Option<String> {
    const NAMED: usize = 5;
    let jobs: Vec<String> = runs
        .iter()
        .filter_map(|run| {
            let manifest = run.read_manifest().ok()?;
            (!manifest.state.is_terminal()).then_some(())?;
            let name = run.path().file_name()?.to_string_lossy().into_owned();
            Some(format!("{} ({name})", manifest.slurm_job_ids.last()?))
        })
        .collect();
    match jobs.len() {
        0 => None,
        n if n <= NAMED => Some(jobs.join(", ")),
        n => Some(format!(
            "{} and {} more",
            jobs[..NAMED].join(", "),
            n - NAMED
        )),
    }
}

pub fn execute(args: Args) -> anyhow::Result<()> {
    let runs = slurm::find_runs(&args.run);
    if runs.is_empty() {
        anyhow::bail!("no run directory at {}\n  fix: pass the folder `shardrun submit` or `shardrun run` printed (see `shardrun status`)", args.run.display());
    }
    let mut ids = Vec::new();
    let mut running = 0;
    let mut requeued = Vec::new();
    let mut stopped = Vec::new();
    let mut refused = Vec::new();
    // Slurm says which jobs it still holds: a run whose manifest has its end may have been
    // requeued since.
    let (statuses, _) = match slurm::refresh(&runs) {
        Ok(answer) => answer,
        Err(e) if e.controller_unreachable() => {
            let not_done = match recorded_jobs(&runs) {
                Some(jobs) => format!("nothing was cancelled (the jobs recorded: {jobs})"),
                None => "nothing was cancelled".to_string(),
            };
            return Err(slurm::unanswered(
                &not_done,
                "asking Slurm which jobs it still holds",
                &e,
            ));
        }
        Err(e) => return Err(e.into()),
    };
    refuse_many(&args.run, &statuses, args.all)?;
    for status in &statuses {
        let run = &status.run;
        let in_slurm = matches!(status.state, RunState::Submitted | RunState::Running);
        if let Some(id) = status.job_id.as_ref().filter(|_| in_slurm) {
            ids.push(id.clone());
            running += usize::from(status.state == RunState::Running);
            let manifest = run.read_manifest()?;
            // A finished run's job run again has nothing to lose: it stays finished.
            if manifest.state.is_terminal() && manifest.state != RunState::Completed {
                requeued.push((run, id, manifest));
            }
            continue;
        }
        match RunLock::signal_holder(run.path(), libc::SIGTERM) {
            Ok(pid) => stopped.push(format!(
                "Sent SIGTERM to the controller of {path} (pid {pid}): its ranks stop at their \
                 next step boundary; `shardrun status {word}` shows when it has ended",
                path = run.path().display(),
                word = crate::output::pasteable(run.path())
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
        for (run, id, manifest) in requeued {
            let said = slurm::cancelled_while_requeued(run, &manifest, id, " (`shardrun cancel`)");
            run.update_manifest(|m| {
                m.state = RunState::Cancelled;
                m.error = Some(said);
            })?;
        }
        outln!(
            "Cancelled Slurm job(s) {}; `shardrun status {}` shows when they have ended{}",
            slurm::compact_job_ids(&ids),
            crate::output::pasteable(&args.run),
            match running {
                0 => "",
                // The controller asks for it on Slurm's SIGTERM, before Slurm's kill.
                _ =>
                    " (a running one's ranks write a checkpoint at their next step boundary \
                      first, which the run resumes from)",
            }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_folder_of_runs_with_several_going_is_cancelled_only_with_all() {
        let root = tempfile::tempdir().unwrap();
        let runs: Vec<RunDir> = ["a", "b", "c"]
            .iter()
            .map(|name| {
                let dir = root.path().join(name);
                std::fs::create_dir(&dir).unwrap();
                crate::rundir::running_local_run(&dir)
            })
            .collect();
        let _locks = [&runs[0], &runs[1]].map(|run| RunLock::acquire(run.path()).unwrap());
        let (statuses, _) = slurm::refresh(&runs).unwrap();
        let err = refuse_many(root.path(), &statuses, false).unwrap_err();
        let text = err.to_string();
        assert!(
            text.starts_with(&format!(
                "{} holds 2 runs or sweeps still going:",
                root.path().display()
            )) && text.contains(&format!("  {}\n", runs[0].path().display()))
                && !text.contains(&runs[2].path().display().to_string())
                && text.contains("add --all"),
            "{text}"
        );
        refuse_many(root.path(), &statuses, true).unwrap();
        // One run, named by its own directory: no question.
        refuse_many(runs[0].path(), &statuses[..1], false).unwrap();
    }

    #[test]
    fn a_sweep_in_a_folder_of_runs_is_named_by_its_folder() {
        let root = tempfile::tempdir().unwrap();
        let sweep = root.path().join("grid");
        std::fs::create_dir_all(Journal::new(&sweep).dir()).unwrap();
        let runs: Vec<RunDir> = [sweep.join("p1"), sweep.join("p2"), root.path().join("solo")]
            .iter()
            .map(|dir| {
                std::fs::create_dir(dir).unwrap();
                crate::rundir::running_local_run(dir)
            })
            .collect();
        let _locks = [&runs[0], &runs[1]].map(|run| RunLock::acquire(run.path()).unwrap());
        let (statuses, _) = slurm::refresh(&runs).unwrap();
        // Only the sweep is going: cancelling the folder cancels that one sweep.
        refuse_many(root.path(), &statuses, false).unwrap();
        let _solo = RunLock::acquire(runs[2].path()).unwrap();
        let (statuses, _) = slurm::refresh(&runs).unwrap();
        let text = refuse_many(root.path(), &statuses, false)
            .unwrap_err()
            .to_string();
        assert!(
            text.contains(&format!(
                "  {} (a sweep: 2 point(s) going)\n",
                sweep.display()
            )) && text.contains("or sweep folder"),
            "{text}"
        );
    }
}
