//! What a signal from Slurm announces. Slurm sends the job's `--signal` (SIGUSR2) both when
//! it preempts the job and `signal_seconds` before its time limit; the controller checkpoints
//! (and requeues) for either, and says which, from the time limit and time used that squeue
//! reports for the job. A SIGTERM is a cancel, unless Slurm is requeueing the job
//! (`scontrol requeue`, a failed node): then it is a notice too, and the job is already queued.

use crate::resolve::slurm_duration;
use serde::{Deserialize, Serialize};
use std::time::Duration;
use tokio::process::Command;

/// Set by the batch script: how many seconds before the time limit Slurm sends SIGUSR2
/// (`preemption.signal_seconds`).
pub const NOTICE_SECONDS_VAR: &str = "SHARDRUN_NOTICE_SECONDS";

/// Slurm may send the time-limit signal up to a minute before it is due ("due to the
/// resolution of event handling by Slurm", sbatch's manual).
pub(crate) const SIGNAL_EARLY_BY: u64 = 60;

/// How long squeue or scontrol may take to answer: the notice leaves little time, and the
/// checkpoint must not wait on a busy slurmctld.
const SLURM_WAIT: Duration = Duration::from_secs(5);

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Notice {
    /// Slurm preempts the job (or someone sent SIGUSR2 well before the time limit).
    Preemption,
    /// The job's time limit is near.
    TimeLimit,
    /// A SIGUSR2 that is not known to be either: outside Slurm, or squeue did not answer
    /// (and in events written before notices were named).
    #[default]
    Signal,
    /// SIGTERM from Slurm requeueing the job: it runs again by itself.
    SlurmRequeue,
}

impl Notice {
    /// What the SIGUSR2 just received announces, asked of Slurm (one squeue call).
    pub async fn of_this_job() -> Notice {
        let (Some(job), Some(notice_seconds)) = (
            env("SLURM_JOB_ID"),
            env(NOTICE_SECONDS_VAR).and_then(|s| s.parse().ok()),
        ) else {
            return Notice::Signal;
        };
        match ask_slurm("squeue", &["--noheader", "--jobs", &job, "--format=%l %M"]).await {
            Some(line) => Notice::from_squeue(&line, notice_seconds),
            None => Notice::Signal,
        }
    }

    /// Whether Slurm is requeueing this job (it sends SIGTERM first): its restart count is
    /// past the one it started with (`SLURM_RESTART_COUNT`, absent on the first run).
    pub async fn requeued_by_slurm() -> bool {
        let Some(job) = env("SLURM_JOB_ID") else {
            return false;
        };
        let started_with: u64 = env("SLURM_RESTART_COUNT")
            .and_then(|n| n.parse().ok())
            .unwrap_or(0);
        ask_slurm("scontrol", &["show", "job", &job])
            .await
            .and_then(|shown| restarts(&shown))
            .is_some_and(|n| n > started_with)
    }

    /// Whether Slurm is ending this job itself (`scancel`, the kill at its time limit):
    /// squeue shows it COMPLETING, or already CANCELLED, while its batch script still runs.
    pub async fn ended_by_slurm() -> bool {
        let Some(job) = env("SLURM_JOB_ID") else {
            return false;
        };
        ask_slurm("squeue", &["--noheader", "--jobs", &job, "--format=%T"])
            .await
            .is_some_and(|state| matches!(state.trim(), "COMPLETING" | "CANCELLED"))
    }

    /// From squeue's `%l %M` (time limit, time used: `1:00:00 42:17`, `UNLIMITED 5:03`) and
    /// the seconds before the limit that Slurm signals.
    fn from_squeue(line: &str, notice_seconds: u64) -> Notice {
        let mut fields = line.split_whitespace();
        let (Some(limit), Some(used)) = (fields.next(), fields.next()) else {
            return Notice::Signal;
        };
        if limit == "UNLIMITED" {
            return Notice::Preemption;
        }
        match (slurm_duration(limit), slurm_duration(used)) {
            (Some(limit), Some(used)) => {
                if limit.saturating_sub(used) <= notice_seconds + SIGNAL_EARLY_BY {
                    Notice::TimeLimit
                } else {
                    Notice::Preemption
                }
            }
            _ => Notice::Signal,
        }
    }

    /// The notice in a few words, with the signal: the subject of a train.log line.
    pub fn announced(self) -> &'static str {
        match self {
            Notice::Preemption => "preemption notice (SIGUSR2)",
            Notice::TimeLimit => "the job's time limit is near (SIGUSR2)",
            Notice::Signal => "SIGUSR2 (a preemption or time-limit notice)",
            Notice::SlurmRequeue => {
                "SIGTERM: Slurm is requeueing the job (`scontrol requeue`, or a failed node)"
            }
        }
    }

    /// The label of a plot's marker where the run stopped for it.
    pub fn marker(self) -> &'static str {
        match self {
            Notice::Preemption => "preempted",
            Notice::TimeLimit => "time limit",
            Notice::Signal => "SIGUSR2",
            Notice::SlurmRequeue => "requeued by Slurm",
        }
    }

    /// How a run that stopped for it ended, after "the run": `was preempted`.
    pub fn ended(self) -> &'static str {
        match self {
            Notice::Preemption => "was preempted",
            Notice::TimeLimit => "stopped before its time limit",
            Notice::Signal => "stopped on SIGUSR2",
            Notice::SlurmRequeue => "was requeued by Slurm",
        }
    }
}

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

/// What a Slurm command printed, or `None` when it failed or took longer than the notice
/// can wait.
async fn ask_slurm(program: &str, args: &[&str]) -> Option<String> {
    let asked = Command::new(program).args(args).kill_on_drop(true).output();
    match tokio::time::timeout(SLURM_WAIT, asked).await {
        Ok(Ok(out)) if out.status.success() => {
            Some(String::from_utf8_lossy(&out.stdout).into_owned())
        }
        _ => None,
    }
}

/// What gives a job stopped by its time limit more time to train: a longer limit, and a later
/// notice only where this one is well over the minute Slurm may signal early by (a smaller
/// `signal_seconds` gains nothing there, and leaves the checkpoint less time).
pub fn more_time_to_train() -> String {
    let notice_seconds: Option<u64> = env(NOTICE_SECONDS_VAR).and_then(|s| s.parse().ok());
    more_time_with(notice_seconds)
}

fn more_time_with(notice_seconds: Option<u64>) -> String {
    match notice_seconds {
        Some(seconds) if seconds > 2 * SIGNAL_EARLY_BY => format!(
            "give the job more time (`resources.time`) or take the notice later (a smaller \
             `preemption.signal_seconds` than {seconds}, leaving the checkpoint time to be \
             written)"
        ),
        Some(seconds) => format!(
            "give the job more time (`resources.time`): a smaller \
             `preemption.signal_seconds` than {seconds} gains little, as Slurm may send the \
             notice up to {SIGNAL_EARLY_BY} s early"
        ),
        None => "give the job more time (`resources.time`)".to_string(),
    }
}

/// `Restarts=N` of `scontrol show job`: how many times the job was requeued.
fn restarts(shown: &str) -> Option<u64> {
    shown
        .split_whitespace()
        .find_map(|field| field.strip_prefix("Restarts="))
        .and_then(|n| n.parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_restart_count_is_read_from_scontrol() {
        let shown = "JobId=68 JobName=rq.sh\n   JobState=COMPLETING Reason=None Dependency=(null)\n   Requeue=1 Restarts=1 BatchFlag=1 Reboot=0 ExitCode=0:0\n";
        assert_eq!(restarts(shown), Some(1));
        assert_eq!(restarts("JobId=68 JobState=RUNNING"), None);
    }

    #[test]
    fn a_later_notice_is_advised_only_where_it_gains_time() {
        assert!(
            more_time_with(Some(300)).contains("a smaller `preemption.signal_seconds` than 300")
        );
        let short = more_time_with(Some(30));
        assert!(
            short.starts_with("give the job more time (`resources.time`): a smaller")
                && short.ends_with("up to 60 s early"),
            "{short}"
        );
        assert_eq!(
            more_time_with(None),
            "give the job more time (`resources.time`)"
        );
    }

    #[test]
    fn the_time_left_tells_a_time_limit_from_a_preemption() {
        use Notice::*;
        // (squeue's `%l %M`, signal_seconds, the notice). A 1 min limit signalled 30 s before
        // it is the limit's even at the start: Slurm may signal up to a minute early.
        let cases = [
            ("1:00 0:31\n", 30, TimeLimit),
            ("1:00 0:00\n", 30, TimeLimit),
            ("2:00:00 1:58:10", 90, TimeLimit),
            ("2:00:00 1:00:10", 90, Preemption),
            ("1-00:00:00 23:57:00", 120, TimeLimit),
            ("1-00:00:00 2-01:00", 120, TimeLimit),
            ("UNLIMITED 5:03", 90, Preemption),
            // A job squeue no longer lists, or output it does not read.
            ("", 90, Signal),
            ("INVALID 0:05", 90, Signal),
        ];
        for (squeue, notice_seconds, notice) in cases {
            assert_eq!(
                Notice::from_squeue(squeue, notice_seconds),
                notice,
                "{squeue:?}"
            );
        }
    }
}
