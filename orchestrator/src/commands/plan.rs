//! `shardrun plan job.yaml`: check a spec and print the resolved plan. Given a run
//! directory without a `job.yaml` (a sweep's point), it prints the plan the directory
//! records, the one its job runs.

use crate::commands::spec_args::{load_and_resolve, SetArgs};
use crate::resolve::{Overrides, ResolvedJob};
use crate::rundir::RunDir;
use crate::sbatch::shell_quote;
use crate::sweeps;
use anyhow::Context;
use std::path::{Path, PathBuf};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Job spec (YAML), or a run directory (its `job.yaml` is used; a sweep point's
    /// directory has none, and its recorded plan is printed).
    pub spec: PathBuf,
    /// Plan for N local ranks on this machine, as `shardrun run --nproc N` would.
    #[arg(long)]
    pub nproc: Option<u64>,
    /// Print the resolved job as JSON instead of the human summary.
    #[arg(long)]
    pub json: bool,
    /// Plan the job even when its peak memory per rank exceeds the GPU's.
    #[arg(long)]
    pub force: bool,
    #[command(flatten)]
    pub set: SetArgs,
}

pub fn execute(args: Args) -> anyhow::Result<()> {
    let overrides = Overrides {
        world_size: args.nproc,
        force: args.force,
        ..Overrides::submitting()
    };
    let job = match recorded_plan(&args.spec)? {
        Some(job) => {
            if args.nproc.is_some() || args.force || !args.set.set.is_empty() {
                anyhow::bail!(
                    "{} is a sweep point: its plan was fixed when the sweep was submitted, so \
                     --nproc, --force and --set cannot change it\n  fix: drop them to see the \
                     point's plan, or plan the sweep's spec with the point's values as --set",
                    args.spec.display()
                );
            }
            job
        }
        None => {
            let (loaded, job) = load_and_resolve(&args.spec, &overrides, &args.set)?;
            if let Some(sweep) = &loaded.spec.sweep {
                errln!(
                    "note: this spec sweeps {} point(s); this is the plan of the values outside \
                     the sweep (`shardrun sweep {} --dry-run` plans every point)",
                    sweeps::written_points(sweep),
                    shell_quote(&args.spec.display().to_string())
                );
                job
            } else {
                // As the run directory would record it (`train` is its train_config.json):
                // the checkpoint folder made absolute below the run directory.
                let run_dir = crate::commands::run::run_path(&args.spec, &loaded.spec)?;
                RunDir::recorded(&job, &std::path::absolute(&run_dir)?)
            }
        }
    };
    if args.json {
        outln!(
            "{}",
            serde_json::to_string_pretty(&job).context("serializing the plan")?
        );
    } else {
        out!("{}", job.summary());
    }
    Ok(())
}

/// The plan a sweep point's directory records (it holds no `job.yaml`); `None` for anything
/// else, which is then read as a spec or a run directory with one.
fn recorded_plan(path: &Path) -> anyhow::Result<Option<ResolvedJob>> {
    if !path.is_dir() || path.join("job.yaml").exists() {
        return Ok(None);
    }
    let Ok(run) = RunDir::open(path) else {
        return Ok(None);
    };
    if run.read_manifest()?.sweep_params.is_empty() {
        return Ok(None);
    }
    Ok(Some(run.read_resolved()?))
}
