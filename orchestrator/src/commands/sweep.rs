//! `shardrun sweep job.yaml`: expand the sweep and submit the points that are new, changed
//! or failed, split into as many job arrays as the cluster's limits need; finished and
//! running points are skipped and listed.
//!
//! Each array is recorded in the sweep folder before and after `sbatch` (`sweep::journal`),
//! submitted held, its points' manifests updated, then released: a run cut short anywhere
//! leaves arrays the next `shardrun sweep` finds and finishes, so no point is submitted twice
//! and none is lost. With a throttle, each array starts after the previous one has ended
//! (`--dependency=afterany`) and runs at most `throttle` tasks at once (`--array=...%N`), so
//! at most `throttle` of the sweep's tasks run at any time.

use crate::commands::render::shardrun_exe;
use crate::plan::ResolvedJob;
use crate::render::{render_sbatch, ScriptTarget};
use crate::rundir::{self, ArrayRef, Manifest, RunDir, RunState};
use crate::slurm::{self, limits::Destination};
use crate::spec;
use crate::sweep::journal::{self, ArrayRecord, ArrayState, Journal};
use crate::sweep::point_dirs;
use crate::sweep::split::{self, ArrayPlan, SubmitLimits};
use crate::sweep::{self as sweeps, SweepPoint};
use anyhow::Context;
use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Job spec with a `sweep:` section.
    pub spec: PathBuf,
    /// At most this many of the sweep's tasks at once (overrides `sweep.throttle`).
    #[arg(long)]
    pub throttle: Option<u32>,
    /// List the points and the job arrays that would be submitted; write and submit nothing.
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

/// What the sweep folder says about the points, after asking Slurm.
struct Survey {
    decisions: Vec<Decision>,
    /// Array jobs of this sweep with points still pending or running.
    active_arrays: BTreeSet<String>,
}

pub fn execute(args: Args) -> anyhow::Result<()> {
    let loaded = spec::load(&crate::commands::plan::spec_path(&args.spec))?;
    let points = sweeps::expand(&loaded)?;
    let sweep = loaded.spec.sweep.clone().unwrap_or_default();
    let root = loaded
        .spec
        .run_root
        .clone()
        .unwrap_or_else(|| PathBuf::from(crate::plan::defaults::RUN_ROOT));
    let sweep_dir =
        std::path::absolute(root.join(&loaded.spec.name)).context("resolving the sweep folder")?;
    let throttle = args.throttle.or(sweep.throttle);
    if throttle == Some(0) {
        anyhow::bail!("--throttle 0 would never run a task\n  fix: use 1 or more");
    }
    let journal = Journal::new(&sweep_dir);

    // One submitter at a time, and first finish what an interrupted one left.
    let _lock = if args.dry_run {
        let unresolved = journal
            .records()?
            .iter()
            .filter(|r| r.state.unresolved())
            .count();
        if unresolved > 0 {
            println!("{unresolved} array(s) of an interrupted `shardrun sweep` would be looked up in Slurm and recorded first");
        }
        None
    } else {
        let lock = journal.lock()?;
        resolve_interrupted(&journal, &sweep_dir)?;
        Some(lock)
    };

    let survey = survey(&sweep_dir, &points)?;
    let mut to_submit: Vec<(&SweepPoint, Decision)> = points
        .iter()
        .zip(&survey.decisions)
        .filter(|(_, d)| !matches!(d, Decision::Skip(_)))
        .map(|(p, d)| (p, *d))
        .collect();
    // One array has one allocation shape: points asking for different resources go into
    // different arrays (stable, so the order within a shape stays the sweep's).
    let shapes = shape_groups(&mut to_submit);
    let limits = if to_submit.is_empty() {
        None
    } else {
        Some(read_limits(&to_submit[0].0.job, &sweep, args.dry_run)?)
    };
    let plan = limits
        .as_ref()
        .map(|l| split::plan_arrays(&shapes, l))
        .unwrap_or(ArrayPlan {
            arrays: Vec::new(),
            waiting: 0,
        });

    print_points(&points, &survey.decisions, &to_submit, &plan);
    report_stale(&sweep_dir, &points);
    let skipped = points.len() - to_submit.len();
    let Some(limits) = limits else {
        println!(
            "Nothing to submit: all {} point(s) are finished or running",
            points.len()
        );
        return Ok(());
    };
    for line in limits.describe() {
        println!("limits: {line}");
    }
    if let Some(t) = throttle {
        println!("throttle {t}: each array runs at most {t} tasks at once and starts after the sweep's previous array has ended");
    }
    if plan.arrays.is_empty() {
        println!(
            "No room to queue any of the {} point(s) now ({}); run `shardrun sweep {}` again when some of your jobs have ended",
            to_submit.len(),
            limits.queue.as_ref().map(|l| l.what.as_str()).unwrap_or("limit"),
            args.spec.display()
        );
        return Ok(());
    }
    if args.dry_run {
        print_arrays(&plan, throttle, skipped);
        return Ok(());
    }

    let submitter = Submitter {
        journal: &journal,
        sweep_dir: &sweep_dir,
        sweep_name: &loaded.spec.name,
        exe: shardrun_exe()?,
        throttle,
    };
    let submission = journal::new_submission_id();
    rundir::write_file(&journal.spec_path(&submission), loaded.source.as_bytes())?;
    std::fs::create_dir_all(sweep_dir.join("slurm"))
        .context("creating the sweep's slurm log folder")?;
    let planned = &to_submit[..plan.submitted()];

    // With a throttle, arrays run one after the other, the first after the sweep's arrays
    // still queued from an earlier `shardrun sweep`.
    let mut after: Vec<String> = match throttle {
        Some(_) => survey.active_arrays.iter().cloned().collect(),
        None => Vec::new(),
    };
    let mut submitted: Vec<(ArrayRef, String, usize)> = Vec::new();
    for (k, range) in plan.arrays.iter().enumerate() {
        let array = ArrayRef {
            submission: submission.clone(),
            index: k + 1,
            count: plan.arrays.len(),
        };
        match submitter.submit(&array, &planned[range.clone()], &after) {
            Ok(job_id) => {
                if throttle.is_some() {
                    after = vec![job_id.clone()];
                }
                submitted.push((array, job_id, range.len()));
            }
            Err(failure) => {
                let done: usize = submitted.iter().map(|(_, _, n)| n).sum();
                let what = if failure.rejected {
                    "was not accepted; its points are marked SUBMIT_FAILED"
                } else {
                    "could not be submitted"
                };
                return Err(failure.error.context(format!(
                    "array {}/{} ({} point(s)) {what}. {done} point(s) in {} earlier array(s) were submitted; \
                     {} point(s) of later arrays and {} waiting were not. The next `shardrun sweep {}` submits each of them once",
                    array.index,
                    array.count,
                    range.len(),
                    submitted.len(),
                    plan.submitted() - range.end,
                    plan.waiting,
                    args.spec.display()
                )));
            }
        }
    }

    println!(
        "Submitted {} point(s) as {} job array(s) (skipped {skipped})",
        plan.submitted(),
        submitted.len()
    );
    for (array, job_id, n) in &submitted {
        println!(
            "  array {}/{}  Slurm job {job_id}  {n} point(s)",
            array.index, array.count
        );
    }
    if plan.waiting > 0 {
        println!(
            "  {} point(s) wait: no room for them now ({}); run `shardrun sweep {}` again when some have ended",
            plan.waiting,
            limits.queue.as_ref().map(|l| l.what.as_str()).unwrap_or("limit"),
            args.spec.display()
        );
    }
    println!("  sweep folder   {}", sweep_dir.display());
    println!(
        "  follow         tail -f {}/slurm/{}-<job>_<task>.out",
        sweep_dir.display(),
        loaded.spec.name
    );
    println!("  status         shardrun status {}", sweep_dir.display());
    Ok(())
}

/// One line per point: what happens to it and in which array.
fn print_points(
    points: &[SweepPoint],
    decisions: &[Decision],
    to_submit: &[(&SweepPoint, Decision)],
    plan: &ArrayPlan,
) {
    let array_of: HashMap<&str, usize> = plan
        .arrays
        .iter()
        .enumerate()
        .flat_map(|(k, range)| range.clone().map(move |i| (i, k)))
        .map(|(i, k)| (to_submit[i].0.key.as_str(), k))
        .collect();
    for (point, decision) in points.iter().zip(decisions) {
        let array = array_of.get(point.key.as_str());
        let what = match (decision, array) {
            (Decision::Skip(state), _) => format!("skip ({})", state_name(*state)),
            (_, None) => "wait (no room now)".to_string(),
            (Decision::New, Some(_)) => "submit (new)".to_string(),
            (Decision::Retry(state), Some(_)) => format!("submit (was {})", state_name(*state)),
        };
        let array = array
            .map(|k| format!("array {}/{}", k + 1, plan.arrays.len()))
            .unwrap_or_default();
        println!("{what:<22} {}  {array:<12} {}", point.key, point.label());
    }
}

/// The arrays a dry run would submit.
fn print_arrays(plan: &ArrayPlan, throttle: Option<u32>, skipped: usize) {
    println!(
        "dry run: would submit {} point(s) as {} job array(s), skip {skipped}, leave {} waiting:",
        plan.submitted(),
        plan.arrays.len(),
        plan.waiting
    );
    for (k, range) in plan.arrays.iter().enumerate() {
        let after = if throttle.is_some() && k > 0 {
            format!(", after array {k}")
        } else {
            String::new()
        };
        println!(
            "  array {}/{}: {} point(s), --array={}{after}",
            k + 1,
            plan.arrays.len(),
            range.len(),
            array_range(range.len(), throttle),
        );
    }
}

/// Order the points to submit by allocation shape (in order of first appearance, the
/// sweep's order within each), returning the size of each shape's group.
fn shape_groups(points: &mut Vec<(&SweepPoint, Decision)>) -> Vec<usize> {
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

/// The cluster's limits (and the spec's). A dry run works without Slurm, on defaults.
fn read_limits(
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
        Err(err) => {
            return Err(anyhow::Error::new(err).context("reading the cluster's limits (squeue)"))
        }
    };
    Ok(split::submit_limits(&cluster, sweep.limits.as_ref()))
}

/// `0-<n-1>` with `%throttle`.
fn array_range(tasks: usize, throttle: Option<u32>) -> String {
    match throttle {
        Some(t) => format!("0-{}%{t}", tasks - 1),
        None => format!("0-{}", tasks - 1),
    }
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
    let mut batch = point_dirs::Batch::new(sweep_dir);
    for (task, slot) in slots.into_iter().enumerate() {
        match slot {
            Slot::New(dir) => batch.add_new(*dir, |m| change(task, m))?,
            Slot::Existing(run) => batch.update(&run, |m| change(task, m))?,
        }
    }
    batch.commit()
}

/// Why an array was not submitted.
struct SubmitFailure {
    /// sbatch refused it, or it was cancelled after: its points are SUBMIT_FAILED.
    rejected: bool,
    error: anyhow::Error,
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

/// Submits one array at a time, recording it before and after sbatch.
struct Submitter<'a> {
    journal: &'a Journal,
    sweep_dir: &'a Path,
    sweep_name: &'a str,
    exe: PathBuf,
    throttle: Option<u32>,
}

impl Submitter<'_> {
    /// Write the array's points and record, `sbatch --hold` it, write its points' manifests
    /// with their job ids, release it. On failure its points are SUBMIT_FAILED and the record
    /// says why.
    fn submit(
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
                    _ => Slot::Existing(RunDir::open(&self.sweep_dir.join(&point.name))?),
                })
            })
            .collect::<Result<Vec<Slot>, rundir::RunDirError>>()
            .context("writing the points' run directories")?;
        let paths: Vec<PathBuf> = slots.iter().map(Slot::path).collect();
        self.journal.write_points(array, &paths)?;
        let mut array_job = points[0].0.job.clone();
        array_job.name = self.sweep_name.to_string();
        let target = ScriptTarget::Array {
            points_file: self.journal.points_path(array),
            log_dir: self.sweep_dir.join("slurm"),
            tasks: slots.len(),
            throttle: self.throttle,
        };
        let script = render_sbatch(&array_job, &target, &self.exe)?;
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

        let mut sbatch_args = vec!["--hold".to_string(), format!("--comment={}", record.tag)];
        if !after.is_empty() {
            sbatch_args.push(format!("--dependency=afterany:{}", after.join(":")));
        }
        let job_id = match slurm::submit(&script_path, &sbatch_args) {
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
                        println!(
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
/// saw.
fn resolve_interrupted(journal: &Journal, sweep_dir: &Path) -> anyhow::Result<()> {
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
        let names: Vec<String> = points
            .iter()
            .filter_map(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
            .collect();
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
            point_dirs::remove_leftovers(sweep_dir, &names);
            println!(
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
            println!(
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
            point_dirs::remove_leftovers(sweep_dir, &names);
            println!(
                "array {} (Slurm job {}) of an interrupted `shardrun sweep` was held with its points not written: cancelled, its {} point(s) are decided again",
                record.array,
                job.array_job_id,
                points.len()
            );
        }
    }
    Ok(())
}

/// Compare each point with its run directory, refreshing unfinished ones from Slurm.
fn survey(sweep_dir: &Path, points: &[SweepPoint]) -> anyhow::Result<Survey> {
    let existing: Vec<RunDir> = points
        .iter()
        .filter_map(|p| RunDir::open(&sweep_dir.join(&p.name)).ok())
        .collect();
    let mut states: HashMap<PathBuf, RunState> = HashMap::new();
    let mut active_arrays = BTreeSet::new();
    if !existing.is_empty() {
        let (statuses, _) =
            slurm::refresh(&existing).context("querying Slurm for the points already submitted")?;
        for status in statuses {
            if matches!(status.state, RunState::Submitted | RunState::Running) {
                if let Some(id) = &status.job_id {
                    active_arrays.insert(id.split('_').next().unwrap_or(id).to_string());
                }
            }
            states.insert(status.run.path().to_path_buf(), status.state);
        }
    }
    let decisions = points
        .iter()
        .map(|p| match states.get(&sweep_dir.join(&p.name)) {
            None => Decision::New,
            Some(state @ (RunState::Completed | RunState::Submitted | RunState::Running)) => {
                Decision::Skip(*state)
            }
            Some(state) => Decision::Retry(*state),
        })
        .collect();
    Ok(Survey {
        decisions,
        active_arrays,
    })
}

/// Runs in the sweep folder that no point matches any more (their parameters changed).
fn report_stale(sweep_dir: &Path, points: &[SweepPoint]) {
    let current: std::collections::HashSet<PathBuf> =
        points.iter().map(|p| sweep_dir.join(&p.name)).collect();
    let stale = slurm::find_runs(sweep_dir)
        .into_iter()
        .filter(|r| !current.contains(r.path()))
        .count();
    if stale > 0 {
        println!("{stale} run(s) in {} belong to no current point (their parameters changed); left as they are", sweep_dir.display());
    }
}

fn state_name(state: RunState) -> String {
    serde_json::to_value(state)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default()
}
