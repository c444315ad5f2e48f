//! One module per subcommand; each exposes `execute(args) -> anyhow::Result<()>`.
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
pub mod status;
pub mod submit;
pub mod sweep;
