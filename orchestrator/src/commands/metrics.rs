//! `shardrun metrics <run or sweep dir> [--json] [--stragglers]`: the latest metrics of one
//! run, or of every run under a directory (a sweep), as a table or one JSON document; with
//! `--stragglers`, which ranks held each run back.

use crate::events_file;
use crate::exit::{ExitCode, EXIT_NO_RUN};
use crate::job_controller::console::group_thousands;
use crate::metrics_file::{self, EvalRecord};
use crate::rundir::{Manifest, RunDir, RunState};
use crate::slurm::died;
use crate::step_record::StepRecord;
use crate::stragglers::{self, JudgedBy, StragglerReport};
use crate::sweeps::journal::CurrentPoints;
use crate::sweeps::labels::{marked_superseded, ParamColumns, SUPERSEDED_NOTE};
use serde::Serialize;
use shardrun_protocol::messages::{grad_norm_text, loss_text};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Version of the `--json` documents; bumped only when a field changes meaning or goes.
pub const JSON_VERSION: u32 = 1;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Run directories, or directories of run directories (a sweep), one table for all.
    #[arg(required = true)]
    pub paths: Vec<PathBuf>,
    /// Print one JSON document instead of a table (fields: docs/cli.md).
    #[arg(long)]
    pub json: bool,
    /// Which ranks were slowest, how often and by how much, instead of the latest values.
    #[arg(long)]
    pub stragglers: bool,
}

/// One run's latest metrics, as `--json` prints them.
#[derive(Debug, Serialize)]
pub struct RunMetricsSummary {
    pub name: String,
    pub run_dir: PathBuf,
    /// `succeeded`, `failed`, `cancelled`, `preempted` (from result.json; `timed out`, `out of
    /// memory`, `node failed` where Slurm said more), else `queued` (a
    /// Slurm job not started yet, or requeued by its controller), `running`, `died` (a local
    /// run whose controller is gone:
    /// [`died`]) or `not started`.
    pub status: String,
    /// Steps the run trains for.
    pub total_steps: Option<u64>,
    /// Step records in metrics.jsonl (after replays).
    pub steps_logged: u64,
    /// Sweep points: the parameters the sweep gave this run.
    pub sweep_params: BTreeMap<String, serde_json::Value>,
    /// A run in a sweep folder that is not a point of the spec `shardrun sweep` last
    /// submitted there: left from an earlier version of it.
    pub superseded: bool,
    /// The latest step record (every field of metrics.jsonl, absent ones as null), or null.
    pub latest: Option<serde_json::Value>,
    /// The same record, typed (for the table).
    #[serde(skip)]
    pub record: Option<StepRecord>,
    /// The latest evaluation on held-out data, or null.
    pub eval: Option<EvalJson>,
    /// The step from which the run diverged (its loss or gradients NaN or inf, as `status`,
    /// re-runs and sweeps judge it), or null.
    pub diverged_from: Option<u64>,
    /// The run's pace over its logged steps, or null.
    pub mean: Option<MeanPace>,
}

/// The pace of a run over its logged steps but the first of each attempt (its allocations
/// warm up), as its summary line says it: the job's tokens over the time its steps took,
/// not a mean of each step's rate (one slow step weighs as the time it took). What the
/// table compares runs by: one step's figures vary too much from step to step.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MeanPace {
    /// Step records it is taken over.
    pub steps: u64,
    pub tokens_per_s: f64,
    /// The tokens in the loss, per second (real data only).
    pub trained_tokens_per_s: Option<f64>,
    /// GPU runs with a known peak.
    pub mfu: Option<f64>,
    /// The slowest rank's step time, averaged.
    pub step_time_s: f64,
}

impl MeanPace {
    /// Over `steps` (a run's records in step order) but step 1 and those of `warm_ups` (the
    /// first steps of attempts), unless no other is left; `None` without a step whose rate
    /// was measured. Step 1 is named apart: files of the old layout mark no warm-ups.
    pub fn of(steps: &[StepRecord], warm_ups: &BTreeSet<u64>) -> Option<MeanPace> {
        let steady: Vec<&StepRecord> = steps
            .iter()
            .filter(|r| r.step != 1 && !warm_ups.contains(&r.step))
            .collect();
        let steady = match steady.is_empty() {
            true => steps.iter().collect(),
            false => steady,
        };
        // A step's time is its tokens over its rate: summed as `1 / rate` (the tokens of a
        // step are the same every step).
        let timed: Vec<&StepRecord> = steady
            .into_iter()
            .filter(|r| r.tokens_per_s.is_finite() && r.tokens_per_s > 0.0)
            .collect();
        let inverse: f64 = timed.iter().map(|r| 1.0 / r.tokens_per_s).sum();
        if timed.is_empty() || inverse <= 0.0 {
            return None;
        }
        let n = timed.len() as f64;
        // Per unit of time, weighted as `1 / rate` weighs each step.
        let weighted = |value: &dyn Fn(&StepRecord) -> Option<f64>| -> Option<f64> {
            let all: Option<Vec<f64>> = timed
                .iter()
                .map(|r| value(r).map(|v| v / r.tokens_per_s))
                .collect();
            Some(all?.iter().sum::<f64>() / inverse)
        };
        Some(MeanPace {
            steps: timed.len() as u64,
            tokens_per_s: n / inverse,
            trained_tokens_per_s: weighted(&|r| r.trained_tokens_per_s),
            mfu: weighted(&|r| r.mfu),
            step_time_s: timed.iter().map(|r| r.step_time_max_s).sum::<f64>() / n,
        })
    }
}

#[derive(Debug, Serialize)]
pub struct EvalJson {
    pub step: u64,
    pub eval_loss: f64,
    pub eval_perplexity: Option<f64>,
}

impl From<&EvalRecord> for EvalJson {
    fn from(e: &EvalRecord) -> Self {
        EvalJson {
            step: e.step,
            eval_loss: e.eval_loss,
            eval_perplexity: e.eval_perplexity,
        }
    }
}

#[derive(Serialize)]
struct Document<T: Serialize> {
    version: u32,
    runs: Vec<T>,
}

#[derive(Serialize)]
struct StragglerJson {
    name: String,
    run_dir: PathBuf,
    #[serde(flatten)]
    report: StragglerReport,
}

pub fn execute(args: Args) -> anyhow::Result<()> {
    let mut runs = Vec::new();
    for path in &args.paths {
        runs.extend(find_runs(path)?);
    }
    if args.stragglers {
        let reports: Vec<StragglerJson> = runs
            .iter()
            .map(|run| {
                let metrics = metrics_file::read(&run.metrics()).unwrap_or_default();
                if let Some(damage) = metrics.damage(still_logging(run)) {
                    errln!("warning: {}: {damage}", run.metrics().display());
                }
                StragglerJson {
                    name: name_of(run),
                    run_dir: run.path().to_path_buf(),
                    report: stragglers::analyse(
                        &metrics.steps,
                        &stragglers::starts(&events_file::read(&run.events()).unwrap_or_default()),
                        &metrics.warm_ups,
                    ),
                }
            })
            .collect();
        if args.json {
            print_json(&reports)?;
        } else {
            for r in &reports {
                out!("{}", straggler_text(&r.name, &r.report));
            }
        }
        return Ok(());
    }
    let mut summaries = summaries(&runs);
    if args.json {
        // A sweep's points in the order of their values, as the table lists them.
        ParamColumns::given(summaries.iter().map(|r| &r.sweep_params)).sort(
            &mut summaries,
            |r| &r.run_dir,
            |r| &r.sweep_params,
        );
        return print_json(&summaries);
    }
    out!("{}", metrics_table(&summaries));
    Ok(())
}

fn print_json<T: Serialize>(runs: &[T]) -> anyhow::Result<()> {
    let doc = Document {
        version: JSON_VERSION,
        runs: runs.iter().collect(),
    };
    outln!("{}", serde_json::to_string_pretty(&doc)?);
    Ok(())
}

/// Run directories at `path` (itself, or those below it), or the error scripts can tell
/// from a failure ([`EXIT_NO_RUN`]).
pub fn find_runs(path: &Path) -> anyhow::Result<Vec<RunDir>> {
    let (runs, unreadable) = crate::slurm::find_runs_and_unreadable(path);
    for folder in &unreadable {
        errln!("warning: {}", crate::slurm::unreadable_warning(folder));
    }
    if runs.is_empty() {
        return Err(anyhow::Error::new(ExitCode(EXIT_NO_RUN)).context(format!(
            "no run directories at {} (a run directory holds manifest.json)\n  fix: pass a run \
             directory or a sweep folder, or start a run with `shardrun run job.yaml` or \
             `shardrun submit job.yaml`",
            path.display()
        )));
    }
    Ok(runs)
}

fn name_of(run: &RunDir) -> String {
    run.path()
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// Every run's summary, each sweep folder's current points read once.
pub fn summaries(runs: &[RunDir]) -> Vec<RunMetricsSummary> {
    let mut current = CurrentPoints::default();
    runs.iter()
        .map(|run| summarise(run, &mut current))
        .collect()
}

/// The run's state as the table says it (`succeeded`, `running`, `queued`, `died`, ...):
/// its manifest, with its controller's result and whether it still holds the run.
fn status_of(run: &RunDir, manifest: Option<&Manifest>) -> String {
    // The run's end as the manifest has it: the controller's, or later news of the run (a
    // requeued job cancelled before it ran again ends `cancelled`, whatever its last attempt's
    // result.json says).
    let ended = manifest
        .map(|m| m.state)
        .filter(|state| state.is_terminal())
        .map(|state| match state {
            RunState::Completed => "succeeded",
            RunState::Cancelled => "cancelled",
            RunState::Preempted => "preempted",
            RunState::SubmitFailed => "submit failed",
            // Slurm's word for how the job ended, where it says more than "failed".
            RunState::Timeout => "timed out",
            RunState::OutOfMemory => "out of memory",
            RunState::NodeFail => "node failed",
            _ => "failed",
        });
    let verdict = std::fs::read_to_string(run.result())
        .ok()
        .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok());
    // Preempted and requeued by its controller, with no later news: queued to run again.
    let requeued = ended == Some("preempted") && crate::slurm::requeued_by_its_controller(run);
    let result = verdict.and_then(|v| v["status"].as_str().map(str::to_string));
    match (result, ended) {
        _ if requeued => "queued".into(),
        (Some(result), Some(ended)) if result != ended => ended.into(),
        (Some(result), _) => result,
        // A run that ended before its controller could write result.json (its data could
        // not be prepared, say) has its end in the manifest.
        (None, Some(ended)) => ended.into(),
        (None, None) if manifest.is_some_and(|m| died(run, m).is_some()) => "died".into(),
        // Submitted and not started yet (its controller writes RUNNING when it starts): what
        // an earlier attempt logged is no sign of running.
        (None, None) if manifest.is_some_and(|m| m.state == RunState::Submitted) => "queued".into(),
        (None, None) if run.train_log().exists() => "running".into(),
        (None, None) => "not started".into(),
    }
}

/// Whether the run may still append to its metrics (a partial last line is being written).
pub fn still_logging(run: &RunDir) -> bool {
    matches!(
        status_of(run, run.read_manifest().ok().as_ref()).as_str(),
        "running" | "queued"
    )
}

fn summarise(run: &RunDir, current: &mut CurrentPoints) -> RunMetricsSummary {
    let manifest = run.read_manifest().ok();
    let status = status_of(run, manifest.as_ref());
    let metrics = metrics_file::read(&run.metrics()).unwrap_or_default();
    let still_written = matches!(status.as_str(), "running" | "queued");
    if let Some(damage) = metrics.damage(still_written) {
        errln!("warning: {}: {damage}", run.metrics().display());
    }
    RunMetricsSummary {
        name: name_of(run),
        run_dir: run.path().to_path_buf(),
        status,
        total_steps: run.read_train_config().ok().map(|c| c.steps),
        steps_logged: metrics.steps.len() as u64,
        sweep_params: manifest.map(|m| m.sweep_params).unwrap_or_default(),
        superseded: current.superseded(run.path()),
        latest: metrics.steps.last().map(StepRecord::to_json_complete),
        record: metrics.steps.last().cloned(),
        eval: metrics.evals.last().map(EvalJson::from),
        diverged_from: metrics.diverged_from().map(|d| d.step),
        mean: MeanPace::of(&metrics.steps, &metrics.warm_ups),
    }
}

/// One row per run: its name, the values a sweep gave it (a column per parameter), its
/// status and latest figures. `lr now` is the scheduled LR of the latest step, apart from a
/// swept `lr`, the peak the schedule started from.
fn metrics_table(runs: &[RunMetricsSummary]) -> String {
    let with_eval = runs.iter().any(|r| r.eval.is_some());
    // Data with a loss mask (prompt/completion, chat) trains on fewer tokens than it reads.
    let with_trained = runs.iter().any(|r| {
        r.record
            .as_ref()
            .is_some_and(|m| m.trained_tokens_per_s.is_some())
    });
    let siblings = crate::sweeps::labels::unlisted_siblings(
        runs.iter()
            .filter(|r| !r.sweep_params.is_empty())
            .map(|r| r.run_dir.as_path()),
    );
    let params = ParamColumns::given_alongside(runs.iter().map(|r| &r.sweep_params), &siblings);
    let mut runs: Vec<&RunMetricsSummary> = runs.iter().collect();
    params.sort(&mut runs, |r| &r.run_dir, |r| &r.sweep_params);
    let mut header = vec!["run"];
    header.extend(params.names());
    header.extend(["status", "step", "loss", "lr now", "grad norm"]);
    if with_eval {
        header.extend(["eval loss", "ppl"]);
    }
    header.push("tokens/s");
    if with_trained {
        header.push("trained/s");
    }
    header.extend(["MFU", "step time", "peak mem"]);
    let dash = || "-".to_string();
    let rows: Vec<Vec<String>> = runs
        .iter()
        .map(|run| {
            let mut row = vec![if run.superseded {
                marked_superseded(&run.name)
            } else {
                run.name.clone()
            }];
            row.extend(
                params
                    .cells(&run.sweep_params)
                    .into_iter()
                    .map(|cell| cell.unwrap_or_else(dash)),
            );
            row.push(match run.diverged_from {
                Some(_) if run.status == "succeeded" => "diverged".into(),
                Some(_) => format!("{}, diverged", run.status),
                None => run.status.clone(),
            });
            let latest = run.record.as_ref();
            row.push(match (latest, run.total_steps) {
                (Some(m), Some(t)) => format!("{}/{t}", m.step),
                (Some(m), None) => m.step.to_string(),
                (None, _) => dash(),
            });
            let field = |f: &dyn Fn(&StepRecord) -> String| latest.map(f).unwrap_or_else(dash);
            row.push(field(&|m| loss_text(m.loss())));
            row.push(field(&|m| format!("{:.2e}", m.lr)));
            row.push(field(&|m| grad_norm_text(m.grad_norm)));
            if with_eval {
                match &run.eval {
                    Some(e) => {
                        // An evaluation older than the latest step says which step it is of.
                        row.push(match latest {
                            Some(m) if m.step != e.step => {
                                format!("{:.4} (step {})", e.eval_loss, e.step)
                            }
                            _ => format!("{:.4}", e.eval_loss),
                        });
                        row.push(
                            e.eval_perplexity
                                .map(|p| format!("{p:.2}"))
                                .unwrap_or_else(dash),
                        );
                    }
                    None => row.extend([dash(), dash()]),
                }
            }
            // The run's pace, not its latest step's: runs are compared by it.
            let pace = |f: &dyn Fn(&MeanPace) -> Option<String>| {
                run.mean.as_ref().and_then(f).unwrap_or_else(dash)
            };
            row.push(pace(&|p| Some(group_thousands(p.tokens_per_s))));
            if with_trained {
                row.push(pace(&|p| p.trained_tokens_per_s.map(group_thousands)));
            }
            row.push(pace(&|p| p.mfu.map(|x| format!("{:.1}%", x * 100.0))));
            // The slowest rank's, as tokens/s is: the job moves at its pace.
            row.push(pace(&|p| Some(format_seconds(p.step_time_s))));
            row.push(field(&|m| {
                format!("{:.0} MiB", m.peak_memory_max_bytes as f64 / 1048576.0)
            }));
            row
        })
        .collect();
    let mut text = table(&header, &rows, 2 + params.len());
    if runs.iter().any(|r| r.superseded) {
        text.push_str(SUPERSEDED_NOTE);
        text.push('\n');
    }
    text
}

/// `0.0123` → `12.3 ms`, `2.5` → `2.50 s`.
fn format_seconds(s: f64) -> String {
    if s < 1.0 {
        format!("{:.1} ms", s * 1000.0)
    } else {
        format!("{s:.2} s")
    }
}

fn straggler_text(name: &str, r: &StragglerReport) -> String {
    let mut out = format!("{name}: {} step records, {} rank(s)", r.steps, r.ranks);
    match r.first_step.filter(|_| !r.earlier.is_empty()) {
        Some(first) => out.push_str(&format!(", from step {first}\n")),
        None => out.push('\n'),
    }
    for segment in &r.earlier {
        out.push_str(&format!(
            "  steps {}-{} ran on {} rank(s): not judged (other processes held those ranks)\n",
            segment.first_step, segment.last_step, segment.ranks
        ));
    }
    if !r.warm_ups_not_judged.is_empty() {
        let steps: Vec<String> = r.warm_ups_not_judged.iter().map(u64::to_string).collect();
        out.push_str(&format!(
            "  warm-up step(s) not judged (the first of each attempt): {}\n",
            steps.join(", ")
        ));
    }
    if r.slowest_ranks.is_empty() {
        out.push_str("  no step with more than one rank reporting: nothing to compare\n");
        return out;
    }
    out.push_str(match r.judged_by {
        JudgedBy::BusyTime => {
            "  ranks compared by busy time: each rank's step less its wait for the others\n"
        }
        JudgedBy::StepTime => {
            "  ranks compared by step time, which every rank ends together: a straggler hardly \
             shows (GPU ranks report no busy time)\n"
        }
    });
    out.push_str(&format!(
        "  slowest rank vs median rank: +{:.1}% at the median step, +{:.1}% at the 90th percentile\n",
        r.spread_median * 100.0,
        r.spread_p90 * 100.0
    ));
    if let Some(w) = &r.worst {
        out.push_str(&format!(
            "  worst step: {} (rank {} took {} against a median of {})\n",
            w.step,
            w.rank,
            format_seconds(w.time_max_s),
            format_seconds(w.time_median_s)
        ));
    }
    if let (Some(rank), Some(bytes)) = (r.peak_memory_max_rank, r.peak_memory_max_bytes) {
        out.push_str(&format!(
            "  most memory: rank {rank} ({:.0} MiB peak at the latest step)\n",
            bytes as f64 / 1048576.0
        ));
    }
    let expected = 100.0 / r.ranks.max(1) as f64;
    out.push_str(&format!(
        "  slowest rank of a step (by chance each rank would be about {expected:.0}% of the steps):\n"
    ));
    let header = ["rank", "steps", "share", "mean excess", "last step"];
    let rows: Vec<Vec<String>> = r
        .slowest_ranks
        .iter()
        .take(10)
        .map(|s| {
            vec![
                s.rank.to_string(),
                s.times.to_string(),
                format!("{:.0}%", s.share * 100.0),
                format_seconds(s.mean_excess_s),
                s.last_step.to_string(),
            ]
        })
        .collect();
    for line in table(&header, &rows, 2).lines() {
        out.push_str(&format!("    {line}\n"));
    }
    if r.slowest_ranks.len() > 10 {
        out.push_str(&format!(
            "    ... and {} more rank(s)\n",
            r.slowest_ranks.len() - 10
        ));
    }
    out
}

/// The first `names` columns left-aligned, the figures after them right-aligned.
fn table(header: &[&str], rows: &[Vec<String>], names: usize) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<String>| {
        let mut out = String::new();
        for (i, (cell, w)) in cells.iter().zip(&widths).enumerate() {
            if i > 0 {
                out.push_str("  ");
            }
            if i < names {
                out.push_str(&format!("{cell:<w$}"));
            } else {
                out.push_str(&format!("{cell:>w$}"));
            }
        }
        out.trim_end().to_string() + "\n"
    };
    let mut out = line(header.iter().map(|h| h.to_string()).collect());
    for row in rows {
        out.push_str(&line(row.clone()));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn summary(run: &RunDir) -> RunMetricsSummary {
        summarise(run, &mut CurrentPoints::default())
    }
    use std::collections::BTreeSet;

    #[test]
    fn aligned_table() {
        let t = table(
            &["run", "status", "loss"],
            &[
                vec!["a".into(), "ok".into(), "1.5".into()],
                vec!["long-name".into(), "failed".into(), "10.25".into()],
            ],
            2,
        );
        assert_eq!(
            t,
            "run        status   loss\na          ok        1.5\nlong-name  failed  10.25\n"
        );
    }

    #[test]
    fn a_local_run_whose_controller_is_gone_has_died() {
        let dir = tempfile::tempdir().unwrap();
        let run = crate::rundir::running_local_run(dir.path());
        std::fs::write(run.train_log(), "step 708\n").unwrap();
        let lock = crate::rundir::RunLock::acquire(run.path()).unwrap();
        assert_eq!(summary(&run).status, "running");
        drop(lock);
        assert_eq!(summary(&run).status, "died");
    }

    #[test]
    fn a_run_that_ended_before_its_controller_wrote_a_result_has_its_end_from_the_manifest() {
        // Its data could not be prepared: no result.json, no train.log; the manifest says.
        let dir = tempfile::tempdir().unwrap();
        let run = crate::rundir::running_local_run(dir.path());
        assert_eq!(summary(&run).status, "died");
        run.update_manifest(|m| {
            m.state = RunState::Failed;
            m.error = Some("preparing the training data: no field `body`".into());
        })
        .unwrap();
        assert_eq!(summary(&run).status, "failed");
        run.update_manifest(|m| m.state = RunState::Cancelled)
            .unwrap();
        assert_eq!(summary(&run).status, "cancelled");
    }

    #[test]
    fn a_run_slurm_ended_says_how_where_result_json_says_only_failed() {
        // Killed at its time limit: its controller wrote `failed` as the signal came.
        let dir = tempfile::tempdir().unwrap();
        let run = crate::rundir::running_local_run(dir.path());
        std::fs::write(run.result(), r#"{"status":"failed","requeued":false}"#).unwrap();
        for (state, said) in [
            (RunState::Timeout, "timed out"),
            (RunState::OutOfMemory, "out of memory"),
            (RunState::NodeFail, "node failed"),
            (RunState::Failed, "failed"),
        ] {
            run.update_manifest(|m| m.state = state).unwrap();
            assert_eq!(summary(&run).status, said, "{state}");
        }
    }

    #[test]
    fn a_resubmitted_run_waiting_in_the_queue_is_queued_not_running() {
        let dir = tempfile::tempdir().unwrap();
        let run = crate::rundir::running_local_run(dir.path());
        // Its first attempt logged steps; submitting it again cleared result.json.
        std::fs::write(run.train_log(), "step 273\n").unwrap();
        run.update_manifest(|m| {
            m.state = RunState::Submitted;
            m.slurm_job_ids = vec!["33_0".into()];
        })
        .unwrap();
        assert_eq!(summary(&run).status, "queued");
        run.update_manifest(|m| m.state = RunState::Running)
            .unwrap();
        assert_eq!(summary(&run).status, "running");
    }

    #[test]
    fn a_run_its_controller_requeued_is_queued_until_it_runs_again() {
        let dir = tempfile::tempdir().unwrap();
        let run = crate::rundir::running_local_run(dir.path());
        run.update_manifest(|m| m.state = RunState::Preempted)
            .unwrap();
        std::fs::write(run.result(), r#"{"status":"preempted","requeued":true}"#).unwrap();
        assert_eq!(summary(&run).status, "queued");
        std::fs::write(run.result(), r#"{"status":"preempted","requeued":false}"#).unwrap();
        assert_eq!(summary(&run).status, "preempted");
    }

    #[test]
    fn a_requeued_run_cancelled_before_it_ran_again_is_cancelled_not_preempted() {
        let dir = tempfile::tempdir().unwrap();
        let run = crate::rundir::running_local_run(dir.path());
        // Its last attempt checkpointed and asked Slurm to queue it again.
        std::fs::write(run.result(), r#"{"status":"preempted","requeued":true}"#).unwrap();
        run.update_manifest(|m| m.state = RunState::Preempted)
            .unwrap();
        assert_eq!(summary(&run).status, "queued");
        // `shardrun cancel` while it waited: the manifest has the news.
        run.update_manifest(|m| m.state = RunState::Cancelled)
            .unwrap();
        assert_eq!(summary(&run).status, "cancelled");
    }

    /// `steps` step records whose scheduled LR falls from `peak` to a tenth of it.
    fn write_steps(run: &RunDir, peak: f64, steps: u64) {
        use shardrun_protocol::messages::StepMetrics;
        let lines: Vec<String> = (1..=steps)
            .map(|step| {
                let decay = 1.0 - 0.9 * (step - 1) as f64 / (steps - 1) as f64;
                let record = StepRecord::fold(
                    &[StepMetrics {
                        step,
                        loss: 2.0,
                        lr: peak * decay,
                        grad_norm: 1.0,
                        step_time_s: 0.1,
                        tokens_per_s: 100.0,
                        model_state_bytes: 1,
                        peak_memory_bytes: 1 << 20,
                        ..Default::default()
                    }],
                    0.0,
                );
                serde_json::to_string(&record).unwrap()
            })
            .collect();
        std::fs::write(run.metrics(), lines.join("\n") + "\n").unwrap();
    }

    /// The table's cells by column name (cells hold at most single spaces).
    fn cells(table: &str) -> Vec<BTreeMap<String, String>> {
        let split = |line: &str| -> Vec<String> {
            line.split("  ")
                .map(str::trim)
                .filter(|c| !c.is_empty())
                .map(str::to_string)
                .collect()
        };
        let mut lines = table.lines();
        let header = split(lines.next().unwrap());
        lines
            .map(|line| header.iter().cloned().zip(split(line)).collect())
            .collect()
    }

    #[test]
    fn a_sweep_names_each_point_by_its_values_apart_from_the_scheduled_lr() {
        let dir = tempfile::tempdir().unwrap();
        let points = crate::sweeps::point_dirs::written_points(
            dir.path(),
            include_str!("../../../examples/sweep.yaml"),
        );
        assert_eq!(points.len(), 12);
        for run in &points {
            let params = run.read_manifest().unwrap().sweep_params;
            write_steps(run, params["training.optimizer.lr"].as_f64().unwrap(), 5);
        }
        let summaries = summaries(&find_runs(dir.path()).unwrap());
        let text = metrics_table(&summaries);
        assert!(
            text.starts_with("run  ") && text.lines().next().unwrap().contains("  lr now  "),
            "{text}"
        );
        let header: Vec<&str> = text
            .lines()
            .next()
            .unwrap()
            .split("  ")
            .map(str::trim)
            .filter(|c| !c.is_empty())
            .collect();
        assert_eq!(
            header[..6],
            ["run", "lr", "weight_decay", "seed", "status", "step"],
            "{text}"
        );
        let rows = cells(&text);
        assert_eq!(rows.len(), 12);
        for row in &rows {
            let summary = summaries.iter().find(|s| s.name == row["run"]).unwrap();
            let lr = summary.sweep_params["training.optimizer.lr"]
                .as_f64()
                .unwrap();
            assert_eq!(row["lr"], format!("{lr:e}"), "{text}");
            assert_eq!(row["lr now"], format!("{:.2e}", lr * 0.1), "{text}");
        }
        // Listed by value, not by their folders' hashed names.
        let values: Vec<(f64, f64, u64)> = rows
            .iter()
            .map(|row| {
                (
                    row["lr"].parse().unwrap(),
                    row["weight_decay"].parse().unwrap(),
                    row["seed"].parse().unwrap(),
                )
            })
            .collect();
        assert!(
            values.windows(2).all(|w| w[0] < w[1]),
            "rows out of order:\n{text}"
        );
        let wanted = [
            "1e-3",
            "0.1",
            "1",
            "not started",
            "5/50",
            "2.0000",
            "1.00e-4",
        ];
        assert!(
            rows.iter().any(|row| {
                [
                    "lr",
                    "weight_decay",
                    "seed",
                    "status",
                    "step",
                    "loss",
                    "lr now",
                ]
                .iter()
                .map(|column| row[*column].as_str())
                .eq(wanted)
            }),
            "no row {wanted:?} in\n{text}"
        );
    }

    #[test]
    fn a_run_outside_a_sweep_has_no_parameter_columns() {
        let dir = tempfile::tempdir().unwrap();
        let run = crate::rundir::running_local_run(dir.path());
        write_steps(&run, 3e-4, 3);
        let text = metrics_table(&[summary(&run)]);
        let rows = cells(&text);
        assert_eq!(
            rows[0].keys().map(String::as_str).collect::<BTreeSet<_>>(),
            BTreeSet::from([
                "run",
                "status",
                "step",
                "loss",
                "lr now",
                "grad norm",
                "tokens/s",
                "MFU",
                "step time",
                "peak mem"
            ]),
            "{text}"
        );
        assert_eq!(rows[0]["lr now"], "3.00e-5");
    }

    #[test]
    fn data_with_a_loss_mask_shows_the_tokens_trained_on() {
        let dir = tempfile::tempdir().unwrap();
        let run = crate::rundir::running_local_run(dir.path());
        // One rank's step appended to the run's metrics.jsonl.
        let append = |m: shardrun_protocol::messages::StepMetrics| {
            let line = serde_json::to_string(&StepRecord::fold(&[m], 0.0)).unwrap() + "\n";
            let mut file = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(run.metrics())
                .unwrap();
            std::io::Write::write_all(&mut file, line.as_bytes()).unwrap();
        };
        append(shardrun_protocol::messages::StepMetrics {
            step: 1,
            loss: 2.0,
            tokens_per_s: 12_000.0,
            trained_tokens_per_s: Some(3_386.4),
            ..Default::default()
        });
        let rows = cells(&metrics_table(&[summary(&run)]));
        assert_eq!(
            (rows[0]["tokens/s"].as_str(), rows[0]["trained/s"].as_str()),
            ("12,000", "3,386")
        );
        assert_eq!(rows[0]["loss"], "2.0000");
        // A step whose batch held no target token has no loss to show. The rates are the
        // run's from its second step on (the first warms up): this one's alone.
        append(shardrun_protocol::messages::StepMetrics {
            step: 2,
            loss: 0.0,
            tokens_per_s: 6_000.0,
            trained_tokens_per_s: Some(0.0),
            ..Default::default()
        });
        let rows = cells(&metrics_table(&[summary(&run)]));
        assert_eq!(
            (
                rows[0]["loss"].as_str(),
                rows[0]["tokens/s"].as_str(),
                rows[0]["trained/s"].as_str()
            ),
            ("-", "6,000", "0")
        );
        // Over steps 2 and 3, the tokens over the time they took (a step at 6,000 tokens/s
        // takes twice as long as one at 12,000): 8,000 tokens/s, of which 1,000 trained.
        append(shardrun_protocol::messages::StepMetrics {
            step: 3,
            loss: 1.5,
            tokens_per_s: 12_000.0,
            trained_tokens_per_s: Some(3_000.0),
            ..Default::default()
        });
        let rows = cells(&metrics_table(&[summary(&run)]));
        assert_eq!(
            (rows[0]["tokens/s"].as_str(), rows[0]["trained/s"].as_str()),
            ("8,000", "1,000")
        );
        // A resumed attempt's first step warms up as the run's first did: left out.
        std::io::Write::write_all(
            &mut std::fs::OpenOptions::new()
                .append(true)
                .open(run.metrics())
                .unwrap(),
            b"{\"resumed_at_step\":3}\n",
        )
        .unwrap();
        for (step, tokens_per_s) in [(4, 100.0), (5, 12_000.0)] {
            append(shardrun_protocol::messages::StepMetrics {
                step,
                loss: 1.5,
                tokens_per_s,
                trained_tokens_per_s: Some(3_000.0),
                ..Default::default()
            });
        }
        // Steps 2, 3 and 5: 3 steps over 1/6,000 + 2/12,000 of a second a token.
        let mean = summary(&run).mean.unwrap();
        assert_eq!((mean.steps, mean.tokens_per_s), (3, 9_000.0));

        // Every fifth step logged: step 1, the warm-up, is not among them, and step 5 counts.
        let fifths: Vec<StepRecord> = [(5, 4_000.0), (10, 12_000.0), (15, 12_000.0)]
            .into_iter()
            .map(|(step, tokens_per_s)| {
                let metrics = shardrun_protocol::messages::StepMetrics {
                    step,
                    loss: 1.5,
                    tokens_per_s,
                    ..Default::default()
                };
                StepRecord::fold(&[metrics], step as f64)
            })
            .collect();
        let mean = MeanPace::of(&fifths, &BTreeSet::new()).unwrap();
        assert_eq!(mean.steps, 3);
        assert!(
            (mean.tokens_per_s - 7_200.0).abs() < 1e-9,
            "{}",
            mean.tokens_per_s
        );
    }

    #[test]
    fn an_evaluation_older_than_the_latest_step_says_its_step() {
        let dir = tempfile::tempdir().unwrap();
        let run = crate::rundir::running_local_run(dir.path());
        write_steps(&run, 3e-4, 5);
        let eval =
            |step| format!("{{\"step\":{step},\"eval_loss\":2.5,\"eval_perplexity\":12.18}}\n");
        let mut file = std::fs::OpenOptions::new()
            .append(true)
            .open(run.metrics())
            .unwrap();
        std::io::Write::write_all(&mut file, eval(3).as_bytes()).unwrap();
        let rows = cells(&metrics_table(&[summary(&run)]));
        assert_eq!(rows[0]["eval loss"], "2.5000 (step 3)");
        std::io::Write::write_all(&mut file, eval(5).as_bytes()).unwrap();
        let rows = cells(&metrics_table(&[summary(&run)]));
        assert_eq!(rows[0]["eval loss"], "2.5000");
    }

    #[test]
    fn a_run_sbatch_refused_reads_submit_failed_not_failed() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("manifest.json"),
            r#"{"version": 1, "name": "refused", "state": "SUBMIT_FAILED", "config_hash": "h", "created_at": 0, "updated_at": 0}"#,
        )
        .unwrap();
        let run = RunDir::open(dir.path()).unwrap();
        assert_eq!(summary(&run).status, "submit failed");
    }

    #[test]
    fn seconds_for_people() {
        assert_eq!(format_seconds(0.0123), "12.3 ms");
        assert_eq!(format_seconds(2.5), "2.50 s");
    }
}
