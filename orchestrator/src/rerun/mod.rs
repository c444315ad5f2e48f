//! Running a spec whose run directory already holds a run: the same command again continues
//! it. An interrupted run (cancelled, failed, preempted, timed out, its node or controller
//! lost) resumes from its newest checkpoint; a finished run is left alone, unless the spec
//! now asks for more steps; a run still going is not touched; a spec that changed in what
//! the run computes is refused, naming the fields ([`changes`] says which are safe to change
//! on resume, and those are applied). `--force` deletes the run and starts over, saying what
//! it deletes. `shardrun run` and `shardrun submit` both decide through [`prepare`].

pub mod changes;

use crate::metrics_file::Divergence;
use crate::resume_data::{self, DataChanged, DataNow};
use crate::rundir::{Ended, Manifest, NewRun, RunDir, RunDirError, RunLock, RunState};
use crate::slurm;
use crate::sweeps::journal::Journal;
pub use changes::FieldChange;
use shardrun_checkpoint::{find_latest, find_latest_readable, CheckpointError, Verify};
use shardrun_protocol::config::{DataConfig, LrDecay};
use shardrun_protocol::schedule::Schedule;
use shardrun_protocol::TrainConfig;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// A checkpoint of the run: the step it holds, its folder, and the fingerprint of the data
/// it was trained on (none for synthetic data).
#[derive(Debug, Clone, PartialEq)]
pub struct CheckpointAt {
    pub step: u64,
    /// Updates applied by then (fewer than `step` when fp16 overflows skipped some): where
    /// the LR schedule continues.
    pub updates: u64,
    pub dir: PathBuf,
    pub data_fingerprint: Option<String>,
}

/// What [`prepare`] made of the run directory.
#[derive(Debug)]
pub enum RunStart {
    /// There was none: a new run.
    New(RunDir),
    /// `--force`: the old run was deleted (`deleted` says what it held); a new run.
    Replaced { run: RunDir, deleted: String },
    /// The old run ended before training a step (bad data, a wrong path) and the spec
    /// changed: nothing to keep, so a new run with the new spec.
    Redone(Redone),
    /// An interrupted run (or one asked to train longer), ready to continue.
    Resume(Resume),
    /// The run already trained every step asked for: nothing to do.
    Finished(Finished),
}

#[derive(Debug)]
pub struct Resume {
    pub run: RunDir,
    /// What the ranks will load (the newest checkpoint by its seal and sizes; the ranks
    /// verify checksums and fall back to an older one if this one is damaged, saying so).
    pub checkpoint: Option<CheckpointAt>,
    /// Newer checkpoints found damaged and passed over, and why the newest of them is:
    /// `the newer step-150, damaged: … sha256 is …`.
    pub passed_over: Option<String>,
    /// How the run ended last time, in words (`"was cancelled by SIGINT after step 150"`).
    pub ended: String,
    /// The last step the run logged, if any.
    pub last_step: Option<u64>,
    /// Differences from the run's recorded spec that are safe on resume: applied.
    pub applied: Vec<FieldChange>,
    /// Whether the spec saves checkpoints as it trains (it has a `checkpoint:` section).
    pub periodic_saves: bool,
    /// How the run stood before this re-run: what a job submitted to continue it goes back
    /// to when it refuses to start.
    pub before: Ended,
    /// What a change of `training.steps` does to the LR of the first resumed step.
    pub lr_change: Option<LrChange>,
    /// The data as it is now is not prepared yet: the controller compares it with the
    /// checkpoint's once it has prepared it, and may still refuse.
    pub data_checked_later: bool,
}

/// A decaying LR schedule follows `training.steps`: changed on resume, it is re-shaped, and
/// the LR jumps where the run continues.
#[derive(Debug, Clone, PartialEq)]
pub struct LrChange {
    pub decay: LrDecay,
    /// The first resumed step (1-based), and its LR under the old and the new schedule.
    pub step: u64,
    pub was: f64,
    pub now: f64,
    /// `training.steps`, old and new.
    pub steps_was: u64,
    pub steps_now: u64,
}

impl LrChange {
    /// The LR of the step after `done` under both configs' schedules, when they differ; the
    /// schedules continue at `updates`, the updates applied in those steps.
    pub fn of(was: &TrainConfig, now: &TrainConfig, done: u64, updates: u64) -> Option<LrChange> {
        let lr = |c: &TrainConfig| Schedule::of(c).lr(updates);
        let (before, after) = (lr(was), lr(now));
        let differs = (after - before).abs() > 1e-9 * before.abs().max(after.abs());
        (was.steps != now.steps && differs).then(|| LrChange {
            decay: now.schedule.decay,
            step: done + 1,
            was: before,
            now: after,
            steps_was: was.steps,
            steps_now: now.steps,
        })
    }
}

impl std::fmt::Display for LrChange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let decay = match self.decay {
            LrDecay::Cosine => "cosine",
            LrDecay::Linear => "linear",
            LrDecay::Constant => "constant",
        };
        let direction = if self.now > self.was { "up" } else { "down" };
        let (now, was) = told_apart(self.now, self.was);
        write!(
            f,
            "the {decay} LR schedule is re-shaped to {} steps: step {} trains at LR {now}, {direction} \
             from ",
            self.steps_now, self.step
        )?;
        // A finished run's schedule has no next step: compare with where it ended.
        if self.step > self.steps_was {
            write!(f, "the {was} the {}-step schedule ended at", self.steps_was)
        } else {
            write!(f, "{was} on the {}-step schedule", self.steps_was)
        }
    }
}

/// Two different values in scientific notation, with the fewest digits (at least four) that
/// tell them apart: "up from" never joins two equal-looking numbers.
fn told_apart(a: f64, b: f64) -> (String, String) {
    let mut digits = 3;
    loop {
        let (x, y) = (format!("{a:.digits$e}"), format!("{b:.digits$e}"));
        if x != y || digits >= 12 {
            return (x, y);
        }
        digits += 1;
    }
}

impl Resume {
    /// The first line a re-run prints: the step, the checkpoint, and why it stopped.
    pub fn headline(&self) -> String {
        let path = self.run.path().display();
        let mut line = match &self.checkpoint {
            Some(c) => format!(
                "resuming {path} at step {} from its checkpoint of step {} ({}): it {}",
                c.step + 1,
                c.step,
                c.dir.display(),
                self.ended
            ),
            None if !self.periodic_saves => format!(
                "starting {path} again from step 1 (its spec saves no checkpoints: it has no \
                 `checkpoint:` section): it {}",
                self.ended
            ),
            None => format!(
                "starting {path} again from step 1 (it has no checkpoint yet): it {}",
                self.ended
            ),
        };
        let saved = self.checkpoint.as_ref().map_or(0, |c| c.step);
        if let Some(step) = self.last_step.filter(|&step| step > saved) {
            if !line.contains(&format!("after step {step}")) {
                let _ = write!(line, "; it had logged step {step}");
            }
        }
        if self.data_checked_later {
            line.push_str("; once its data is prepared, it must match the checkpoint's");
        }
        line
    }

    /// The lines under the headline: the newer checkpoints passed over as damaged, then one
    /// line per safe change that was applied (a change of `training.steps` says what it does
    /// to the LR).
    pub fn detail_lines(&self) -> Vec<String> {
        let passed_over = self
            .passed_over
            .as_ref()
            .map(|p| format!("passed over: {p}"));
        passed_over
            .into_iter()
            .chain(changed_on_resume(
                &self.applied,
                self.lr_change.as_ref(),
                "",
            ))
            .map(|line| format!("  {line}"))
            .collect()
    }
}

/// "changed on resume{by}: <change>" for each change a continued run takes, the one of
/// `training.steps` with what it does to the LR (`by` names who changed it, or is empty).
pub fn changed_on_resume(
    changes: &[FieldChange],
    lr_change: Option<&LrChange>,
    by: &str,
) -> Vec<String> {
    changes
        .iter()
        .map(|c| match lr_change {
            Some(lr) if c.field == STEPS_FIELD => format!("changed on resume{by}: {c}; {lr}"),
            _ => format!("changed on resume{by}: {c}"),
        })
        .collect()
}

/// How the spec names `training.steps` ([`FieldChange::field`]).
const STEPS_FIELD: &str = "training.steps";

#[derive(Debug)]
pub struct Redone {
    pub run: RunDir,
    /// How the old run ended (`"failed (...)"`).
    pub ended: String,
    pub changed: Vec<FieldChange>,
}

impl Redone {
    /// What a re-run prints before starting over.
    pub fn message(&self) -> String {
        starting_over(
            self.run.path(),
            &self.ended,
            &self.changed,
            "starting it over with the changed spec",
        )
    }
}

/// "<run> failed (...) before training a step: <doing>", then the changes.
fn starting_over(path: &Path, ended: &str, changed: &[FieldChange], doing: &str) -> String {
    let mut text = format!("{} {ended} before training a step: {doing}", path.display());
    for change in changed {
        let _ = write!(text, "\n  changed: {change}");
    }
    text
}

#[derive(Debug)]
pub struct Finished {
    pub run: RunDir,
    /// Steps the run has trained.
    pub steps_done: u64,
    /// Steps the spec asks for now.
    pub steps_asked: u64,
    pub checkpoint: Option<CheckpointAt>,
    /// The newer checkpoints passed over as damaged, in words (see [`checkpoint_to_resume`]).
    pub passed_over: Option<String>,
    /// How the data as it is now differs from what the run trained on.
    pub data_changes: Vec<String>,
    /// The step from which it diverged ([`diverged_from`]): it does not go on.
    pub diverged_from: Option<Divergence>,
    /// The step of the newest checkpoint it has but does not continue from, its spec saying
    /// `checkpoint.resume: false`.
    pub unused_checkpoint: Option<u64>,
    /// A run whose own job asks for more steps than it trained (it was trained longer with
    /// `--set training.steps`, and did not finish), run again with a spec that asks for
    /// fewer: how that job ended, and to what step it would continue it.
    pub own_job_unfinished: Option<(RunState, u64)>,
}

impl Finished {
    /// A controller that ended after the run's last checkpoint without a result (killed,
    /// its node lost) left a run `status` calls died or failed while this says it is
    /// finished: from now on its state says so too.
    fn record_the_end(&self) -> Result<(), RerunError> {
        // All the steps it was started for, not only those asked for now.
        let recorded = self.run.read_train_config()?.steps;
        if self.run.result().exists() || self.steps_done < self.steps_asked.max(recorded) {
            return Ok(());
        }
        let checkpoint = self
            .checkpoint
            .as_ref()
            .map(|c| format!(", its last checkpoint step {}", c.step))
            .unwrap_or_default();
        let detail = format!(
            "trained all {} steps{checkpoint}; its controller ended without a result (killed, \
             or its node lost), so its summary was not written",
            self.steps_done
        );
        self.run.update_manifest(|m| {
            if m.state != RunState::Completed {
                m.state = RunState::Completed;
                m.error = Some(detail);
            }
        })?;
        Ok(())
    }

    /// What a re-run of a finished run prints (and exits 0).
    pub fn message(&self) -> String {
        let path = self.run.path().display();
        let mut text = if self.steps_asked < self.steps_done {
            format!(
                "{path} has trained {} steps and the spec asks for {}: nothing to do",
                self.steps_done, self.steps_asked
            )
        } else if self.own_job_unfinished.is_some() {
            // Its own, longer job did not finish: the run is not finished, the spec's is.
            format!(
                "{path} has trained the {} steps the spec asks for: nothing to do",
                self.steps_done
            )
        } else {
            format!(
                "{path} is finished: it trained all {} steps; nothing to do",
                self.steps_done
            )
        };
        if let Some((state, steps)) = self.own_job_unfinished {
            let command = match self.run.read_manifest() {
                Ok(m) if !m.slurm_job_ids.is_empty() => "submit",
                _ => "run",
            };
            let _ = write!(
                text,
                "\n  its own job asks for {steps} steps, and it ended {state} before them: to \
                 continue it to step {steps}, give its directory instead of the spec \
                 (`shardrun {command} {}`)",
                crate::output::pasteable(self.run.path())
            );
        }
        if let Some(c) = &self.checkpoint {
            let _ = write!(
                text,
                "\n  its last checkpoint: {} (step {})",
                c.dir.display(),
                c.step
            );
            if let Some(passed_over) = &self.passed_over {
                let _ = write!(text, "\n  passed over: {passed_over}");
            }
        }
        if !self.data_changes.is_empty() {
            text.push_str("\n  the data it trained on differs from the data as it is now:");
            for change in &self.data_changes {
                let _ = write!(text, "\n    {change}");
            }
            text.push_str("\n  to train on the data as it is now: add --force (deletes this run and starts over), or give the new run another `name`");
            return text;
        }
        if let Some(divergence) = self.diverged_from {
            let remedies = match self.run.read_train_config() {
                Ok(train) => crate::metrics_file::divergence_remedies(train.optimizer.grad_clip),
                Err(_) => "a lower LR".to_string(),
            };
            let _ = write!(
                text,
                "\n  it diverged: {} from step {}, so it cannot train on from its checkpoint\n  to start it over: add --force, with {remedies}",
                divergence.what(),
                divergence.step
            );
            return text;
        }
        let more = format!("`--set training.steps=<more than {}>`", self.steps_done);
        let _ = match (&self.checkpoint, self.unused_checkpoint) {
            (Some(_), _) => write!(
                text,
                "\n  to train it longer: add {more} (it continues from its last checkpoint)"
            ),
            (None, Some(step)) => write!(
                text,
                "\n  its spec says `checkpoint.resume: false`, so it does not continue: to train it longer from its checkpoint of step {step}, remove `resume: false` and add {more}"
            ),
            (None, None) => write!(
                text,
                "\n  it has no checkpoint to continue from: to train it longer, add --force with {more} (it starts over)"
            ),
        };
        text.push_str("\n  to start it over: add --force");
        text
    }
}

#[derive(Debug, thiserror::Error)]
pub enum RerunError {
    #[error(transparent)]
    RunDir(#[from] RunDirError),
    #[error("{path} is still running: {how}\n  fix: wait for it to end (`shardrun status {}`), or stop it ({}) and run this again to resume it", crate::sbatch::shell_quote(path), how_to_stop(path, *under_slurm))]
    StillRunning {
        path: String,
        how: String,
        /// Its job is Slurm's: stopped with `scancel`, not with Ctrl-C where it runs.
        under_slurm: bool,
    },
    #[error("{path} is still running: {how}; --force would delete the run under it\n  fix: stop it first ({}), then add --force again to start over; or give the new run another `name` (or --run-dir)", how_to_stop(path, *under_slurm))]
    ForceWhileRunning {
        path: String,
        how: String,
        under_slurm: bool,
    },
    #[error("{path} holds a run started with a different spec; these fields differ (run → now):\n{}\n  fix: {}\n  (safe to change on resume, and applied: {})", list(.fields), changed_fix(path, diverged.as_ref()), changes::SAFE_IN_WORDS)]
    Changed {
        path: String,
        fields: Vec<FieldChange>,
        /// A diverged run is not continued even with the changes undone.
        diverged: Option<Divergence>,
    },
    #[error("{path} {ended}, and its spec says `checkpoint.resume: false`: it does not resume\n  fix: add --force to delete it and start over{}", match checkpoint {
        Some(step) => format!(", or remove `resume: false` to continue it from its last checkpoint, of step {step}"),
        None => String::new(),
    })]
    NoResume {
        path: String,
        ended: String,
        /// The step of the newest checkpoint it would continue from without `resume: false`.
        checkpoint: Option<u64>,
    },
    #[error("{path} diverged: {} from step {}, and {}\n  fix: add --force to delete it and start over, with {remedies}", divergence.what(), divergence.step, again_it_diverges(divergence, *checkpoint))]
    Diverged {
        path: String,
        divergence: Divergence,
        /// The step of its newest checkpoint, if it has one.
        checkpoint: Option<u64>,
        /// What to change ([`crate::metrics_file::divergence_remedies`]).
        remedies: String,
    },
    #[error("{path} finished {done} steps but has no checkpoint to continue from to step {asked}\n  fix: add --force to start over with {asked} steps")]
    NothingToContinue { path: String, done: u64, asked: u64 },
    #[error("{path}: no checkpoint of this run loads ({names}; the newest, {}: {why}), and resuming would start over at step 1\n  fix: restore that checkpoint's files from a copy and run the same command again, or {over}", newest.display())]
    NoCheckpointLoads {
        path: String,
        /// Every one, by its folder's name (`step-20, step-10`).
        names: String,
        newest: PathBuf,
        why: String,
        /// How to start over: `--force` deletes checkpoints in the run directory only.
        over: String,
    },
    /// A checkpoint of the run that cannot be read (it names itself, in the run or not).
    #[error(transparent)]
    UnreadableCheckpoint(CheckpointError),
    #[error("{path} is the folder of a sweep (its points' runs are inside), not a run directory\n  fix: give this job a name of its own (`--set name=...`; `shardrun run` also takes --run-dir)")]
    SweepFolder { path: String },
    /// Another user's run (or one made read-only): refused before anything is changed.
    #[error(transparent)]
    NotUsable(#[from] crate::rundir::access::NotUsable),
    #[error(transparent)]
    DataChanged(#[from] Box<DataChanged>),
    /// Preparing the data of a run that resumes here failed (a bad record, a missing file).
    #[error(transparent)]
    DataPreparation(Box<dyn std::error::Error + Send + Sync>),
    #[error("cannot ask Slurm whether {path} is still running: {source}")]
    Slurm {
        path: String,
        #[source]
        source: slurm::RunsError,
    },
}

fn list(fields: &[FieldChange]) -> String {
    fields
        .iter()
        .map(|c| format!("  {c}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Slurm's view of a run submitted to it (`None` for a local run). Asked even when the
/// manifest has the run's end: a requeued job is queued again.
fn slurm_status(
    run: &RunDir,
    manifest: &Manifest,
    shown: &str,
) -> Result<Option<slurm::RunStatus>, RerunError> {
    if manifest.slurm_job_ids.is_empty() {
        return Ok(None);
    }
    let (statuses, _) =
        slurm::refresh(std::slice::from_ref(run)).map_err(|source| RerunError::Slurm {
            path: shown.to_string(),
            source,
        })?;
    Ok(statuses.into_iter().next())
}

/// Whether a run is still going, and if not, Slurm's last word on it (`None` for a local run).
enum Liveness {
    /// How it goes on: "its controller is running (pid 7 on n1)", "Slurm job 12 is PENDING";
    /// `under_slurm`: a job Slurm holds.
    Going {
        how: String,
        under_slurm: bool,
    },
    Ended(Option<Box<slurm::RunStatus>>),
}

fn liveness(run: &RunDir, manifest: &Manifest, shown: &str) -> Result<Liveness, RerunError> {
    if let Some(holder) = RunLock::holder(run.path()) {
        // A live controller is enough to know; Slurm, if it answers, says whose it is.
        let slurm = slurm_status(run, manifest, shown)
            .ok()
            .flatten()
            .as_ref()
            .and_then(in_slurms_hands);
        return Ok(Liveness::Going {
            under_slurm: slurm.is_some(),
            how: match slurm {
                Some(job) => format!("{job} (its controller: {holder})"),
                None => format!("its controller is running ({holder})"),
            },
        });
    }
    let status = slurm_status(run, manifest, shown)?;
    Ok(match status.as_ref().and_then(in_slurms_hands) {
        Some(how) => Liveness::Going {
            how,
            under_slurm: true,
        },
        None => Liveness::Ended(status.map(Box::new)),
    })
}

/// How to stop the run at `path`: `shardrun cancel`, and for a local run Ctrl-C too.
fn how_to_stop(path: &str, under_slurm: bool) -> String {
    let cancel = format!("`shardrun cancel {}`", crate::sbatch::shell_quote(path));
    if under_slurm {
        cancel
    } else {
        format!("{cancel}, or Ctrl-C where it runs")
    }
}

/// "Slurm job 12 is PENDING" while Slurm still holds the run's job.
fn in_slurms_hands(status: &slurm::RunStatus) -> Option<String> {
    if status.state.is_terminal() {
        return None;
    }
    let job = status.job_id.as_deref().unwrap_or_default();
    let slurm_state = status
        .slurm
        .as_ref()
        .map(|r| r.state.to_string())
        .unwrap_or_else(|| "SUBMITTED".into());
    Some(format!("Slurm job {job} is {slurm_state}"))
}

/// Decide what running `new` in `path` means, and get the run directory ready for it: a new
/// run, a resumed one (its spec files rewritten with the safe changes), or nothing to do.
/// Refuses, touching nothing, when the run is still going or its spec changed unsafely.
pub fn prepare(path: &Path, new: NewRun<'_>) -> Result<RunStart, RerunError> {
    let path = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    Ok(match decide(&path, new)? {
        RunDecision::New => RunStart::New(RunDir::create(&path, new)?),
        RunDecision::Replace { deleted } => RunStart::Replaced {
            run: RunDir::create(&path, new)?,
            deleted,
        },
        RunDecision::Redo { ended, changed } => RunStart::Redone(Redone {
            run: RunDir::create(&path, NewRun { force: true, ..new })?,
            ended,
            changed,
        }),
        RunDecision::Resume(resume) => {
            resume.run.update_spec(new)?;
            RunStart::Resume(resume)
        }
        RunDecision::Finished(finished) => {
            // Best effort: a finished run of another user's, or a read-only one, is only
            // looked at.
            let _ = finished.record_the_end();
            RunStart::Finished(finished)
        }
    })
}

/// What [`prepare`] would do with the run directory, decided without writing anything (the
/// data of a run that resumes is prepared when `new.data_here`).
#[derive(Debug)]
pub enum RunDecision {
    New,
    /// `--force` deletes what the folder holds (in words).
    Replace {
        deleted: String,
    },
    /// The old run ended before training a step and the spec changed: it starts over.
    Redo {
        ended: String,
        changed: Vec<FieldChange>,
    },
    /// The run continues; its spec files are not rewritten yet.
    Resume(Resume),
    Finished(Finished),
}

impl RunDecision {
    /// What `shardrun submit --dry-run` says it would do.
    pub fn dry_run_words(&self, path: &Path) -> String {
        let shown = path.display();
        match self {
            RunDecision::New => format!("would write {shown} and submit it with sbatch"),
            RunDecision::Replace { deleted } => format!(
                "--force would delete {deleted}, then write {shown} and submit it with sbatch"
            ),
            RunDecision::Redo { ended, changed } => starting_over(
                path,
                ended,
                changed,
                "would start it over with the changed spec and submit it with sbatch",
            ),
            RunDecision::Resume(resume) => {
                let mut text = format!(
                    "would submit a job that continues the run:\n  {}",
                    resume.headline()
                );
                for line in resume.detail_lines() {
                    let _ = write!(text, "\n{line}");
                }
                text
            }
            RunDecision::Finished(finished) => {
                format!("would submit nothing: {}", finished.message())
            }
        }
    }
}

/// [`prepare`]'s decision: reads the run directory (and asks Slurm about its job), writes
/// nothing to it.
pub fn decide(path: &Path, new: NewRun<'_>) -> Result<RunDecision, RerunError> {
    let decision = decide_for_anyone(path, new)?;
    // Resumed, redone or replaced, its files are rewritten: before any of them is, the run
    // must be one this user can run to its end. A finished one is only looked at.
    if !matches!(decision, RunDecision::Finished(_)) {
        let path = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
        crate::rundir::access::check_usable(&path)?;
    }
    Ok(decision)
}

/// [`decide`], whoever may write the run directory.
fn decide_for_anyone(path: &Path, new: NewRun<'_>) -> Result<RunDecision, RerunError> {
    let path = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    if new.force && path.exists() {
        // Deleting a live run would leave its controller and ranks writing into nothing, and
        // a queued job would start into the new run's folder.
        let shown = path.display().to_string();
        if let Ok(run) = RunDir::open(&path) {
            let going = match run.read_manifest() {
                Ok(manifest) => match liveness(&run, &manifest, &shown)? {
                    Liveness::Going { how, under_slurm } => Some((how, under_slurm)),
                    Liveness::Ended(_) => None,
                },
                // A damaged manifest (the fix its error gives is this --force) names no
                // Slurm job: only a live controller keeps the run.
                Err(_) => RunLock::holder(run.path())
                    .map(|holder| (format!("its controller is running ({holder})"), false)),
            };
            if let Some((how, under_slurm)) = going {
                return Err(RerunError::ForceWhileRunning {
                    path: shown,
                    how,
                    under_slurm,
                });
            }
        }
        return Ok(RunDecision::Replace {
            deleted: describe_contents(&path),
        });
    }
    if !path.exists() {
        return Ok(RunDecision::New);
    }
    let run = match RunDir::open(&path) {
        Ok(run) => run,
        Err(RunDirError::NotARunDir(_)) if Journal::new(&path).dir().is_dir() => {
            return Err(RerunError::SweepFolder {
                path: path.display().to_string(),
            })
        }
        Err(RunDirError::NotARunDir(_)) => return Err(RunDirError::Exists(path).into()),
        Err(e) => return Err(e.into()),
    };
    let shown = path.display().to_string();
    let manifest = run.read_manifest()?;
    let mut state = manifest.state;
    let mut detail = manifest.error.clone();
    match liveness(&run, &manifest, &shown)? {
        Liveness::Going { how, under_slurm } => {
            return Err(RerunError::StillRunning {
                path: shown,
                how,
                under_slurm,
            })
        }
        Liveness::Ended(Some(status)) => {
            state = status.state;
            detail = Some(status.detail).filter(|d| !d.is_empty());
        }
        Liveness::Ended(None) => {}
    }

    let recorded = run.read_resolved()?;
    let target = RunDir::recorded(new.resolved, &path);
    let all = changes::between(&recorded, &target);
    let (applied, refused): (Vec<_>, Vec<_>) = all.into_iter().partition(|c| c.safe);
    // Read once: nothing runs in the directory any more.
    let logged = crate::metrics_file::read(&run.metrics()).ok();
    let last_step = logged.as_ref().and_then(|m| m.last()).map(|r| r.step);
    let diverged = logged.as_ref().and_then(|m| m.diverged_from());
    let recorded_checkpoint = newest_checkpoint(&run, &recorded.train);
    // Any checkpoint folder, one that loads or not (damaged, unreadable), holds steps trained.
    let saved_any = recorded_checkpoint.is_some() || has_checkpoint_folders(&run, &recorded.train);
    if !refused.is_empty() && !saved_any && last_step.is_none() {
        // A run that failed before its first step (the fix is often the very change being
        // refused): nothing of it is worth keeping.
        let ended = how_it_ended(&run, state, detail.as_deref(), None);
        let mut changed = refused;
        changed.extend(applied);
        return Ok(RunDecision::Redo { ended, changed });
    }
    if !refused.is_empty() {
        return Err(RerunError::Changed {
            path: shown,
            fields: refused,
            diverged,
        });
    }

    let resumes = target.train.checkpoint.resume;
    let (newest, verify, passed_over) =
        checkpoint_to_resume(&run, &target.train).map_err(RerunError::UnreadableCheckpoint)?;
    // The one it would continue from, were it not for `resume: false`.
    let unused_checkpoint = newest.as_ref().filter(|_| !resumes).map(|c| c.step);
    let checkpoint = newest.filter(|_| resumes);
    let ended = how_it_ended(&run, state, detail.as_deref(), checkpoint.as_ref());
    let asked = target.train.steps;
    // What a finished run trained, as [`steps_trained`] tells it from what was read above.
    let trained = recorded_checkpoint
        .as_ref()
        .map(|c| c.step)
        .max(last_step)
        .unwrap_or(recorded.train.steps);
    let done = match (&checkpoint, state) {
        (_, RunState::Completed) => Some(trained),
        (Some(c), _) => Some(c.step),
        (None, _) => None,
    };
    if let Some(done) = done.filter(|&done| done >= asked) {
        let data_changes = match &target.train.data {
            DataConfig::Dataset(data) => DataNow::look(data).changes_since_run(&run),
            _ => Vec::new(),
        };
        return Ok(RunDecision::Finished(Finished {
            run,
            steps_done: done,
            steps_asked: asked,
            passed_over: passed_over.filter(|_| checkpoint.is_some()),
            checkpoint,
            data_changes,
            diverged_from: diverged,
            unused_checkpoint,
            own_job_unfinished: (state != RunState::Completed && recorded.train.steps > done)
                .then_some((state, recorded.train.steps)),
        }));
    }
    if checkpoint.is_none() && resumes {
        // Checkpoints that all fail to load are not a run to start over silently: the ranks
        // would refuse them too, after the job waited in the queue.
        if let Some((names, newest, why)) = damaged_checkpoints(&run, &target.train, verify) {
            let over = match newest.parent().filter(|root| !root.starts_with(run.path())) {
                Some(root) => format!(
                    "move {} aside (outside the run directory, --force leaves it) and start \
                     the run over with --force",
                    root.display()
                ),
                None => "start the run over with --force (which deletes them)".to_string(),
            };
            return Err(RerunError::NoCheckpointLoads {
                path: shown,
                names,
                newest,
                why,
                over,
            });
        }
    }
    match (state, &checkpoint) {
        _ if !resumes && started(state) => {
            return Err(RerunError::NoResume {
                path: shown,
                ended,
                checkpoint: unused_checkpoint,
            })
        }
        (RunState::Completed, None) => {
            return Err(RerunError::NothingToContinue {
                path: shown,
                done: trained,
                asked,
            })
        }
        _ => {}
    }
    if let Some(divergence) = diverged {
        return Err(RerunError::Diverged {
            path: shown,
            divergence,
            checkpoint: checkpoint.as_ref().map(|c| c.step),
            remedies: crate::metrics_file::divergence_remedies(target.train.optimizer.grad_clip),
        });
    }
    let ended = if state == RunState::Completed {
        format!(
            "finished its {} steps, and the spec now asks for {asked}",
            trained
        )
    } else {
        ended
    };
    let mut data_checked_later = false;
    if let (Some(checkpoint), DataConfig::Dataset(data)) = (&checkpoint, &target.train.data) {
        // Data already prepared as it is now (`shardrun prepare`, another run), else files
        // changed since the run recorded them, tell here before anything is tokenized; what
        // only preparing tells, a local run's data prepared now does, else the job's
        // controller once it has prepared it.
        let now = DataNow::look(data);
        if let Some(refusal) = now.refusal(&run, checkpoint) {
            return Err(refusal.into());
        }
        if now.identity().is_none() && checkpoint.data_fingerprint.is_some() {
            if new.data_here {
                let prepared = crate::data_prep::prepare_identity(&target.train)
                    .map_err(|e| RerunError::DataPreparation(e.into()))?;
                if let Some(prepared) = prepared {
                    resume_data::check(&run, checkpoint, &prepared)?;
                }
            } else {
                data_checked_later = true;
            }
        }
    }
    let lr_change = checkpoint
        .as_ref()
        .and_then(|c| LrChange::of(&recorded.train, &target.train, c.step, c.updates));
    let periodic_saves = target.train.checkpoint.saves_periodically();
    Ok(RunDecision::Resume(Resume {
        run,
        passed_over: passed_over.filter(|_| checkpoint.is_some()),
        checkpoint,
        ended,
        last_step,
        applied,
        periodic_saves,
        before: Ended {
            state,
            error: detail,
        },
        lr_change,
        data_checked_later,
    }))
}

/// Whether the run ever reached its controller (else there is nothing to resume or lose).
fn started(state: RunState) -> bool {
    !matches!(state, RunState::Created | RunState::SubmitFailed)
}

/// The newest committed checkpoint of the run, checked by its seal and sizes (cheap on a
/// login node; the ranks verify checksums before loading).
pub fn newest_checkpoint(run: &RunDir, train: &TrainConfig) -> Option<CheckpointAt> {
    readable_newest_checkpoint(run, train).ok().flatten()
}

/// [`newest_checkpoint`], with a checkpoint that cannot be read (permissions, the file
/// system) as the error it is; one damaged is passed over as the ranks pass it over.
pub fn readable_newest_checkpoint(
    run: &RunDir,
    train: &TrainConfig,
) -> Result<Option<CheckpointAt>, CheckpointError> {
    let Some(root) = train.checkpoint.root(Some(run.path())) else {
        return Ok(None);
    };
    let found = find_latest_readable(&root, Verify::Structure)?;
    Ok(found.checkpoint.as_ref().map(checkpoint_at))
}

/// Whether the run's checkpoint folder holds any committed checkpoint, loadable or not; one
/// that cannot be listed is taken to.
fn has_checkpoint_folders(run: &RunDir, train: &TrainConfig) -> bool {
    let Some(root) = train.checkpoint.root(Some(run.path())) else {
        return false;
    };
    match shardrun_checkpoint::naming::list_entries(&root) {
        Ok(entries) => entries
            .iter()
            .any(|(kind, _)| matches!(kind, shardrun_checkpoint::naming::EntryKind::Complete(_))),
        Err(_) => root.exists(),
    }
}

/// The checkpoint a re-run of `run` announces on its first line, how it was checked, and the
/// newer ones passed over as damaged (their names, and why the newest of them is). Checked by
/// seal and sizes, then by checksums too where the newest one's files hold at most
/// [`CHECKSUMS_AT_MOST`] (a file damaged in place is then passed over here as the ranks will
/// pass it over); past that the ranks say where they fall back.
///
/// A checkpoint that cannot be read (permissions, the file system) is an error: the ranks
/// would refuse it too, after the job waited in the queue.
fn checkpoint_to_resume(
    run: &RunDir,
    train: &TrainConfig,
) -> Result<(Option<CheckpointAt>, Verify, Option<String>), CheckpointError> {
    let Some(root) = train.checkpoint.root(Some(run.path())) else {
        return Ok((None, Verify::Structure, None));
    };
    let found = find_latest_readable(&root, Verify::Structure)?;
    let small = found.checkpoint.as_ref().is_some_and(|c| {
        c.metadata().files.iter().map(|f| f.size).sum::<u64>() <= CHECKSUMS_AT_MOST
    });
    let (found, verify) = if small {
        (
            find_latest_readable(&root, Verify::Checksums)?,
            Verify::Checksums,
        )
    } else {
        (found, Verify::Structure)
    };
    let passed_over = found.skipped.first().map(|(newest, why)| {
        let newest = newest.file_name().unwrap_or_default().to_string_lossy();
        match found.skipped.len() {
            1 => format!("the newer {newest}, damaged: {why}"),
            _ => format!(
                "the newer {}, damaged ({newest}: {why})",
                found.skipped_names()
            ),
        }
    });
    Ok((
        found.checkpoint.as_ref().map(checkpoint_at),
        verify,
        passed_over,
    ))
}

/// The most checkpoint bytes a re-run reads on the login node to verify what it announces.
const CHECKSUMS_AT_MOST: u64 = 1 << 30;

fn checkpoint_at(c: &shardrun_checkpoint::Checkpoint) -> CheckpointAt {
    CheckpointAt {
        step: c.step(),
        updates: c.metadata().trainer.optimizer_step,
        dir: c.dir().to_path_buf(),
        data_fingerprint: c.metadata().trainer.data.data_fingerprint.clone(),
    }
}

/// What running `run` again does, from the config it recorded: "resumes it from step N", or
/// "starts it over (it has no checkpoint)".
pub fn again_words(run: &RunDir) -> String {
    let found = match run.read_train_config() {
        Ok(train) => readable_newest_checkpoint(run, &train),
        Err(_) => Ok(None),
    };
    match found {
        Ok(Some(checkpoint)) => format!("resumes it from step {}", checkpoint.step),
        Ok(None) => "starts it over (it has no checkpoint)".to_string(),
        Err(e) => format!(
            "is refused until its newest checkpoint can be read ({})",
            match &e {
                CheckpointError::Unreadable { cause, .. } => cause.to_string(),
                other => other.to_string(),
            }
        ),
    }
}

/// When the run has committed checkpoints but none that loads: their names, the newest one
/// and why it does not.
fn damaged_checkpoints(
    run: &RunDir,
    train: &TrainConfig,
    verify: Verify,
) -> Option<(String, PathBuf, String)> {
    let root = train.checkpoint.root(Some(run.path()))?;
    let found = find_latest(&root, verify).ok()?;
    if found.checkpoint.is_some() {
        return None;
    }
    let (newest, why) = found.skipped.first()?;
    Some((found.skipped_names(), newest.clone(), why.to_string()))
}

/// The steps a run has trained, as its checkpoints and metrics show: the later of its
/// newest checkpoint's step and its last logged one; `None` when it has neither.
pub fn steps_done(run: &RunDir, recorded: &TrainConfig) -> Option<u64> {
    let saved = newest_checkpoint(run, recorded).map(|c| c.step);
    saved.max(last_logged_step(run))
}

/// [`steps_done`], else the steps the run records (a finished run that logged nothing). Its
/// recorded `steps` may have been raised since by a re-run that never trained (refused, or
/// never submitted), so it comes last.
pub fn steps_trained(run: &RunDir, recorded: &TrainConfig) -> u64 {
    steps_done(run, recorded).unwrap_or(recorded.steps)
}

/// The step from which the run had diverged by its last logged step (see
/// [`crate::metrics_file::RunMetrics::diverged_at`]), or `None`. Such a run does not go on:
/// from a checkpoint saved since, it would train on from weights that are not finite; from
/// one saved before (a run stopped where it diverged) or from the start, it would train the
/// same steps into the same divergence.
pub fn diverged_from(run: &RunDir) -> Option<Divergence> {
    crate::metrics_file::read(&run.metrics())
        .ok()?
        .diverged_from()
}

/// What to do about a spec that changed fields a run cannot change on resume.
fn changed_fix(path: &str, diverged: Option<&Divergence>) -> String {
    let elsewhere = "to start a new run instead, give it another `name` (or --run-dir)";
    match diverged {
        None => format!(
            "undo these changes to continue the run (its spec is {path}/job.yaml); {elsewhere}; \
             to delete this one and start over, add --force"
        ),
        Some(d) => format!(
            "it diverged ({} from step {}), so it does not continue even with these changes \
             undone: add --force to delete it and start over with them; {elsewhere}",
            d.what(),
            d.step
        ),
    }
}

/// Why a run that diverged is not continued from its newest checkpoint (of step
/// `checkpoint`, if any).
fn again_it_diverges(divergence: &Divergence, checkpoint: Option<u64>) -> String {
    match checkpoint {
        Some(step) if step >= divergence.step => format!(
            "its newest checkpoint, of step {step}, was saved after that: continuing it would \
             train on from {} weights",
            if divergence.blew_up {
                "blown-up"
            } else {
                "non-finite"
            }
        ),
        Some(step) => format!(
            "resumed from its newest checkpoint, of step {step}, it would train the same steps \
             into the same divergence (that checkpoint's weights are finite, not necessarily \
             good)"
        ),
        None => "started over, it would train the same steps into the same divergence".to_string(),
    }
}

/// The last step logged (the latest attempt's, when steps were repeated).
fn last_logged_step(run: &RunDir) -> Option<u64> {
    crate::metrics_file::read(&run.metrics())
        .ok()?
        .last()
        .map(|m| m.step)
}

/// "was cancelled by SIGINT after step 150": the controller's own words from `result.json`
/// when it wrote them, else what the manifest and Slurm say.
fn how_it_ended(
    run: &RunDir,
    state: RunState,
    detail: Option<&str>,
    checkpoint: Option<&CheckpointAt>,
) -> String {
    if let Some(verdict) = crate::slurm::read_result(run) {
        // Later news than the last attempt's words: the job its controller requeued was
        // cancelled before it ran again.
        if state == RunState::Cancelled && verdict.requeued {
            return "was cancelled while its requeued job waited to run again".into();
        }
        if let Some(ended) = verdict.ended {
            return ended;
        }
    }
    let what = match state {
        RunState::Created => "was created but never started",
        RunState::Submitted | RunState::Running | RunState::Died => {
            "stopped without recording how (its controller was killed, or its node was lost)"
        }
        RunState::SubmitFailed => "was not accepted by sbatch",
        RunState::Completed => "finished",
        RunState::Failed => "failed",
        RunState::Cancelled => "was cancelled",
        RunState::Timeout => "reached its time limit",
        RunState::Preempted => "was preempted",
        RunState::OutOfMemory => "ran out of memory",
        RunState::NodeFail => "lost its node",
    };
    let mut text = what.to_string();
    if let Some(detail) = detail.filter(|d| !d.is_empty()) {
        let _ = write!(text, " ({detail})");
    }
    if state == RunState::Preempted {
        if let Some(c) = checkpoint {
            let _ = write!(text, " after step {}", c.step);
        }
    }
    text
}

/// What `--force` deletes, in a few words: the checkpoints and the logs of the run (or an
/// empty folder: it replaces nothing else).
pub fn describe_contents(path: &Path) -> String {
    let Ok(run) = RunDir::open(path) else {
        return format!("{} (an empty folder)", path.display());
    };
    let mut parts = Vec::new();
    let root = run.checkpoints();
    let mut steps: Vec<u64> = std::fs::read_dir(&root)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| shardrun_checkpoint::naming::step_of_dir(&e.path()))
        .collect();
    steps.sort_unstable();
    if !steps.is_empty() {
        parts.push(format!(
            "{} checkpoint(s) ({})",
            steps.len(),
            steps
                .iter()
                .map(|s| format!("step {s}"))
                .collect::<Vec<_>>()
                .join(", ")
        ));
        if !root.starts_with(run.path()) {
            parts.push(format!("in {}", root.display()));
        }
    }
    if let Some(step) = last_logged_step(&run) {
        parts.push(format!("metrics up to step {step}"));
    }
    parts.push("its logs".into());
    let kept = match run.exports() {
        Some(exports) => format!("; kept the models exported into it ({})", exports.display()),
        None => String::new(),
    };
    format!("{} ({}){kept}", path.display(), parts.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resolve::{resolve, Overrides, ResolvedJob};
    use crate::spec::{overrides, parse};
    use std::collections::BTreeMap;

    fn resolved(root: &Path, sets: &[&str]) -> ResolvedJob {
        let loaded = parse(
            include_str!("../../../examples/demo.yaml"),
            Path::new("demo.yaml"),
        )
        .unwrap();
        let sets: Vec<_> = sets.iter().map(|s| overrides::parse(s).unwrap()).collect();
        let mut job = resolve(
            &overrides::apply(loaded, &sets).unwrap(),
            &Overrides::default(),
        )
        .unwrap();
        job.run_root = root.to_path_buf();
        job
    }

    fn new_run<'a>(
        job: &'a ResolvedJob,
        params: &'a BTreeMap<String, serde_json::Value>,
    ) -> NewRun<'a> {
        NewRun {
            resolved: job,
            job_yaml: "name: demo\n",
            sbatch: None,
            sweep_params: params,
            force: false,
            spec_dir: None,
            data_here: false,
        }
    }

    /// A run directory whose run ended in `state` (nothing trained, no checkpoint).
    fn existing(root: &Path, state: RunState, sets: &[&str]) -> RunDir {
        let job = resolved(root, sets);
        let params = BTreeMap::new();
        let run = RunDir::create(
            &RunDir::planned_path(&job.run_root, &job.name).unwrap(),
            new_run(&job, &params),
        )
        .unwrap();
        run.update_manifest(|m| m.state = state).unwrap();
        run
    }

    #[test]
    fn a_run_whose_controller_holds_the_lock_is_not_touched() {
        let tmp = tempfile::tempdir().unwrap();
        let run = existing(tmp.path(), RunState::Running, &[]);
        let _lock = RunLock::acquire(run.path()).unwrap();
        let job = resolved(tmp.path(), &[]);
        let params = BTreeMap::new();
        let err = prepare(run.path(), new_run(&job, &params)).unwrap_err();
        assert!(matches!(err, RerunError::StillRunning { .. }), "{err}");
        assert!(
            err.to_string().contains("its controller is running (pid "),
            "{err}"
        );
    }

    #[test]
    fn force_refuses_to_delete_a_run_whose_controller_holds_the_lock() {
        let tmp = tempfile::tempdir().unwrap();
        let run = existing(tmp.path(), RunState::Running, &[]);
        let before = std::fs::read(run.train_config()).unwrap();
        let lock = RunLock::acquire(run.path()).unwrap();
        let job = resolved(tmp.path(), &["training.seed=9"]);
        let params = BTreeMap::new();
        let mut forced = new_run(&job, &params);
        forced.force = true;
        let err = prepare(run.path(), forced).unwrap_err();
        assert!(
            err.to_string().starts_with(&format!(
                "{path} is still running: its controller is running (pid {pid} on ",
                path = run.path().display(),
                pid = std::process::id()
            )) && err
                .to_string()
                .contains(&format!("`shardrun cancel {}`", run.path().display())),
            "{err}"
        );
        assert_eq!(std::fs::read(run.train_config()).unwrap(), before);
        assert_eq!(run.read_manifest().unwrap().state, RunState::Running);
        // Once its controller is gone, --force starts over.
        drop(lock);
        let mut forced = new_run(&job, &params);
        forced.force = true;
        assert!(matches!(
            prepare(run.path(), forced).unwrap(),
            RunStart::Replaced { .. }
        ));
    }

    #[test]
    fn a_run_whose_controller_died_resumes_and_says_so() {
        let tmp = tempfile::tempdir().unwrap();
        let run = existing(tmp.path(), RunState::Running, &[]);
        let job = resolved(tmp.path(), &["training.log_every=5"]);
        let params = BTreeMap::new();
        let RunStart::Resume(resume) = prepare(run.path(), new_run(&job, &params)).unwrap() else {
            panic!("expected a resume")
        };
        assert_eq!(resume.checkpoint, None);
        assert!(
            resume.headline().starts_with(&format!(
                "starting {} again from step 1 (it has no checkpoint yet): it stopped without recording how",
                run.path().display()
            )),
            "{}",
            resume.headline()
        );
        assert_eq!(
            resume.detail_lines(),
            vec!["  changed on resume: training.log_every: 1 → 5".to_string()]
        );
        assert_eq!(
            run.read_train_config().unwrap().log_every,
            5,
            "the safe change is applied"
        );
    }

    #[test]
    fn deciding_writes_nothing_and_says_what_a_submit_would_do() {
        let tmp = tempfile::tempdir().unwrap();
        let run = existing(tmp.path(), RunState::Preempted, &[]);
        let files = |run: &RunDir| {
            [run.train_config(), run.path().join("manifest.json")]
                .map(|f| std::fs::read(f).unwrap())
        };
        let before = files(&run);
        let params = BTreeMap::new();

        let job = resolved(tmp.path(), &["training.log_every=5"]);
        let decision = decide(run.path(), new_run(&job, &params)).unwrap();
        let RunDecision::Resume(resume) = &decision else {
            panic!("expected a resume, got {decision:?}")
        };
        assert_eq!(resume.applied.len(), 1);
        let words = decision.dry_run_words(run.path());
        assert!(
            words.starts_with("would submit a job that continues the run:\n  starting ")
                && words.ends_with("  changed on resume: training.log_every: 1 → 5"),
            "{words}"
        );
        assert_eq!(files(&run), before, "the safe change is not applied");

        // Changed in what it computes, before a step: started over, in words only.
        let job = resolved(tmp.path(), &["training.seed=9"]);
        let decision = decide(run.path(), new_run(&job, &params)).unwrap();
        assert!(matches!(decision, RunDecision::Redo { .. }), "{decision:?}");
        assert!(
            decision
                .dry_run_words(run.path())
                .contains("before training a step: would start it over"),
            "{decision:?}"
        );
        assert_eq!(files(&run), before);

        let mut forced = new_run(&job, &params);
        forced.force = true;
        let decision = decide(run.path(), forced).unwrap();
        assert!(
            matches!(decision, RunDecision::Replace { .. }),
            "{decision:?}"
        );
        assert_eq!(files(&run), before);
    }

    /// The run logged its first step (it trained, though it saved no checkpoint).
    fn trained_a_step(run: &RunDir) {
        std::fs::write(
            run.metrics(),
            r#"{"rank":0,"step":1,"loss":6.9,"lr":0.001,"grad_norm":1.0,"step_time_s":0.1,"tokens_per_s":5.0,"mfu":null,"model_state_bytes":1,"peak_memory_bytes":1,"loss_scale":null}"#
                .to_string()
                + "\n",
        )
        .unwrap();
    }

    #[test]
    fn a_run_without_periodic_saves_says_it_starts_over_because_of_its_spec() {
        let tmp = tempfile::tempdir().unwrap();
        let mut job = resolved(tmp.path(), &[]);
        job.train.checkpoint.interval_steps = None;
        let params = BTreeMap::new();
        let run = RunDir::create(
            &RunDir::planned_path(&job.run_root, &job.name).unwrap(),
            new_run(&job, &params),
        )
        .unwrap();
        run.update_manifest(|m| m.state = RunState::Cancelled)
            .unwrap();
        let RunStart::Resume(resume) = prepare(run.path(), new_run(&job, &params)).unwrap() else {
            panic!("expected a resume")
        };
        assert!(
            resume.headline().starts_with(&format!(
                "starting {} again from step 1 (its spec saves no checkpoints: it has no \
                 `checkpoint:` section): it was cancelled",
                run.path().display()
            )),
            "{}",
            resume.headline()
        );
    }

    /// A job its controller requeued after a preemption notice, cancelled before it ran
    /// again: the run resumes as a cancelled one, not in its last attempt's words.
    #[test]
    fn a_run_cancelled_while_requeued_resumes_as_cancelled() {
        let tmp = tempfile::tempdir().unwrap();
        let job = resolved(tmp.path(), &[]);
        let params = BTreeMap::new();
        let run = RunDir::create(
            &RunDir::planned_path(&job.run_root, &job.name).unwrap(),
            new_run(&job, &params),
        )
        .unwrap();
        trained_a_step(&run);
        std::fs::write(
            run.result(),
            r#"{"status": "preempted", "requeued": true, "ended": "was preempted by a preemption notice after step 1"}"#,
        )
        .unwrap();
        run.update_manifest(|m| m.state = RunState::Cancelled)
            .unwrap();
        let RunStart::Resume(resume) = prepare(run.path(), new_run(&job, &params)).unwrap() else {
            panic!("expected a resume")
        };
        let headline = resume.headline();
        assert!(
            headline.contains(": it was cancelled while its requeued job waited to run again;")
                && !headline.contains("preempted"),
            "{headline}"
        );
        // Not requeued (`requeue: false`): its controller's words stand.
        std::fs::write(
            run.result(),
            r#"{"status": "preempted", "requeued": false, "ended": "was preempted after step 1"}"#,
        )
        .unwrap();
        let RunStart::Resume(resume) = prepare(run.path(), new_run(&job, &params)).unwrap() else {
            panic!("expected a resume")
        };
        assert!(
            resume
                .headline()
                .contains(": it was preempted after step 1"),
            "{}",
            resume.headline()
        );
    }

    #[test]
    fn a_change_of_steps_says_what_it_does_to_a_decaying_lr() {
        let tmp = tempfile::tempdir().unwrap();
        // The demo: 200 steps, 20 of warmup, cosine decay.
        let short = resolved(tmp.path(), &[]).train;
        let long = resolved(tmp.path(), &["training.steps=400"]).train;
        let longer = LrChange::of(&short, &long, 100, 100).unwrap();
        assert_eq!(
            (longer.step, longer.steps_was, longer.steps_now),
            (101, 200, 400)
        );
        assert!(longer.now > longer.was, "{longer}");
        assert!(
            longer.to_string().starts_with(
                "the cosine LR schedule is re-shaped to 400 steps: step 101 trains at LR "
            ),
            "{longer}"
        );
        let shorter = LrChange::of(&long, &short, 100, 100).unwrap();
        assert!(shorter.to_string().contains(", down from "), "{shorter}");
        // Steps skipped for fp16 overflows applied no update: the schedules continue at the
        // updates applied, for the step after the checkpoint's.
        let skipped = LrChange::of(&short, &long, 100, 90).unwrap();
        assert_eq!(skipped.step, 101);
        assert_eq!(
            (skipped.was, skipped.now),
            (Schedule::of(&short).lr(90), Schedule::of(&long).lr(90))
        );
        // Within the warmup, or with a constant LR, the schedule gives the same LR.
        assert_eq!(LrChange::of(&short, &long, 10, 10), None);
        let sets = ["training.schedule.decay=constant"];
        let flat = resolved(tmp.path(), &sets).train;
        let flat_long = resolved(tmp.path(), &[sets[0], "training.steps=400"]).train;
        assert_eq!(LrChange::of(&flat, &flat_long, 100, 100), None);
        // Trained on from the end of a decay: the LR moves in its fifth digit, and the line
        // shows digits enough to see it.
        let ended = resolved(tmp.path(), &["training.steps=3000"]).train;
        let on = resolved(tmp.path(), &["training.steps=3010"]).train;
        let slightly = LrChange::of(&ended, &on, 3000, 3000).unwrap();
        let text = slightly.to_string();
        let number = |after: &str| {
            text.split(after)
                .nth(1)
                .unwrap()
                .split([',', ' '])
                .next()
                .unwrap()
                .to_string()
        };
        assert_ne!(number("trains at LR "), number("up from the "), "{text}");
        // The 3000-step schedule has no step 3001: its last LR is what the new one leaves.
        assert!(
            text.ends_with(&format!(
                "up from the {} the 3000-step schedule ended at",
                number("up from the ")
            )),
            "{text}"
        );
    }

    #[test]
    fn two_values_are_shown_with_the_digits_that_tell_them_apart() {
        assert_eq!(
            told_apart(2.0e-4, 1.0e-4),
            ("2.000e-4".to_string(), "1.000e-4".to_string())
        );
        assert_eq!(
            told_apart(1.00004e-4, 1.0e-4),
            ("1.00004e-4".to_string(), "1.00000e-4".to_string())
        );
    }

    #[test]
    fn an_unsafe_change_is_refused_and_nothing_is_written() {
        let tmp = tempfile::tempdir().unwrap();
        let run = existing(tmp.path(), RunState::Cancelled, &[]);
        trained_a_step(&run);
        let before = std::fs::read(run.train_config()).unwrap();
        let job = resolved(tmp.path(), &["training.seed=7", "training.steps=300"]);
        let params = BTreeMap::new();
        let err = prepare(run.path(), new_run(&job, &params)).unwrap_err();
        let RerunError::Changed { fields, .. } = &err else {
            panic!("{err}")
        };
        assert_eq!(
            fields.iter().map(|f| f.to_string()).collect::<Vec<_>>(),
            vec!["training.seed: 0 → 7"],
            "only the unsafe field is listed"
        );
        assert_eq!(std::fs::read(run.train_config()).unwrap(), before);
    }

    #[test]
    fn a_run_that_failed_before_its_first_step_starts_over_with_the_changed_spec() {
        // E.g. a bad data record stopped it, and the fix is a changed data option.
        let tmp = tempfile::tempdir().unwrap();
        let run = existing(tmp.path(), RunState::Failed, &[]);
        let job = resolved(tmp.path(), &["training.seed=7"]);
        let params = BTreeMap::new();
        let RunStart::Redone(redone) = prepare(run.path(), new_run(&job, &params)).unwrap() else {
            panic!("expected the run to start over")
        };
        assert_eq!(
            redone.message(),
            format!(
                "{} failed before training a step: starting it over with the changed spec\n  \
                 changed: training.seed: 0 → 7",
                run.path().display()
            )
        );
        assert_eq!(run.read_train_config().unwrap().seed, 7);
        assert_eq!(run.read_manifest().unwrap().state, RunState::Created);
        // A checkpoint folder that does not load (unreadable, damaged) holds steps trained
        // all the same (logged or not, with `log_every` past them): the change is refused.
        let checkpoint = run.path().join("checkpoints/step-2");
        std::fs::create_dir_all(&checkpoint).unwrap();
        run.update_manifest(|m| m.state = RunState::Failed).unwrap();
        let job = resolved(tmp.path(), &["training.seed=9"]);
        let err = prepare(run.path(), new_run(&job, &params)).unwrap_err();
        assert!(matches!(err, RerunError::Changed { .. }), "{err}");
        assert!(checkpoint.is_dir());
        std::fs::remove_dir_all(&checkpoint).unwrap();
        // Once it trained a step, the same change is refused.
        trained_a_step(&run);
        run.update_manifest(|m| m.state = RunState::Failed).unwrap();
        let job = resolved(tmp.path(), &["training.seed=8"]);
        let err = prepare(run.path(), new_run(&job, &params)).unwrap_err();
        assert!(matches!(err, RerunError::Changed { .. }), "{err}");
    }

    #[test]
    fn resume_false_does_not_resume_and_a_finished_run_needs_a_checkpoint_to_go_on() {
        let tmp = tempfile::tempdir().unwrap();
        let sets = ["training.checkpoint.resume=false"];
        let run = existing(tmp.path(), RunState::Cancelled, &sets);
        let job = resolved(tmp.path(), &sets);
        let params = BTreeMap::new();
        let err = prepare(run.path(), new_run(&job, &params)).unwrap_err();
        assert!(matches!(err, RerunError::NoResume { .. }), "{err}");
        assert!(err.to_string().contains("--force"), "{err}");

        let tmp = tempfile::tempdir().unwrap();
        let run = existing(tmp.path(), RunState::Completed, &[]);
        let same = resolved(tmp.path(), &[]);
        let RunStart::Finished(finished) = prepare(run.path(), new_run(&same, &params)).unwrap()
        else {
            panic!("expected finished")
        };
        assert_eq!((finished.steps_done, finished.steps_asked), (200, 200));
        let longer = resolved(tmp.path(), &["training.steps=300"]);
        let err = prepare(run.path(), new_run(&longer, &params)).unwrap_err();
        assert!(
            matches!(
                err,
                RerunError::NothingToContinue {
                    done: 200,
                    asked: 300,
                    ..
                }
            ),
            "{err}"
        );
    }

    #[test]
    fn a_run_none_of_whose_checkpoints_loads_is_refused_naming_the_newest() {
        for state in [RunState::Completed, RunState::Cancelled] {
            let tmp = tempfile::tempdir().unwrap();
            let run = existing(tmp.path(), state, &[]);
            for step in [10, 20] {
                let dir = run.path().join(format!("checkpoints/step-{step}"));
                std::fs::create_dir_all(&dir).unwrap();
                std::fs::write(dir.join("COMPLETE"), "").unwrap();
                std::fs::write(dir.join("metadata.json"), "{ truncated").unwrap();
            }
            let longer = resolved(tmp.path(), &["training.steps=300"]);
            let err = prepare(run.path(), new_run(&longer, &BTreeMap::new())).unwrap_err();
            let text = err.to_string();
            assert!(
                matches!(err, RerunError::NoCheckpointLoads { .. })
                    && text.contains("loads (step-20, step-10; the newest, ")
                    && text.contains("step-20: ")
                    && text.contains("restore that checkpoint's files from a copy"),
                "{state:?}: {text}"
            );
        }
    }

    #[test]
    fn force_says_what_it_deletes_and_a_non_run_folder_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let run = existing(tmp.path(), RunState::Failed, &[]);
        std::fs::write(
            run.metrics(),
            r#"{"rank":0,"step":7,"loss":1.0,"lr":0.1,"grad_norm":1.0,"step_time_s":0.1,"tokens_per_s":5.0,"mfu":null,"model_state_bytes":1,"peak_memory_bytes":2,"loss_scale":null}"#,
        )
        .unwrap();
        // A model exported from it (`shardrun export`'s default place) is the user's: it stays.
        let exported = run.checkpoints().join("export/hf-step-7/model.safetensors");
        std::fs::create_dir_all(exported.parent().unwrap()).unwrap();
        std::fs::write(&exported, b"weights").unwrap();
        let job = resolved(tmp.path(), &["training.seed=9"]);
        let params = BTreeMap::new();
        let mut forced = new_run(&job, &params);
        forced.force = true;
        let RunStart::Replaced { deleted, run: new } = prepare(run.path(), forced).unwrap() else {
            panic!("expected a replaced run")
        };
        assert_eq!(
            deleted,
            format!(
                "{} (metrics up to step 7, its logs); kept the models exported into it ({})",
                run.path().display(),
                run.checkpoints().join("export").display()
            )
        );
        assert!(!new.metrics().exists());
        assert_eq!(new.read_train_config().unwrap().seed, 9);
        assert_eq!(std::fs::read(&exported).unwrap(), b"weights");
        // Nothing else of the old run is left beside the new one.
        let siblings: Vec<_> = std::fs::read_dir(run.path().parent().unwrap())
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.contains(".old-"))
            .collect();
        assert!(siblings.is_empty(), "{siblings:?}");

        let plain = tmp.path().join("plain");
        std::fs::create_dir(&plain).unwrap();
        let err = prepare(&plain, new_run(&job, &params)).unwrap_err();
        assert!(err.to_string().contains("is not a run directory"), "{err}");

        // A sweep's folder (the spec's name with its sweep turned off) is named as one.
        std::fs::create_dir_all(plain.join("arrays")).unwrap();
        let err = prepare(&plain, new_run(&job, &params)).unwrap_err();
        assert!(
            err.to_string().starts_with(&format!(
                "{} is the folder of a sweep (its points' runs are inside)",
                plain.display()
            )) && err.to_string().contains("--set name="),
            "{err}"
        );
    }

    #[test]
    fn force_replaces_only_run_directories_and_empty_folders() {
        let tmp = tempfile::tempdir().unwrap();
        let job = resolved(tmp.path(), &[]);
        let params = BTreeMap::new();
        let forced = || NewRun {
            force: true,
            ..new_run(&job, &params)
        };

        // A folder of other files is refused whole, naming what it holds.
        let mine = tmp.path().join("mydir");
        std::fs::create_dir_all(mine.join("data")).unwrap();
        std::fs::write(mine.join("notes.txt"), "keep me").unwrap();
        let err = prepare(&mine, forced()).unwrap_err().to_string();
        assert_eq!(
            err,
            format!(
                "{0} is not a run directory (no manifest.json): it holds data/, notes.txt; \
                 --force deletes only run directories and empty folders\n  fix: pick another \
                 --run-dir (or `name`), or remove {0} by hand if it is meant to go",
                mine.display()
            )
        );
        assert_eq!(
            std::fs::read_to_string(mine.join("notes.txt")).unwrap(),
            "keep me"
        );
        assert!(mine.join("data").is_dir());
        let file = tmp.path().join("notes.md");
        std::fs::write(&file, "keep me too").unwrap();
        let err = prepare(&file, forced()).unwrap_err().to_string();
        assert!(
            err.starts_with(&format!(
                "{} is a file, not a run directory; --force deletes only run directories",
                file.display()
            )),
            "{err}"
        );
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "keep me too");
        let names: Vec<_> = std::fs::read_dir(tmp.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names.len(), 2, "nothing set aside or left over: {names:?}");

        // An empty folder becomes the run.
        let empty = tmp.path().join("empty");
        std::fs::create_dir(&empty).unwrap();
        let RunStart::Replaced { deleted, run } = prepare(&empty, forced()).unwrap() else {
            panic!("expected a replaced folder")
        };
        assert_eq!(deleted, format!("{} (an empty folder)", empty.display()));
        assert!(run.read_manifest().is_ok());
    }
}
