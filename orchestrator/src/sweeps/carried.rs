//! Points carried over to the run directories they already have. A point is keyed by its
//! whole resolved job, so a value a resumed run may take (`training.steps`, resources, the
//! checkpoint interval, ...) changed outside the grid gives every point a new key. A run of
//! the sweep with the same swept values whose job differs only in such values is the same
//! point: it keeps its directory and, like `shardrun submit` of one run, continues from its
//! checkpoint with the change applied. A finished run that cannot continue (it does not
//! resume, or saved no checkpoint) is left as it is: the point starts over in a directory of
//! its own.

use crate::rerun::changes::{self, FieldChange};
use crate::rerun::{
    changed_on_resume, newest_checkpoint, readable_newest_checkpoint, steps_done, steps_trained,
    LrChange,
};
use crate::resolve::ResolvedJob;
use crate::rundir::{self, RunDir, RunDirError, RunState};
use crate::slurm;
use crate::sweeps::SweepPoint;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};

/// The changes a point carried into the directory of an earlier run of its values.
#[derive(Debug)]
pub struct Carried {
    /// The point's name (its run directory's, once carried).
    pub point: String,
    pub changes: Vec<FieldChange>,
    /// What a longer or shorter `training.steps` does to the LR where the point continues.
    pub lr_change: Option<LrChange>,
}

/// Gives each point without a directory under its own key the directory of a run of the
/// same swept values whose job differs from the point's only in what a resumed run may
/// take; renames those points after their directories.
pub fn carry_over(sweep_dir: &Path, points: &mut [SweepPoint]) -> Vec<Carried> {
    let current: HashSet<PathBuf> = points.iter().map(|p| sweep_dir.join(&p.name)).collect();
    // The other runs by their swept values, each manifest read once: a sweep of thousands
    // of points whose keys all changed looks each up once.
    let mut others: HashMap<String, Vec<(RunDir, RunState)>> = HashMap::new();
    for run in slurm::find_runs(sweep_dir) {
        if current.contains(run.path()) {
            continue;
        }
        if let Ok(manifest) = run.read_manifest() {
            others
                .entry(values_key(&manifest.sweep_params))
                .or_default()
                .push((run, manifest.state));
        }
    }
    let mut carried = Vec::new();
    for point in points.iter_mut() {
        if others.is_empty() {
            break;
        }
        if sweep_dir.join(&point.name).exists() {
            continue;
        }
        let Some(runs) = others.get_mut(&values_key(&point.params)) else {
            continue;
        };
        // Of several runs of the values (made by earlier unsafe changes), the one still
        // going, else the one that trained furthest.
        let several = runs.len() > 1;
        let found = runs
            .iter()
            .enumerate()
            .filter_map(|(at, (run, state))| {
                let recorded = run.read_resolved().ok()?;
                let changes = changes::between(&recorded, &as_run_of(point, run.path()));
                let takes = changes.iter().all(|c| c.safe)
                    && cannot_continue(run, *state, &recorded, point).is_none();
                if !takes {
                    return None;
                }
                let rank = several.then(|| {
                    let going = matches!(state, RunState::Submitted | RunState::Running);
                    (going, steps_done(run, &recorded.train).unwrap_or(0))
                });
                Some((rank, at, changes, recorded))
            })
            .max_by_key(|(rank, ..)| *rank);
        if let Some((_, at, changes, recorded)) = found {
            let (run, _) = runs.remove(at);
            rename(point, run.path());
            // A point whose directory already records its job carries nothing to say.
            if !changes.is_empty() {
                carried.push(Carried {
                    point: point.name.clone(),
                    lr_change: lr_change(&run, &recorded, &point.job),
                    changes,
                });
            }
        }
    }
    carried
}

/// Why `run`, finished (its manifest's `state`), cannot train the longer run `point` asks
/// for in its directory: a run that does not resume, or has no checkpoint to resume from,
/// would start over there and overwrite what it finished. One whose newest checkpoint cannot
/// be read now may continue once it can: it keeps its directory, and the sweep holds it back
/// until then (a new directory would train its steps again).
pub fn cannot_continue(
    run: &RunDir,
    state: RunState,
    recorded: &ResolvedJob,
    point: &SweepPoint,
) -> Option<&'static str> {
    if state != RunState::Completed || point.job.train.steps <= steps_trained(run, &recorded.train)
    {
        return None;
    }
    if !point.job.train.checkpoint.resume {
        return Some("their spec says `checkpoint.resume: false`");
    }
    match readable_newest_checkpoint(run, &recorded.train) {
        Ok(Some(_)) | Err(_) => None,
        Ok(None) => Some("they have no checkpoint to continue from"),
    }
}

/// Swept values as one comparable text (the map is ordered by path).
pub fn values_key(params: &BTreeMap<String, serde_json::Value>) -> String {
    serde_json::to_string(params).unwrap_or_default()
}

/// The point's job as the run directory at `path` records it.
pub fn as_run_of(point: &SweepPoint, path: &Path) -> ResolvedJob {
    let name = dir_name(path);
    let mut job = RunDir::recorded(&point.job, path);
    job.name.clone_from(&name);
    job.train.name = name;
    job
}

fn dir_name(path: &Path) -> String {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

fn rename(point: &mut SweepPoint, path: &Path) {
    let name = dir_name(path);
    if let Some(key) = name.rsplit('-').next() {
        point.key = key.to_string();
    }
    point.job.name.clone_from(&name);
    point.job.train.name.clone_from(&name);
    point.name = name;
}

/// Before its job is submitted, a carried point's directory records the job it now runs:
/// `resolved.json` and `train_config.json` replaced (each atomically).
/// What continuing `run`, which recorded `recorded`, as `job` does to its LR; nothing when
/// its newest checkpoint is at or past the steps asked for (nothing is left to continue).
fn lr_change(run: &RunDir, recorded: &ResolvedJob, job: &ResolvedJob) -> Option<LrChange> {
    newest_checkpoint(run, &recorded.train)
        .filter(|c| c.step < job.train.steps)
        .and_then(|c| LrChange::of(&recorded.train, &job.train, c.step, c.updates))
}

pub fn record_job(run: &RunDir, point: &SweepPoint) -> Result<(), RunDirError> {
    let job = as_run_of(point, run.path());
    let recorded = run.read_resolved()?;
    if recorded == job {
        return Ok(());
    }
    rundir::write_json(&run.resolved_json(), &job)?;
    rundir::write_json(&run.train_config(), &job.train)?;
    // Said in the point's log, where its next job's lines follow: what it continues with.
    let lines = changed_on_resume(
        &changes::between(&recorded, &job),
        lr_change(run, &recorded, &job).as_ref(),
        " (`shardrun sweep`)",
    );
    if let Err(e) = run.note_in_train_log(&lines) {
        tracing::warn!(run = %run.path().display(), "cannot note the changes in train.log: {e}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sweeps::point_dirs::written_points;

    const SPEC: &str = include_str!("../../../examples/sweep.yaml");

    fn points(spec: &str) -> Vec<SweepPoint> {
        let loaded = crate::spec::parse(spec, Path::new("sweep.yaml")).unwrap();
        crate::sweeps::expand(&loaded, &crate::resolve::Overrides::submitting()).unwrap()
    }

    /// Failed runs of every point, each having logged `last` steps.
    fn failed_runs(sweep_dir: &Path, spec: &str, last: u64) -> Vec<RunDir> {
        let runs = written_points(sweep_dir, spec);
        for run in &runs {
            run.update_manifest(|m| m.state = RunState::Failed).unwrap();
            let record = format!(
                r#"{{"rank":0,"step":{last},"loss":1.0,"lr":0.1,"grad_norm":1.0,"step_time_s":0.1,"tokens_per_s":5.0,"mfu":null,"model_state_bytes":1,"peak_memory_bytes":2,"loss_scale":null}}"#
            );
            std::fs::write(run.metrics(), record).unwrap();
        }
        runs
    }

    #[test]
    fn of_several_runs_of_the_same_values_the_one_that_trained_furthest_is_carried() {
        for (forty_trained, sixty_trained) in [(30, 10), (10, 30)] {
            let dir = tempfile::tempdir().unwrap();
            let forty = failed_runs(
                dir.path(),
                &SPEC.replace("steps: 50", "steps: 40"),
                forty_trained,
            );
            let sixty = failed_runs(
                dir.path(),
                &SPEC.replace("steps: 50", "steps: 60"),
                sixty_trained,
            );
            // Runs of a longer job that never trained (cancelled while queued) rank last,
            // whatever their recorded steps.
            for run in written_points(dir.path(), &SPEC.replace("steps: 50", "steps: 90")) {
                run.update_manifest(|m| m.state = RunState::Cancelled)
                    .unwrap();
            }
            let mut now = points(SPEC);
            let carried = carry_over(dir.path(), &mut now);
            assert_eq!(carried.len(), 12);
            let furthest = if forty_trained > sixty_trained {
                &forty
            } else {
                &sixty
            };
            for (point, run) in now.iter().zip(furthest) {
                assert_eq!(dir.path().join(&point.name), run.path());
            }
            // Recorded as the points' jobs, the directories carry nothing more to say.
            for (point, run) in now.iter().zip(furthest) {
                record_job(run, point).unwrap();
            }
            let mut again = points(SPEC);
            assert!(carry_over(dir.path(), &mut again).is_empty());
            assert_eq!(
                again.iter().map(|p| &p.name).collect::<Vec<_>>(),
                now.iter().map(|p| &p.name).collect::<Vec<_>>()
            );
        }
    }
}
