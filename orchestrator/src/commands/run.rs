//! `shardrun run job.yaml [--nproc N] [--run-dir DIR]`: the whole job on this machine, with
//! N CPU ranks or one rank per local GPU, no Slurm needed.

use crate::commands::controller::supervise;
use crate::commands::plan::load_and_resolve;
use crate::controller::options::ControllerArgs;
use crate::controller::LaunchMode;
use crate::plan::Overrides;
use crate::rundir::{NewRun, RunDir};
use shardrun_protocol::config::DeviceKind;
use std::collections::BTreeMap;
use std::path::PathBuf;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Job spec (YAML).
    pub spec: PathBuf,
    /// Number of ranks (default: the spec's world size).
    #[arg(long)]
    pub nproc: Option<u64>,
    /// Where to write the run (default: the spec's run root / name).
    #[arg(long)]
    pub run_dir: Option<PathBuf>,
    /// Train on this device kind whatever the spec says.
    #[arg(long, value_enum)]
    pub device: Option<DeviceArg>,
    /// Replace an existing run directory of the same name, and run even when the job's peak
    /// memory per rank exceeds the GPU's.
    #[arg(long)]
    pub force: bool,
    /// No progress bar, one summary line per step instead (automatic when not a terminal).
    #[arg(long)]
    pub no_progress: bool,
    #[command(flatten)]
    pub controller: ControllerArgs,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum DeviceArg {
    Cpu,
    Cuda,
}

pub fn execute(args: Args) -> anyhow::Result<()> {
    let overrides = Overrides {
        world_size: args.nproc,
        device: args.device.map(|d| match d {
            DeviceArg::Cpu => DeviceKind::Cpu,
            DeviceArg::Cuda => DeviceKind::Cuda,
        }),
        force: args.force,
        ..Overrides::submitting()
    };
    let (loaded, job) = load_and_resolve(&args.spec, &overrides)?;
    for warning in &job.warnings {
        eprintln!("warning: {warning}");
    }
    // One GPU per rank, checked before anything is created.
    let gpus = match job.train.device {
        DeviceKind::Cuda => {
            Some(crate::gpus::for_local_run(job.world_size).map_err(anyhow::Error::msg)?)
        }
        DeviceKind::Cpu => None,
    };
    let path = match &args.run_dir {
        Some(dir) => dir.clone(),
        None => RunDir::planned_path(&job)?,
    };
    let run = RunDir::create(
        &path,
        NewRun {
            resolved: &job,
            job_yaml: &loaded.source,
            sbatch: None,
            sweep_params: &BTreeMap::new(),
            force: args.force,
        },
    )?;
    let opts = args
        .controller
        .options(&run, LaunchMode::Local { gpus }, !args.no_progress)?;
    supervise(&run, opts)?;
    println!("run directory: {}", run.path().display());
    println!("  plot: shardrun plot {}", run.path().display());
    Ok(())
}
