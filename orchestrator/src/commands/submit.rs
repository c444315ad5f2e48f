//! `shardrun submit job.yaml`: validate, write the run directory, `sbatch --parsable`.

use crate::commands::plan::load_and_resolve;
use crate::commands::render::shardrun_exe;
use crate::plan::Overrides;
use crate::render::{render_sbatch, ScriptTarget};
use crate::rundir::{NewRun, RunDir, RunDirError, RunState};
use crate::slurm;
use anyhow::Context;
use std::collections::BTreeMap;
use std::path::PathBuf;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Job spec (YAML), or an existing run directory to submit again (with --force).
    pub spec: PathBuf,
    /// Replace an existing run directory of the same name, and submit even when the job's
    /// peak memory per rank exceeds the GPU's.
    #[arg(long)]
    pub force: bool,
    /// Print the sbatch script and the plan; write and submit nothing.
    #[arg(long)]
    pub dry_run: bool,
}

pub fn execute(args: Args) -> anyhow::Result<()> {
    let overrides = Overrides {
        force: args.force,
        ..Overrides::submitting()
    };
    let (loaded, job) = load_and_resolve(&args.spec, &overrides)?;
    let path = RunDir::planned_path(&job)?;
    let script = render_sbatch(
        &job,
        &ScriptTarget::Single {
            run_dir: path.clone(),
        },
        &shardrun_exe()?,
    )?;
    if args.dry_run {
        print!("{script}");
        eprint!("{}", job.summary());
        eprintln!(
            "dry run: would write {} and submit it with sbatch",
            path.display()
        );
        return Ok(());
    }
    for warning in &job.warnings {
        eprintln!("warning: {warning}");
    }
    if path.exists() && !args.force {
        return Err(RunDirError::Exists(path).into());
    }
    let run = RunDir::create(
        &path,
        NewRun {
            resolved: &job,
            job_yaml: &loaded.source,
            sbatch: Some(&script),
            sweep_params: &BTreeMap::new(),
            force: args.force,
        },
    )?;
    let recorded = slurm::submit_recorded(&run.sbatch(), |job_id| {
        run.update_manifest(|m| {
            m.state = RunState::Submitted;
            m.slurm_job_ids.push(job_id.to_string());
            m.error = None;
        })
        .map(|_| ())
    });
    match recorded {
        Ok(job_id) => {
            println!("Submitted {} as Slurm job {job_id}", job.name);
            println!("  run directory  {}", run.path().display());
            println!(
                "  follow         tail -f {}",
                run.slurm_output(&job.name, &job_id).display()
            );
            println!("  status         shardrun status {}", run.path().display());
            Ok(())
        }
        Err(err) => {
            let message = err.to_string();
            run.update_manifest(|m| {
                m.state = RunState::SubmitFailed;
                m.error = Some(message);
            })
            .context("also failed to mark the run directory as SUBMIT_FAILED")?;
            Err(anyhow::Error::new(err).context(format!(
                "sbatch did not accept the job; {} is kept and marked SUBMIT_FAILED. Fix the cause, then run `shardrun submit {} --force`",
                run.path().display(),
                args.spec.display()
            )))
        }
    }
}
