//! The state of runs: their manifests, one batched Slurm query, and the controller's
//! `result.json`. Ended states are written back to the manifest so the answer survives
//! Slurm forgetting the job.

use super::{query, JobRecord, JobState, QuerySource, SlurmError};
use crate::rundir::{
    ArrayRef, Holder, LockState, Manifest, RunDir, RunDirError, RunLock, RunState,
};
use crate::sweeps::journal::CurrentPoints;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

#[derive(Debug, Clone)]
pub struct RunStatus {
    pub run: RunDir,
    pub name: String,
    pub state: RunState,
    /// The Slurm job id the state refers to (latest submission).
    pub job_id: Option<String>,
    /// Slurm's record, when Slurm still knows the job.
    pub slurm: Option<JobRecord>,
    /// Human detail: pending reason, exit code, result summary, error.
    pub detail: String,
    /// Sweep points: the job array the point was last put in.
    pub array: Option<ArrayRef>,
    /// Sweep points: the parameters the sweep gave the run.
    pub sweep_params: BTreeMap<String, serde_json::Value>,
    /// In a sweep folder, but not a point of the spec last submitted there.
    pub superseded: bool,
    /// How often its jobs were requeued after a preemption notice, over all its attempts.
    pub requeues: u32,
    /// How often Slurm requeued its jobs itself (`scontrol requeue`) while a controller ran:
    /// not counted in `max_requeues`.
    pub requeued_by_slurm: u32,
    /// Why the end worked out from Slurm could not be written into its manifest (a full
    /// disk, another user's run): shown all the same, and worked out again next time.
    pub unrecorded: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum RunsError {
    #[error(transparent)]
    RunDir(#[from] RunDirError),
    #[error(transparent)]
    Slurm(#[from] SlurmError),
}

impl RunsError {
    /// See [`SlurmError::controller_unreachable`].
    pub fn controller_unreachable(&self) -> bool {
        matches!(self, RunsError::Slurm(e) if e.controller_unreachable())
    }
}

/// Run directories at or below `path` (a run directory, a sweep folder or a run root),
/// at most three levels deep, sorted by path. Below `path`, a folder is a run when it holds
/// another of a run directory's files too ([`RunDir::made_by_shardrun`]): the data cache
/// (by default in the run root) keeps a `manifest.json` of its own.
pub fn find_runs(path: &Path) -> Vec<RunDir> {
    find_runs_and_unreadable(path).0
}

/// [`find_runs`], and the folders on the way this user may not look into (another user's
/// private runs): said, where a listing would otherwise leave them out without a word.
pub fn find_runs_and_unreadable(path: &Path) -> (Vec<RunDir>, Vec<PathBuf>) {
    const DEPTH: usize = 3;
    fn walk(path: &Path, depth: usize, out: &mut Vec<RunDir>, unreadable: &mut Vec<PathBuf>) {
        if let Ok(run) = RunDir::open(path) {
            if depth == DEPTH || run.made_by_shardrun() {
                out.push(run);
                return;
            }
        }
        if depth == 0 {
            return;
        }
        let entries = match std::fs::read_dir(path) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
                // Hidden folders and a file system's lost+found are nobody's runs.
                let name = path.file_name().map(|n| n.to_string_lossy());
                if !name.is_some_and(|n| n.starts_with('.') || n == "lost+found") {
                    unreadable.push(path.to_path_buf());
                }
                return;
            }
            Err(_) => return,
        };
        let mut children: Vec<_> = entries
            .filter_map(|e| e.ok())
            .map(|e| e.path())
            .filter(|p| p.is_dir())
            .collect();
        children.sort();
        for child in children {
            // Temporary and set-aside directories of an interrupted create are not runs.
            let name = child
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            if !name.contains(".tmp-") && !name.contains(".old-") {
                walk(&child, depth - 1, out, unreadable);
            }
        }
    }
    let mut out = Vec::new();
    let mut unreadable = Vec::new();
    walk(path, DEPTH, &mut out, &mut unreadable);
    (out, unreadable)
}

/// The warning for a folder [`find_runs_and_unreadable`] could not look into.
pub fn unreadable_warning(folder: &Path) -> String {
    let whose = crate::rundir::access::owner_and_mode(folder)
        .map(|(owner, mode)| format!(", which is {owner}'s (mode {mode:o})"))
        .unwrap_or_default();
    format!(
        "this user cannot look into {}{whose}: runs in it, if any, are left out",
        folder.display()
    )
}

fn run_state_of(state: &JobState) -> RunState {
    match state {
        JobState::Pending | JobState::Requeued | JobState::Suspended | JobState::Other(_) => {
            RunState::Submitted
        }
        JobState::Configuring | JobState::Running | JobState::Completing => RunState::Running,
        JobState::Completed => RunState::Completed,
        JobState::Failed | JobState::BootFail | JobState::Deadline => RunState::Failed,
        JobState::Cancelled => RunState::Cancelled,
        JobState::Timeout => RunState::Timeout,
        JobState::Preempted => RunState::Preempted,
        JobState::NodeFail => RunState::NodeFail,
        JobState::OutOfMemory => RunState::OutOfMemory,
    }
}

/// What the controller wrote in `result.json` (`{"status": "succeeded" | "failed" |
/// "cancelled" | "preempted", "message": ...}`): the run's state and the message.
#[derive(Debug, Clone, PartialEq)]
pub struct Verdict {
    state: Option<RunState>,
    message: Option<String>,
    /// How the attempt ended, in words without advice ("was cancelled by SIGTERM after step
    /// 40"): what a job queued again says of the attempt before.
    pub ended: Option<String>,
    /// The controller requeued its Slurm job (after a preemption).
    pub requeued: bool,
}

/// The [`Verdict`] in `result.json`; `None` when there is none, or none that reads.
pub fn read_result(run: &RunDir) -> Option<Verdict> {
    let bytes = std::fs::read(run.result()).ok()?;
    let value: serde_json::Value = serde_json::from_slice(&bytes).ok()?;
    let failed = value.get("exit_code").and_then(|c| c.as_i64()).unwrap_or(0) != 0;
    let state = value
        .get("status")
        .and_then(|v| v.as_str())
        .map(|status| match status {
            "succeeded" => RunState::Completed,
            "cancelled" => RunState::Cancelled,
            // With no requeue left, or one Slurm refused, the controller exits 1: Slurm
            // says FAILED, and so does the run.
            "preempted" if failed => RunState::Failed,
            "preempted" => RunState::Preempted,
            _ => RunState::Failed,
        });
    let message = value
        .get("message")
        .and_then(|v| v.as_str())
        .map(str::to_string);
    let requeued = value.get("requeued").and_then(|r| r.as_bool()) == Some(true);
    let ended = value
        .get("ended")
        .and_then(|v| v.as_str())
        .map(str::to_string);
    Some(Verdict {
        state,
        message,
        ended,
        requeued,
    })
}

/// Whether the run's controller had its Slurm job requeued (after a preemption), as its
/// `result.json` says.
pub fn requeued_by_its_controller(run: &RunDir) -> bool {
    read_result(run).is_some_and(|verdict| verdict.requeued)
}

/// A local run (one never submitted to Slurm) whose manifest says it runs, as its lock and
/// its verdict tell.
enum LocalRun<'a> {
    /// Its controller holds the lock.
    Running(Holder),
    /// Its controller ended just now: its verdict is written, the manifest is next.
    Ended(&'a Verdict),
    /// Nobody holds the lock and no verdict says how the run ended: its controller was killed
    /// (SIGKILL, the OOM killer), its machine went down, or it could not write its end.
    Died,
    /// The lock cannot be read: no telling.
    Unknown,
}

/// What a run is, if it is a local one its manifest says runs (else `None`); `verdict`: its
/// [`read_result`]. Not written to the manifest: only the lock, asked at the time, can tell.
fn local_run<'a>(
    run: &RunDir,
    manifest: &Manifest,
    verdict: Option<&'a Verdict>,
) -> Option<LocalRun<'a>> {
    if manifest.state != RunState::Running || !manifest.slurm_job_ids.is_empty() {
        return None;
    }
    Some(match (RunLock::state(run.path()), verdict) {
        (LockState::Held(holder), _) => LocalRun::Running(holder),
        (LockState::Free, Some(verdict)) => LocalRun::Ended(verdict),
        (LockState::Free, None) => LocalRun::Died,
        (LockState::Unknown, _) => LocalRun::Unknown,
    })
}

/// Why a local run is DIED, when it is ([`LocalRun::Died`]).
pub fn died(run: &RunDir, manifest: &Manifest) -> Option<String> {
    let verdict = read_result(run);
    matches!(
        local_run(run, manifest, verdict.as_ref()),
        Some(LocalRun::Died)
    )
    .then(|| died_detail(run))
}

fn died_detail(run: &RunDir) -> String {
    let controller = match RunLock::last_holder(run.path()) {
        Some(holder @ Holder::Process { .. }) => format!("its controller ({holder})"),
        _ => "its controller".to_string(),
    };
    let again = crate::rerun::again_words(run);
    format!(
        "{controller} is gone without saying how the run ended: it was killed (SIGKILL, the \
         OOM killer), its machine went down, or it could not write its end (a full disk: its \
         terminal says); `shardrun run {}` {again}",
        crate::output::pasteable(run.path())
    )
}

/// Slurm's `.out` or `.err` file (`ext`) of job `job_id`: `<name>-<job id>.<ext>` in the run
/// directory, or for a sweep point in its sweep's `slurm/` folder.
fn job_file(run: &RunDir, job_id: &str, ext: &str) -> Option<PathBuf> {
    let suffix = format!("-{job_id}.{ext}");
    let folders = [
        Some(run.path().to_path_buf()),
        run.path().parent().map(|p| p.join("slurm")),
    ];
    folders.into_iter().flatten().find_map(|folder| {
        std::fs::read_dir(folder)
            .ok()?
            .flatten()
            .map(|e| e.path())
            .find(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.ends_with(&suffix))
            })
    })
}

/// What a Slurm job's error file says of its last attempt.
#[derive(Debug, PartialEq)]
enum ErrorFileEnding {
    /// The last line it wrote (cut to 300 characters), with the file's words before it.
    Said(String),
    /// Nothing, with the file's words.
    Nothing(String),
}

/// How [`error_file_ending`]'s words start.
const ENDED_WITHOUT_RESULT: &str = "the job ended before its controller wrote a result";

/// What an error file ends with, after the words for a killed controller, which say already
/// that no result came.
fn after_killed(said: String) -> String {
    match said.strip_prefix(&format!("{ENDED_WITHOUT_RESULT}; ")) {
        Some(rest) => rest.to_string(),
        None => said,
    }
}

/// For a Slurm job that ended before its controller wrote a result: its error file (the
/// sbatch script's `--error`, named `<job name>-<job id>.err` in the run directory, or in
/// the sweep's `slurm/` folder for an array task) and the last line its last attempt wrote,
/// which says why as far as anything did. A requeued job appends to the same file: lines
/// before the last attempt's start ([`crate::sbatch::ATTEMPT_START`]) are an earlier one's.
fn error_file_ending(run: &RunDir, job_id: &str) -> Option<ErrorFileEnding> {
    let LastAttempt {
        file,
        lines: attempt,
        start,
    } = last_attempt(run, job_id)?;
    const SHOWN: usize = 300;
    let last =
        attempt
            .iter()
            .rev()
            .find(|l| !l.is_empty())
            .map(|l| match l.char_indices().nth(SHOWN) {
                Some((cut, _)) => format!("{}...", &l[..cut]),
                None => l.to_string(),
            });
    let ended = ENDED_WITHOUT_RESULT;
    Some(match (last, start) {
        (Some(line), _) => {
            ErrorFileEnding::Said(format!("{ended}; {} ends: {line}", file.display()))
        }
        (None, None) => ErrorFileEnding::Nothing(format!("{ended}; {} is empty", file.display())),
        (None, Some(_)) => ErrorFileEnding::Nothing(format!(
            "{ended}; {} has nothing after its last start",
            file.display()
        )),
    })
}

/// The lines a Slurm job's last attempt wrote to its error file (trimmed).
struct LastAttempt {
    file: PathBuf,
    lines: Vec<String>,
    /// Whether the file marks the attempt's start (else it holds one attempt).
    start: Option<usize>,
}

fn last_attempt(run: &RunDir, job_id: &str) -> Option<LastAttempt> {
    let file = job_file(run, job_id, "err")?;
    let tail = file_tail(&file, 64 * 1024).ok()?;
    let text = String::from_utf8_lossy(&tail);
    let lines: Vec<&str> = text.lines().map(str::trim).collect();
    let start = lines
        .iter()
        .rposition(|l| l.starts_with(crate::sbatch::ATTEMPT_START));
    let lines = lines[start.map_or(0, |i| i + 1)..]
        .iter()
        .map(|l| l.to_string())
        .collect();
    Some(LastAttempt { file, lines, start })
}

/// What the controller of a Slurm job's last attempt said when it could not write the run's
/// end (a full disk), from the job's error file: that line and the fix after it.
fn end_not_recorded(run: &RunDir, job_id: &str) -> Option<String> {
    let lines = last_attempt(run, job_id)?.lines;
    let at = lines
        .iter()
        .rposition(|l| l.contains(crate::job_controller::END_NOT_RECORDED))?;
    let said = lines[at..].join("\n");
    let said = one_line(said.strip_prefix("warning: ").unwrap_or(&said));
    Some(format!("its controller ended, but {said}"))
}

/// The last `bytes` of `path` (an error file can hold gigabytes of debug output).
fn file_tail(path: &Path, bytes: u64) -> std::io::Result<Vec<u8>> {
    use std::io::{Read, Seek, SeekFrom};
    let mut file = std::fs::File::open(path)?;
    let len = file.metadata()?.len();
    file.seek(SeekFrom::Start(len.saturating_sub(bytes)))?;
    let mut tail = Vec::new();
    file.read_to_end(&mut tail)?;
    Ok(tail)
}

/// A detail as one line of a table: what sbatch or a failure said over several lines,
/// joined with "; " (after a line ending in a colon, which introduces the next, a space).
fn one_line(text: &str) -> String {
    let mut out = String::new();
    for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
        if !out.is_empty() {
            out.push_str(if out.ends_with(':') { " " } else { "; " });
        }
        out.push_str(line);
    }
    out
}

/// Refresh the state of every run with one Slurm query; returns which command answered.
pub fn refresh(runs: &[RunDir]) -> Result<(Vec<RunStatus>, Option<QuerySource>), RunsError> {
    let (statuses, answer) = refresh_or_recorded(runs)?;
    Ok((statuses, answer?))
}

/// Writes how a run ended, as worked out from Slurm, into its manifest, for readers that do
/// not ask Slurm. A manifest that cannot be written (a full disk, a run another user reads)
/// costs only that: the error is returned for the caller to mention.
fn record_state(run: &RunDir, state: RunState, detail: &str) -> Option<String> {
    run.update_manifest(|m| {
        m.state = state;
        if !detail.is_empty() {
            m.error = Some(detail.to_string());
        }
    })
    .err()
    .map(|e| e.to_string())
}

/// Slurm's reason code for a job, with what it means where the code alone says little to
/// people who do not run Slurm every day.
fn reason_in_words(reason: &str, job_id: &str) -> String {
    let meaning = match reason {
        "BeginTime" => {
            "not to start before its begin time (`sbatch --begin`; Slurm also holds a \
             requeued job back a while, about two minutes)"
        }
        "Priority" => "jobs of higher priority are ahead of it",
        "Resources" => "waiting for the nodes it asks for to be free",
        "Dependency" => "waiting for the jobs it depends on",
        "JobArrayTaskLimit" => "its array's throttle (`%N`) holds it back",
        "JobHeldAdmin" => {
            return format!(
                "{reason}: held by an administrator (`scontrol hold`): it starts once an \
                 administrator releases it (`scontrol release {job_id}`)"
            )
        }
        "JobHeldUser" => {
            return format!(
                "{reason}: held by its user (`scontrol hold` or `sbatch --hold`): `scontrol \
                 release {job_id}` lets it start"
            )
        }
        "QOSMaxJobsPerUserLimit" | "AssocMaxJobsLimit" | "AssocGrpJobsLimit" => {
            "this user's or account's limit on running jobs holds it back"
        }
        _ => return reason.to_string(),
    };
    format!("{reason}: {meaning}")
}

/// The detail of a run whose state Slurm did not give.
const RECORDED: &str = "state as last recorded: Slurm did not answer";

/// Which command answered a query (`None` when no run needed Slurm), or what Slurm said
/// when it did not.
pub type SlurmAnswer = Result<Option<QuerySource>, SlurmError>;

/// [`refresh`], except that a Slurm that does not answer leaves the runs it holds in the
/// state their manifests last recorded (said so in their detail, and not written back),
/// with Slurm's error beside them: who asks can still show every run.
pub fn refresh_or_recorded(runs: &[RunDir]) -> Result<(Vec<RunStatus>, SlurmAnswer), RunDirError> {
    let mut manifests = Vec::with_capacity(runs.len());
    for run in runs {
        manifests.push(run.read_manifest()?);
    }
    // A run whose controller requeued its job waits in Slurm's queue: asked as a live job
    // (sacct too, once slurmctld has forgotten a job cancelled meanwhile).
    let results: Vec<Option<Verdict>> = runs.iter().map(read_result).collect();
    let going: Vec<bool> = manifests
        .iter()
        .zip(&results)
        .map(|(m, result)| {
            !m.state.is_terminal()
                || (m.state == RunState::Preempted && result.as_ref().is_some_and(|v| v.requeued))
        })
        .collect();
    let last_jobs = |ended: bool| -> Vec<String> {
        manifests
            .iter()
            .zip(&going)
            .filter(|(_, &going)| going != ended)
            .filter_map(|(m, _)| m.slurm_job_ids.last().cloned())
            .collect()
    };
    let (active, ended) = (last_jobs(false), last_jobs(true));
    let (records, answer) = match query(&active, &ended) {
        Ok((records, source)) => (records, Ok(source)),
        Err(error) => (HashMap::new(), Err(error)),
    };
    // A run that ended is back in Slurm's hands when its job was requeued (by its own
    // controller after a preemption, or `scontrol requeue`): the job is queued again, or
    // running again. A COMPLETING job is on its way back to the queue when its controller
    // requeued it (its verdict says so); else it is the job that wrote the end, in its epilog.
    let queued_again = |id: &String, verdict: Option<&Verdict>| {
        records.get(id).is_some_and(|r| {
            let completing = r.state == JobState::Completing;
            (!completing || verdict.is_some_and(|v| v.requeued))
                && !run_state_of(&r.state).is_terminal()
        })
    };
    let answer = answer.map(|source| {
        let asked = !records.is_empty()
            || !active.is_empty()
            || matches!(source, QuerySource::Recorded { .. });
        asked.then_some(source)
    });
    let unanswered = answer.is_err();
    let mut out = Vec::with_capacity(runs.len());
    let mut current_points = CurrentPoints::default();
    for ((run, manifest), result) in runs.iter().zip(manifests).zip(results) {
        let job_id = manifest.slurm_job_ids.last().cloned();
        let slurm = job_id.as_ref().and_then(|id| records.get(id)).cloned();
        let mut state = manifest.state;
        let mut detail = manifest.error.clone().unwrap_or_default();
        let mut unrecorded = None;
        let requeued = state.is_terminal()
            && job_id
                .as_ref()
                .is_some_and(|id| queued_again(id, result.as_ref()));
        // Its controller requeued the job, which was cancelled (scancel, or Slurm) before it
        // ran again: had it run, its controller would have said RUNNING. (`shardrun cancel`
        // records its own cancel.)
        let cancelled_before_it_ran_again = state == RunState::Preempted
            && result.as_ref().is_some_and(|v| v.requeued)
            && slurm
                .as_ref()
                .is_some_and(|r| r.state == JobState::Cancelled);
        if unanswered && job_id.is_some() && !state.is_terminal() {
            // The controller's result.json tells how the job ended without Slurm; a job
            // still queued or running is shown as it was last recorded.
            match &result {
                Some(verdict) if !verdict.requeued => {
                    state = verdict.state.unwrap_or(RunState::Failed);
                    detail = verdict.message.clone().unwrap_or_default();
                }
                _ => {
                    detail = match detail.as_str() {
                        "" => RECORDED.to_string(),
                        said => format!("{RECORDED}; {said}"),
                    }
                }
            }
        } else if let (true, Some(id)) = (cancelled_before_it_ran_again, &job_id) {
            state = RunState::Cancelled;
            detail = cancelled_while_requeued(run, &manifest, id, "");
            unrecorded = record_state(run, state, &detail);
        } else if !state.is_terminal() || requeued {
            match (&slurm, &result) {
                (Some(record), _) => {
                    state = run_state_of(&record.state);
                    detail = [
                        // A job cancelled while it waited keeps the reason it waited for.
                        // Slurm says JobLaunchFailure of a batch script killed by a signal,
                        // also after its controller started (and said RUNNING): said below.
                        record
                            .reason
                            .clone()
                            .filter(|reason| {
                                record.state != JobState::Cancelled
                                    && !(reason == "JobLaunchFailure"
                                        && manifest.state == RunState::Running)
                            })
                            .map(|reason| reason_in_words(&reason, &record.id)),
                        record
                            .exit_code
                            .clone()
                            .filter(|e| e != "0:0")
                            .map(|e| format!("exit {e}")),
                    ]
                    .into_iter()
                    .flatten()
                    .collect::<Vec<_>>()
                    .join(", ");
                    if detail.is_empty() && record.state == JobState::Cancelled {
                        let id = job_id.as_deref().unwrap_or_default();
                        detail = if job_file(run, id, "out").is_none() {
                            "cancelled while it waited in the queue".into()
                        } else {
                            "cancelled (`shardrun cancel` or scancel)".into()
                        };
                    }
                }
                (None, Some(verdict)) if job_id.is_some() => {
                    state = verdict.state.unwrap_or(RunState::Failed);
                    detail = verdict
                        .message
                        .clone()
                        .unwrap_or_else(|| "from result.json".into());
                }
                // Never started: its controller never wrote RUNNING, and Slurm wrote it no
                // output. An array task cancelled while pending leaves Slurm no record at all.
                (None, None)
                    if manifest.state == RunState::Submitted
                        && job_id
                            .as_deref()
                            .is_some_and(|id| job_file(run, id, "out").is_none()) =>
                {
                    state = RunState::Cancelled;
                    detail = format!(
                        "Slurm job {} is gone without having started (no output file): \
                         cancelled while it waited",
                        job_id.as_deref().unwrap_or_default()
                    );
                }
                (None, None) if job_id.is_some() => {
                    state = RunState::Failed;
                    detail =
                        "Slurm no longer knows the job and the controller wrote no result.json"
                            .into();
                }
                // Never submitted: a local run, whose lock says whether its controller lives.
                _ => match local_run(run, &manifest, result.as_ref()) {
                    Some(LocalRun::Running(holder)) => {
                        detail = format!("its controller is running ({holder}): {}", progress(run))
                    }
                    Some(LocalRun::Ended(verdict)) => {
                        state = verdict.state.unwrap_or(RunState::Failed);
                        detail = verdict.message.clone().unwrap_or_default();
                    }
                    Some(LocalRun::Died) => {
                        state = RunState::Died;
                        detail = died_detail(run);
                    }
                    Some(LocalRun::Unknown) | None => {}
                },
            }
            // Ended by its time limit with no word from its controller: Slurm's `TimeLimit`
            // says nothing of why the notice before it saved nothing.
            if let (RunState::Timeout, None) = (state, &result) {
                if let Some(why) = timed_out_after_notice(run) {
                    detail = why;
                }
            }
            // Nothing of the job said why it ended (a set-up line failed, the controller was
            // killed): its error file does.
            if let (RunState::Failed, None, Some(id)) = (state, &result, &job_id) {
                // A controller that started (it said RUNNING) and then wrote nothing more
                // was killed, or lost with its node: what its error file ends with is
                // older than that.
                // Unless it said it could not write the run's end (a full disk).
                let unrecorded = end_not_recorded(run, id);
                let killed =
                    (manifest.state == RunState::Running && unrecorded.is_none()).then(|| {
                        "its controller stopped after it started without writing a result: it \
                         was killed (SIGKILL, the OOM killer) or its node was lost; \
                         `shardrun submit` the run again to resume it from its last checkpoint"
                            .to_string()
                    });
                // After that, an error file with nothing of this attempt says nothing more.
                let ending = unrecorded.or_else(|| {
                    error_file_ending(run, id).and_then(|ending| match ending {
                        ErrorFileEnding::Said(said) if killed.is_some() => Some(after_killed(said)),
                        ErrorFileEnding::Said(said) => Some(said),
                        ErrorFileEnding::Nothing(_) if killed.is_some() => None,
                        ErrorFileEnding::Nothing(nothing) => Some(nothing),
                    })
                });
                for said in [killed, ending].into_iter().flatten() {
                    detail = if detail.is_empty() {
                        said
                    } else {
                        format!("{detail}; {said}")
                    };
                }
            }
            // Slurm's COMPLETED of a job whose controller wrote no result: the batch script
            // ended before it (a set-up line's `exit 0`), and nothing trained.
            if let (RunState::Completed, None, Some(id)) = (state, &result, &job_id) {
                if let Some(ErrorFileEnding::Said(said) | ErrorFileEnding::Nothing(said)) =
                    error_file_ending(run, id)
                {
                    detail = format!("it trained nothing: {said}");
                }
            }
            // A local run's manifest is its controller's to write: one starting now takes
            // the lock and writes RUNNING, which a state written here would overwrite.
            if state.is_terminal() && job_id.is_some() {
                unrecorded = record_state(run, state, &detail);
            }
        }
        if let Some(Verdict {
            message: Some(error),
            ended,
            requeued: requeued_by_its_controller,
            ..
        }) = &result
        {
            if !detail.contains(error.as_str()) {
                // A job queued again after its attempt ended: what that attempt said is
                // about the attempt before, and its advice (submit it again, or that it is
                // requeued) no longer holds, whatever became of the job since (cancelled
                // while it waited, say).
                let about_the_attempt_before =
                    *requeued_by_its_controller || (requeued && !state.is_terminal());
                let error = match ended {
                    _ if !about_the_attempt_before => error.clone(),
                    Some(ended) => format!("the attempt before {ended}"),
                    None => format!("the attempt before: {error}"),
                };
                detail = if detail.is_empty() {
                    error
                } else {
                    format!("{detail}; {error}")
                };
            }
        }
        // A job Slurm runs says nothing more of itself: how far it has trained does.
        if state == RunState::Running && detail.is_empty() && job_id.is_some() {
            detail = progress(run);
        }
        // An attempt since the submission that requeued its job has said how it ended
        // (above): what the manifest kept of the attempt before the submission is older.
        let attempt_since = result.as_ref().is_some_and(|v| v.requeued);
        if state == RunState::Submitted && !attempt_since {
            detail = with_attempt_before(detail, manifest.ended_before.as_ref());
        }
        // An end reached through preemptions says so: its last attempt's words do not.
        let (requeues, requeued_by_slurm) = requeues_of(run);
        if state.is_terminal() && requeues + requeued_by_slurm > 0 {
            let said = match (requeues, requeued_by_slurm) {
                (n, 0) => format!("its jobs were requeued {n} time(s) after a preemption notice"),
                (0, m) => format!("its jobs were requeued {m} time(s) by Slurm"),
                (n, m) => format!(
                    "its jobs were requeued {n} time(s) after a preemption notice and {m} \
                     time(s) by Slurm"
                ),
            };
            detail = match detail.is_empty() {
                true => said,
                false => format!("{detail}; {said}"),
            };
        }
        out.push(RunStatus {
            run: run.clone(),
            name: manifest.name,
            state,
            job_id,
            slurm,
            detail: one_line(&detail),
            array: manifest.sweep_array,
            sweep_params: manifest.sweep_params,
            superseded: current_points.superseded(run.path()),
            requeues,
            requeued_by_slurm,
            unrecorded,
        });
    }
    Ok((out, answer))
}

/// How often a run's jobs were requeued, from its `events.jsonl` (read once): by their
/// controllers after a preemption notice (a requeue Slurm refused, after which the attempt
/// failed before any later start, is not one), and by Slurm itself (`scontrol requeue`)
/// while a controller ran, whether or not the ranks could checkpoint first.
fn requeues_of(run: &RunDir) -> (u32, u32) {
    let events = crate::events_file::read(&run.events()).unwrap_or_default();
    let by_controllers = (0..events.len())
        .filter(|&at| crate::events_file::requeued_at(&events, at))
        .count();
    let by_slurm = events
        .iter()
        .filter(|e| {
            matches!(
                e.event,
                crate::events_file::RunEvent::Preempted {
                    notice: crate::job_controller::notice::Notice::SlurmRequeue,
                    ..
                }
            )
        })
        .count();
    (by_controllers as u32, by_slurm as u32)
}

/// A run whose controller had requeued its job, cancelled before the job ran again (no
/// controller was there to record it): `by` names who cancelled it (` (shardrun cancel)`),
/// or is empty when that is not known.
pub fn cancelled_while_requeued(
    run: &RunDir,
    manifest: &Manifest,
    job_id: &str,
    by: &str,
) -> String {
    let again = if manifest.sweep_params.is_empty() {
        format!(
            "submitting it again (`shardrun submit {}`)",
            crate::output::pasteable(run.path())
        )
    } else {
        "running `shardrun sweep` on the sweep's spec again".to_string()
    };
    format!(
        "cancelled{by} before its requeued Slurm job {job_id} ran again; {again} {}",
        crate::rerun::again_words(run)
    )
}

/// Why a job Slurm ended at its time limit saved nothing after its notice, when it did not:
/// the run's last event is the notice, so its ranks never reached a step boundary to
/// checkpoint and stop at before the kill (a step, or the start-up, outlasted
/// `preemption.signal_seconds`).
fn timed_out_after_notice(run: &RunDir) -> Option<String> {
    let events = crate::events_file::read(&run.events()).ok()?;
    let crate::events_file::RunEvent::PreemptRequested { .. } = events.last()?.event else {
        return None;
    };
    let were = match crate::metrics_file::latest_step(&run.metrics()) {
        Some(step) => format!("still in a step (the last one logged: {step})"),
        None => "still starting (no step logged)".to_string(),
    };
    Some(format!(
        "the time limit came before the ranks could checkpoint after its notice (SIGUSR2): \
         they were {were}, so nothing was saved since the notice; a step, or the start-up, \
         takes longer than `preemption.signal_seconds`: take the notice earlier (a larger \
         `signal_seconds`) or give the job more `time`, then `shardrun submit` the run again \
         to resume from its newest checkpoint"
    ))
}

/// A pace of `seconds` a step, as people read it: "2.6 s/step", "1.4 steps/s" (not rounded
/// to "1 steps/s"), "250 steps/s".
fn pace_in_words(seconds: f64) -> String {
    let per_second = 1.0 / seconds;
    match seconds {
        s if s >= 1.0 => format!("{s:.1} s/step"),
        _ if per_second < 10.0 => format!("{per_second:.1} steps/s"),
        _ => format!("{per_second:.0} steps/s"),
    }
}

/// How far a running run has trained and, at its recent pace, how long it has left: "at step
/// 26 of 60, about 1m30s left (2.6 s/step)", or that no step is logged yet. A run that has
/// logged nothing for much longer than its steps took says for how long instead of a time
/// left that would not come true (a rank hung or stopped, a long checkpoint or evaluation).
fn progress(run: &RunDir) -> String {
    let total = run.read_train_config().ok().map(|train| train.steps);
    let Some(now) = crate::metrics_file::latest_progress(&run.metrics()) else {
        return "no step logged yet (starting, or preparing its data)".to_string();
    };
    let at = match total {
        Some(total) => format!("at step {} of {total}", now.step),
        None => format!("at step {}", now.step),
    };
    let pace = now.seconds_per_step();
    // The newest write of the run's logs: a rank's line, a step, an event (a new attempt).
    let quiet = [run.metrics(), run.train_log(), run.events()]
        .iter()
        .filter_map(|file| std::fs::metadata(file).and_then(|m| m.modified()).ok())
        .max()
        .and_then(|written| written.elapsed().ok())
        .map(|quiet| quiet.as_secs_f64());
    if let Some(quiet) = quiet.filter(|&q| q > QUIET_FOR.max(QUIET_STEPS * pace.unwrap_or(0.0))) {
        let before = pace
            .map(|p| format!(" (its steps took {} before)", pace_in_words(p)))
            .unwrap_or_default();
        return format!(
            "{at}, nothing logged for {}{before}",
            crate::job_controller::console::format_duration(quiet)
        );
    }
    let left = now.since.and_then(|(first, elapsed)| {
        crate::job_controller::console::eta_seconds(elapsed, first, now.step, total?)
    });
    match (total, pace, left) {
        (Some(total), Some(pace), Some(left)) if total > now.step => format!(
            "{at}, about {} left ({})",
            crate::job_controller::console::format_duration(left),
            pace_in_words(pace)
        ),
        _ => at,
    }
}

/// A running run whose logs have not been written for this long, and for [`QUIET_STEPS`]
/// of its steps, is said to have logged nothing for that long.
const QUIET_FOR: f64 = 60.0;
const QUIET_STEPS: f64 = 10.0;

/// A run submitted again to continue it says, while it waits, how its attempt before ended
/// (the new job has not written anything of its own yet).
fn with_attempt_before(detail: String, before: Option<&crate::rundir::Ended>) -> String {
    let Some(before) = before else {
        return detail;
    };
    let said = match &before.error {
        Some(error) => format!("the attempt before ended {}: {error}", before.state),
        None => format!("the attempt before ended {}", before.state),
    };
    if detail.is_empty() {
        said
    } else {
        format!("{detail}; {said}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A requeue counts once its job is queued again: not one Slurm refused, after which the
    /// attempt failed.
    #[test]
    fn requeues_are_counted_from_the_events_but_refused_ones() {
        let dir = tempfile::tempdir().unwrap();
        let run = RunDir::at(dir.path());
        let started = r#"{"time":1.0,"event":"started","world_size":2}"#;
        let requeued = |n: u32| {
            format!(
                r#"{{"time":2.0,"event":"requeued","step":40,"slurm_job_id":"7","requeue":{n},"max_requeues":3}}"#
            )
        };
        let failed = r#"{"time":3.0,"event":"failed","step":40,"reason":"not requeued"}"#;
        assert_eq!(requeues_of(&run), (0, 0));
        let lines = [
            started.to_string(),
            requeued(1),
            started.to_string(),
            requeued(2),
            failed.to_string(),
        ];
        std::fs::write(run.events(), lines.join("\n") + "\n").unwrap();
        assert_eq!(requeues_of(&run), (1, 0));
        let lines = [lines.join("\n"), started.to_string(), requeued(1)];
        std::fs::write(run.events(), lines.join("\n") + "\n").unwrap();
        assert_eq!(requeues_of(&run), (2, 0));
        // Slurm's own requeues (`scontrol requeue`) are counted apart.
        let by_slurm = r#"{"time":4.0,"event":"preempted","step":50,"notice":"slurm_requeue"}"#;
        let lines = [lines.join("\n"), started.to_string(), by_slurm.to_string()];
        std::fs::write(run.events(), lines.join("\n") + "\n").unwrap();
        assert_eq!(requeues_of(&run), (2, 1));
    }

    #[test]
    fn common_pending_reasons_are_said_in_words_and_others_as_slurm_says_them() {
        assert_eq!(
            reason_in_words("Priority", "12"),
            "Priority: jobs of higher priority are ahead of it"
        );
        assert!(reason_in_words("BeginTime", "12").starts_with("BeginTime: not to start before"));
        assert_eq!(reason_in_words("ReqNodeNotAvail", "12"), "ReqNodeNotAvail");
    }

    #[test]
    fn a_pace_is_said_to_its_first_decimal_below_ten_steps_a_second() {
        let said: Vec<String> = [2.6, 1.0, 0.72, 0.11, 0.004]
            .into_iter()
            .map(pace_in_words)
            .collect();
        assert_eq!(
            said,
            [
                "2.6 s/step",
                "1.0 s/step",
                "1.4 steps/s",
                "9.1 steps/s",
                "250 steps/s"
            ]
        );
    }

    #[test]
    fn a_run_that_logged_nothing_for_long_says_for_how_long_not_a_time_left() {
        let dir = tempfile::tempdir().unwrap();
        let run = crate::rundir::running_local_run(dir.path());
        // Steps 1-5, a second each.
        let lines: String = (1..=5)
            .map(|step| {
                let metrics = shardrun_protocol::messages::StepMetrics {
                    step,
                    loss: 1.0,
                    ..Default::default()
                };
                let record = crate::step_record::StepRecord::fold(&[metrics], step as f64);
                format!("{}\n", serde_json::to_string(&record).unwrap())
            })
            .collect();
        std::fs::write(run.metrics(), lines).unwrap();
        assert_eq!(progress(&run), "at step 5");
        let written = std::time::SystemTime::now() - std::time::Duration::from_secs(130);
        std::fs::File::options()
            .write(true)
            .open(run.metrics())
            .and_then(|file| file.set_modified(written))
            .unwrap();
        let said = progress(&run);
        assert!(
            said.starts_with("at step 5, nothing logged for 2m1")
                && said.ends_with(" (its steps took 1.0 s/step before)"),
            "{said}"
        );
        // A rank's line just now (an evaluation, a checkpoint): the run is not quiet.
        std::fs::write(run.train_log(), "[rank 0] eval after step 5\n").unwrap();
        assert_eq!(progress(&run), "at step 5");
    }

    /// A run whose last event is a notice its ranks never got to act on is explained; one
    /// whose ranks checkpointed after the notice, or that had none, is not.
    #[test]
    fn a_time_limit_that_came_before_the_ranks_could_stop_is_explained() {
        let dir = tempfile::tempdir().unwrap();
        let run = RunDir::at(dir.path());
        std::fs::write(run.events(), "").unwrap();
        assert_eq!(timed_out_after_notice(&run), None);
        let started = r#"{"time":1.0,"event":"started","world_size":2}"#;
        let notice = r#"{"time":2.0,"event":"preempt_requested","notice":"time_limit"}"#;
        std::fs::write(run.events(), format!("{started}\n")).unwrap();
        assert_eq!(timed_out_after_notice(&run), None);
        std::fs::write(run.events(), format!("{started}\n{notice}\n")).unwrap();
        let said = timed_out_after_notice(&run).unwrap();
        assert!(
            said.starts_with(
                "the time limit came before the ranks could checkpoint after its notice \
                 (SIGUSR2): they were still starting (no step logged)"
            ) && said.contains("a larger `signal_seconds`"),
            "{said}"
        );
        let step_7 = shardrun_protocol::messages::StepMetrics {
            step: 7,
            loss: 1.0,
            ..Default::default()
        };
        let record = crate::step_record::StepRecord::fold(&[step_7], 1.0);
        std::fs::write(
            run.metrics(),
            format!("{}\n", serde_json::to_string(&record).unwrap()),
        )
        .unwrap();
        let said = timed_out_after_notice(&run).unwrap();
        assert!(
            said.contains("they were still in a step (the last one logged: 7)"),
            "{said}"
        );
        let saved = r#"{"time":3.0,"event":"checkpoint","step":7,"path":"c/step-7"}"#;
        std::fs::write(run.events(), format!("{started}\n{notice}\n{saved}\n")).unwrap();
        assert_eq!(timed_out_after_notice(&run), None);
    }

    /// Another user's private run (mode 700) is named as a folder this user cannot look
    /// into, beside the runs it can. Looked at as `nobody`, in a child process: root reads
    /// everything.
    #[test]
    fn a_folder_another_user_keeps_private_is_named_not_left_out_in_silence() {
        use std::os::unix::fs::PermissionsExt;
        let root = tempfile::tempdir().unwrap();
        let mode = |path: &Path, mode| {
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap()
        };
        mode(root.path(), 0o755);
        for (name, folder_mode) in [("mine", 0o755), ("private", 0o700)] {
            let run = root.path().join(name);
            std::fs::create_dir(&run).unwrap();
            std::fs::write(run.join("manifest.json"), "{}").unwrap();
            std::fs::write(run.join("resolved.json"), "{}").unwrap();
            mode(&run, folder_mode);
        }
        let path = root.path().to_path_buf();
        // SAFETY: the child only switches user, walks the folder and exits with what it saw.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            // A panic must not unwind into the test harness's copy in this child.
            let seen = std::panic::catch_unwind(|| {
                unsafe { libc::setgid(65534) == 0 && libc::setuid(65534) == 0 }
                    .then(|| find_runs_and_unreadable(&path))
            })
            .unwrap_or_else(|_| unsafe { libc::_exit(3) });
            let code = match seen {
                Some((runs, unreadable))
                    if runs.len() == 1
                        && runs[0].path().ends_with("mine")
                        && unreadable == [path.join("private")] =>
                {
                    0
                }
                Some(_) => 1,
                None => 2,
            };
            unsafe { libc::_exit(code) };
        }
        let mut status = 0;
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        assert!(libc::WIFEXITED(status), "{status}");
        assert_eq!(
            libc::WEXITSTATUS(status),
            0,
            "1: other runs or folders seen, 2: not root (setuid refused), 3: a panic"
        );
        // Root sees both, and the warning names the owner and mode.
        assert_eq!(find_runs_and_unreadable(root.path()).0.len(), 2);
        assert_eq!(
            unreadable_warning(&root.path().join("private")),
            format!(
                "this user cannot look into {}, which is root's (mode 700): runs in it, if any, \
                 are left out",
                root.path().join("private").display()
            )
        );
    }

    #[test]
    fn a_run_submitted_again_says_how_its_attempt_before_ended_while_it_waits() {
        use crate::rundir::Ended;
        let failed = Ended {
            state: RunState::Failed,
            error: Some("rank 1 on n2 exited with code 3".into()),
        };
        assert_eq!(
            with_attempt_before("Priority".into(), Some(&failed)),
            "Priority; the attempt before ended FAILED: rank 1 on n2 exited with code 3"
        );
        let finished = Ended {
            state: RunState::Completed,
            error: None,
        };
        assert_eq!(
            with_attempt_before(String::new(), Some(&finished)),
            "the attempt before ended COMPLETED"
        );
        assert_eq!(with_attempt_before("Resources".into(), None), "Resources");
    }

    #[test]
    fn a_detail_of_several_lines_is_one_line_of_the_table() {
        let sbatch = "sbatch: error: invalid partition specified: nosuch\n\
                      sbatch: error: Batch job submission failed: Invalid partition name specified\n";
        assert_eq!(
            one_line(sbatch),
            "sbatch: error: invalid partition specified: nosuch; sbatch: error: Batch job \
             submission failed: Invalid partition name specified"
        );
        assert_eq!(one_line("training finished"), "training finished");
        assert_eq!(
            one_line(
                "`sbatch --test-only job.sbatch` failed (exit status: 1):\nallocation failure"
            ),
            "`sbatch --test-only job.sbatch` failed (exit status: 1): allocation failure"
        );
    }

    /// A controller that could not write the run's end (a full disk) said so in the job's
    /// error file: its words, not a killed controller's, are the detail. An earlier
    /// attempt's are not this one's.
    #[test]
    fn a_controller_that_could_not_write_the_runs_end_is_not_taken_for_killed() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("manifest.json"), "{}").unwrap();
        let run = RunDir::open(dir.path()).unwrap();
        assert_eq!(end_not_recorded(&run, "7"), None);
        let unrecorded = "warning: the run's end is not recorded (cannot write /r/result.json: \
                          No space left on device (os error 28))\n  \
                          fix: free space in (or make writable) /r, then `shardrun submit /r`\n";
        let file = dir.path().join("job-7.err");
        std::fs::write(
            &file,
            format!("shardrun: start of job 7, attempt 1\n{unrecorded}"),
        )
        .unwrap();
        assert_eq!(
            end_not_recorded(&run, "7").as_deref(),
            Some(
                "its controller ended, but the run's end is not recorded (cannot write \
                 /r/result.json: No space left on device (os error 28)); fix: free space in \
                 (or make writable) /r, then `shardrun submit /r`"
            )
        );
        std::fs::write(
            &file,
            format!("{unrecorded}shardrun: start of job 7, attempt 2\nkilled\n"),
        )
        .unwrap();
        assert_eq!(end_not_recorded(&run, "7"), None);
    }

    #[test]
    fn the_error_file_of_a_run_or_of_its_array_task_ends_the_detail() {
        let sweep = tempfile::tempdir().unwrap();
        let point = sweep.path().join("lr=0.1");
        std::fs::create_dir_all(sweep.path().join("slurm")).unwrap();
        std::fs::create_dir_all(&point).unwrap();
        std::fs::write(point.join("manifest.json"), "{}").unwrap();
        let run = RunDir::open(&point).unwrap();
        assert_eq!(error_file_ending(&run, "41"), None);

        let single = point.join("job-41.err");
        std::fs::write(&single, "first\nshardrun: it failed\n\n").unwrap();
        let said = error_file_ending(&run, "41").unwrap();
        assert_eq!(
            said,
            ErrorFileEnding::Said(format!(
                "the job ended before its controller wrote a result; {} ends: shardrun: it failed",
                single.display()
            ))
        );
        // After a killed controller's words, the file's ending alone.
        let ErrorFileEnding::Said(said) = said else {
            unreachable!()
        };
        assert_eq!(
            after_killed(said),
            format!("{} ends: shardrun: it failed", single.display())
        );
        // A requeued job appends: only its last attempt's lines are its own.
        let attempts = "shardrun: start of job 41 on n1, attempt 1\n\
                        slurmstepd: error: *** JOB 41 CANCELLED DUE TO NODE FAILURE ***\n\
                        shardrun: start of job 41 on n2, attempt 2\n";
        std::fs::write(&single, attempts).unwrap();
        assert_eq!(
            error_file_ending(&run, "41").unwrap(),
            ErrorFileEnding::Nothing(format!(
                "the job ended before its controller wrote a result; {} has nothing after its \
                 last start",
                single.display()
            ))
        );
        std::fs::write(
            &single,
            format!("{attempts}shardrun: a resources.setup line failed\n"),
        )
        .unwrap();
        assert_eq!(
            error_file_ending(&run, "41").unwrap(),
            ErrorFileEnding::Said(format!(
                "the job ended before its controller wrote a result; {} ends: shardrun: a \
                 resources.setup line failed",
                single.display()
            ))
        );
        // Another job's file is not this one's.
        assert_eq!(error_file_ending(&run, "1"), None);
        // Only its end is read.
        let long = format!(
            "{}the last line\n",
            "NCCL INFO debug output\n".repeat(10_000)
        );
        std::fs::write(&single, long).unwrap();
        assert!(matches!(error_file_ending(&run, "41").unwrap(),
            ErrorFileEnding::Said(said) if said.ends_with("ends: the last line")));

        let task = sweep.path().join("slurm/sweep-57_3.err");
        std::fs::write(&task, "x".repeat(400)).unwrap();
        let detail = error_file_ending(&run, "57_3").unwrap();
        assert!(
            matches!(&detail, ErrorFileEnding::Said(said)
                if said.ends_with(&format!("{} ends: {}...", task.display(), "x".repeat(300)))),
            "{detail:?}"
        );
        std::fs::write(&task, "").unwrap();
        assert!(matches!(error_file_ending(&run, "57_3").unwrap(),
            ErrorFileEnding::Nothing(nothing) if nothing.ends_with("is empty")));
    }

    #[test]
    fn result_json_of_the_controller_maps_to_run_states() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("manifest.json"), "{}").unwrap();
        let run = RunDir::open(dir.path()).unwrap();
        for (status, state) in [
            ("succeeded", RunState::Completed),
            ("failed", RunState::Failed),
            ("cancelled", RunState::Cancelled),
            ("preempted", RunState::Preempted),
        ] {
            std::fs::write(
                run.result(),
                format!("{{\"status\": \"{status}\", \"message\": \"m\", \"exit_code\": 0}}"),
            )
            .unwrap();
            assert_eq!(
                read_result(&run),
                Some(Verdict {
                    state: Some(state),
                    message: Some("m".to_string()),
                    ended: None,
                    requeued: false,
                })
            );
        }
        std::fs::write(
            run.result(),
            r#"{"status": "preempted", "message": "m", "ended": "was preempted after step 40", "requeued": true}"#,
        )
        .unwrap();
        assert!(read_result(&run).is_some_and(
            |v| v.requeued && v.ended.as_deref() == Some("was preempted after step 40")
        ));
        // Preempted with no requeue left: the controller exits 1, and Slurm says FAILED.
        std::fs::write(
            run.result(),
            r#"{"status": "preempted", "message": "no requeue left", "exit_code": 1}"#,
        )
        .unwrap();
        assert!(read_result(&run).is_some_and(|v| v.state == Some(RunState::Failed)));
        std::fs::write(run.result(), "{\"stat").unwrap();
        assert_eq!(
            read_result(&run),
            None,
            "a truncated result.json is ignored"
        );
    }

    #[test]
    fn a_local_run_whose_controller_is_gone_has_died() {
        let dir = tempfile::tempdir().unwrap();
        let run = crate::rundir::running_local_run(dir.path());
        let state_of = |run: &RunDir| {
            let (statuses, source) = refresh(std::slice::from_ref(run)).unwrap();
            assert_eq!(source, None, "no Slurm asked");
            (statuses[0].state, statuses[0].detail.clone())
        };
        // Its controller took the lock, wrote its name, and died: its name is left, the lock
        // free. (Not taken and dropped here: a child another test forks at that moment would
        // hold it until it execs.)
        let me = format!("pid {} on ", std::process::id());
        std::fs::write(
            run.path().join(crate::rundir::LOCK_FILE),
            format!("{me}{}\n", shardrun_protocol::host::hostname()),
        )
        .unwrap();
        let (state, detail) = state_of(&run);
        assert_eq!(state, RunState::Died);
        assert!(
            detail.starts_with(&format!("its controller ({me}")),
            "{detail}"
        );
        assert!(
            detail.ends_with("starts it over (it has no checkpoint)"),
            "{detail}"
        );
        let manifest = run.read_manifest().unwrap();
        assert_eq!(manifest.state, RunState::Running, "not written back");
        assert!(died(&run, &manifest).is_some());

        let lock = RunLock::acquire(run.path()).unwrap();
        let (state, detail) = state_of(&run);
        assert_eq!(state, RunState::Running);
        assert!(
            detail.starts_with(&format!("its controller is running ({me}"))
                && detail.ends_with("): no step logged yet (starting, or preparing its data)"),
            "{detail}"
        );
        // How far it is, as for a Slurm job.
        let step = r#"{"step":3,"time":1796179309.9,"ranks":2,"loss":8.3,"lr":0.0001,"grad_norm":2.3,"tokens_per_s":3816.6,"trained_tokens_per_s":3816.6,"step_time_min_s":0.52,"step_time_median_s":0.53,"step_time_max_s":0.54,"slowest_rank":0,"peak_memory_max_bytes":502886400,"peak_memory_max_rank":0,"model_state_max_bytes":38946816}"#;
        std::fs::write(run.metrics(), format!("{step}\n")).unwrap();
        let (_, detail) = state_of(&run);
        assert!(detail.contains("): at step 3"), "{detail}");
        assert!(died(&run, &manifest).is_none());
        drop(lock);

        // Its verdict written, its manifest not yet: the verdict holds.
        std::fs::write(
            run.result(),
            r#"{"status": "cancelled", "message": "the run was cancelled by SIGTERM"}"#,
        )
        .unwrap();
        assert_eq!(state_of(&run).0, RunState::Cancelled);
        assert!(died(&run, &manifest).is_none());
    }

    #[test]
    fn status_and_died_judge_a_local_run_alike() {
        let dir = tempfile::tempdir().unwrap();
        let run = crate::rundir::running_local_run(dir.path());
        let manifest = run.read_manifest().unwrap();
        let judged = |run: &RunDir| {
            let (statuses, _) = refresh(std::slice::from_ref(run)).unwrap();
            (
                statuses[0].state == RunState::Died,
                died(run, &manifest).is_some(),
            )
        };
        // No verdict, a verdict cut short, a verdict, with the lock free.
        assert_eq!(judged(&run), (true, true));
        std::fs::write(run.result(), "{\"stat").unwrap();
        assert_eq!(
            judged(&run),
            (true, true),
            "a truncated result.json says nothing"
        );
        std::fs::write(run.result(), r#"{"status": "failed"}"#).unwrap();
        assert_eq!(judged(&run), (false, false));
        // Its controller lives, verdict or not.
        let _lock = RunLock::acquire(run.path()).unwrap();
        std::fs::remove_file(run.result()).unwrap();
        assert_eq!(judged(&run), (false, false));
    }

    #[test]
    fn the_data_cache_in_a_run_root_is_not_a_run() {
        let root = tempfile::tempdir().unwrap();
        let run = root.path().join("llama");
        let cache = root.path().join("data-cache/jsonl-0123");
        for dir in [&run, &cache] {
            std::fs::create_dir_all(dir).unwrap();
            std::fs::write(dir.join("manifest.json"), "{}").unwrap();
        }
        std::fs::write(run.join("resolved.json"), "{}").unwrap();
        let found: Vec<_> = find_runs(root.path())
            .iter()
            .map(|r| r.path().to_path_buf())
            .collect();
        assert_eq!(found, vec![std::path::absolute(&run).unwrap()]);
    }
}
