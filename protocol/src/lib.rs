//! The contract between the `shardrun` controller and `shardrun-worker`.
//!
//! * [`config`]: the resolved training configuration a worker runs (produced by the
//!   orchestrator from the YAML job spec, never parsed from YAML by the worker).
//! * [`config_diff`]: two job configs field by field, and the fields a resume may change.
//! * [`messages`]: one serde enum per direction ([`FromWorker`], [`ToWorker`]).
//! * [`connection`]: length-delimited frames, the handshake (version, role, secret) and
//!   typed connections, async for the controller and blocking for the workers and rank 0's
//!   rendezvous listener.
//! * [`rendezvous`]: which registrations make up the world, and the start every rank gets.
//! * [`env`]: the environment variable names both sides agree on.
//! * [`lock_file`]: lock files any user sharing their folder can take.
//! * [`error_text`]: an error and its causes in one line, each said once.
//! * [`units`]: how a model's parameters form FSDP units (the plan and the worker agree).
//! * [`footprint`]: an architecture's parameters, segments and activation memory, for the
//!   memory plan.
//! * [`schedule`]: the learning rate of every step (the worker trains with it; a resume that
//!   changes `steps` says what it does to the LR).

pub mod config;
pub mod config_diff;
pub mod connection;
pub mod env;
pub mod error_text;
pub mod footprint;
pub mod host;
pub mod lock_file;
pub mod messages;
pub mod rendezvous;
pub mod schedule;
pub mod units;
pub mod users;

pub use config::TrainConfig;

/// Bytes as MiB, as messages and summaries give memory.
pub fn mib(bytes: u64) -> f64 {
    bytes as f64 / f64::from(1u32 << 20)
}

pub use messages::{FromWorker, ToWorker};

/// Bumped on every incompatible change of [`messages`] or the handshake.
pub const PROTOCOL_VERSION: u32 = 6;
