//! Running the Slurm commands. One batched query for many jobs: `sacct` when accounting
//! works, else `squeue --states=all` plus `scontrol show job` for what squeue missed.

use super::node_fit::{parse_sinfo, shortfall, waits_for, NodeInfo, NodeRequest, SINFO_FORMAT};
use super::parse::{
    parse_commented_jobs, parse_sacct, parse_sbatch_parsable, parse_scontrol, parse_squeue,
    CommentedJob,
};
use super::{JobRecord, SlurmError};
use std::collections::{HashMap, HashSet};
use std::io::ErrorKind;
use std::path::Path;
use std::process::{Command, Output};

pub(super) fn run(program: &'static str, args: &[&str]) -> Result<Output, SlurmError> {
    use std::os::unix::process::CommandExt;
    Command::new(program)
        .args(args)
        // Out of the terminal's process group: a Ctrl-C is shardrun's to act on (see
        // [`submit_recorded`]), not a kill of an sbatch whose job Slurm may already have.
        .process_group(0)
        .output()
        .map_err(|source| spawn_error(program, source))
}

fn spawn_error(program: &'static str, source: std::io::Error) -> SlurmError {
    match source.kind() {
        ErrorKind::NotFound => SlurmError::NotInstalled { command: program },
        _ => SlurmError::Spawn {
            command: program,
            source,
        },
    }
}

/// [`run`] with `input` on the program's stdin.
fn run_with_input(program: &'static str, args: &[&str], input: &str) -> Result<Output, SlurmError> {
    use std::io::Write;
    use std::os::unix::process::CommandExt;
    let mut child = Command::new(program)
        .args(args)
        .process_group(0)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(|source| spawn_error(program, source))?;
    let mut stdin = child.stdin.take().expect("stdin is piped");
    // A program that exits before reading all of it closes the pipe: its answer says why.
    let _ = stdin.write_all(input.as_bytes());
    drop(stdin);
    child
        .wait_with_output()
        .map_err(|source| spawn_error(program, source))
}

pub(super) fn check(program: &str, args: &[&str], output: Output) -> Result<String, SlurmError> {
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    } else {
        Err(SlurmError::Failed {
            command: format!("{program} {}", args.join(" ")),
            status: output.status.to_string(),
            stderr: String::from_utf8_lossy(&output.stderr).trim().to_string(),
        })
    }
}

/// `sbatch --parsable [extra args] <script>` → the job id.
pub fn submit(script: &Path, extra_args: &[String]) -> Result<String, SlurmError> {
    test_submission(script, extra_args)?;
    sbatch(script, extra_args)
}

/// What [`submit`] asks before a held job is submitted: that the script is there and that
/// Slurm would take the job.
fn test_submission(script: &Path, extra_args: &[String]) -> Result<(), SlurmError> {
    if !script.is_file() {
        return Err(SlurmError::MissingScript(script.to_path_buf()));
    }
    // slurmctld takes a held job without matching it to the nodes (`--mem=900G` is
    // accepted, then pends for ever with BadConstraints once released): `--test-only`
    // first, which refuses what a plain sbatch would, and also what needs a node that is
    // drained or down for now, which a plain sbatch queues (told apart with `sinfo`).
    if extra_args.iter().any(|a| a == "--hold") {
        let others: Vec<String> = extra_args
            .iter()
            .filter(|a| *a != "--hold")
            .cloned()
            .collect();
        let text = std::fs::read_to_string(script)
            .map_err(|_| SlurmError::MissingScript(script.to_path_buf()))?;
        if let TestOnly::WaitsFor(waited_for) = test_only(&text, &others)? {
            errln!(
                "warning: `sbatch --test-only` refused the job, which nodes of its partition \
                 out of service now would meet ({}): submitted, so that it waits for them as a \
                 plain sbatch's job would",
                waited_for.join(", ")
            );
        }
    }
    Ok(())
}

/// What Slurm would do with a job, asked with `sbatch --test-only`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TestOnly {
    /// It would take it: sbatch's words on when and where it would start.
    Starts(String),
    /// `--test-only` refused it, but a plain sbatch would queue it for these nodes out of
    /// service (`node (state)`).
    WaitsFor(Vec<String>),
}

/// `sbatch --test-only [extra args]` of the batch script `script` (given on its stdin). A
/// refusal carries, under sbatch's own words, each ask of the job no node of its partition
/// meets ([`shortfall`]).
pub fn test_only(script: &str, extra_args: &[String]) -> Result<TestOnly, SlurmError> {
    let mut args = vec!["--test-only".to_string()];
    args.extend(extra_args.iter().cloned());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let output = run_with_input("sbatch", &args, script)?;
    // sbatch --test-only answers on stderr: "sbatch: Job 12 to start at ... on nodes ...".
    let said = String::from_utf8_lossy(&output.stderr).trim().to_string();
    let refused = match check("sbatch", &args, output) {
        Ok(_) => return Ok(TestOnly::Starts(said)),
        Err(refused) => refused,
    };
    // Not a refusal of the job: sinfo would only wait for the same controller.
    if refused.controller_unreachable() {
        return Err(refused);
    }
    let fit = node_fit(script);
    if let Some(nodes) = fit
        .as_ref()
        .and_then(|(request, nodes)| waits_for(request, nodes))
    {
        return Ok(TestOnly::WaitsFor(nodes));
    }
    let why = fit.and_then(|(request, nodes)| shortfall(&request, &nodes));
    Err(match (refused, why) {
        (
            SlurmError::Failed {
                command,
                status,
                stderr,
            },
            Some(why),
        ) => SlurmError::Failed {
            command,
            status,
            stderr: format!("{stderr}\n  why: {}", why.join("\n  why: ")),
        },
        (refused, _) => refused,
    })
}

/// `sbatch --parsable [extra args] <script>` itself → the job id.
fn sbatch(script: &Path, extra_args: &[String]) -> Result<String, SlurmError> {
    let args = sbatch_args(script, extra_args);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let output = run("sbatch", &args)?;
    parse_sbatch_parsable(&check("sbatch", &args, output)?)
}

/// What the job of `script` asks of each node, and the nodes sinfo lists: whether it waits
/// for nodes out of service ([`waits_for`]) or no node could hold it ([`shortfall`]).
fn node_fit(script: &str) -> Option<(NodeRequest, Vec<NodeInfo>)> {
    let request = NodeRequest::of_script(script);
    let args = ["--noheader", "--Node", SINFO_FORMAT];
    let text = check("sinfo", &args, run("sinfo", &args).ok()?).ok()?;
    Some((request, parse_sinfo(&text)))
}

/// The arguments [`submit`] gives sbatch (a dry run shows them).
pub fn sbatch_args(script: &Path, extra_args: &[String]) -> Vec<String> {
    let mut args = vec!["--parsable".to_string()];
    args.extend_from_slice(extra_args);
    args.push(script.to_string_lossy().into_owned());
    args
}

/// `scontrol release <id>`: let a job submitted with `--hold` start.
pub fn release(id: &str) -> Result<(), SlurmError> {
    let args = ["release", id];
    let output = run("scontrol", &args)?;
    check("scontrol", &args, output).map(|_| ())
}

/// `sbatch --hold`, record the id with `record`, then release the job. The job cannot
/// start (and its controller cannot write the manifest) before the id is recorded.
///
/// A stop signal (Ctrl-C, a closed terminal, `kill`) from the held sbatch to the release
/// is held back (a second one acts at once): ended in between, the job would stay held in
/// Slurm with nothing that knows of it. The caller records the outcome, then
/// [`StopsHeld::release`] acts on the signal.
pub fn submit_recorded<E: std::fmt::Display>(
    script: &Path,
    record: impl FnOnce(&str) -> Result<(), E>,
) -> (Result<String, SlurmError>, StopsHeld) {
    let hold = ["--hold".to_string()];
    if let Err(refused) = test_submission(script, &hold) {
        return (Err(refused), StopsHeld { old: Vec::new() });
    }
    let held = StopsHeld::begin();
    let submitted = sbatch(script, &hold).and_then(|id| {
        let recorded = record(&id).map_err(|e| SlurmError::Failed {
            command: "recording the job id".into(),
            status: "error".into(),
            stderr: e.to_string(),
        });
        match recorded.and_then(|()| release(&id)) {
            Ok(()) => Ok(id),
            Err(err) => {
                // Never leave a held job behind that nothing knows about.
                let _ = cancel(std::slice::from_ref(&id));
                Err(err)
            }
        }
    });
    (submitted, held)
}

/// The first stop signal that came while [`StopsHeld`] held them (0: none).
static DEFERRED: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);

extern "C" fn defer_stop(signal: libc::c_int) {
    let first = DEFERRED.compare_exchange(
        0,
        signal,
        std::sync::atomic::Ordering::SeqCst,
        std::sync::atomic::Ordering::SeqCst,
    );
    if first.is_err() {
        // A second one is meant: it acts as it would have. SAFETY: both calls are
        // async-signal-safe.
        unsafe {
            libc::signal(signal, libc::SIG_DFL);
            libc::raise(signal);
        }
    }
}

/// SIGINT, SIGTERM and SIGHUP noted instead of acted on, process-wide, until
/// [`StopsHeld::release`]. Signals ignored before (`nohup`) stay ignored.
#[must_use = "a stop signal held back must be released"]
pub struct StopsHeld {
    old: Vec<(libc::c_int, libc::sigaction)>,
}

impl StopsHeld {
    const SIGNALS: [libc::c_int; 3] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP];

    fn begin() -> StopsHeld {
        DEFERRED.store(0, std::sync::atomic::Ordering::SeqCst);
        let mut old = Vec::new();
        for signal in Self::SIGNALS {
            // SAFETY: installs an async-signal-safe handler (one atomic store); the previous
            // action is kept to be put back.
            unsafe {
                let mut before: libc::sigaction = std::mem::zeroed();
                if libc::sigaction(signal, std::ptr::null(), &mut before) != 0
                    || before.sa_sigaction == libc::SIG_IGN
                {
                    continue;
                }
                let mut action: libc::sigaction = std::mem::zeroed();
                action.sa_sigaction = defer_stop as extern "C" fn(libc::c_int) as usize;
                libc::sigemptyset(&mut action.sa_mask);
                if libc::sigaction(signal, &action, std::ptr::null_mut()) == 0 {
                    old.push((signal, before));
                }
            }
        }
        StopsHeld { old }
    }

    /// The signal that came while they were held, if one did.
    pub fn signal(&self) -> Option<libc::c_int> {
        Some(DEFERRED.load(std::sync::atomic::Ordering::SeqCst)).filter(|&s| s != 0)
    }

    /// Puts the actions back and acts on a signal that came meanwhile as it would have
    /// acted then (by default: the process ends with it, 128 + its number to shells).
    pub fn release(self) {
        for (signal, before) in &self.old {
            // SAFETY: restores the action read in `begin`.
            unsafe { libc::sigaction(*signal, before, std::ptr::null_mut()) };
        }
        let signal = DEFERRED.swap(0, std::sync::atomic::Ordering::SeqCst);
        if signal != 0 {
            // SAFETY: a plain signal to this process.
            unsafe { libc::raise(signal) };
        }
    }
}

/// The user's jobs that slurmctld holds and that carry a `--comment`, by comment (the first
/// of each: an array's tasks share it).
pub fn jobs_by_comment() -> Result<HashMap<String, CommentedJob>, SlurmError> {
    let user = super::limits::current_user();
    let args = ["-h", "--states=all", "-u", &user, "-o", "%F|%T|%r|%k"];
    let output = run("squeue", &args)?;
    let mut jobs = HashMap::new();
    for job in parse_commented_jobs(&check("squeue", &args, output)?) {
        jobs.entry(job.comment.clone()).or_insert(job);
    }
    Ok(jobs)
}

/// `scancel <ids>`.
pub fn cancel(ids: &[String]) -> Result<(), SlurmError> {
    if ids.is_empty() {
        return Ok(());
    }
    let args: Vec<&str> = ids.iter().map(String::as_str).collect();
    let output = run("scancel", &args)?;
    check("scancel", &args, output).map(|_| ())
}

/// Which commands answered a [`query`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum QuerySource {
    /// `squeue` knew every job.
    Squeue,
    /// `squeue`, then `sacct` for the jobs slurmctld has forgotten.
    SqueueSacct,
    /// `squeue`, then `scontrol` because accounting is not enabled (sacct exits non-zero).
    SqueueScontrol,
    /// `squeue` did not answer (what it said), and only jobs of runs that had ended were
    /// asked after: their recorded ends stand, though a requeue since would not show.
    Recorded { squeue_error: String },
}

/// States of `active` (`1234` or `1234_5`: jobs of runs not known to have ended) in as few
/// calls as possible, and of those of `ended` (jobs of runs that ended) that slurmctld still
/// holds: requeued ones are queued again. Ids no command knows are absent from the map.
///
/// `squeue` comes first because it is live: `sacct` lags slurmctld by seconds (a running
/// job still reads PENDING there). sacct then answers for active jobs slurmctld no longer
/// holds; without accounting, `scontrol show job` is the last resort. Ended jobs are asked of
/// squeue only; when it does not answer, their recorded ends stand
/// ([`QuerySource::Recorded`]): a finished run's status needs no Slurm.
pub fn query(
    active: &[String],
    ended: &[String],
) -> Result<(HashMap<String, JobRecord>, QuerySource), SlurmError> {
    let mut found = HashMap::new();
    let active_wanted: HashSet<String> = active.iter().cloned().collect();
    let mut wanted = active_wanted.clone();
    wanted.extend(ended.iter().cloned());
    let keep = |records: Vec<JobRecord>,
                wanted: &HashSet<String>,
                found: &mut HashMap<String, JobRecord>| {
        for r in records {
            if wanted.contains(&r.id) && !found.contains_key(&r.id) {
                found.insert(r.id.clone(), r);
            }
        }
    };
    if wanted.is_empty() {
        return Ok((found, QuerySource::Squeue));
    }
    // All jobs in one call, ended ones included while slurmctld remembers them; filtering
    // here avoids squeue failing on an id it has already forgotten.
    let args = ["-h", "-r", "--states=all", "-o", "%i|%T|%r"];
    let answer = run("squeue", &args).and_then(|output| check("squeue", &args, output));
    match answer {
        Ok(text) => keep(parse_squeue(&text), &wanted, &mut found),
        Err(e) if active.is_empty() => {
            let squeue_error = e.to_string().trim_end().to_string();
            return Ok((found, QuerySource::Recorded { squeue_error }));
        }
        Err(e) => return Err(e),
    }
    let ids: Vec<&String> = active
        .iter()
        .filter(|id| !found.contains_key(*id))
        .collect();
    if ids.is_empty() {
        return Ok((found, QuerySource::Squeue));
    }

    // Array tasks are asked for by their array's id; sacct then lists every task.
    let mut jobs: Vec<&str> = ids
        .iter()
        .map(|id| id.split('_').next().unwrap_or(id))
        .collect();
    jobs.sort_unstable();
    jobs.dedup();
    let job_list = jobs.join(",");
    let sacct_args = [
        "-n",
        "-P",
        "-X",
        "-j",
        &job_list,
        "-o",
        "JobID,State,ExitCode",
    ];
    // sacct exits non-zero when accounting storage is disabled (no slurmdbd).
    if let Ok(output) = run("sacct", &sacct_args) {
        if output.status.success() {
            keep(
                parse_sacct(&String::from_utf8_lossy(&output.stdout)),
                &active_wanted,
                &mut found,
            );
            return Ok((found, QuerySource::SqueueSacct));
        }
    }
    let args = ["-o", "show", "job"];
    let output = run("scontrol", &args)?;
    if let Ok(text) = check("scontrol", &args, output) {
        keep(parse_scontrol(&text), &active_wanted, &mut found);
    }
    Ok((found, QuerySource::SqueueScontrol))
}
