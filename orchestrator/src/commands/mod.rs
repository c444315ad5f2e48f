//! One module per subcommand, named as the subcommand; each exposes
//! `execute(args) -> anyhow::Result<()>` and keeps to the command line and what it prints.
//! The work behind them lives in library modules named for what they handle:
//! [`crate::resolve`] (spec to job), [`crate::sbatch`] (the script), [`crate::sweeps`]
//! (points, arrays, their journal), [`crate::data_prep`] (tokenizing before the ranks start).
pub mod cancel;
pub mod completions;
pub mod controller;
pub mod export;
pub mod logs;
pub mod metrics;
pub mod plan;
pub mod plot;
pub mod prepare;
pub mod render;
pub mod run;
pub mod spec_args;
pub mod status;
pub mod submit;
pub mod sweep;
