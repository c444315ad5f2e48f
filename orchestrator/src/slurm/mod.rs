//! Thin wrappers over the Slurm commands (`sbatch`, `squeue`, `sacct`, `scontrol`,
//! `scancel`, `sacctmgr`) and parsers of their output. Parsers are pure and tested on
//! outputs recorded from Slurm 22.05 (`testdata/`); the commands run with whatever
//! `SLURM_CONF` is set.

mod command;
pub mod limits;
mod node_fit;
mod parse;
mod runs;
mod state;

pub use command::{
    cancel, jobs_by_comment, query, release, sbatch_args, submit, submit_recorded, test_only,
    QuerySource, TestOnly,
};
pub use parse::{
    compact_job_ids, memory_size_for_sbatch, parse_commented_jobs, parse_memory_size, parse_sacct,
    parse_sbatch_parsable, parse_scontrol, parse_squeue, CommentedJob,
};
pub use runs::{
    cancelled_while_requeued, died, find_runs, find_runs_and_unreadable, read_result, refresh,
    refresh_or_recorded, requeued_by_its_controller, unreadable_warning, RunStatus, RunsError,
    Verdict,
};
pub use state::{JobRecord, JobState};

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum SlurmError {
    #[error("`{command}` was not found on PATH\n  fix: run this on a Slurm login node, or start the project's local cluster with `slurm/start.sh` and `. slurm/env.sh`")]
    NotInstalled { command: &'static str },
    #[error("could not run `{command}`: {source}")]
    Spawn {
        command: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("`{command}` failed ({status}):\n{stderr}")]
    Failed {
        command: String,
        status: String,
        stderr: String,
    },
    #[error("`{command}` printed something shardrun does not understand: {output:?}")]
    Unparsable {
        command: &'static str,
        output: String,
    },
    #[error("batch script {0} does not exist")]
    MissingScript(PathBuf),
}

/// What Slurm's commands print when slurmctld does not answer them.
const CONTROLLER_UNREACHABLE: [&str; 3] = [
    "Unable to contact slurm controller",
    "Socket timed out on send/recv",
    "Zero Bytes were transmitted or received",
];

/// What to do when slurmctld did not answer: a command run where Slurm is installed, whose
/// controller is down, restarting or cut off.
pub const CONTROLLER_UNREACHABLE_FIX: &str = "slurmctld did not answer (down, restarting, or \
    unreachable from this host): `scontrol ping` tells when it answers again; then run this again";

/// The error of a command whose question to Slurm (`doing`) slurmctld did not answer: what
/// did not happen (`not_done`: "nothing was submitted"), the error, and what to do.
pub fn unanswered(not_done: &str, doing: &str, error: &dyn std::fmt::Display) -> anyhow::Error {
    anyhow::anyhow!("{not_done}: {doing}: {error}\n  fix: {CONTROLLER_UNREACHABLE_FIX}")
}

impl SlurmError {
    /// Whether the command ran but slurmctld did not answer it (as opposed to Slurm
    /// refusing what was asked, or its commands missing here).
    pub fn controller_unreachable(&self) -> bool {
        matches!(self, SlurmError::Failed { stderr, .. }
            if CONTROLLER_UNREACHABLE.iter().any(|said| stderr.contains(said)))
    }
}
