//! The job controller: one process per job that serves the rendezvous, launches the ranks,
//! writes every rank's logs and metrics into the run directory, and stops the job as a
//! whole when a rank dies, when it is cancelled, or when it is preempted.
//!
//! * [`job`]: the decisions, a pure state machine;
//! * [`event_loop`]: wires sockets, processes, signals and timers to it;
//! * [`server`]: TCP endpoint and handshake; [`progress_watch`]: is a rank still moving;
//!   [`launcher`]: processes; [`rank_variables`]: the variables every rank gets;
//! * [`writer`] with [`logbook`], [`metrics_log`] and [`console`]: the files people read
//!   (and `events.jsonl`), appended to through [`crate::rundir::line_files`];
//! * [`outcome`]: how the job ended, [`stop_signal`]: the signals that cancel it,
//!   [`notice`]: what a SIGUSR2 announces (preemption or the time limit);
//!   [`secret`]: the per-job secret.

pub mod clock;
pub mod collective_lag;
pub mod console;
pub mod event_loop;
pub mod job;
pub mod launcher;
pub mod logbook;
pub mod metrics_log;
pub mod notice;
pub mod open_files;
pub mod options;
pub mod outcome;
pub mod priority;
pub mod progress_watch;
pub mod rank_variables;
pub mod secret;
pub mod server;
pub mod stop_signal;
pub mod writer;

pub use event_loop::{run, runtime, ControllerOptions, RunPaths, Timeouts, END_NOT_RECORDED};
pub use launcher::LaunchMode;
pub use outcome::Outcome;
pub use writer::Echo;

#[derive(Debug, thiserror::Error)]
pub enum ControllerError {
    #[error("cannot {what} {}: {source}", path.display())]
    File {
        what: &'static str,
        path: std::path::PathBuf,
        source: std::io::Error,
    },
    #[error("{} is not a valid training config ({source}); recreate the run with `shardrun run` or `shardrun submit`", path.display())]
    Config {
        path: std::path::PathBuf,
        source: serde_json::Error,
    },
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: String,
        source: std::io::Error,
    },
    #[error("cannot start the controller's runtime: {0}")]
    Runtime(std::io::Error),
    #[error(transparent)]
    Busy(#[from] crate::rundir::LockError),
}
