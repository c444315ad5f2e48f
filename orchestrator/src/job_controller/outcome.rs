//! How a job ended, in words for people and as `result.json` for machines.

use super::collective_lag::{rank_list, Lag};
use super::notice::Notice;
use super::stop_signal::StopSignal;
use serde::{Serialize, Serializer};
use shardrun_protocol::messages::{signal_name, StopReason};

/// How a process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ExitInfo {
    Code(i32),
    Signal(i32),
}

impl ExitInfo {
    pub fn from_status(status: std::process::ExitStatus) -> ExitInfo {
        use std::os::unix::process::ExitStatusExt;
        match (status.code(), status.signal()) {
            (Some(code), _) => ExitInfo::Code(code),
            (None, Some(sig)) => ExitInfo::Signal(sig),
            (None, None) => ExitInfo::Code(-1),
        }
    }

    pub fn success(&self) -> bool {
        *self == ExitInfo::Code(0)
    }

    /// Killed by SIGTERM or SIGUSR2, the signals Slurm gives notice with; srun reports its
    /// tasks so killed as 128 + the signal.
    pub fn is_notice_signal(&self) -> bool {
        self.killed_by(libc::SIGTERM) || self.killed_by(libc::SIGUSR2)
    }

    /// SIGBUS: what touching a mapped page past the end of a truncated file gives.
    pub fn is_bus_error(&self) -> bool {
        self.killed_by(libc::SIGBUS)
    }

    /// Killed by `signal`, as the kernel says it or as srun reports it (128 + the signal).
    fn killed_by(&self, signal: i32) -> bool {
        match *self {
            ExitInfo::Signal(sig) => sig == signal,
            ExitInfo::Code(code) => code == 128 + signal,
        }
    }

    /// The status of a worker that stopped on request (not a failure, if it said so).
    pub fn is_stop_status(&self) -> bool {
        matches!(*self, ExitInfo::Code(code) if shardrun_protocol::messages::is_stop_status(code))
    }
}

/// "died with signal 7 (SIGBUS)", and what such a death most likely means where it is not
/// the signal's name alone; for a kill, where to look: `sacct` of `slurm_job` (the job this
/// controller runs in, if any) and `dmesg`.
fn died_with(exit: &ExitInfo, slurm_job: Option<&str>) -> String {
    if exit.is_bus_error() {
        format!(
            "died with {exit}: a file it had mapped shrank or went away under it (the data \
             cache's token files, a checkpoint or model folder being read), or the disk \
             behind it failed"
        )
    } else if exit.killed_by(libc::SIGKILL) {
        // What kills a training process unasked is mostly memory: the kernel's OOM killer,
        // or Slurm's cgroup limit (which sends the same signal).
        let says = match slurm_job {
            Some(job) => format!("`sacct -j {job} -o State`, or `dmesg` on its node, says so"),
            None => "`dmesg` says so".to_string(),
        };
        format!(
            "died with {exit}: killed, most often for running out of memory (the kernel's \
             OOM killer or the job's memory limit: {says}), else by `kill -9`"
        )
    } else if exit.killed_by(libc::SIGABRT) {
        format!(
            "died with {exit}: it aborted, most often for a memory allocation that failed \
             (\"memory allocation of N bytes failed\" in its last lines)"
        )
    } else {
        format!("died with {exit}")
    }
}

impl std::fmt::Display for ExitInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            ExitInfo::Code(code) => write!(f, "exit code {code}"),
            ExitInfo::Signal(sig) => {
                write!(f, "signal {sig} ({})", signal_name(sig).unwrap_or("signal"))
            }
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum FailureCause {
    /// The process ended with a failure status (the status is in [`Failure::exit`]).
    Exited,
    /// The process exited 0 without telling the controller it finished.
    ExitedWithoutFinishing,
    /// The worker reported an error.
    Reported {
        error: String,
    },
    ConnectionLost {
        why: String,
    },
    /// No heartbeat came for the heartbeat timeout; `same_host`: other ranks of its host
    /// that went silent too; `whole_host`: with them, every rank of the host (a lost node or
    /// network, more than hung processes).
    HeartbeatLost {
        #[serde(skip_serializing_if = "Vec::is_empty")]
        same_host: Vec<u64>,
        #[serde(skip_serializing_if = "std::ops::Not::not")]
        whole_host: bool,
        /// Its process is stopped (SIGSTOP, Ctrl-Z), as this host's `/proc` says: seen for
        /// ranks on the controller's own host only.
        #[serde(skip_serializing_if = "std::ops::Not::not")]
        stopped: bool,
    },
    RendezvousTimeout {
        missing: Vec<u64>,
        waited_secs: u64,
        /// Nodes of the Slurm allocation from which no rank registered.
        #[serde(skip_serializing_if = "Vec::is_empty")]
        silent_nodes: Vec<String>,
    },
    /// A registration that cannot belong to this job.
    Inconsistent {
        problem: String,
    },
    /// The rank cannot use the device the job asks for (no GPU on its node, ...).
    Device {
        problem: String,
    },
    /// The rank's process (or, with no rank named, the job's ranks) could not be started.
    Launch {
        problem: String,
    },
    /// The run directory stopped taking the job's logs and metrics (a full disk, a quota):
    /// the ranks were asked to checkpoint and stop rather than train on unrecorded.
    RunDirectoryUnwritable {
        why: String,
    },
    /// Training diverged at `step` (`what` was not finite, or blew up) and the ranks stopped there, as
    /// `training.on_divergence: stop` asks.
    Diverged {
        step: u64,
        what: String,
    },
    /// Heartbeats kept coming but the rank stayed at `step` for `secs` seconds.
    Stalled {
        step: u64,
        secs: u64,
        /// Where the other ranks were.
        others: String,
    },
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Failure {
    pub rank: Option<u64>,
    pub host: Option<String>,
    pub pid: Option<u32>,
    pub cause: FailureCause,
    pub exit: Option<ExitInfo>,
    /// Ranks the others were waiting for, by their collective counts.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lag: Option<Lag>,
    /// The rank a reported error names as its cause (a peer that closed the connection or
    /// timed out): that rank's own report, if it comes, replaces this failure.
    #[serde(skip)]
    pub follows: Option<u64>,
}

impl Failure {
    /// A failure of the job as a whole (no single rank to blame).
    pub fn job(cause: FailureCause) -> Failure {
        Failure {
            rank: None,
            host: None,
            pid: None,
            cause,
            exit: None,
            lag: None,
            follows: None,
        }
    }

    /// One sentence: who, where, what, and what to look at next.
    pub fn describe(&self) -> String {
        // This controller's Slurm job (a rank's is the same), for where to look.
        let slurm_job = std::env::var("SLURM_JOB_ID")
            .ok()
            .filter(|id| !id.is_empty());
        let who = match (self.rank, &self.host, self.pid) {
            (Some(rank), Some(host), Some(pid)) => format!("rank {rank} on {host} (pid {pid})"),
            (Some(rank), _, _) => format!("rank {rank}"),
            _ => "the job".to_string(),
        };
        let what = match &self.cause {
            FailureCause::Exited => match &self.exit {
                Some(exit) => died_with(exit, slurm_job.as_deref()),
                None => "died".to_string(),
            },
            FailureCause::ExitedWithoutFinishing => {
                "exited without reporting the end of training".to_string()
            }
            FailureCause::Reported { error } => format!("failed: {error}"),
            FailureCause::ConnectionLost { why } => match &self.exit {
                Some(exit) => format!(
                    "{} (its connection ended: {why})",
                    died_with(exit, slurm_job.as_deref())
                ),
                None => format!("lost its connection to the controller ({why})"),
            },
            FailureCause::HeartbeatLost { stopped: true, .. } => {
                "stopped sending heartbeats: its process is stopped (a SIGSTOP, or Ctrl-Z where \
                 it was started; `kill -CONT` resumes such a process)"
                    .to_string()
            }
            FailureCause::HeartbeatLost { same_host, .. } if same_host.is_empty() => {
                "stopped sending heartbeats (hung or frozen process?)".to_string()
            }
            FailureCause::HeartbeatLost {
                same_host,
                whole_host: true,
                ..
            } => format!(
                "stopped sending heartbeats, and so did rank(s) {} on the same host, every rank \
                 there: the host or its network is likely lost (or every process there froze)",
                rank_list(same_host)
            ),
            FailureCause::HeartbeatLost {
                same_host,
                whole_host: false,
                ..
            } => format!(
                "stopped sending heartbeats, and so did rank(s) {} on the same host (hung or \
                 frozen processes?)",
                rank_list(same_host)
            ),
            FailureCause::RendezvousTimeout {
                missing,
                waited_secs,
                silent_nodes,
            } => {
                let nodes = match silent_nodes.as_slice() {
                    [] => String::new(),
                    nodes => format!(
                        "; no rank registered from {} of the allocation (did its ranks start? \
                         can that node reach this one's network?)",
                        nodes.join(", ")
                    ),
                };
                format!(
                    "timed out in the rendezvous: rank(s) {} never registered within {waited_secs} \
                     s{nodes} (did they start? see their lines in train.log and logs/; if they \
                     are only slow to start, allow them longer: `export \
                     SHARDRUN_RENDEZVOUS_TIMEOUT=SECS` in the spec's `resources.setup`, or \
                     `shardrun run --rendezvous-timeout SECS`)",
                    missing
                        .iter()
                        .map(|r| r.to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            }
            FailureCause::Inconsistent { problem } => {
                format!("cannot join this job: {problem}")
            }
            FailureCause::Device { problem } => format!("cannot use its device: {problem}"),
            FailureCause::Launch { problem } if self.rank.is_some() => {
                format!("could not be started: {problem}")
            }
            FailureCause::Launch { problem } => format!("could not start its ranks: {problem}"),
            FailureCause::RunDirectoryUnwritable { why } => format!(
                "stopped: its run directory cannot be written ({why}), and steps it cannot \
                 record would be lost"
            ),
            FailureCause::Diverged { step, what } => format!(
                "stopped after step {step}, where training diverged ({what}), as \
                 `training.on_divergence: stop` asks: no checkpoint holds its weights from \
                 that step on"
            ),
            FailureCause::Stalled { step, secs, others } => {
                let others = if others.is_empty() {
                    String::new()
                } else {
                    format!(" ({others})")
                };
                // The collective counts may tell where it is stuck; else it is a question.
                let known = self
                    .lag
                    .as_ref()
                    .is_some_and(|lag| self.rank.is_some_and(|r| lag.ranks.contains(&r)));
                let guess = if known {
                    ""
                } else {
                    "; blocked in a collective or in I/O?"
                };
                format!(
                    "made no progress for {secs} s: still at step {step} while heartbeating\
                     {others}{guess} (--progress-timeout)"
                )
            }
        };
        match &self.lag {
            Some(lag) => format!("{who} {what}; {}", lag.describe(self.rank)),
            None => format!("{who} {what}"),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "snake_case", tag = "status")]
pub enum Outcome {
    Succeeded,
    Failed(Failure),
    /// Stopped on request without a checkpoint; `step`: the step the ranks agreed to stop
    /// after.
    Cancelled {
        by: CancelledBy,
        step: Option<u64>,
    },
    /// Every rank checkpointed and stopped on a preemption or time-limit notice.
    Preempted {
        notice: Notice,
    },
}

impl Outcome {
    /// The controller's exit status: 0 for success and for a preempted job that will be
    /// requeued (the caller decides the latter), 1 for a failure, and for a cancel 128 + the
    /// signal's number as shells report it (129 for SIGHUP, 130 for SIGINT, 143 for
    /// SIGTERM; 130, as for Ctrl-C, when no signal is named).
    pub fn exit_code(&self) -> i32 {
        match self {
            Outcome::Succeeded | Outcome::Preempted { .. } => 0,
            Outcome::Failed(_) => 1,
            Outcome::Cancelled { by, .. } => {
                by.signal().unwrap_or(StopSignal::Interrupt).exit_code()
            }
        }
    }
}

/// Who cancelled a job; in `result.json` and in words, `"SIGTERM"` or `"SIGTERM to rank 1"`.
#[derive(Debug, Clone, PartialEq)]
pub enum CancelledBy {
    /// A signal to the controller.
    Signal(StopSignal),
    /// A rank that was asked to stop on its own (a signal to it), in its words.
    Rank { rank: u64, reason: StopReason },
    /// The ranks stopped on a request none of them named.
    Request,
}

impl CancelledBy {
    /// The signal the cancel came from, when it names one.
    pub fn signal(&self) -> Option<StopSignal> {
        match self {
            CancelledBy::Signal(signal) => Some(*signal),
            CancelledBy::Rank {
                reason: StopReason::Signal { signal },
                ..
            } => StopSignal::from_number(*signal),
            CancelledBy::Rank { .. } | CancelledBy::Request => None,
        }
    }
}

impl std::fmt::Display for CancelledBy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CancelledBy::Signal(signal) => write!(f, "{signal}"),
            CancelledBy::Rank { rank, reason } => write!(f, "{reason} to rank {rank}"),
            CancelledBy::Request => f.write_str("a request to the ranks"),
        }
    }
}

impl Serialize for CancelledBy {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descriptions_name_rank_host_and_status() {
        let f = Failure {
            rank: Some(1),
            host: Some("gpu7".into()),
            pid: Some(42),
            cause: FailureCause::ConnectionLost {
                why: "closed".into(),
            },
            exit: Some(ExitInfo::Signal(9)),
            lag: None,
            follows: None,
        };
        let described = f.describe();
        assert!(
            described.starts_with(
                "rank 1 on gpu7 (pid 42) died with signal 9 (SIGKILL): killed, most often for \
                 running out of memory (the kernel's OOM killer or the job's memory limit: "
            ) && described.ends_with("), else by `kill -9` (its connection ended: closed)"),
            "{described}"
        );
        // Where to look: the job's accounting under Slurm, with its id; else the kernel's log.
        let killed = ExitInfo::Signal(libc::SIGKILL);
        assert!(
            died_with(&killed, Some("30"))
                .contains("memory limit: `sacct -j 30 -o State`, or `dmesg` on its node, says so)"),
            "{}",
            died_with(&killed, Some("30"))
        );
        assert!(died_with(&killed, None).contains("memory limit: `dmesg` says so)"));
        let abort = Failure {
            cause: FailureCause::Exited,
            exit: Some(ExitInfo::Signal(libc::SIGABRT)),
            ..f.clone()
        };
        assert!(
            abort.describe().ends_with(
                "died with signal 6 (SIGABRT): it aborted, most often for a memory allocation \
                 that failed (\"memory allocation of N bytes failed\" in its last lines)"
            ),
            "{}",
            abort.describe()
        );
        let json = serde_json::to_value(Outcome::Failed(f.clone())).unwrap();
        assert_eq!(json["status"], "failed");
        assert_eq!(json["rank"], 1);
        // A bus error names the mapped files it comes from, as a signal or as srun reports it.
        for exit in [
            ExitInfo::Signal(libc::SIGBUS),
            ExitInfo::Code(128 + libc::SIGBUS),
        ] {
            let bus = Failure {
                cause: FailureCause::Exited,
                exit: Some(exit),
                ..f.clone()
            };
            assert!(
                bus.describe()
                    .contains(": a file it had mapped shrank or went away under it"),
                "{}",
                bus.describe()
            );
        }
    }

    #[test]
    fn a_cancel_says_who_in_result_json_and_exits_with_the_signal() {
        let cancelled = |by| Outcome::Cancelled { by, step: Some(3) };
        let rank = |reason| CancelledBy::Rank { rank: 1, reason };
        let signal = |signal| rank(StopReason::Signal { signal });
        for (by, words, exit_code) in [
            (CancelledBy::Signal(StopSignal::Hangup), "SIGHUP", 129),
            (CancelledBy::Signal(StopSignal::Interrupt), "SIGINT", 130),
            (CancelledBy::Signal(StopSignal::Terminate), "SIGTERM", 143),
            (signal(libc::SIGTERM), "SIGTERM to rank 1", 143),
            (signal(libc::SIGINT), "SIGINT to rank 1", 130),
            (
                rank(StopReason::LostController {
                    why: "closed".into(),
                }),
                "lost the controller (closed) to rank 1",
                130,
            ),
            (CancelledBy::Request, "a request to the ranks", 130),
        ] {
            let outcome = cancelled(by);
            assert_eq!(
                serde_json::to_value(&outcome).unwrap(),
                serde_json::json!({"status": "cancelled", "by": words, "step": 3})
            );
            assert_eq!(outcome.exit_code(), exit_code, "{words}");
        }
    }
}
