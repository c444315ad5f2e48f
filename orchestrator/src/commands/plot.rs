//! `shardrun plot <run or sweep folder>`: a run's curves (loss, learning rate, gradient
//! norm, throughput, memory, with its checkpoints, stops and resumes marked), or every
//! point of a sweep with its final loss by parameter, as SVG (default) or PNG (by the
//! output's extension).

use crate::charts::run::RunFigure;
use crate::charts::sweep::{PointProgress, PointRecords, SweepFigure};
use crate::rundir::RunState;
use crate::sweeps::journal::CurrentPoints;
use crate::sweeps::labels::{ParamColumns, PointParams};
use crate::{charts, events_file, metrics_file};
use anyhow::bail;
use shardrun_protocol::messages::loss_text;
use std::path::{Path, PathBuf};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// A run directory, or a sweep folder (a folder of run directories).
    pub run: PathBuf,
    /// Output file, `.svg` or `.png` (default: `<run>/metrics.svg`, `<sweep>/sweep.svg`).
    #[arg(long, short)]
    pub output: Option<PathBuf>,
    /// Weight of the exponential moving average drawn over the raw curves, as TensorBoard's
    /// smoothing slider (and its default, 0.6: a heavier one lags a short run's curve far
    /// behind its loss): 0 draws the raw curves only, 0.99 smooths heavily.
    #[arg(long, default_value_t = 0.6, value_parser = smoothing)]
    pub smoothing: f64,
    /// Draw the loss on a logarithmic axis.
    #[arg(long)]
    pub log_loss: bool,
    /// A sweep's final-loss panel: the parameter along its axis (its short name, `lr`, or
    /// dotted path), a line per combination of the other swept parameters' values (default:
    /// the parameter with the most values).
    #[arg(long, value_name = "PARAM")]
    pub by: Option<String>,
}

fn smoothing(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(w) if (0.0..1.0).contains(&w) => Ok(w),
        _ => Err(format!(
            "{text} is not a smoothing weight: give a number from 0 (none) up to, not \
             including, 1"
        )),
    }
}

pub fn execute(args: Args) -> anyhow::Result<()> {
    if let Some(output) = &args.output {
        charts::check_format(output)?;
    }
    let is_run = crate::rundir::RunDir::open(&args.run).is_ok();
    if is_run {
        if let Some(by) = &args.by {
            bail!(
                "`--by {by}` picks the axis of a sweep's final-loss panel, and {} is one run\n  \
                 fix: give the sweep's folder, or leave out --by",
                args.run.display()
            );
        }
        return plot_run(&args);
    }
    let runs = crate::commands::metrics::find_runs(&args.run)?;
    plot_sweep(&args, &runs)
}

fn name_of(path: &Path) -> String {
    std::path::absolute(path)
        .ok()
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_default()
}

fn plot_run(args: &Args) -> anyhow::Result<()> {
    let metrics_path = args.run.join("metrics.jsonl");
    if !metrics_path.is_file() {
        bail!(
            "no metrics at {}: has the run logged a step yet?",
            metrics_path.display()
        );
    }
    let metrics = metrics_file::read(&metrics_path)?;
    let still_written = crate::rundir::RunDir::open(&args.run)
        .map_or(true, |run| super::metrics::still_logging(&run));
    if let Some(damage) = metrics.damage(still_written) {
        errln!("warning: {}: {damage}", metrics_path.display());
    }
    if metrics.steps.is_empty() {
        bail!(
            "{} has no metrics records yet; try again after the first step",
            metrics_path.display()
        );
    }
    let events = events_file::read(&args.run.join("events.jsonl"))?;
    let last = metrics.steps.last().map(|r| (r.step, r.loss(), r.ranks));
    let params = crate::rundir::RunDir::open(&args.run)
        .and_then(|run| run.read_manifest())
        .map(|m| m.sweep_params)
        .unwrap_or_default();
    let siblings = if params.is_empty() {
        Vec::new()
    } else {
        crate::sweeps::labels::unlisted_siblings([args.run.as_path()])
    };
    let title = run_title(&name_of(&args.run), &params, &siblings, last);
    let figure = RunFigure {
        title,
        steps: metrics.steps,
        evals: metrics.evals,
        events,
        smoothing: args.smoothing,
        log_loss: args.log_loss,
    };
    let output = args
        .output
        .clone()
        .unwrap_or_else(|| args.run.join("metrics.svg"));
    charts::save(&figure, &output)?;
    let markers = figure.markers().len();
    outln!(
        "wrote {} ({} steps, {markers} event marker{})",
        output.display(),
        figure.steps.len(),
        if markers == 1 { "" } else { "s" }
    );
    Ok(())
}

/// The run's name, the values a sweep gave it (its folder's name is a hash) in the notation
/// its sweep's tables use, and where it stands.
fn run_title(
    name: &str,
    params: &PointParams,
    siblings: &[PointParams],
    last: Option<(u64, Option<f64>, u64)>,
) -> String {
    let mut title = name.to_string();
    if !params.is_empty() {
        let values = ParamColumns::of_point(params, siblings).label(params);
        title.push_str(&format!(" ({values})"));
    }
    if let Some((step, loss, ranks)) = last {
        title.push_str(&format!(
            ": step {step}, loss {}, {ranks} rank(s)",
            loss_text(loss)
        ));
    }
    title
}

fn plot_sweep(args: &Args, runs: &[crate::rundir::RunDir]) -> anyhow::Result<()> {
    let mut points = Vec::new();
    let mut waiting = Vec::new();
    // Curves of an earlier version of the spec would share the legend of current points.
    let (superseded, runs): (Vec<_>, Vec<_>) = {
        let mut current = CurrentPoints::default();
        runs.iter().partition(|r| current.superseded(r.path()))
    };
    if !superseded.is_empty() {
        outln!(
            "left out {} run(s) left from an earlier version of the sweep's spec (not points of the spec `shardrun sweep` last submitted); plot one alone with `shardrun plot <its run directory>`",
            superseded.len()
        );
    }
    for run in runs {
        let (steps, evals) = metrics_file::read(&run.metrics())
            .map(|m| {
                let evals = m.evals.iter().map(|e| (e.step, e.eval_loss)).collect();
                (m.steps, evals)
            })
            .unwrap_or_default();
        let name = name_of(run.path());
        if steps.is_empty() {
            waiting.push(name.clone());
        }
        let manifest = run.read_manifest().ok();
        let progress = progress_of(
            manifest.as_ref().map(|m| m.state),
            crate::slurm::requeued_by_its_controller(run),
        );
        points.push(PointRecords {
            name,
            progress,
            params: manifest.map(|m| m.sweep_params).unwrap_or_default(),
            steps,
            evals,
        });
    }
    if points.is_empty() {
        bail!(
            "every run under {} is left from an earlier version of the sweep's spec; plot one \
             alone with `shardrun plot <its run directory>`",
            args.run.display()
        );
    }
    if waiting.len() == points.len() {
        if points.iter().any(|p| p.progress == PointProgress::Going) {
            bail!(
                "no point under {} has logged a step yet; try again once they run",
                args.run.display()
            );
        }
        bail!(
            "no point under {} logged a step before it ended; `shardrun status {}` says how \
             they ended",
            args.run.display(),
            crate::output::pasteable(&args.run)
        );
    }
    // The points drawn; those without a step are named in the command's output.
    let title = match waiting.len() {
        0 => format!("{}: {} point(s)", name_of(&args.run), points.len()),
        n => format!(
            "{}: {} of {} point(s) ({n} without a step)",
            name_of(&args.run),
            points.len() - n,
            points.len()
        ),
    };
    let figure = SweepFigure {
        title,
        points,
        smoothing: args.smoothing,
        log_loss: args.log_loss,
        by: args.by.clone(),
    };
    // Refused before anything is drawn.
    let axes = figure.final_axes().map_err(|why| anyhow::anyhow!(why))?;
    let output = args
        .output
        .clone()
        .unwrap_or_else(|| args.run.join("sweep.svg"));
    charts::save(&figure, &output)?;
    // A point that diverged has no final loss worth comparing.
    let diverged: Vec<String> = figure
        .sorted(&figure.params())
        .into_iter()
        .filter(|p| crate::metrics_file::has_diverged(&p.steps))
        .map(|p| figure.label(p))
        .collect();
    let unfinished = figure.unfinished_in_final_loss();
    outln!(
        "wrote {} ({} point(s){}{}{}{}{})",
        output.display(),
        figure.points.len() - waiting.len(),
        figure
            .without_steps(PointProgress::Going)
            .map(|names| format!("; not started yet: {names}"))
            .unwrap_or_default(),
        figure
            .without_steps(PointProgress::Stopped)
            .map(|names| format!(
                "; ended before their first step (cancelled, failed, ...; `shardrun status` says \
                 how): {names}"
            ))
            .unwrap_or_default(),
        figure
            .without_steps(PointProgress::Finished)
            .map(|names| format!("; finished, but no steps in their metrics.jsonl: {names}"))
            .unwrap_or_default(),
        if diverged.is_empty() {
            String::new()
        } else {
            format!(
                "; diverged (loss or gradients NaN or inf, or loss blown up){}: {}",
                match figure.has_final_loss() {
                    true => ", so left out of the final-loss panel",
                    false => "",
                },
                charts::sweep::named_at_most(&diverged).unwrap_or_default()
            )
        },
        match axes.as_ref().filter(|_| figure.has_final_loss()) {
            Some((x, lines)) => format!(
                "; final loss by {}{}{}{}",
                x,
                match lines.len() {
                    0 => String::new(),
                    1 => format!(", a line per value of {}", lines[0]),
                    _ => format!(", a line per combination of {}", lines.join(", ")),
                },
                match figure.without_axis_value() {
                    None => String::new(),
                    Some(left) => format!(" (left out, not given {x}: {left})"),
                },
                match unfinished {
                    0 => String::new(),
                    n => format!(" ({n} point(s) not finished: rings at their latest loss)"),
                }
            ),
            None => String::new(),
        }
    );
    Ok(())
}

/// Where a point's run is, from its manifest's state and whether its controller had the
/// job requeued when it was preempted.
fn progress_of(state: Option<RunState>, requeued: bool) -> PointProgress {
    match state {
        Some(RunState::Completed) => PointProgress::Finished,
        Some(RunState::Preempted) if requeued => PointProgress::Going,
        Some(
            RunState::Failed
            | RunState::Cancelled
            | RunState::Timeout
            | RunState::OutOfMemory
            | RunState::NodeFail
            | RunState::SubmitFailed
            | RunState::Preempted,
        ) => PointProgress::Stopped,
        Some(RunState::Created | RunState::Submitted | RunState::Running | RunState::Died)
        | None => PointProgress::Going,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_point_is_going_finished_or_stopped_by_its_runs_state() {
        use PointProgress::*;
        for (state, requeued, progress) in [
            (RunState::Created, false, Going),
            (RunState::Submitted, false, Going),
            (RunState::Running, false, Going),
            (RunState::Completed, false, Finished),
            (RunState::Failed, false, Stopped),
            (RunState::Cancelled, false, Stopped),
            (RunState::Timeout, false, Stopped),
            (RunState::OutOfMemory, false, Stopped),
            (RunState::NodeFail, false, Stopped),
            (RunState::SubmitFailed, false, Stopped),
            // Preempted: queued again by its controller, or ended (no requeue).
            (RunState::Preempted, true, Going),
            (RunState::Preempted, false, Stopped),
        ] {
            assert_eq!(progress_of(Some(state), requeued), progress, "{state:?}");
        }
        assert_eq!(progress_of(None, false), Going);
    }

    #[test]
    fn a_sweeps_plot_leaves_out_the_runs_of_an_earlier_spec() {
        use crate::step_record::StepRecord;
        use shardrun_protocol::messages::StepMetrics;
        let dir = tempfile::tempdir().unwrap();
        let points = crate::sweeps::point_dirs::written_points(
            dir.path(),
            include_str!("../../../examples/sweep.yaml"),
        );
        let (last, _) = points.split_last().unwrap();
        // The last point was cancelled before its first step: no metrics.
        last.update_manifest(|m| m.state = RunState::Cancelled)
            .unwrap();
        for (i, run) in points[..points.len() - 1].iter().enumerate() {
            let record = StepRecord::fold(
                &[StepMetrics {
                    step: 1,
                    loss: 2.0 + i as f64,
                    lr: 1e-3,
                    grad_norm: 1.0,
                    step_time_s: 0.1,
                    tokens_per_s: 100.0,
                    ..Default::default()
                }],
                0.0,
            );
            std::fs::write(
                run.metrics(),
                serde_json::to_string(&record).unwrap() + "\n",
            )
            .unwrap();
        }
        let name = |run: &crate::rundir::RunDir| {
            run.path()
                .file_name()
                .unwrap()
                .to_string_lossy()
                .into_owned()
        };
        let current: Vec<String> = points[1..].iter().map(name).collect();
        let journal = crate::sweeps::journal::Journal::new(dir.path());
        std::fs::create_dir_all(journal.dir()).unwrap();
        journal
            .write_current_points(current.iter().map(String::as_str))
            .unwrap();
        let output = dir.path().join("sweep.svg");
        let args = Args {
            run: dir.path().to_path_buf(),
            output: Some(output.clone()),
            smoothing: 0.6,
            log_loss: false,
            by: None,
        };
        plot_sweep(&args, &points).unwrap();
        let svg = std::fs::read_to_string(&output).unwrap();
        // The first point is of an earlier spec; the last one is named, not drawn.
        let title = format!(
            ": {} of {} point(s) (1 without a step)",
            points.len() - 2,
            points.len() - 1
        );
        assert!(svg.contains(&title), "{title} not in the figure");
    }

    #[test]
    fn a_sweep_point_is_titled_by_its_values() {
        let params: PointParams = [
            (
                "training.optimizer.lr".to_string(),
                serde_json::json!(0.003),
            ),
            ("training.seed".to_string(), serde_json::json!(1)),
        ]
        .into();
        assert_eq!(
            run_title("lrs-d095a6c3", &params, &[], Some((1500, Some(5.5529), 2))),
            "lrs-d095a6c3 (lr=3e-3, seed=1): step 1500, loss 5.5529, 2 rank(s)"
        );
        // 0.03 alone reads shortest as it is; beside 3e-3 the sweep's tables write 3e-2.
        let mut point = params.clone();
        point.insert("training.optimizer.lr".into(), serde_json::json!(0.03));
        assert_eq!(
            run_title("lrs-1", &point, &[], None),
            "lrs-1 (lr=0.03, seed=1)"
        );
        assert_eq!(
            run_title("lrs-1", &point, std::slice::from_ref(&params), None),
            "lrs-1 (lr=3e-2, seed=1)"
        );
        assert_eq!(
            run_title(
                "demo",
                &PointParams::new(),
                &[],
                Some((200, Some(4.8841), 2))
            ),
            "demo: step 200, loss 4.8841, 2 rank(s)"
        );
        // A last step whose batch held no target token.
        assert_eq!(
            run_title("demo", &PointParams::new(), &[], Some((200, None, 2))),
            "demo: step 200, loss -, 2 rank(s)"
        );
    }
}
