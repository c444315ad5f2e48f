//! One module per subcommand; each exposes `execute(args) -> anyhow::Result<()>`.
pub mod plan;
pub mod render;
pub mod submit;
pub mod sweep;
pub mod status;
pub mod cancel;
pub mod run;
pub mod logs;
pub mod metrics;
pub mod plot;
pub mod export;
pub mod controller;
