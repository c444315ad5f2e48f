//! `shardrun sweep job.yaml`: expand the sweep and submit the points that are new, changed
//! or failed, split into as many job arrays as the cluster's limits need; finished and
//! running points are skipped and listed.
//!
//! Submission survives interruption (see [`crate::sweeps::submit`]). With a throttle, each
//! array starts after the previous one has ended (`--dependency=afterany`) and runs at most
//! `throttle` tasks at once (`--array=...%N`), so at most `throttle` of the sweep's tasks run
//! at any time.

use crate::binaries::shardrun_exe;
use crate::commands::spec_args::{not_a_spec_folder, spec_path, SetArgs};
use crate::rerun;
use crate::resolve::{self, Overrides};
use crate::rundir::{self, ArrayRef, RunDir};
use crate::slurm;
use crate::spec;
use crate::sweeps::journal::{self, Journal};
use crate::sweeps::labels::ParamColumns;
use crate::sweeps::split::{self, ArrayPlan};
use crate::sweeps::submit::{read_limits, resolve_interrupted, Submitter};
use crate::sweeps::survey::{shape_groups, survey, Anew, Decision};
use crate::sweeps::{self, SweepPoint};
use anyhow::Context;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Job spec with a `sweep:` section.
    pub spec: PathBuf,
    /// At most this many of the sweep's tasks at once (overrides `sweep.throttle`).
    #[arg(long)]
    pub throttle: Option<u32>,
    /// List the points, the job arrays and their sbatch scripts that would be submitted;
    /// write and submit nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Submit points even when their peak memory per rank exceeds the GPU's (finished and
    /// running points are still skipped).
    #[arg(long)]
    pub force: bool,
    #[command(flatten)]
    pub set: SetArgs,
}

pub fn execute(args: Args) -> anyhow::Result<()> {
    // `--set` changes every point, as if written in the spec (`sweep.grid` included); the
    // points record the values they ran with, so a later sweep without it sees them changed.
    if args.spec.is_dir() && !spec_path(&args.spec).exists() {
        if RunDir::open(&args.spec).is_ok() {
            anyhow::bail!(
                "{} is a run directory without a spec of its own (a sweep's point)\n  fix: \
                 `shardrun sweep` takes the sweep's spec file, the YAML with the `sweep:` \
                 section",
                args.spec.display()
            );
        }
        anyhow::bail!(not_a_spec_folder(&args.spec, "sweep"));
    }
    let loaded = spec::load_with(&spec_path(&args.spec), &args.set.parsed()?)?;
    let overrides = Overrides {
        force: args.force,
        ..Overrides::submitting()
    };
    let mut points = sweeps::expand(&loaded, &overrides)?;
    let sweep = loaded.spec.sweep.clone().unwrap_or_default();
    let sweep_dir = RunDir::planned_path(&resolve::run_root(&loaded.spec), &loaded.spec.name)
        .context("resolving the sweep folder")?;
    let throttle = args.throttle.or(sweep.throttle);
    if throttle == Some(0) {
        anyhow::bail!("--throttle 0 would never run a task\n  fix: use 1 or more");
    }
    let journal = Journal::new(&sweep_dir);
    let carried = sweeps::carried::carry_over(&sweep_dir, &mut points);

    // The command that runs this sweep again, as given: its overrides name the sweep and
    // its points, and a throttle given on the command line is not the spec's.
    let mut sweep_again = format!("shardrun sweep {}", crate::output::pasteable(&args.spec));
    for set in &args.set.set {
        sweep_again.push_str(&format!(" --set {}", crate::sbatch::shell_quote(set)));
    }
    if let Some(throttle) = args.throttle {
        sweep_again.push_str(&format!(" --throttle {throttle}"));
    }
    if args.force {
        sweep_again.push_str(" --force");
    }

    // One submitter at a time, and first finish what an interrupted one left.
    let _lock = if args.dry_run {
        let unresolved = journal
            .records()?
            .iter()
            .filter(|r| r.state.unresolved())
            .count();
        if unresolved > 0 {
            outln!("{unresolved} array(s) of an interrupted `shardrun sweep` would be looked up in Slurm and recorded first");
        }
        None
    } else {
        let lock = journal.lock()?;
        // The arrays submitted stand, and the journal says what an interrupted sweep left.
        crate::interrupt::note_on_stop(
            "the sweep",
            &format!(
                "the arrays it submitted stand; `{sweep_again}` looks up what it left (an array held \
                 or not yet recorded) and submits the rest"
            ),
        );
        resolve_interrupted(&journal, &sweep_dir)?;
        journal
            .write_current_points(points.iter().map(|p| p.name.as_str()))
            .context("recording the sweep's points")?;
        Some(lock)
    };

    let survey = survey(&sweep_dir, &points)?;
    let mut to_submit: Vec<(&SweepPoint, Decision)> = points
        .iter()
        .zip(&survey.decisions)
        .filter(|(_, d)| d.submits())
        .map(|(p, d)| (p, *d))
        .collect();
    // A point continued in another user's run directory would fail in its allocation after
    // its files were rewritten: refused first, as `shardrun run` refuses one run.
    let refused = to_submit
        .iter()
        .find_map(|(p, _)| rundir::access::check_usable(&sweep_dir.join(&p.name)).err());
    if let Some(rundir::access::NotUsable { run_dir, unusable }) = refused {
        anyhow::bail!(
            "point {} cannot be continued by this user: {unusable}\n  fix: ask {} to run \
             `shardrun sweep` of this spec, or sweep into a folder of your own (another `name`)",
            run_dir.display(),
            unusable.owner
        );
    }
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
    print_warnings(&points, &to_submit);
    let going: std::collections::HashSet<&str> = points
        .iter()
        .zip(&survey.decisions)
        .filter(|(_, d)| {
            matches!(
                d,
                Decision::Skip(rundir::RunState::Submitted | rundir::RunState::Running)
            )
        })
        .map(|(p, _)| p.name.as_str())
        .collect();
    let held_back: std::collections::HashSet<&str> = points
        .iter()
        .zip(&survey.decisions)
        .filter(|(_, d)| d.held_back())
        .map(|(p, _)| p.name.as_str())
        .collect();
    report_carried(&carried, &going, &held_back);
    report_stale(&sweep_dir, &points);
    if survey.earlier_going > 0 {
        let meanwhile = match throttle {
            Some(_) => "the throttle holds: the new arrays start after theirs",
            None => "they run beside the points submitted now",
        };
        outln!(
            "{} run(s) of an earlier version of this sweep's spec are still queued or running \
             ({meanwhile}); `shardrun status {}` lists them (marked *), `shardrun cancel <run \
             dir>` stops one",
            survey.earlier_going,
            crate::output::pasteable(&sweep_dir)
        );
    }
    if let Some(first) = survey.data_changed.first() {
        outln!(
            "{} point(s) to retry were trained on other data than the data as it is now: their \
             jobs would refuse to resume, so they are not submitted. The first:\n{first}",
            survey.data_changed.len()
        );
    }
    if let Some(first) = survey.unreadable.first() {
        outln!(
            "{} point(s) to continue have a newest checkpoint that cannot be read: their jobs \
             would wait in the queue only for their ranks to refuse it, so they are not \
             submitted; once it reads, `{sweep_again}` submits them. The first:\n{first}",
            survey.unreadable.len()
        );
    }
    let anew: Vec<&SweepPoint> = points
        .iter()
        .zip(&survey.decisions)
        .filter(|(_, d)| matches!(d, Decision::Retry(_, Anew(true))))
        .map(|(p, _)| p)
        .collect();
    if let Some(first) = anew.first() {
        outln!(
            "{} point(s) to submit again logged steps but have no checkpoint to resume from \
             (`anew`): they train again from step 1, their metrics replaced. The first, {}",
            anew.len(),
            sweep_dir.join(&first.name).display()
        );
    }
    let past = survey
        .decisions
        .iter()
        .filter(|d| matches!(d, Decision::TrainedPast(..)))
        .count();
    if past > 0 {
        outln!(
            "{past} point(s) that did not finish have a checkpoint at or past the steps now \
             asked for: nothing is left to train, so they are not submitted (their checkpoints \
             are kept; with more steps, the sweep continues them)"
        );
    }
    let diverged: Vec<(&SweepPoint, u64)> = points
        .iter()
        .zip(&survey.decisions)
        .filter_map(|(p, d)| match d {
            Decision::Diverged(_, first) => Some((p, *first)),
            _ => None,
        })
        .collect();
    if let Some((point, first)) = diverged.first() {
        outln!(
            "{} point(s) diverged (their loss or gradients went NaN or inf, or the loss blew \
             up): continuing would \
             train on from diverged weights, or the same steps into the same divergence, so \
             they are not submitted. To \
             try them with a lower LR, `optimizer.grad_clip` or a longer warm-up, change the \
             sweep's spec and run `shardrun sweep` again (changed values are new points; \
             deleting a point's directory would train it again as it was). The first, {}, \
             from step {first}",
            diverged.len(),
            sweep_dir.join(&point.name).display()
        );
    }
    let finished_diverged: Vec<(&SweepPoint, u64)> = points
        .iter()
        .zip(&survey.decisions)
        .filter_map(|(p, d)| match d {
            Decision::FinishedDiverged(first) => Some((p, *first)),
            _ => None,
        })
        .collect();
    if let Some((point, first)) = finished_diverged.first() {
        outln!(
            "{} finished point(s) diverged on the way (their loss or gradients went NaN or \
             inf, or the loss blew up, and training went on): their final losses are not \
             results. To try them with a lower LR, `optimizer.grad_clip` or a longer warm-up, \
             change the sweep's spec (changed values are new points). The first, {}, from \
             step {first}",
            finished_diverged.len(),
            sweep_dir.join(&point.name).display()
        );
    }
    if let Some((dir, changes)) = survey.finished_on_other_data.first() {
        outln!(
            "{} finished point(s) trained on data that differs from the data as it is now: \
             they are skipped and keep the results of the data they trained on. To train a \
             point on the data as it is now, delete its directory and run `shardrun sweep` \
             again. The first, {}:",
            survey.finished_on_other_data.len(),
            dir.display()
        );
        for change in changes {
            outln!("  {change}");
        }
    }
    let not_runs: Vec<&SweepPoint> = points
        .iter()
        .zip(&survey.decisions)
        .filter(|(_, d)| matches!(d, Decision::NotARun))
        .map(|(p, _)| p)
        .collect();
    if let Some(first) = not_runs.first() {
        let dir = sweep_dir.join(&first.name);
        outln!(
            "{} point(s) have a folder that is not a run directory to read, so they are not \
             submitted (their jobs would fail on it, and their arrays' other points with \
             them). The first, {}: {}. Move each aside (keeping what it holds) or remove it, \
             then run `{sweep_again}` again to train it anew",
            not_runs.len(),
            dir.display(),
            sweeps::survey::not_a_run(&dir).unwrap_or_default(),
        );
    }
    let skipped = points.len() - to_submit.len();
    let Some(limits) = limits else {
        outln!(
            "Nothing to submit: all {} point(s) are finished, running or refused",
            points.len()
        );
        return Ok(());
    };
    for line in limits.describe() {
        outln!("limits: {line}");
    }
    if let Some(t) = throttle {
        outln!("throttle {t}: each array runs at most {t} tasks at once and starts after the sweep's previous array has ended");
    }
    if plan.arrays.is_empty() {
        outln!(
            "No room to queue any of the {} point(s) now ({}); run `{sweep_again}` again when some of your jobs have ended",
            to_submit.len(),
            limits.queue.as_ref().map(|l| l.what.as_str()).unwrap_or("limit"),
        );
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
    let arrays = |k: usize| ArrayRef {
        submission: submission.clone(),
        index: k + 1,
        count: plan.arrays.len(),
    };
    // With a throttle, arrays run one after the other, the first after the sweep's arrays
    // still queued from an earlier `shardrun sweep`.
    let first_after: Vec<String> = match throttle {
        Some(_) => survey.active_arrays.iter().cloned().collect(),
        None => Vec::new(),
    };
    if args.dry_run {
        print_arrays(&plan, throttle, skipped);
        for (k, range) in plan.arrays.iter().enumerate() {
            let array = arrays(k);
            let after = match k {
                0 => first_after.clone(),
                _ if throttle.is_some() => vec![format!("<job id of array {k}>")],
                _ => Vec::new(),
            };
            let script = submitter.script(&array, &to_submit[range.clone()])?;
            outln!(
                "\n# array {}/{}: submitted held, then released, as (each submission tags it anew)\n# {}\n{}",
                k + 1,
                plan.arrays.len(),
                submitter.sbatch_command(&array, &after),
                script.trim_end()
            );
            // Every array asks the same of each node: the first stands for all of them.
            if k == 0 {
                let what = format!("array 1/{}", plan.arrays.len());
                crate::commands::submit::ask_slurm(&script, &what);
            }
        }
        return Ok(());
    }

    // With its --set overrides applied (and named), as a run's job.yaml: they decide the
    // sweep's name and points.
    let recorded = spec::overrides::recorded_yaml(&loaded);
    rundir::write_file(&journal.spec_path(&submission), recorded.as_bytes())?;
    std::fs::create_dir_all(sweep_dir.join("slurm"))
        .context("creating the sweep's slurm log folder")?;
    let planned = &to_submit[..plan.submitted()];

    let mut after = first_after;
    let mut submitted: Vec<(ArrayRef, String, usize)> = Vec::new();
    for (k, range) in plan.arrays.iter().enumerate() {
        let array = arrays(k);
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
                     {} point(s) of later arrays and {} waiting were not. The next `{sweep_again}` submits each of them once",
                    array.index,
                    array.count,
                    range.len(),
                    submitted.len(),
                    plan.submitted() - range.end,
                    plan.waiting,
                )));
            }
        }
    }

    outln!(
        "Submitted {} point(s) as {} job array(s) (skipped {skipped})",
        plan.submitted(),
        submitted.len()
    );
    for (array, job_id, n) in &submitted {
        outln!(
            "  array {}/{}  Slurm job {job_id}  {n} point(s)",
            array.index,
            array.count
        );
    }
    if plan.waiting > 0 {
        outln!(
            "  {} point(s) wait: no room for them now ({}); run `{sweep_again}` again when some have ended",
            plan.waiting,
            limits.queue.as_ref().map(|l| l.what.as_str()).unwrap_or("limit"),
        );
    }
    outln!("  sweep folder   {}", sweep_dir.display());
    // One array: its job id is known; with more, each has its own.
    let job = match submitted.as_slice() {
        [(_, job_id, _)] => job_id.as_str(),
        _ => "<job>",
    };
    // The folder quoted as a shell needs it; the file name is a pattern to fill in.
    outln!(
        "  follow         tail -F {}/{}-{job}_<task>.out",
        crate::output::pasteable(&sweep_dir.join("slurm")),
        loaded.spec.name
    );
    outln!(
        "  status         shardrun status {}",
        crate::output::pasteable(&sweep_dir)
    );
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
    // Named and written as the status and metrics tables of the sweep will show them.
    let columns = ParamColumns::given(points.iter().map(|p| &p.params));
    let rows: Vec<(&SweepPoint, String, String)> = points
        .iter()
        .zip(decisions)
        .map(|(point, decision)| {
            let (what, array) = decision_words(point, decision, &array_of, plan);
            (point, what, array)
        })
        .collect();
    // As wide as the longest decision (`skip (diverged at step 12000)`), so the keys align.
    let width = rows.iter().map(|(_, what, _)| what.chars().count()).max();
    let width = width.unwrap_or(0).max(22);
    for (point, what, array) in rows {
        outln!(
            "{what:<width$} {}  {array:<12} {}",
            point.key,
            columns.label(&point.params)
        );
    }
}

/// The planning warnings of the points to submit (a `seq_len` past the model's positions, a
/// tight memory fit), each distinct one once, with how many points it concerns: `shardrun
/// plan` of one point shows its own, and a sweep would otherwise submit them unsaid.
fn print_warnings(points: &[SweepPoint], to_submit: &[(&SweepPoint, Decision)]) {
    const SHOWN: usize = 8;
    let columns = ParamColumns::given(points.iter().map(|p| &p.params));
    let warnings = sweeps::shared_warnings(to_submit.iter().map(|(p, _)| *p));
    for (warning, concerned) in warnings.iter().take(SHOWN) {
        let which = match concerned.as_slice() {
            all if all.len() == to_submit.len() => "every point to submit".to_string(),
            [one] => columns.label(&one.params),
            [first, ..] => format!(
                "{} of the {} points to submit, such as {}",
                concerned.len(),
                to_submit.len(),
                columns.label(&first.params)
            ),
            [] => continue,
        };
        errln!("warning: {warning} ({which})");
    }
    if warnings.len() > SHOWN {
        errln!(
            "warning: and {} other warning(s); each point's are in its resolved.json",
            warnings.len() - SHOWN
        );
    }
}

/// What the sweep does with `point` in words, and the array it goes into, if any.
fn decision_words(
    point: &SweepPoint,
    decision: &Decision,
    array_of: &HashMap<&str, usize>,
    plan: &ArrayPlan,
) -> (String, String) {
    let array = array_of.get(point.key.as_str());
    let what = match (decision, array) {
        (Decision::Skip(state), _) => format!("skip ({})", state),
        (Decision::FinishedDiverged(first), _) => {
            format!("skip (COMPLETED, diverged at step {first})")
        }
        (Decision::DataChanged(_), _) => "skip (data changed)".to_string(),
        (Decision::TrainedPast(state, step), _) => {
            format!("skip ({} at step {step})", state)
        }
        (Decision::Diverged(_, first), _) => format!("skip (diverged at step {first})"),
        (Decision::NotARun, _) => "skip (folder not a run)".to_string(),
        (Decision::CheckpointUnreadable(_), _) => "skip (checkpoint unreadable)".to_string(),
        (_, None) => "wait (no room now)".to_string(),
        (Decision::New, Some(_)) => "submit (new)".to_string(),
        (Decision::Retry(state, Anew(false)), Some(_)) => format!("submit (was {})", state),
        (Decision::Retry(state, Anew(true)), Some(_)) => {
            format!("submit (was {}, anew)", state)
        }
    };
    let array = array
        .map(|k| format!("array {}/{}", k + 1, plan.arrays.len()))
        .unwrap_or_default();
    (what, array)
}

/// The arrays a dry run would submit.
fn print_arrays(plan: &ArrayPlan, throttle: Option<u32>, skipped: usize) {
    outln!(
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
        outln!(
            "  array {}/{}: {} point(s), --array={}{after}",
            k + 1,
            plan.arrays.len(),
            range.len(),
            array_range(range.len(), throttle),
        );
    }
}

/// `0-<n-1>` with `%throttle`.
fn array_range(tasks: usize, throttle: Option<u32>) -> String {
    match throttle {
        Some(t) => format!("0-{}%{t}", tasks - 1),
        None => format!("0-{}", tasks - 1),
    }
}

/// Points that keep their run directories, taking changes a resumed run may take.
/// The changes carried points take, and what a re-shaped LR schedule does where they
/// continue; `going`: points still queued or running, which go on as they were submitted;
/// `held_back`: points not submitted for what their folders hold (diverged, ...), said below.
fn report_carried(
    carried: &[sweeps::carried::Carried],
    going: &std::collections::HashSet<&str>,
    held_back: &std::collections::HashSet<&str>,
) {
    if carried.is_empty() {
        return;
    }
    let mut counts: std::collections::BTreeMap<String, usize> = Default::default();
    for change in carried.iter().flat_map(|c| &c.changes) {
        *counts.entry(change.to_string()).or_default() += 1;
    }
    outln!(
        "{} point(s) keep their run directories and take changes a resumed run may take \
         (finished ones continue from their checkpoints only when they are to train longer):",
        carried.len()
    );
    for (change, points) in counts {
        outln!("  {change} ({points} point(s))");
    }
    let (waiting, now): (Vec<_>, Vec<_>) = carried
        .iter()
        .partition(|c| going.contains(c.point.as_str()));
    let (kept, now): (Vec<_>, Vec<_>) = now
        .into_iter()
        .partition(|c| held_back.contains(c.point.as_str()));
    let reshaped: Vec<_> = now.iter().filter_map(|c| c.lr_change.as_ref()).collect();
    if let Some(first) = reshaped.first() {
        outln!(
            "  {} point(s) continue on a re-shaped LR schedule; the first: {first}",
            reshaped.len()
        );
    }
    if !waiting.is_empty() {
        outln!(
            "  {} of them are queued or running: their jobs go on as submitted, and take the \
             changes when `shardrun sweep` next submits them (run it again once they have ended)",
            waiting.len()
        );
    }
    if !kept.is_empty() {
        outln!(
            "  {} of them are not submitted (said below): they take the changes only if they \
             are submitted later",
            kept.len()
        );
    }
}

/// Runs in the sweep folder that no point matches any more, and why: a point is its whole
/// resolved job, so a changed value anywhere in the spec makes new points.
fn report_stale(sweep_dir: &Path, points: &[SweepPoint]) {
    let current: std::collections::HashSet<PathBuf> =
        points.iter().map(|p| sweep_dir.join(&p.name)).collect();
    let stale: Vec<RunDir> = slurm::find_runs(sweep_dir)
        .into_iter()
        .filter(|r| !current.contains(r.path()))
        .collect();
    if stale.is_empty() {
        return;
    }
    outln!(
        "{} run(s) in {} belong to no current point; left as they are",
        stale.len(),
        sweep_dir.display()
    );
    for line in stale_reasons(&stale, points) {
        outln!("  {line}");
    }
}

/// What changed for stale runs: against the current point with the same swept values, the
/// fields that made its point new (changes a resumed run may take only when the run, finished,
/// cannot continue); else that the point continues in another of the sweep's directories, or
/// that their swept values left the sweep.
fn stale_reasons(stale: &[RunDir], points: &[SweepPoint]) -> Vec<String> {
    let by_values: HashMap<String, &SweepPoint> = points
        .iter()
        .map(|p| (sweeps::carried::values_key(&p.params), p))
        .collect();
    // (change, why a finished run cannot continue, whether the point has a run of its own
    // already: it was submitted before, or the spec went back to values it had) → runs.
    let mut changed: std::collections::BTreeMap<(String, Option<&str>, bool), usize> =
        Default::default();
    let (mut dropped, mut elsewhere) = (Vec::new(), 0);
    for run in stale {
        let Ok(manifest) = run.read_manifest() else {
            continue;
        };
        let Some(point) = by_values.get(&sweeps::carried::values_key(&manifest.sweep_params))
        else {
            dropped.push(manifest.sweep_params);
            continue;
        };
        let Ok(recorded) = run.read_resolved() else {
            continue;
        };
        let now = sweeps::carried::as_run_of(point, run.path());
        let finished = sweeps::carried::cannot_continue(run, manifest.state, &recorded, point);
        let causes: Vec<_> = rerun::changes::between(&recorded, &now)
            .into_iter()
            .filter(|c| !c.safe || finished.is_some())
            .collect();
        if causes.is_empty() {
            elsewhere += 1;
        }
        let returning = run
            .path()
            .parent()
            .is_some_and(|folder| RunDir::open(&folder.join(&point.name)).is_ok());
        for change in causes {
            *changed
                .entry((change.to_string(), finished, returning))
                .or_default() += 1;
        }
    }
    let mut lines: Vec<String> = changed
        .into_iter()
        .map(
            |((change, finished, returning), runs)| match (finished, returning) {
                (_, true) => format!(
                    "{change} ({runs} run(s)): the points with their swept values now are other \
                 runs, which have run directories of their own"
                ),
                (Some(why), false) => format!(
                    "{change} ({runs} finished run(s)): {why}, so their points are new, trained \
                 from step 1"
                ),
                (None, false) => {
                    format!("{change} ({runs} run(s)): their points are new, trained from step 1")
                }
            },
        )
        .collect();
    if elsewhere > 0 {
        lines.push(format!(
            "{elsewhere} run(s) have the swept values of points that continue in other run \
             directories of the sweep"
        ));
    }
    if !dropped.is_empty() {
        // Named by their values, the first few, in the notation and order of the sweep's
        // table (a run without recorded values has none to name).
        const NAMED: usize = 4;
        let current: Vec<sweeps::labels::PointParams> =
            points.iter().map(|p| p.params.clone()).collect();
        let columns = crate::sweeps::labels::ParamColumns::given_alongside(&dropped, &current);
        dropped.sort_by(|a, b| columns.order(a, b));
        let valued: Vec<&sweeps::labels::PointParams> =
            dropped.iter().filter(|params| !params.is_empty()).collect();
        let mut named: Vec<String> = valued
            .iter()
            .take(NAMED)
            .map(|params| columns.label(params))
            .collect();
        if valued.len() > NAMED {
            named.push(format!("{} more", valued.len() - NAMED));
        }
        let named = match named.is_empty() {
            true => String::new(),
            false => format!(" ({})", named.join("; ")),
        };
        lines.push(format!(
            "{} run(s) have swept values the sweep no longer gives{named}",
            dropped.len()
        ));
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stale_runs_say_whether_the_points_with_their_values_are_new_or_have_runs_already() {
        let dir = tempfile::tempdir().unwrap();
        let spec = include_str!("../../../examples/sweep.yaml");
        let wide = crate::sweeps::point_dirs::written_points(dir.path(), spec);
        let narrow_spec = spec.replace("hidden_dim: 256", "hidden_dim: 128");
        let loaded = crate::spec::parse(&narrow_spec, Path::new("sweep.yaml")).unwrap();
        let narrow = sweeps::expand(&loaded, &crate::resolve::Overrides::submitting()).unwrap();
        // The spec's hidden_dim changed: the points are new, not written yet.
        let lines = stale_reasons(&wide, &narrow);
        assert_eq!(
            lines,
            ["training.model.hidden_dim: 256 → 128 (12 run(s)): their points are new, trained from step 1"]
        );
        // Back to what it was, once the narrow points ran: the wide ones go on in their own
        // directories, which exist.
        let narrow_runs = crate::sweeps::point_dirs::written_points(dir.path(), &narrow_spec);
        let loaded = crate::spec::parse(spec, Path::new("sweep.yaml")).unwrap();
        let wide_points =
            sweeps::expand(&loaded, &crate::resolve::Overrides::submitting()).unwrap();
        let lines = stale_reasons(&narrow_runs, &wide_points);
        assert_eq!(
            lines,
            [
                "training.model.hidden_dim: 128 → 256 (12 run(s)): the points with their swept \
              values now are other runs, which have run directories of their own"
            ]
        );
    }
}
