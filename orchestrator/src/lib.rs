//! The `shardrun` orchestrator: job specs, plans, sbatch rendering, submission, sweeps and
//! status on the login node; the job controller (rendezvous, launching, logs, metrics)
//! inside the allocation or in local mode.

// Output goes through `outln!` and `errln!` ([`output`]): a closed stdout must not panic.
#![deny(clippy::print_stdout, clippy::print_stderr)]

#[macro_use]
pub mod output;

pub mod binaries;
pub mod charts;
pub mod cli;
pub mod commands;

pub mod data_prep;
pub mod diagnostics;
pub mod events_file;
pub mod exit;
pub mod gpus;
pub mod interrupt;
pub mod job_controller;
pub mod metrics_file;
pub mod rerun;
pub mod resolve;
pub mod resume_data;
pub mod rundir;
pub mod sbatch;
pub mod slurm;
pub mod spec;
pub mod step_record;
pub mod stragglers;
pub mod sweeps;
