//! Where each point of a sweep stands: compared with its run directory (and Slurm, for the
//! unfinished ones), a point is new, retried (failed, cancelled, changed) or skipped
//! (finished, queued or running, diverged, or trained on other data than the data now); the points to
//! submit are grouped by allocation shape.

use crate::rerun::{diverged_from, readable_newest_checkpoint, steps_trained, CheckpointAt};
use crate::resume_data::{DataChanged, DataNow};
use crate::rundir::{RunDir, RunDirError, RunState};
use crate::slurm;
use crate::sweeps::SweepPoint;
use shardrun_protocol::config::{DataConfig, DatasetConfig};
use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};

/// Why a point is (not) submitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    New,
    /// A point to submit again; whether it trains again from step 1 though it logged steps
    /// (no checkpoint to resume from: deleted, or none saved yet), which is said.
    Retry(RunState, Anew),
    Skip(RunState),
    /// A finished point that diverged on its way (`on_divergence: continue`, the default): it
    /// is skipped as any finished point, and said to have diverged, from this step, so that
    /// its final loss is not taken for a result.
    FinishedDiverged(u64),
    /// A point to retry whose checkpoint was trained on other data than the data as it is
    /// prepared now: its job would refuse to resume, so it is not submitted.
    DataChanged(RunState),
    /// A point that ended unfinished (cancelled, failed, preempted) with a checkpoint at or
    /// past the steps the sweep now asks for: nothing is left to train, as `shardrun submit`
    /// says of such a run, so it is not submitted (its job would only end it "finished" at a
    /// step past its schedule). The step of that checkpoint.
    TrainedPast(RunState, u64),
    /// A point to continue whose newest checkpoint was saved after it diverged (its loss or
    /// gradients NaN or inf, [`crate::metrics_file::RunMetrics::diverged_at`]): its job would
    /// train on from diverged weights, so it is not submitted. The step it diverged at.
    Diverged(RunState, u64),
    /// A point to submit whose folder is not a run directory its job can be submitted with
    /// (a file deleted or damaged by hand): submitting would fail on it, taking its array's
    /// other points down too, so it is not submitted ([`not_a_run`] says why).
    NotARun,
    /// A point to continue whose newest checkpoint cannot be read (permissions, the file
    /// system): its job would wait in the queue only for its ranks to refuse it, and passing
    /// over it would train its steps again, so it is not submitted.
    CheckpointUnreadable(RunState),
}

impl Decision {
    pub fn submits(self) -> bool {
        matches!(self, Decision::New | Decision::Retry(..))
    }

    /// A point that would be submitted but for what its folder holds (said apart).
    pub fn held_back(self) -> bool {
        matches!(
            self,
            Decision::DataChanged(_)
                | Decision::TrainedPast(..)
                | Decision::Diverged(..)
                | Decision::NotARun
                | Decision::CheckpointUnreadable(_)
        )
    }
}

/// What the sweep folder says about the points, after asking Slurm.
pub struct Survey {
    pub decisions: Vec<Decision>,
    /// Array jobs of this sweep folder with runs still pending or running (of the current
    /// points, or of an earlier version of the spec).
    pub active_arrays: BTreeSet<String>,
    /// Runs of an earlier version of the spec (not current points) still queued or running.
    pub earlier_going: usize,
    /// Why the [`Decision::DataChanged`] points would be refused, in the points' order.
    pub data_changed: Vec<Box<DataChanged>>,
    /// Why the [`Decision::CheckpointUnreadable`] points' checkpoints cannot be read (the
    /// error names the checkpoint and the fix), in the points' order.
    pub unreadable: Vec<shardrun_checkpoint::CheckpointError>,
    /// Finished points trained on other data than the data as it is now: their directories
    /// and how the data differs.
    pub finished_on_other_data: Vec<(PathBuf, Vec<String>)>,
}

/// Why the folder of a point to submit keeps it from being submitted
/// ([`Decision::NotARun`]), or `None`: no folder there, an empty one (the new point's
/// replaces it), one this user cannot look into (refused before submitting, naming its
/// owner), or a run directory its job can be submitted with.
pub fn not_a_run(dir: &Path) -> Option<String> {
    let meta = std::fs::symlink_metadata(dir).ok()?;
    if !meta.is_dir() {
        return Some("it is a file, not a folder".into());
    }
    // An empty folder, or one this user cannot look into: not this check's to refuse.
    std::fs::read_dir(dir).ok()?.next()?.ok()?;
    let run = match RunDir::open(dir) {
        Ok(run) => run,
        Err(_) => return Some("it has no manifest.json".into()),
    };
    if let Err(e) = run.read_manifest() {
        let why = match e {
            RunDirError::Corrupt { source, .. } => source.to_string(),
            other => other.to_string(),
        };
        return Some(format!("its manifest.json does not read ({why})"));
    }
    (!run.resolved_json().is_file())
        .then(|| "it has no resolved.json, the job its point is submitted as".into())
}

/// Compare each point with its run directory, refreshing unfinished ones from Slurm.
pub fn survey(sweep_dir: &Path, points: &[SweepPoint]) -> anyhow::Result<Survey> {
    // Every run of the folder, those of an earlier version of the spec too: their arrays
    // still queued hold a throttled sweep back as the current points' do.
    // A run whose manifest does not read has no state to ask Slurm about: its point is
    // decided by its folder ([`not_a_run`]).
    let mut existing = slurm::find_runs(sweep_dir);
    existing.retain(|run| run.read_manifest().is_ok());
    let current: BTreeSet<PathBuf> = points.iter().map(|p| sweep_dir.join(&p.name)).collect();
    let mut states: HashMap<PathBuf, RunState> = HashMap::new();
    let mut active_arrays = BTreeSet::new();
    let mut earlier_going = 0;
    if !existing.is_empty() {
        let (statuses, _) = match slurm::refresh(&existing) {
            Ok(answer) => answer,
            Err(e) if e.controller_unreachable() => {
                return Err(slurm::unanswered(
                    "nothing was submitted",
                    "querying Slurm for the points already submitted",
                    &e,
                ))
            }
            Err(e) => {
                return Err(anyhow::Error::new(e)
                    .context("querying Slurm for the points already submitted"))
            }
        };
        for status in statuses {
            if matches!(status.state, RunState::Submitted | RunState::Running) {
                if let Some(id) = &status.job_id {
                    active_arrays.insert(id.split('_').next().unwrap_or(id).to_string());
                }
                if !current.contains(status.run.path()) {
                    earlier_going += 1;
                }
            }
            states.insert(status.run.path().to_path_buf(), status.state);
        }
    }
    let mut data_changed = Vec::new();
    let mut unreadable = Vec::new();
    let mut finished_on_other_data = Vec::new();
    let mut probed = DataProbes::default();
    let decisions = points
        .iter()
        .map(|p| match states.get(&sweep_dir.join(&p.name)) {
            None => Decision::New,
            Some(RunState::Completed) if !asks_more_steps(&sweep_dir.join(&p.name), p) => {
                let dir = sweep_dir.join(&p.name);
                let changes = data_changes(&dir, p, &mut probed);
                if !changes.is_empty() {
                    finished_on_other_data.push((dir.clone(), changes));
                }
                match RunDir::open(&dir).ok().and_then(|run| diverged_from(&run)) {
                    Some(divergence) => Decision::FinishedDiverged(divergence.step),
                    None => Decision::Skip(RunState::Completed),
                }
            }
            Some(state @ (RunState::Submitted | RunState::Running)) => Decision::Skip(*state),
            Some(&state) => {
                let dir = sweep_dir.join(&p.name);
                match resumed_from(&dir, p) {
                    Ok(Some((_, checkpoint))) if checkpoint.step >= p.job.train.steps => {
                        Decision::TrainedPast(state, checkpoint.step)
                    }
                    // Continued from a checkpoint saved since, it would train on from
                    // diverged weights; started over, or from one saved before, it would
                    // diverge at the same step again; whatever its checkpoint.
                    resumed => match (
                        RunDir::open(&dir).ok().and_then(|r| diverged_from(&r)),
                        resumed,
                    ) {
                        (Some(divergence), _) => Decision::Diverged(state, divergence.step),
                        (None, Err(e)) => {
                            unreadable.push(e);
                            Decision::CheckpointUnreadable(state)
                        }
                        (None, Ok(None)) => Decision::Retry(state, anew(&dir)),
                        (None, Ok(Some((run, checkpoint)))) => {
                            match data_refusal(&run, &checkpoint, p, &mut probed) {
                                Some(refusal) => {
                                    data_changed.push(refusal);
                                    Decision::DataChanged(state)
                                }
                                None => Decision::Retry(state, Anew(false)),
                            }
                        }
                    },
                }
            }
        })
        .zip(points)
        .map(|(decision, p)| {
            if decision.submits() && not_a_run(&sweep_dir.join(&p.name)).is_some() {
                Decision::NotARun
            } else {
                decision
            }
        })
        .collect();
    Ok(Survey {
        decisions,
        active_arrays,
        earlier_going,
        data_changed,
        unreadable,
        finished_on_other_data,
    })
}

/// The data as it is now, looked at once per distinct data config: a sweep's points mostly
/// share theirs, and a look expands the globs and hashes the tokenizer files.
#[derive(Default)]
struct DataProbes(Vec<(DatasetConfig, DataNow)>);

impl DataProbes {
    fn now(&mut self, data: &DatasetConfig) -> &DataNow {
        let at = match self.0.iter().position(|(config, _)| config == data) {
            Some(at) => at,
            None => {
                self.0.push((data.clone(), DataNow::look(data)));
                self.0.len() - 1
            }
        };
        &self.0[at].1
    }
}

/// How the data the finished point trained on differs from its data as it is now.
fn data_changes(dir: &Path, point: &SweepPoint, probes: &mut DataProbes) -> Vec<String> {
    let (DataConfig::Dataset(data), Ok(run)) = (&point.job.train.data, RunDir::open(dir)) else {
        return Vec::new();
    };
    probes.now(data).changes_since_run(&run)
}

/// Whether a finished point is asked to train more steps than it has (a point carried over
/// with a longer `training.steps`): it continues from its checkpoint. What it trained is
/// read from its checkpoints and metrics, not its recorded job, which records the longer
/// job before its array is submitted.
fn asks_more_steps(dir: &Path, point: &SweepPoint) -> bool {
    let Ok(run) = RunDir::open(dir) else {
        return false;
    };
    run.read_train_config()
        .is_ok_and(|train| point.job.train.steps > steps_trained(&run, &train))
}

/// Whether a point to retry without a checkpoint starts over from step 1 after logging steps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Anew(pub bool);

/// [`Anew`] of the point whose run directory is `dir` and that has no checkpoint to resume.
fn anew(dir: &Path) -> Anew {
    let logged = std::fs::metadata(RunDir::at(dir).metrics()).is_ok_and(|m| m.len() > 0);
    Anew(logged)
}

/// The point's run and the newest checkpoint its job would continue from (read once: a
/// point that did not finish is judged by it three ways), when it resumes at all. A newest
/// checkpoint that cannot be read is the error it is, as a re-run refuses it.
fn resumed_from(
    dir: &Path,
    point: &SweepPoint,
) -> Result<Option<(RunDir, CheckpointAt)>, shardrun_checkpoint::CheckpointError> {
    if !point.job.train.checkpoint.resume {
        return Ok(None);
    }
    let Ok(run) = RunDir::open(dir) else {
        return Ok(None);
    };
    // Where the run keeps its checkpoints is in its own record.
    let Ok(train) = run.read_train_config() else {
        return Ok(None);
    };
    Ok(readable_newest_checkpoint(&run, &train)?.map(|checkpoint| (run, checkpoint)))
}

/// The refusal a retried point's job would meet: its newest checkpoint was trained on other
/// data than the data as it is prepared now, or than its files now (what only preparing
/// tells is compared by the job).
fn data_refusal(
    run: &RunDir,
    checkpoint: &CheckpointAt,
    point: &SweepPoint,
    probes: &mut DataProbes,
) -> Option<Box<DataChanged>> {
    let DataConfig::Dataset(data) = &point.job.train.data else {
        return None;
    };
    probes.now(data).refusal(run, checkpoint)
}

/// Order the points to submit by allocation shape (in order of first appearance, the
/// sweep's order within each), returning the size of each shape's group.
pub fn shape_groups(points: &mut Vec<(&SweepPoint, Decision)>) -> Vec<usize> {
    let mut shapes = Vec::new();
    let mut keyed = Vec::with_capacity(points.len());
    for item in points.drain(..) {
        let shape = (&item.0.job.slurm, &item.0.job.preemption);
        let index = shapes.iter().position(|s| *s == shape).unwrap_or_else(|| {
            shapes.push(shape);
            shapes.len() - 1
        });
        keyed.push((index, item));
    }
    keyed.sort_by_key(|(index, _)| *index);
    let mut sizes = vec![0; shapes.len()];
    for (index, item) in keyed {
        sizes[index] += 1;
        points.push(item);
    }
    sizes
}
