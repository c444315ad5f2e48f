//! Submitting a sweep's points as job arrays, safely against interruption: each array is
//! recorded in the sweep's journal before and after `sbatch`, submitted held, its points'
//! manifests updated, then released. A run cut short anywhere leaves arrays the next
//! `shardrun sweep` finds and finishes ([`resolve_interrupted`]), so no point is submitted
//! twice and none is lost.

use crate::resolve::ResolvedJob;
use crate::rundir::{self, ArrayRef, Manifest, RunDir, RunState};
use crate::sbatch::{render_sbatch, RenderError, ScriptTarget};
use crate::slurm::{self, limits::Destination};
use crate::sweeps::journal::{self, ArrayRecord, ArrayState, Journal};
use crate::sweeps::split::{self, SubmitLimits};
use crate::sweeps::survey::Decision;
use crate::sweeps::SweepPoint;
use crate::sweeps::{carried, point_dirs};
use anyhow::Context;
use std::path::{Path, PathBuf};

/// The cluster's limits (and the spec's). A dry run works without Slurm, on defaults.
pub fn read_limits(
    job: &ResolvedJob,
    sweep: &crate::spec::SweepSpec,
    dry_run: bool,
) -> anyhow::Result<SubmitLimits> {
    let to = Destination {
        account: job.slurm.account.as_deref(),
        partition: job.slurm.partition.as_deref(),
        qos: job.slurm.qos.as_deref(),
    };
    let cluster = match slurm::limits::read_limits(to) {
        Ok(cluster) => cluster,
        Err(err) if dry_run => slurm::limits::ClusterLimits {
            notes: vec![format!("the cluster's limits could not be read: {err}")],
            ..Default::default()
        },
        Err(err) if err.controller_unreachable() => {
            return Err(slurm::unanswered(
                "nothing was submitted",
                "reading the cluster's limits (squeue)",
                &err,
            ))
        }
        Err(err) => {
            return Err(anyhow::Error::new(err).context("reading the cluster's limits (squeue)"))
        }
    };
    Ok(split::submit_limits(&cluster, sweep.limits.as_ref()))
}

/// A point about to go into an array: a new one (written but for its manifest) or one
/// retried in its existing run directory (checkpoints stay).
enum Slot {
    New(Box<point_dirs::NewPointDir>),
    Existing(RunDir),
}

impl Slot {
    fn path(&self) -> PathBuf {
        match self {
            Slot::New(dir) => dir.path().to_path_buf(),
            Slot::Existing(run) => run.path().to_path_buf(),
        }
    }
}

/// Commit every slot's manifest in one batch, each changed by `change` (given the task index).
fn commit(
    sweep_dir: &Path,
    slots: Vec<Slot>,
    change: impl Fn(usize, &mut Manifest),
) -> Result<(), rundir::RunDirError> {
    let mut batch = point_dirs::ManifestBatch::new(sweep_dir);
    for (task, slot) in slots.into_iter().enumerate() {
        match slot {
            Slot::New(dir) => batch.add_new(*dir, |m| change(task, m))?,
            Slot::Existing(run) => batch.update(&run, |m| change(task, m))?,
        }
    }
    batch.commit()
}

/// Why an array was not submitted.
pub struct SubmitFailure {
    /// sbatch refused it, or it was cancelled after: its points are SUBMIT_FAILED.
    pub rejected: bool,
    pub error: anyhow::Error,
}

impl<E: Into<anyhow::Error>> From<E> for SubmitFailure {
    fn from(error: E) -> Self {
        SubmitFailure {
            rejected: false,
            error: error.into(),
        }
    }
}

fn rejected(error: anyhow::Error) -> SubmitFailure {
    SubmitFailure {
        rejected: true,
        error,
    }
}

/// An array is submitted held (released once its points know their job ids), tagged so a
/// lost sbatch answer can be looked up, and after `after` when there is a throttle.
fn sbatch_options(tag: &str, after: &[String]) -> Vec<String> {
    let mut options = vec!["--hold".to_string(), format!("--comment={tag}")];
    if !after.is_empty() {
        options.push(format!("--dependency=afterany:{}", after.join(":")));
    }
    options
}

/// Submits one array at a time, recording it before and after sbatch.
pub struct Submitter<'a> {
    pub journal: &'a Journal,
    pub sweep_dir: &'a Path,
    pub sweep_name: &'a str,
    pub exe: PathBuf,
    pub throttle: Option<u32>,
}

impl Submitter<'_> {
    /// The sbatch script of `array`, which runs `points` (of one allocation shape): the
    /// first point's resources, the sweep's name, one task per point.
    pub fn script(
        &self,
        array: &ArrayRef,
        points: &[(&SweepPoint, Decision)],
    ) -> Result<String, RenderError> {
        let mut array_job = points[0].0.job.clone();
        array_job.name = self.sweep_name.to_string();
        let target = ScriptTarget::Array {
            points_file: self.journal.points_path(array),
            log_dir: self.sweep_dir.join("slurm"),
            tasks: points.len(),
            throttle: self.throttle,
        };
        render_sbatch(&array_job, &target, &self.exe)
    }

    /// The sbatch command line of `array`, starting after the jobs `after` (with a throttle).
    pub fn sbatch_command(&self, array: &ArrayRef, after: &[String]) -> String {
        let options = sbatch_options(&journal::tag(self.sweep_name, array), after);
        let args = slurm::sbatch_args(&self.journal.script_path(array), &options);
        let mut words = vec!["sbatch".to_string()];
        words.extend(args.iter().map(|arg| crate::sbatch::shell_quote(arg)));
        words.join(" ")
    }

    /// Write the array's points and record, `sbatch --hold` it, write its points' manifests
    /// with their job ids, release it. On failure its points are SUBMIT_FAILED and the record
    /// says why.
    pub fn submit(
        &self,
        array: &ArrayRef,
        points: &[(&SweepPoint, Decision)],
        after: &[String],
    ) -> Result<String, SubmitFailure> {
        let slots = points
            .iter()
            .map(|(point, decision)| {
                Ok(match decision {
                    Decision::New => {
                        Slot::New(Box::new(point_dirs::prepare(self.sweep_dir, point)?))
                    }
                    _ => {
                        let run = RunDir::open(&self.sweep_dir.join(&point.name))?;
                        // A point carried over takes the changes it was carried with.
                        carried::record_job(&run, point)?;
                        Slot::Existing(run)
                    }
                })
            })
            .collect::<Result<Vec<Slot>, rundir::RunDirError>>()
            .context("writing the points' run directories")?;
        let paths: Vec<PathBuf> = slots.iter().map(Slot::path).collect();
        self.journal.write_points(array, &paths)?;
        let script = self.script(array, points)?;
        let script_path = self.journal.script_path(array);
        rundir::write_file(&script_path, script.as_bytes())?;
        let mut record = ArrayRecord {
            array: array.clone(),
            tasks: slots.len(),
            tag: journal::tag(self.sweep_name, array),
            job_id: None,
            after: after.to_vec(),
            state: ArrayState::Submitting,
            error: None,
            updated_at: 0,
        };
        self.journal.write(&mut record)?;

        let job_id = match slurm::submit(&script_path, &sbatch_options(&record.tag, after)) {
            Ok(id) => id,
            Err(err) => {
                // sbatch may fail after slurmctld took the job (killed, timed out): look
                // for it by its tag.
                let lookup = slurm::jobs_by_comment();
                let found = lookup
                    .as_ref()
                    .ok()
                    .and_then(|jobs| jobs.get(&record.tag))
                    .map(|job| job.array_job_id.clone());
                match found {
                    Some(id) => {
                        outln!(
                            "sbatch failed ({err}), but Slurm has array {}/{} as job {id}: going on",
                            array.index, array.count
                        );
                        id
                    }
                    None => {
                        let message = err.to_string();
                        // If Slurm could not be asked, the next `shardrun sweep` asks again
                        // (and cancels the array should Slurm have it after all).
                        record.state = if lookup.is_ok() {
                            ArrayState::Rejected
                        } else {
                            ArrayState::Submitting
                        };
                        record.error = Some(message.clone());
                        self.journal.write(&mut record)?;
                        commit(self.sweep_dir, slots, |_, m| {
                            m.state = RunState::SubmitFailed;
                            m.error = Some(message.clone());
                            m.sweep_array = Some(array.clone());
                        })?;
                        return Err(rejected(anyhow::Error::new(err)));
                    }
                }
            }
        };
        record.job_id = Some(job_id.clone());
        record.state = ArrayState::Held;
        self.journal.write(&mut record)?;
        let recorded = commit(self.sweep_dir, slots, |task, m| {
            // A point retried in its run directory goes back to how it had ended if its job
            // refuses to start (its data changed).
            m.ended_before = m.state.is_terminal().then(|| m.before_start());
            m.state = RunState::Submitted;
            m.slurm_job_ids.push(format!("{job_id}_{task}"));
            m.error = None;
            m.sweep_array = Some(array.clone());
        });
        if let Err(err) = recorded {
            cancel(
                self.journal,
                &mut record,
                &format!("its points could not be written: {err}"),
            );
            return Err(anyhow::Error::new(err)
                .context(format!(
                    "Slurm job {job_id} (array {array}) was cancelled: its points could not be written"
                ))
                .into());
        }
        release(self.journal, self.sweep_dir, &mut record, &paths, true).map_err(rejected)?;
        Ok(job_id)
    }
}

/// Let a held array whose points are recorded run; if that fails, cancel it and mark its
/// points SUBMIT_FAILED.
fn release(
    journal: &Journal,
    sweep_dir: &Path,
    record: &mut ArrayRecord,
    points: &[PathBuf],
    held: bool,
) -> anyhow::Result<()> {
    let job_id = record
        .job_id
        .clone()
        .expect("a recorded array has a job id");
    if held {
        // Nothing of the array has run yet (best effort: the controller replaces the
        // verdict when it starts).
        for run in points.iter().filter_map(|p| RunDir::open(p).ok()) {
            let _ = run.forget_last_job();
        }
        if let Err(err) = slurm::release(&job_id) {
            let message = format!("`scontrol release {job_id}` failed: {err}");
            cancel(journal, record, &message);
            let runs: Vec<Slot> = points
                .iter()
                .filter_map(|p| RunDir::open(p).ok().map(Slot::Existing))
                .collect();
            commit(sweep_dir, runs, |_, m| {
                m.state = RunState::SubmitFailed;
                m.error = Some(message.clone());
            })?;
            anyhow::bail!("{message}; Slurm job {job_id} was cancelled and its points are marked SUBMIT_FAILED");
        }
    }
    record.state = ArrayState::Released;
    record.error = None;
    journal.write(record)?;
    Ok(())
}

/// Cancel an array that must not run, and record why.
fn cancel(journal: &Journal, record: &mut ArrayRecord, why: &str) {
    if let Some(id) = &record.job_id {
        let _ = slurm::cancel(std::slice::from_ref(id));
    }
    record.state = ArrayState::Rejected;
    record.error = Some(why.to_string());
    let _ = journal.write(record);
}

/// Finish the arrays an interrupted `shardrun sweep` left between "about to submit" and
/// "released". An array Slurm holds (found by its comment) whose points were all written
/// with its job ids is released; one whose points were not written is cancelled (it never
/// ran: it was held) and its points are decided afresh, as are those of an array Slurm never
/// saw. Then the point folders any interrupted submission left half written go.
pub fn resolve_interrupted(journal: &Journal, sweep_dir: &Path) -> anyhow::Result<()> {
    resolve_arrays(journal, sweep_dir)?;
    let removed = point_dirs::remove_interrupted_writes(sweep_dir);
    if removed > 0 {
        outln!(
            "removed {removed} point folder(s) an interrupted `shardrun sweep` left half \
             written (their points are decided again)"
        );
    }
    Ok(())
}

/// The arrays part of [`resolve_interrupted`].
fn resolve_arrays(journal: &Journal, sweep_dir: &Path) -> anyhow::Result<()> {
    let mut pending: Vec<ArrayRecord> = journal
        .records()?
        .into_iter()
        .filter(|r| r.state.unresolved())
        .collect();
    if pending.is_empty() {
        return Ok(());
    }
    let jobs = slurm::jobs_by_comment()
        .context("looking up the arrays of an interrupted `shardrun sweep` in Slurm")?;
    for record in &mut pending {
        let points = journal.read_points(&record.array)?;
        let job = jobs.get(&record.tag).or_else(|| {
            // Its id was recorded but the comment is gone: look it up by id.
            record
                .job_id
                .as_ref()
                .and_then(|id| jobs.values().find(|j| &j.array_job_id == id))
        });
        let Some(job) = job else {
            record.state = ArrayState::Abandoned;
            journal.write(record)?;
            outln!(
                "array {} of an interrupted `shardrun sweep` never reached Slurm: its {} point(s) are decided again",
                record.array,
                points.len()
            );
            continue;
        };
        record.job_id = Some(job.array_job_id.clone());
        let recorded = points.iter().enumerate().all(|(task, path)| {
            RunDir::open(path)
                .and_then(|run| run.read_manifest())
                .map(|m| m.slurm_job_ids.last() == Some(&format!("{}_{task}", job.array_job_id)))
                .unwrap_or(false)
        });
        if recorded {
            release(journal, sweep_dir, record, &points, job.held)?;
            outln!(
                "array {} (Slurm job {}) of an interrupted `shardrun sweep` was accepted and recorded: {}",
                record.array,
                job.array_job_id,
                if job.held { "released now" } else { "it was already released" }
            );
        } else {
            cancel(
                journal,
                record,
                "an interrupted `shardrun sweep` had not written its points yet",
            );
            outln!(
                "array {} (Slurm job {}) of an interrupted `shardrun sweep` was held with its points not written: cancelled, its {} point(s) are decided again",
                record.array,
                job.array_job_id,
                points.len()
            );
        }
    }
    Ok(())
}
