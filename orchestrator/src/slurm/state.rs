//! Slurm job states as Slurm names them, so PREEMPTED, TIMEOUT, FAILED and CANCELLED are
//! reported as themselves.

use serde::{Deserialize, Serialize};
use std::fmt;

#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum JobState {
    Pending,
    Configuring,
    Running,
    Completing,
    Suspended,
    Requeued,
    Completed,
    Failed,
    Cancelled,
    Timeout,
    Preempted,
    NodeFail,
    OutOfMemory,
    BootFail,
    Deadline,
    /// A state this version does not know; kept verbatim.
    Other(String),
}

impl JobState {
    /// Parse a state as `squeue %T`, `sacct State` or `scontrol JobState` print it
    /// (sacct appends `by <uid>` to CANCELLED; squeue's compact codes are accepted too).
    pub fn parse(text: &str) -> JobState {
        let word = text
            .split_whitespace()
            .next()
            .unwrap_or("")
            .trim_end_matches('+');
        match word {
            "PENDING" | "PD" => JobState::Pending,
            "CONFIGURING" | "CF" => JobState::Configuring,
            "RUNNING" | "R" => JobState::Running,
            "COMPLETING" | "CG" => JobState::Completing,
            "SUSPENDED" | "S" => JobState::Suspended,
            "REQUEUED" | "REQUEUE_HOLD" | "REQUEUE_FED" | "RQ" => JobState::Requeued,
            "COMPLETED" | "CD" => JobState::Completed,
            "FAILED" | "F" => JobState::Failed,
            "CANCELLED" | "CA" => JobState::Cancelled,
            "TIMEOUT" | "TO" => JobState::Timeout,
            "PREEMPTED" | "PR" => JobState::Preempted,
            "NODE_FAIL" | "NF" => JobState::NodeFail,
            "OUT_OF_MEMORY" | "OOM" => JobState::OutOfMemory,
            "BOOT_FAIL" | "BF" => JobState::BootFail,
            "DEADLINE" | "DL" => JobState::Deadline,
            other => JobState::Other(other.to_string()),
        }
    }

    /// The job will not change any more.
    pub fn is_finished(&self) -> bool {
        matches!(
            self,
            JobState::Completed
                | JobState::Failed
                | JobState::Cancelled
                | JobState::Timeout
                | JobState::Preempted
                | JobState::NodeFail
                | JobState::OutOfMemory
                | JobState::BootFail
                | JobState::Deadline
        )
    }
}

impl fmt::Display for JobState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match self {
            JobState::Pending => "PENDING",
            JobState::Configuring => "CONFIGURING",
            JobState::Running => "RUNNING",
            JobState::Completing => "COMPLETING",
            JobState::Suspended => "SUSPENDED",
            JobState::Requeued => "REQUEUED",
            JobState::Completed => "COMPLETED",
            JobState::Failed => "FAILED",
            JobState::Cancelled => "CANCELLED",
            JobState::Timeout => "TIMEOUT",
            JobState::Preempted => "PREEMPTED",
            JobState::NodeFail => "NODE_FAIL",
            JobState::OutOfMemory => "OUT_OF_MEMORY",
            JobState::BootFail => "BOOT_FAIL",
            JobState::Deadline => "DEADLINE",
            JobState::Other(s) => s,
        };
        f.write_str(name)
    }
}

/// One job (or array task, id `1234_5`) as Slurm reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobRecord {
    pub id: String,
    pub state: JobState,
    /// Why it is pending or failed (`JobArrayTaskLimit`, `NonZeroExitCode`), if given.
    pub reason: Option<String>,
    /// `exit:signal` as Slurm prints it, if known.
    pub exit_code: Option<String>,
}
