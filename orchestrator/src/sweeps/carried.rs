//! Points carried over to the run directories they already have. A point is keyed by its
//! whole resolved job, so a value a resumed run may take (`training.steps`, resources, the
//! checkpoint interval, ...) changed outside the grid gives every point a new key. A run of
//! the sweep with the same swept values whose job differs only in such values is the same
//! point: it keeps its directory and, like `shardrun submit` of one run, continues from its
//! checkpoint with the change applied. A finished run that cannot continue (it does not
//! resume, or saved no checkpoint) is left as it is: the point starts over in a directory of
//! its own.

use crate::rerun::changes::{self, FieldChange};
use crate::rerun::newest_checkpoint;
use crate::resolve::ResolvedJob;
use crate::rundir::{self, RunDir, RunDirError, RunState};
use crate::slurm;
use crate::sweeps::SweepPoint;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};

/// The changes a point carried into the directory of an earlier run of its values.
#[derive(Debug)]
pub struct Carried {
    pub changes: Vec<FieldChange>,
}

/// Gives each point without a directory under its own key the directory of a run of the
/// same swept values whose job differs from the point's only in what a resumed run may
/// take; renames those points after their directories.
pub fn carry_over(sweep_dir: &Path, points: &mut [SweepPoint]) -> Vec<Carried> {
    let current: HashSet<PathBuf> = points.iter().map(|p| sweep_dir.join(&p.name)).collect();
    // The other runs by their swept values, each manifest read once: a sweep of thousands
    // of points whose keys all changed looks each up once.
    let mut others: HashMap<String, Vec<RunDir>> = HashMap::new();
    for run in slurm::find_runs(sweep_dir) {
        if current.contains(run.path()) {
            continue;
        }
        if let Ok(manifest) = run.read_manifest() {
            others
                .entry(values_key(&manifest.sweep_params))
                .or_default()
                .push(run);
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
        let found = runs.iter().enumerate().find_map(|(at, run)| {
            let recorded = run.read_resolved().ok()?;
            let changes = changes::between(&recorded, &as_run_of(point, run.path()));
            let takes =
                changes.iter().all(|c| c.safe) && cannot_continue(run, &recorded, point).is_none();
            takes.then_some((at, changes))
        });
        if let Some((at, changes)) = found {
            let run = runs.remove(at);
            rename(point, run.path());
            carried.push(Carried { changes });
        }
    }
    carried
}

/// Why `run`, finished, cannot train the longer run `point` asks for in its directory: a
/// run that does not resume, or has no checkpoint to resume from, would start over there
/// and overwrite what it finished.
pub fn cannot_continue(
    run: &RunDir,
    recorded: &ResolvedJob,
    point: &SweepPoint,
) -> Option<&'static str> {
    let finished = run
        .read_manifest()
        .is_ok_and(|m| m.state == RunState::Completed);
    if !finished || point.job.train.steps <= recorded.train.steps {
        return None;
    }
    if !point.job.train.checkpoint.resume {
        return Some("their spec says `checkpoint.resume: false`");
    }
    match newest_checkpoint(run, &recorded.train) {
        Some(_) => None,
        None => Some("they have no checkpoint to continue from"),
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
pub fn record_job(run: &RunDir, point: &SweepPoint) -> Result<(), RunDirError> {
    let job = as_run_of(point, run.path());
    if run.read_resolved()? == job {
        return Ok(());
    }
    rundir::write_json(&run.resolved_json(), &job)?;
    rundir::write_json(&run.train_config(), &job.train)
}
