//! `shardrun controller --run-dir DIR`: the job controller inside a Slurm allocation, started
//! (with `exec`) by the rendered sbatch script. Launches the ranks with `srun`.

use crate::exit::{AlreadySaid, ExitCode};
use crate::job_controller::options::ControllerArgs;
use crate::job_controller::stop_signal::Signals;
use crate::job_controller::{self, LaunchMode};
use crate::resume_data::DataChanged;
use crate::rundir::{RunDir, RunLock, RunState, StartLock};
use anyhow::Context;
use shardrun_protocol::config::DeviceKind;
use std::path::PathBuf;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The run directory (`shardrun submit` wrote it; the sbatch script passes it).
    #[arg(long, env = "SHARDRUN_RUN_DIR")]
    pub run_dir: PathBuf,
    #[command(flatten)]
    pub controller: ControllerArgs,
}

pub fn execute(args: Args) -> anyhow::Result<()> {
    if std::env::var_os("SLURM_JOB_ID").is_none() {
        anyhow::bail!(
            "`shardrun controller` runs inside a Slurm allocation (no SLURM_JOB_ID here); \
             on this machine use `shardrun run job.yaml`"
        );
    }
    let run = RunDir::open(&args.run_dir)?;
    let config = run.read_train_config()?;
    let nodes = allocation_node_count().unwrap_or(1);
    // The GPUs per node the sbatch script asked for; the step asks for them the same way.
    let gpus_per_node = match config.device {
        DeviceKind::Cpu => 0,
        DeviceKind::Cuda => run
            .read_resolved()
            .map(|job| job.slurm.gpus_per_node)
            .ok()
            .filter(|&n| n > 0)
            .or_else(|| {
                std::env::var("SLURM_GPUS_ON_NODE")
                    .ok()
                    .and_then(|n| n.trim().parse().ok())
            })
            .unwrap_or(0),
    };
    let manifest = run.read_manifest()?;
    let launch = LaunchMode::Slurm {
        nodes,
        gpus_per_node,
        sweep_point: !manifest.sweep_params.is_empty() || manifest.sweep_array.is_some(),
    };
    let opts = args.controller.options(&run, launch, false)?;
    supervise(&run, opts, None)
}

/// How many nodes the Slurm allocation this runs in has, if it runs in one.
pub fn allocation_node_count() -> Option<u64> {
    std::env::var("SLURM_JOB_NUM_NODES")
        .or_else(|_| std::env::var("SLURM_NNODES"))
        .ok()
        .and_then(|n| n.trim().parse().ok())
}

/// Runs the controller and records the run's state in its manifest; shared with `run`.
/// Runs the job of `run` as its controller; `starting`, the lock the command that got the
/// run directory ready holds, is let go once the controller's own lock is taken.
pub fn supervise(
    run: &RunDir,
    mut opts: job_controller::ControllerOptions,
    starting: Option<StartLock>,
) -> anyhow::Result<()> {
    // One controller per run directory. Taken before the manifest says RUNNING, so that a
    // RUNNING run whose lock is free is one whose controller died (`shardrun status`).
    let lock = RunLock::acquire(run.path())?;
    drop(starting);
    let before = run.read_manifest()?.before_start();
    if before.state == RunState::Completed {
        // Slurm ran the job of a finished run again (`scontrol requeue` after it ended):
        // nothing is left to train, so no rank is started.
        let config = run.read_train_config()?;
        let last = crate::rerun::newest_checkpoint(run, &config);
        if let Some(done) = last.filter(|c| c.step >= config.steps) {
            outln!(
                "shardrun: {} already trained its {} steps (its checkpoint of step {} is in {}); \
                 nothing to train",
                run.path().display(),
                config.steps,
                done.step,
                done.dir.display()
            );
            return Ok(());
        }
    }
    // The previous attempt's error is no longer this run's state.
    let _ = run.update_manifest(|m| {
        m.state = RunState::Running;
        m.error = None;
    });
    // An error from here on ends the run before its controller could write result.json:
    // the manifest keeps the reason, or `status` could only guess that the run was killed.
    let failed = |e: anyhow::Error| {
        let message = crate::exit::message(&e);
        let _ = run.update_manifest(|m| {
            m.state = RunState::Failed;
            m.error = Some(message);
        });
        e
    };
    // A requeued job, or a run started again, is in the same directory.
    run.forget_verdict()
        .with_context(|| {
            format!(
                "cannot remove the previous attempt's {}",
                run.result().display()
            )
        })
        .map_err(failed)?;
    let config = run.read_train_config().map_err(|e| failed(e.into()))?;
    // Made before anything trains: a folder the ranks cannot write would lose the whole run
    // at its first save.
    if let Some(dir) = &config.checkpoint.dir {
        std::fs::create_dir_all(dir)
            .map_err(|e| {
                anyhow::anyhow!(
                    "cannot create the checkpoint folder {} (`checkpoint.dir`): {e}\n  fix: name \
                     a folder this job can write, or leave `dir` out for checkpoints/ in the run \
                     directory",
                    dir.display()
                )
            })
            .map_err(failed)?;
    }
    // The runtime and its signal handlers come first, so that no signal goes unseen. One
    // process tokenizes, before any rank starts; a stop meanwhile is recorded as such.
    let runtime = job_controller::runtime()
        .context("cannot start the job controller")
        .map_err(failed)?;
    let signals = Signals::install(&runtime, {
        let (run, again) = (run.clone(), opts.launch.run_again(run.path()));
        move |signal| {
            let why =
                format!("by {signal} while its data was being prepared, before any rank started");
            let _ = run.update_manifest(|m| {
                m.state = RunState::Cancelled;
                m.error = Some(why.clone());
            });
            // The process ends without unwinding: a half-built data cache is removed here.
            let _ = shardrun_data::cache::abandon_builds();
            outln!(
                "shardrun: the run was cancelled {why}; nothing of it is lost: {again} to go on"
            );
        }
    })
    .context("cannot watch for Ctrl-C")
    .map_err(failed)?;
    let prepared = crate::data_prep::before_launch(run, &config);
    // Data prepared by this attempt is progress a requeued one keeps.
    opts.prepared_data = matches!(prepared, Ok(true));
    if let Err(e) = prepared {
        // What the run's end says from here is the refusal's or the failure's: a stop now
        // has nothing left to stop, and must not write the manifest over it.
        drop(signals.hand_over());
        if let Some(refusal) = e.downcast_ref::<DataChanged>() {
            // Refused before anything ran: the run stays as it was. A Slurm job's refusal is
            // recorded, or `status` could only say the job failed (a local one is said on
            // the terminal that started it).
            let _ = run.update_manifest(|m| match opts.launch {
                LaunchMode::Slurm { .. } => {
                    m.refused_start(before, &refusal.in_one_line(stderr_file().as_deref()))
                }
                LaunchMode::Local { .. } => {
                    m.state = before.state;
                    m.error = before.error;
                }
            });
            return Err(e);
        }
        return Err(failed(e));
    }
    let report = job_controller::run(&runtime, signals, opts, lock)
        .context("the job controller failed")
        .map_err(failed)?;
    let state = match &report.outcome {
        job_controller::Outcome::Succeeded => RunState::Completed,
        job_controller::Outcome::Failed(_) => RunState::Failed,
        job_controller::Outcome::Cancelled { .. } => RunState::Cancelled,
        // Preempted with no requeue left (or a requeue Slurm refused): the job failed.
        job_controller::Outcome::Preempted { .. } if report.exit_code != 0 => RunState::Failed,
        job_controller::Outcome::Preempted { .. } => RunState::Preempted,
    };
    if let Some(unrecorded) = &report.unrecorded {
        errln!("warning: {unrecorded}");
    }
    let message = report.message.clone();
    let _ = run.update_manifest(|m| {
        m.state = state;
        m.error = (report.exit_code != 0).then(|| message.clone());
    });
    if let job_controller::Outcome::Cancelled { .. } = report.outcome {
        // Not an error: the controller's last line said where it stopped and what is left.
        return Err(AlreadySaid(report.exit_code).into());
    }
    if report.exit_code != 0 {
        let error = report.error.unwrap_or(report.message);
        return Err(anyhow::Error::new(ExitCode(report.exit_code)).context(error));
    }
    Ok(())
}

/// The file this process's stderr goes to, when it is one (Slurm's `--error` file).
fn stderr_file() -> Option<PathBuf> {
    let path = std::fs::read_link("/proc/self/fd/2").ok()?;
    path.is_file().then_some(path)
}
