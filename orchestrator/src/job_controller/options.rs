//! Command-line options shared by `shardrun run` and `shardrun controller`, and the step
//! from a run directory to [`ControllerOptions`].

use super::rank_variables::RankVariables;
use super::{ControllerOptions, Echo, LaunchMode, RunPaths, Timeouts};
use crate::binaries::worker_bin;
use crate::rundir::RunDir;

use std::time::Duration;

#[derive(Debug, Clone, clap::Args)]
pub struct ControllerArgs {
    /// Fail the job if not every rank registered within this many seconds of launch (as
    /// torchrun's join timeout: ranks of a large job load libtorch and CUDA from a shared
    /// file system all at once).
    #[arg(
        long,
        env = "SHARDRUN_RENDEZVOUS_TIMEOUT",
        default_value_t = 600,
        value_name = "SECS",
        value_parser = clap::value_parser!(u64).range(1..)
    )]
    pub rendezvous_timeout: u64,
    /// Consider a rank hung after this many seconds without any message from it.
    #[arg(
        long,
        env = "SHARDRUN_HEARTBEAT_TIMEOUT",
        default_value_t = 60,
        value_name = "SECS",
        value_parser = clap::value_parser!(u64).range(1..)
    )]
    pub heartbeat_timeout: u64,
    /// Fail the job when a rank's step has not advanced for this many seconds while it still
    /// heartbeats (stuck in a collective or in I/O); 0: never.
    #[arg(
        long,
        env = "SHARDRUN_PROGRESS_TIMEOUT",
        default_value_t = 1800,
        value_name = "SECS"
    )]
    pub progress_timeout: u64,
    /// Seconds the ranks of a failed job get to exit before SIGTERM (and again before
    /// SIGKILL).
    #[arg(long, default_value_t = 2, value_name = "SECS")]
    pub grace: u64,
    /// Seconds the ranks of a cancelled job (Ctrl-C, SIGTERM) get to reach their next step
    /// boundary and stop there before they are killed.
    #[arg(long, default_value_t = 60, value_name = "SECS")]
    pub stop_timeout: u64,
    /// Which ranks' log lines are echoed on stdout (train.log always has every rank).
    #[arg(long, value_enum, default_value_t = EchoArg::Rank0)]
    pub echo: EchoArg,
    /// Requeues allowed after a preemption notice inside a Slurm job (the sbatch script sets
    /// it from `preemption.max_requeues`).
    #[arg(long, env = "SHARDRUN_MAX_REQUEUES", default_value_t = 3)]
    pub max_requeues: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum EchoArg {
    /// Rank 0's lines plus every rank's warnings, errors and stderr.
    #[value(name = "0")]
    Rank0,
    /// Every rank's lines.
    All,
    /// No rank's lines: the controller's own and the progress only.
    None,
}

impl ControllerArgs {
    pub fn options(
        &self,
        run: &RunDir,
        launch: LaunchMode,
        progress_bar: bool,
    ) -> anyhow::Result<ControllerOptions> {
        let grace = Duration::from_secs(self.grace);
        let resolved = run.read_resolved().ok();
        Ok(ControllerOptions {
            paths: run_paths(run),
            launch,
            worker_bin: worker_bin()?,
            timeouts: Timeouts {
                rendezvous: Duration::from_secs(self.rendezvous_timeout),
                heartbeat: Duration::from_secs(self.heartbeat_timeout),
                progress: (self.progress_timeout > 0)
                    .then(|| Duration::from_secs(self.progress_timeout)),
                shutdown_grace: grace,
                step_boundary: Duration::from_secs(self.stop_timeout),
                kill_grace: grace.max(Duration::from_secs(1)),
                ..Timeouts::default()
            },
            echo: match self.echo {
                EchoArg::Rank0 => Echo::Rank0,
                EchoArg::All => Echo::All,
                EchoArg::None => Echo::None,
            },
            progress_bar,
            max_requeues: self.max_requeues,
            rank_variables: resolved
                .as_ref()
                .map(|job| {
                    RankVariables::new(&job.slurm.env, &job.slurm.from_shell, |name| {
                        std::env::var(name).ok()
                    })
                })
                .unwrap_or_default(),
            plan_warnings: resolved.map(|job| job.warnings).unwrap_or_default(),
            prepared_data: false,
        })
    }
}

pub fn run_paths(run: &RunDir) -> RunPaths {
    RunPaths {
        run_dir: run.path().to_path_buf(),
        train_config: run.train_config(),
        secret: run.secret(),
        controller_addr: run.controller_addr(),
        train_log: run.train_log(),
        logs_dir: run.logs_dir(),
        metrics: run.metrics(),
        events: run.events(),
        result: run.result(),
        requeue_count: run.requeue_count(),
    }
}

#[cfg(test)]
mod tests {
    use crate::cli::Cli;
    use clap::Parser;

    #[test]
    fn timeouts_that_would_fail_every_job_at_once_are_refused() {
        for flag in ["--rendezvous-timeout", "--heartbeat-timeout"] {
            let err = Cli::try_parse_from(["shardrun", "run", "job.yaml", flag, "0"])
                .unwrap_err()
                .to_string();
            assert!(
                err.contains(flag) && err.contains("0 is not in 1.."),
                "{err}"
            );
            assert!(Cli::try_parse_from(["shardrun", "run", "job.yaml", flag, "1"]).is_ok());
        }
    }
}
