//! `shardrun sweep job.yaml`: expand the sweep and submit the points that are new, changed
//! or failed as one job array; finished and running points are skipped and listed.

use crate::commands::render::shardrun_exe;
use crate::render::{render_sbatch, ScriptTarget};
use crate::rundir::{self, NewRun, RunDir, RunState};
use crate::slurm;
use crate::spec;
use crate::sweep::{self, SweepPoint};
use anyhow::Context;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Job spec with a `sweep:` section.
    pub spec: PathBuf,
    /// At most this many array tasks at once (overrides `sweep.throttle`).
    #[arg(long)]
    pub throttle: Option<u32>,
    /// List what would be submitted and skipped; write and submit nothing.
    #[arg(long)]
    pub dry_run: bool,
}

/// Why a point is (not) submitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Decision {
    New,
    Retry(RunState),
    Skip(RunState),
}

pub fn execute(args: Args) -> anyhow::Result<()> {
    let loaded = spec::load(&crate::commands::plan::spec_path(&args.spec))?;
    let points = sweep::expand(&loaded)?;
    let root = loaded
        .spec
        .run_root
        .clone()
        .unwrap_or_else(|| PathBuf::from(crate::plan::defaults::RUN_ROOT));
    let sweep_dir =
        std::path::absolute(root.join(&loaded.spec.name)).context("resolving the sweep folder")?;
    let throttle = args
        .throttle
        .or(loaded.spec.sweep.as_ref().and_then(|s| s.throttle));

    let decisions = decide(&sweep_dir, &points)?;
    let mut submit = Vec::new();
    for (point, decision) in points.iter().zip(&decisions) {
        let what = match decision {
            Decision::New => "submit (new)".to_string(),
            Decision::Retry(state) => format!("submit (was {})", state_name(*state)),
            Decision::Skip(state) => format!("skip ({})", state_name(*state)),
        };
        println!("{:<22} {}  {}", what, point.key, point.label());
        if !matches!(decision, Decision::Skip(_)) {
            submit.push(point);
        }
    }
    report_stale(&sweep_dir, &points);
    let skipped = points.len() - submit.len();
    if submit.is_empty() {
        println!(
            "Nothing to submit: all {} point(s) are finished or running",
            points.len()
        );
        return Ok(());
    }
    check_same_shape(&submit)?;
    if args.dry_run {
        println!(
            "dry run: would submit {} point(s) as one job array, skip {skipped}",
            submit.len()
        );
        return Ok(());
    }

    // Write the run directories of new points; failed ones are reused (checkpoints stay).
    let exe = shardrun_exe()?;
    let mut runs = Vec::with_capacity(submit.len());
    for (point, decision) in points.iter().zip(&decisions) {
        let path = sweep_dir.join(&point.name);
        match decision {
            Decision::Skip(_) => continue,
            Decision::Retry(_) => runs.push(RunDir::open(&path)?),
            Decision::New => {
                let script = render_sbatch(
                    &point.job,
                    &ScriptTarget::Single {
                        run_dir: path.clone(),
                    },
                    &exe,
                )?;
                runs.push(RunDir::create(
                    &path,
                    NewRun {
                        resolved: &point.job,
                        job_yaml: &loaded.source,
                        sbatch: Some(&script),
                        sweep_params: &point.params,
                        force: true,
                    },
                )?);
            }
        }
    }

    // The array script picks its point's run directory by SLURM_ARRAY_TASK_ID from this file.
    let stamp = format!("{}-{}", rundir::now_unix(), std::process::id());
    let arrays = sweep_dir.join("arrays");
    std::fs::create_dir_all(&arrays).with_context(|| format!("creating {}", arrays.display()))?;
    std::fs::create_dir_all(sweep_dir.join("slurm"))
        .context("creating the sweep's slurm log folder")?;
    let points_file = arrays.join(format!("points-{stamp}.txt"));
    let lines: String = runs
        .iter()
        .map(|r| format!("{}\n", r.path().display()))
        .collect();
    rundir::write_file(&points_file, lines.as_bytes())?;
    let mut array_job = submit[0].job.clone();
    array_job.name = loaded.spec.name.clone();
    let target = ScriptTarget::Array {
        points_file: points_file.clone(),
        log_dir: sweep_dir.join("slurm"),
        tasks: runs.len(),
        throttle,
    };
    let script = render_sbatch(&array_job, &target, &exe)?;
    let script_path = arrays.join(format!("array-{stamp}.sbatch"));
    rundir::write_file(&script_path, script.as_bytes())?;

    let recorded = slurm::submit_recorded(&script_path, |job_id| {
        for (task, run) in runs.iter().enumerate() {
            run.update_manifest(|m| {
                m.state = RunState::Submitted;
                m.slurm_job_ids.push(format!("{job_id}_{task}"));
                m.error = None;
            })?;
        }
        Ok::<(), crate::rundir::RunDirError>(())
    });
    match recorded {
        Ok(job_id) => {
            println!(
                "Submitted {} point(s) as Slurm job array {job_id} (skipped {skipped})",
                runs.len()
            );
            println!("  sweep folder   {}", sweep_dir.display());
            println!(
                "  follow         tail -f {}/slurm/{}-{job_id}_<task>.out",
                sweep_dir.display(),
                loaded.spec.name
            );
            println!("  status         shardrun status {}", sweep_dir.display());
            Ok(())
        }
        Err(err) => {
            let message = err.to_string();
            for run in &runs {
                run.update_manifest(|m| {
                    m.state = RunState::SubmitFailed;
                    m.error = Some(message.clone());
                })?;
            }
            Err(anyhow::Error::new(err).context(format!(
                "sbatch did not accept the job array; its {} point(s) are marked SUBMIT_FAILED and will be submitted again by the next `shardrun sweep {}`",
                runs.len(),
                args.spec.display()
            )))
        }
    }
}

/// Compare each point with its run directory, refreshing unfinished ones from Slurm.
fn decide(sweep_dir: &Path, points: &[SweepPoint]) -> anyhow::Result<Vec<Decision>> {
    let existing: Vec<RunDir> = points
        .iter()
        .filter_map(|p| RunDir::open(&sweep_dir.join(&p.name)).ok())
        .collect();
    let states: HashMap<PathBuf, RunState> = if existing.is_empty() {
        HashMap::new()
    } else {
        let (statuses, _) =
            slurm::refresh(&existing).context("querying Slurm for the points already submitted")?;
        statuses
            .into_iter()
            .map(|s| (s.run.path().to_path_buf(), s.state))
            .collect()
    };
    Ok(points
        .iter()
        .map(|p| match states.get(&sweep_dir.join(&p.name)) {
            None => Decision::New,
            Some(state @ (RunState::Completed | RunState::Submitted | RunState::Running)) => {
                Decision::Skip(*state)
            }
            Some(state) => Decision::Retry(*state),
        })
        .collect())
}

/// Runs in the sweep folder that no point matches any more (their parameters changed).
fn report_stale(sweep_dir: &Path, points: &[SweepPoint]) {
    let current: std::collections::HashSet<PathBuf> =
        points.iter().map(|p| sweep_dir.join(&p.name)).collect();
    let stale: Vec<RunDir> = slurm::find_runs(sweep_dir)
        .into_iter()
        .filter(|r| !current.contains(r.path()))
        .collect();
    if !stale.is_empty() {
        println!("{} run(s) in {} belong to no current point (their parameters changed); left as they are", stale.len(), sweep_dir.display());
    }
}

/// One job array has one allocation shape: the submitted points must agree on it.
fn check_same_shape(points: &[&SweepPoint]) -> anyhow::Result<()> {
    let first = points[0];
    for p in &points[1..] {
        if p.job.slurm != first.job.slurm || p.job.preemption != first.job.preemption {
            anyhow::bail!(
                "sweep points `{}` and `{}` ask for different Slurm resources, but one job array shares one shape\n  fix: sweep only over `training.*`, or split the sweep into one spec per resource shape",
                first.label(),
                p.label()
            );
        }
    }
    Ok(())
}

fn state_name(state: RunState) -> String {
    serde_json::to_value(state)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default()
}
