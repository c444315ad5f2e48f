//! `shardrun submit job.yaml [--set key=value]`: validate, write the run directory,
//! `sbatch --parsable`. Submitted again on the same run directory, it continues the run
//! (see [`crate::rerun`]): the new job resumes from the run's newest checkpoint.

use crate::binaries::shardrun_exe;
use crate::commands::run::{announce, continues_run, resumes_from_checkpoint, run_path};
use crate::commands::spec_args::{self, OneJob, SetArgs};
use crate::rerun;
use crate::resolve::Overrides;
use crate::rundir::{NewRun, RunState, StartLock};
use crate::sbatch::{render_sbatch, ScriptTarget};
use crate::slurm;
use crate::spec::overrides;
use anyhow::Context;
use std::collections::BTreeMap;
use std::path::PathBuf;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Job spec (YAML), or a run directory (its `job.yaml` is used, and it is the run
    /// directory).
    pub spec: PathBuf,
    /// Delete the run directory's run (checkpoints, logs, metrics) and start over at step 1,
    /// and submit even when the job's peak memory per rank exceeds the GPU's. Without it, a
    /// run directory holding an interrupted run resumes it.
    #[arg(long)]
    pub force: bool,
    /// Print the sbatch script, the plan and what submitting would do with the run directory
    /// (a new run, a resume, nothing to do); write and submit nothing.
    #[arg(long)]
    pub dry_run: bool,
    #[command(flatten)]
    pub set: SetArgs,
}

/// What Slurm would do with `what` (the job, an array) of batch script `script`, asked with
/// `sbatch --test-only` and said for a dry run: when and where it would start, or why the
/// real submit would fail (with the ask no node meets). Never an error: a dry run away from
/// Slurm still shows the script and the plan.
pub(crate) fn ask_slurm(script: &str, what: &str) {
    match slurm::test_only(script, &[]) {
        Ok(slurm::TestOnly::Starts(said)) => errln!(
            "dry run: Slurm would take {what} ({})",
            said.trim_start_matches("sbatch: ")
        ),
        Ok(slurm::TestOnly::WaitsFor(nodes)) => errln!(
            "dry run: Slurm would queue {what} for nodes of its partition out of service now \
             ({})",
            nodes.join(", ")
        ),
        Err(slurm::SlurmError::NotInstalled { .. }) => {
            errln!("dry run: Slurm not asked (`sbatch` is not on PATH)")
        }
        Err(e) => errln!(
            "warning: the real submit would fail here: {}",
            e.to_string().trim_end()
        ),
    }
}

pub fn execute(args: Args) -> anyhow::Result<()> {
    let mut path = PathBuf::new();
    let (loaded, job) = spec_args::load_one_job(&args.spec, &args.set, OneJob::Submit, |loaded| {
        path = run_path(&args.spec, &loaded.spec)?;
        Ok(Overrides {
            force: args.force,
            continues_run: continues_run(&path, args.force),
            resumes_from_checkpoint: resumes_from_checkpoint(&path, args.force),
            ..Overrides::submitting()
        })
    })?;
    let script = render_sbatch(
        &job,
        &ScriptTarget::Single {
            run_dir: path.clone(),
        },
        &shardrun_exe()?,
    )?;
    let job_yaml = overrides::recorded_yaml(&loaded);
    let spec_dir = std::path::absolute(&loaded.base_dir)?;
    let new = NewRun {
        resolved: &job,
        job_yaml: &job_yaml,
        sbatch: Some(&script),
        sweep_params: &BTreeMap::new(),
        force: args.force,
        spec_dir: Some(&spec_dir),
        data_here: false,
    };
    if args.dry_run {
        // The same decision as the real submit (resume, nothing to do, a refusal), made
        // without writing anything.
        let decision = rerun::decide(&path, new)?;
        out!("{script}");
        errln!("{}", job.summary().trim_end());
        errln!("dry run: {}", decision.dry_run_words(&path));
        if !matches!(decision, rerun::RunDecision::Finished(_)) {
            ask_slurm(&script, "the job");
        }
        return Ok(());
    }
    // An existing run directory is this command's alone until its job is submitted.
    let _starting = StartLock::of_existing(&path)?;
    let prepared = rerun::prepare(&path, new)?;
    // A job continuing the run: if it refuses to start, the run goes back to this.
    let ended_before = match &prepared {
        rerun::RunStart::Resume(resume) => Some(resume.before.clone()),
        _ => None,
    };
    let Some(run) = announce(prepared) else {
        return Ok(());
    };
    for warning in &job.warnings {
        errln!("warning: {warning}");
    }
    run.forget_last_job()
        .with_context(|| format!("cannot clear {} for a new job", run.path().display()))?;
    let (recorded, held) = slurm::submit_recorded(&run.sbatch(), |job_id| {
        run.update_manifest(|m| {
            m.state = RunState::Submitted;
            m.slurm_job_ids.push(job_id.to_string());
            m.error = None;
            m.ended_before = ended_before;
        })
        .map(|_| ())
    });
    match recorded {
        Ok(job_id) => {
            outln!("Submitted {} as Slurm job {job_id}", job.name);
            outln!("  run directory  {}", run.path().display());
            outln!(
                "  follow         tail -F {}",
                crate::output::pasteable(&run.slurm_output(&job.name, &job_id))
            );
            outln!(
                "  status         shardrun status {}",
                crate::output::pasteable(run.path())
            );
            if let Some(signal) = held.signal() {
                errln!(
                    "shardrun: {} came while Slurm job {job_id} was submitted: it is \
                     submitted, recorded and released (`shardrun cancel` stops it)",
                    shardrun_protocol::messages::signal_name(signal).unwrap_or("a signal")
                );
            }
            held.release();
            Ok(())
        }
        Err(err) => {
            let message = err.to_string();
            let marked = run
                .update_manifest(|m| {
                    m.state = RunState::SubmitFailed;
                    m.error = Some(message);
                })
                .context("also failed to mark the run directory as SUBMIT_FAILED");
            let context = match err.controller_unreachable() {
                true => format!(
                    "sbatch could not reach slurmctld; {} is kept and marked SUBMIT_FAILED. Once \
                     `scontrol ping` says it answers, run the same `shardrun submit` command again",
                    run.path().display()
                ),
                false => format!(
                    "sbatch did not accept the job; {} is kept and marked SUBMIT_FAILED. Fix the cause (the spec, a --set value or the cluster), then run the same `shardrun submit` command again",
                    run.path().display()
                ),
            };
            let err = anyhow::Error::new(err).context(context);
            if held.signal().is_some() {
                // The signal ends the process: the error is said first.
                errln!("error: {}", crate::exit::message(&err));
            }
            held.release();
            marked?;
            Err(err)
        }
    }
}
