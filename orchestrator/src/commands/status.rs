//! `shardrun status [runs/ | run dir | sweep dir] [--json]`: one batched Slurm query for all
//! runs, as a table or one JSON document.

use crate::exit::{ExitCode, EXIT_NO_RUN};
use crate::rundir::ArrayRef;
use crate::slurm::{self, QuerySource, RunStatus};
use crate::sweeps::labels::{marked_superseded, ParamColumns, SUPERSEDED_NOTE};
use anyhow::Context;
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Run directories, sweep folders or run roots (default `runs`).
    pub paths: Vec<PathBuf>,
    /// Print one JSON document instead of a table (fields: docs/cli.md).
    #[arg(long)]
    pub json: bool,
}

/// `status --json`: every run, and where the states came from.
#[derive(Debug, Serialize)]
pub struct StatusDocument {
    pub version: u32,
    /// `squeue`, `squeue+sacct`, `squeue+scontrol`, `recorded` (Slurm did not answer and
    /// every submitted run had ended), or null when no run needed Slurm.
    pub source: Option<&'static str>,
    /// What Slurm said when it did not answer (the submitted runs' states are then as last
    /// recorded; the command exits 1 unless every one had ended); null when it answered.
    pub slurm_error: Option<String>,
    pub runs: Vec<RunJson>,
}

#[derive(Debug, Serialize)]
pub struct RunJson {
    pub name: String,
    /// The run's state (`CREATED`, `SUBMITTED`, `RUNNING`, `COMPLETED`, `FAILED`, ...).
    pub state: crate::rundir::RunState,
    /// The Slurm job id the state refers to (the latest submission).
    pub job_id: Option<String>,
    /// Slurm's own state of that job, while Slurm still knows it.
    pub slurm_state: Option<String>,
    pub detail: String,
    pub run_dir: PathBuf,
    /// Sweep points: the job array the point was last put in (the table's ARRAY column is
    /// `index/count`).
    pub array: Option<ArrayRef>,
    /// Sweep points: the parameters the sweep gave the run.
    pub sweep_params: BTreeMap<String, serde_json::Value>,
    /// A run in a sweep folder that is not a point of the spec `shardrun sweep` last
    /// submitted there: left from an earlier version of it.
    pub superseded: bool,
    /// Where the run had diverged by its last logged step, as its `metrics.jsonl` shows
    /// (whatever its state: a run that diverged and went on ends `COMPLETED`); null when
    /// it had not.
    pub diverged: Option<DivergedJson>,
    /// How often its jobs were requeued after a preemption notice, over all its attempts.
    pub requeues: u32,
    /// How often Slurm requeued its jobs itself (`scontrol requeue`) while a controller ran.
    pub requeued_by_slurm: u32,
}

/// `status --json`'s `diverged`.
#[derive(Debug, Serialize)]
pub struct DivergedJson {
    /// The first step whose loss or gradients were not finite, or whose loss blew up.
    pub step: u64,
    /// What happened from that step on, as a sentence.
    pub what: String,
}

impl RunJson {
    fn of(s: &RunStatus) -> RunJson {
        RunJson {
            name: s.name.clone(),
            state: s.state,
            job_id: s.job_id.clone(),
            slurm_state: s.slurm.as_ref().map(|r| r.state.to_string()),
            detail: s.detail.clone(),
            run_dir: s.run.path().to_path_buf(),
            array: s.array.clone(),
            sweep_params: s.sweep_params.clone(),
            superseded: s.superseded,
            diverged: crate::rerun::diverged_from(&s.run).map(|d| DivergedJson {
                step: d.step,
                what: d.what(),
            }),
            requeues: s.requeues,
            requeued_by_slurm: s.requeued_by_slurm,
        }
    }
}

pub fn execute(args: Args) -> anyhow::Result<()> {
    let paths = if args.paths.is_empty() {
        vec![crate::resolve::default_run_root()]
    } else {
        args.paths
    };
    let mut runs = Vec::new();
    for path in &paths {
        let (found, unreadable) = slurm::find_runs_and_unreadable(path);
        for folder in &unreadable {
            errln!("warning: {}", slurm::unreadable_warning(folder));
        }
        if found.is_empty() {
            // A sweep's folder whose first `shardrun sweep` wrote its record but no point.
            let fix = match path.join("arrays").is_dir() {
                true => {
                    "it is a sweep's folder without points yet: run `shardrun sweep` on \
                         the sweep's spec (again, if it stopped)"
                }
                false => {
                    "pass a run directory or run root, or create a run with `shardrun \
                          submit job.yaml`"
                }
            };
            return Err(anyhow::Error::new(ExitCode(EXIT_NO_RUN)).context(format!(
                "no run directories at {}\n  fix: {fix}",
                path.display()
            )));
        }
        runs.extend(found);
    }
    // A run whose manifest does not read is named after the others are shown: one damaged
    // folder must not hide a whole sweep.
    let mut unreadable = Vec::new();
    let runs: Vec<_> = runs
        .into_iter()
        .filter(|run| match run.read_manifest() {
            Ok(_) => true,
            Err(e) => {
                unreadable.push(crate::exit::message(&anyhow::Error::new(e)));
                false
            }
        })
        .collect();
    let (mut statuses, answer) =
        slurm::refresh_or_recorded(&runs).context("reading the runs' states")?;
    // Ends worked out but not written back: said once, not once per run of a sweep.
    let unrecorded: Vec<&RunStatus> = statuses.iter().filter(|s| s.unrecorded.is_some()).collect();
    if let Some(first) = unrecorded.first() {
        errln!(
            "warning: the end of {} run(s) is shown but not recorded in their run directories \
             (the first, {}: {}); status works it out again next time\n  fix: free space \
             there, or make the run directories writable, for it to be recorded",
            unrecorded.len(),
            first.run.path().display(),
            first.unrecorded.as_deref().unwrap_or_default()
        );
    }
    // Slurm not answering is an error, but the runs are still shown as last recorded.
    let (source, unanswered) = match answer {
        Ok(source) => (source, None),
        Err(error) => (None, Some(error)),
    };
    let squeue_error = match &source {
        Some(QuerySource::Recorded { squeue_error }) => Some(squeue_error.clone()),
        _ => unanswered.as_ref().map(|e| e.to_string()),
    };
    if args.json {
        // A sweep's points in the order of their values, as the table lists them.
        ParamColumns::given(statuses.iter().map(|s| &s.sweep_params)).sort(
            &mut statuses,
            |s| s.run.path(),
            |s| &s.sweep_params,
        );
        let doc = StatusDocument {
            version: crate::commands::metrics::JSON_VERSION,
            source: source.as_ref().map(|s| match s {
                QuerySource::Squeue => "squeue",
                QuerySource::SqueueSacct => "squeue+sacct",
                QuerySource::SqueueScontrol => "squeue+scontrol",
                QuerySource::Recorded { .. } => "recorded",
            }),
            slurm_error: squeue_error,
            runs: statuses.iter().map(RunJson::of).collect(),
        };
        outln!("{}", serde_json::to_string_pretty(&doc)?);
    } else {
        out!(
            "{}",
            status_table(&statuses, std::env::current_dir().ok().as_deref())
        );
        // A note names the Slurm commands only when one of them gave a state shown: runs
        // that ended long ago, or that ran without Slurm, show what they recorded.
        let from_slurm = statuses.iter().any(|s| s.slurm.is_some());
        let submitted = statuses.iter().any(|s| s.job_id.is_some());
        let note = match &source {
            Some(QuerySource::Squeue | QuerySource::SqueueSacct | QuerySource::SqueueScontrol)
                if !from_slurm =>
            {
                submitted.then_some(
                    "Slurm knows none of these runs' jobs: states as the runs recorded them",
                )
            }
            Some(QuerySource::Squeue) => Some("states from squeue"),
            Some(QuerySource::SqueueSacct) => Some("states from squeue, and sacct for ended jobs"),
            Some(QuerySource::SqueueScontrol) => Some(
                "states from squeue/scontrol: accounting is not enabled, sacct is not available",
            ),
            // Every submitted run had ended: what is shown stands, but a job requeued since
            // (`scontrol requeue`) would not show, and the wait for squeue wants a reason.
            Some(QuerySource::Recorded { squeue_error }) => {
                errln!("warning: {squeue_error}");
                Some(
                    "Slurm did not answer: every run had ended, as shown; a requeue since \
                     would not show",
                )
            }
            None if unanswered.is_some() => {
                Some("Slurm did not answer: the states of submitted runs are as last recorded")
            }
            None => None,
        };
        if let Some(note) = note {
            outln!("({note})");
        }
    }
    if !unreadable.is_empty() {
        return Err(anyhow::anyhow!(
            "{} run director{} not shown:\n{}",
            unreadable.len(),
            if unreadable.len() == 1 {
                "y is"
            } else {
                "ies are"
            },
            unreadable.join("\n")
        ));
    }
    match unanswered {
        Some(error) => Err(anyhow::anyhow!(
            "querying Slurm for the runs' states: {}\n  fix: {}; until then each submitted \
             run is shown as it was last recorded",
            error.to_string().trim_end(),
            match error.controller_unreachable() {
                true => slurm::CONTROLLER_UNREACHABLE_FIX,
                false => "run `shardrun status` where `squeue` reaches the cluster (a login node)",
            }
        )),
        None => Ok(()),
    }
}

/// One row per run: its name, the values a sweep gave it (a column per parameter), its
/// state, Slurm job and, for sweep points, which of the sweep's job arrays it is in
/// (`<k>/<n>`); run directories relative to `cwd` where they are below it.
fn status_table(statuses: &[RunStatus], cwd: Option<&Path>) -> String {
    // One run's detail is shown whole; in a table of many (a sweep), a long one would wrap
    // every row, and the same advice repeats on each.
    let cut_details = statuses.len() > 1;
    let mut cut_any = false;
    let siblings = crate::sweeps::labels::unlisted_siblings(
        statuses
            .iter()
            .filter(|s| !s.sweep_params.is_empty())
            .map(|s| s.run.path()),
    );
    let params = ParamColumns::given_alongside(statuses.iter().map(|s| &s.sweep_params), &siblings);
    let mut statuses: Vec<&RunStatus> = statuses.iter().collect();
    params.sort(&mut statuses, |s| s.run.path(), |s| &s.sweep_params);
    let with_arrays = statuses.iter().any(|s| s.array.is_some());
    let mut header = vec!["RUN"];
    header.extend(params.names());
    header.extend(["STATE", "JOB"]);
    if with_arrays {
        header.push("ARRAY");
    }
    header.extend(["RUN DIRECTORY", "DETAIL"]);
    let rows: Vec<Vec<String>> = statuses
        .iter()
        .map(|s| {
            let state = s.state.to_string();
            let path = s.run.path();
            let shown = cwd
                .and_then(|cwd| path.strip_prefix(cwd).ok())
                .unwrap_or(path);
            let mut row = vec![if s.superseded {
                marked_superseded(&s.name)
            } else {
                s.name.clone()
            }];
            row.extend(
                params
                    .cells(&s.sweep_params)
                    .into_iter()
                    .map(|cell| cell.unwrap_or_else(|| "-".into())),
            );
            row.extend([state, s.job_id.clone().unwrap_or_else(|| "-".into())]);
            if with_arrays {
                row.push(
                    s.array
                        .as_ref()
                        .map(|a| format!("{}/{}", a.index, a.count))
                        .unwrap_or_else(|| "-".into()),
                );
            }
            let detail = match cut_details {
                true => cut_short(&s.detail, DETAIL_SHOWN),
                false => s.detail.clone(),
            };
            cut_any |= detail.len() < s.detail.len();
            row.extend([shown.display().to_string(), detail]);
            row
        })
        .collect();
    let mut text = table(&header, &rows);
    if statuses.len() > 1 {
        text.push_str(&state_counts(&statuses));
        text.push('\n');
    }
    if cut_any {
        text.push_str(&format!(
            "(details past {DETAIL_SHOWN} characters are cut short: `shardrun status <run \
             directory>` shows one run's whole, `--json` every run's)\n"
        ));
    }
    if statuses.iter().any(|s| s.superseded) {
        text.push_str(SUPERSEDED_NOTE);
        text.push('\n');
    }
    text
}

/// How many runs are in each state, most first: `31 runs: 24 COMPLETED, 5 SUBMITTED, 2
/// RUNNING`; runs left from an earlier spec of a sweep counted apart, their states not
/// mixed with the current points'.
fn state_counts(statuses: &[&RunStatus]) -> String {
    let superseded = statuses.iter().filter(|s| s.superseded).count();
    let current: Vec<&&RunStatus> = statuses.iter().filter(|s| !s.superseded).collect();
    let mut counts: Vec<(String, usize)> = Vec::new();
    for status in current.iter() {
        let state = status.state.to_string();
        match counts.iter_mut().find(|(s, _)| *s == state) {
            Some((_, n)) => *n += 1,
            None => counts.push((state, 1)),
        }
    }
    counts.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    let each: Vec<String> = counts.iter().map(|(s, n)| format!("{n} {s}")).collect();
    let runs = |n: usize| match n {
        1 => "1 run".to_string(),
        n => format!("{n} runs"),
    };
    let left = format!("{} left from an earlier spec (*)", runs(superseded));
    match (current.len(), superseded) {
        (_, 0) => format!("{}: {}", runs(statuses.len()), each.join(", ")),
        (0, _) => left,
        (n, _) => format!("{}: {}; and {left}", runs(n), each.join(", ")),
    }
}

/// The characters of a run's detail a table of several runs shows.
const DETAIL_SHOWN: usize = 160;

/// `text` cut to at most `at` characters, at a word where there is one, ending in "…".
fn cut_short(text: &str, at: usize) -> String {
    if text.chars().count() <= at {
        return text.to_string();
    }
    let kept: String = text.chars().take(at - 1).collect();
    let at_word = kept
        .rfind(' ')
        .filter(|&i| i > at / 2)
        .unwrap_or(kept.len());
    format!(
        "{}…",
        kept[..at_word].trim_end_matches([' ', ',', ';', ':'])
    )
}

/// Columns padded to their widest cell (counted in characters), two spaces apart; the last
/// column is not padded.
fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let header: Vec<String> = header.iter().map(|h| h.to_string()).collect();
    let mut out = String::new();
    for row in std::iter::once(&header).chain(rows) {
        let mut line = String::new();
        for (i, cell) in row.iter().enumerate() {
            line.push_str(cell);
            if i + 1 < row.len() {
                line.push_str(&" ".repeat(widths[i] - cell.chars().count() + 2));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_details_are_cut_at_a_word_in_tables_of_several_runs() {
        assert_eq!(cut_short("short", 160), "short");
        let long = "the run was cancelled by SIGTERM after step 408; its newest checkpoint is \
                    step 400 (/runs/hp/hp-34bf651a8e95e942/checkpoints/step-400); its loss blew up";
        let cut = cut_short(long, 60);
        assert_eq!(
            cut, "the run was cancelled by SIGTERM after step 408; its…",
            "cut before the word the limit falls in"
        );
        assert!(cut.chars().count() <= 60);
        let dir = tempfile::tempdir().unwrap();
        let points = crate::sweeps::point_dirs::written_points(
            dir.path(),
            include_str!("../../../examples/sweep.yaml"),
        );
        let (mut statuses, _) = slurm::refresh(&points).unwrap();
        let whole = "word ".repeat(60);
        for status in &mut statuses {
            status.detail = whole.clone();
        }
        let text = status_table(&statuses, None);
        assert!(
            !text.contains(&whole)
                && text.contains("word…")
                && text.ends_with("`--json` every run's)\n"),
            "{text}"
        );
        // One run alone: whole.
        let text = status_table(&statuses[..1], None);
        assert!(
            text.contains(whole.trim_end()) && !text.contains("cut short"),
            "{text}"
        );
    }

    #[test]
    fn a_run_left_from_an_earlier_spec_of_the_sweep_is_marked() {
        let dir = tempfile::tempdir().unwrap();
        let points = crate::sweeps::point_dirs::written_points(
            dir.path(),
            include_str!("../../../examples/sweep.yaml"),
        );
        let sweep_dir = points[0].path().parent().unwrap();
        let name = |i: usize| points[i].path().file_name().unwrap().to_str().unwrap();
        let journal = crate::sweeps::journal::Journal::new(sweep_dir);
        let (statuses, _) = slurm::refresh(&points).unwrap();
        assert!(
            !status_table(&statuses, None).contains('*'),
            "nothing is superseded before a sweep recorded its points"
        );
        std::fs::create_dir_all(journal.dir()).unwrap();
        journal
            .write_current_points((1..points.len()).map(name))
            .unwrap();
        let (statuses, _) = slurm::refresh(&points).unwrap();
        let text = status_table(&statuses, None);
        assert!(
            text.contains(&format!(
                "\n{} runs: {} CREATED; and 1 run left from an earlier spec (*)\n",
                points.len() - 1,
                points.len() - 1
            )),
            "{text}"
        );
        let marked: Vec<&str> = text.lines().filter(|l| l.contains(" * ")).collect();
        assert_eq!(marked.len(), 1, "{text}");
        assert!(marked[0].starts_with(&format!("{} * ", name(0))), "{text}");
        assert!(text.ends_with(&format!("{SUPERSEDED_NOTE}\n")), "{text}");
    }

    /// The count line says one run as one, and a table of only runs left from an earlier
    /// spec as such.
    #[test]
    fn the_count_line_reads_right_at_its_edges() {
        let dir = tempfile::tempdir().unwrap();
        let points = crate::sweeps::point_dirs::written_points(
            dir.path(),
            include_str!("../../../examples/sweep.yaml"),
        );
        let (mut statuses, _) = slurm::refresh(&points[..2]).unwrap();
        statuses[0].superseded = true;
        let all: Vec<&RunStatus> = statuses.iter().collect();
        assert_eq!(
            state_counts(&all),
            "1 run: 1 CREATED; and 1 run left from an earlier spec (*)"
        );
        statuses[1].superseded = true;
        let all: Vec<&RunStatus> = statuses.iter().collect();
        assert_eq!(state_counts(&all), "2 runs left from an earlier spec (*)");
    }

    #[test]
    fn a_sweep_point_shows_its_values_after_its_name() {
        let dir = tempfile::tempdir().unwrap();
        let points = crate::sweeps::point_dirs::written_points(
            dir.path(),
            include_str!("../../../examples/sweep.yaml"),
        );
        let (statuses, source) = slurm::refresh(&points).unwrap();
        assert_eq!(source, None, "points never submitted ask nothing of Slurm");
        let text = status_table(&statuses, Some(dir.path()));
        let lines: Vec<&str> = text.lines().collect();
        let words = |line: &str| {
            line.split_whitespace()
                .map(str::to_string)
                .collect::<Vec<_>>()
        };
        assert_eq!(
            words(lines[0]),
            [
                "RUN",
                "lr",
                "weight_decay",
                "seed",
                "STATE",
                "JOB",
                "RUN",
                "DIRECTORY",
                "DETAIL"
            ],
            "{text}"
        );
        // The header, a row per point, and how many are in each state.
        assert_eq!(lines.len(), 14, "{text}");
        assert_eq!(lines[13], "12 runs: 12 CREATED", "{text}");
        let mut listed = Vec::new();
        for line in &lines[1..13] {
            let status = statuses.iter().find(|s| s.name == words(line)[0]).unwrap();
            let lr = status.sweep_params["training.optimizer.lr"]
                .as_f64()
                .unwrap();
            let seed = &status.sweep_params["training.seed"];
            let decay = &status.sweep_params["training.optimizer.weight_decay"];
            assert_eq!(
                words(line),
                [
                    status.name.clone(),
                    format!("{lr:e}"),
                    // Written as the spec would: 0, not 0.0.
                    format!("{}", decay.as_f64().unwrap()),
                    seed.to_string(),
                    "CREATED".into(),
                    "-".into(),
                    status.name.clone(),
                ],
                "{text}"
            );
            listed.push((lr, decay.as_f64().unwrap(), seed.as_u64().unwrap()));
        }
        // Listed by value, not by their folders' hashed names.
        assert!(
            listed.windows(2).all(|w| w[0] < w[1]),
            "rows out of order:\n{text}"
        );
    }

    #[test]
    fn columns_line_up_whatever_the_cell_lengths() {
        let header = ["RUN", "STATE", "JOB", "RUN DIRECTORY", "DETAIL"];
        let row = |cells: [&str; 5]| cells.iter().map(|c| c.to_string()).collect::<Vec<_>>();
        let rows = [
            row(["demo", "COMPLETED", "-", "runs/demo", "training finished"]),
            row([
                "a-much-longer-name",
                "RUNNING",
                "12345",
                "runs/a-much-longer-name",
                "",
            ]),
        ];
        let text = table(&header, &rows);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3);
        // Every column starts at the same character in every line.
        for (column, word) in header.iter().enumerate().skip(1) {
            let at = lines[0].find(word).unwrap();
            for (line, row) in lines[1..].iter().zip(&rows) {
                if !row[column].is_empty() {
                    assert_eq!(line.find(row[column].as_str()), Some(at), "{text}");
                }
            }
        }
        assert!(
            lines[1].ends_with("runs/demo                training finished"),
            "{text}"
        );
    }
}
