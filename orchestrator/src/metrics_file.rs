//! Reading a run's `metrics.jsonl` back (for `shardrun metrics`, `plot` and re-runs): the
//! job's step records ([`StepRecord`]), evaluation records and resume marks, each line read
//! as the kind it parses as. Files written before step records existed hold every rank's own record per
//! step; those are folded into step records on the way in, so old runs read the same.

use crate::step_record::StepRecord;
use serde::{Deserialize, Serialize};
use shardrun_protocol::messages::StepMetrics;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

#[derive(Debug, thiserror::Error)]
pub enum MetricsFileError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
}

/// The loss on held-out data after `step` (rank 0 reports it; its lines are told from step
/// records by their fields).
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct EvalRecord {
    pub step: u64,
    /// NaN when the weights had diverged (written as null).
    #[serde(deserialize_with = "crate::step_record::nan_if_null")]
    pub eval_loss: f64,
    #[serde(default)]
    pub eval_perplexity: Option<f64>,
}

/// A resumed attempt continues from the checkpoint of `resumed_at_step`: what the run
/// logged after that step came from weights thrown away (the controller writes this when
/// rank 0 has loaded the checkpoint, before the attempt logs anything).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResumeMark {
    pub resumed_at_step: u64,
}

/// What a run logged, one record per step in step order.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RunMetrics {
    pub steps: Vec<StepRecord>,
    pub evals: Vec<EvalRecord>,
    /// The steps of `steps` that were the first of an attempt (the run's first, and each
    /// resumed or restarted attempt's): their time includes the attempt's warm-up
    /// (allocations, the first collectives), as the summary line at a run's end says.
    pub warm_ups: BTreeSet<u64>,
    /// Whole lines (1-based) that are not records: the file was damaged, and the figures
    /// leave them out.
    pub unreadable_lines: Vec<usize>,
    /// The last line, when it has no end and is not a record: being written while the run
    /// goes on, cut short (a crash, a full disk) once it has ended.
    pub partial_last_line: Option<usize>,
}

impl RunMetrics {
    /// What is wrong with the file, for a warning (`None`: nothing). `still_written`: the
    /// run may be appending to it, so a partial last line is the one being written.
    pub fn damage(&self, still_written: bool) -> Option<String> {
        let mut said = Vec::new();
        if let Some((first, rest)) = self.unreadable_lines.split_first() {
            said.push(match rest.len() {
                0 => format!("line {first} is not a metrics record"),
                n => format!(
                    "{} lines are not metrics records (the first: line {first})",
                    n + 1
                ),
            });
        }
        if let Some(line) = self.partial_last_line.filter(|_| !still_written) {
            said.push(format!("its last line ({line}) is cut short"));
        }
        (!said.is_empty()).then(|| {
            format!(
                "{}: left out of the figures (was the file cut short or edited?)",
                said.join(", and ")
            )
        })
    }

    pub fn last(&self) -> Option<&StepRecord> {
        self.steps.last()
    }

    /// Where the run had diverged by its last logged step ([`diverged_at`]), as the end of
    /// the run, `status`, `metrics`, re-runs and sweeps all judge it.
    pub fn diverged_from(&self) -> Option<Divergence> {
        let step = diverged_at(&self.steps, self.last()?.step)?;
        let at = self.steps.partition_point(|r| r.step < step);
        Some(Divergence {
            step,
            blew_up: self.steps.get(at).is_some_and(|r| r.loss_blew_up),
        })
    }
}

/// Where a run diverged, and how its records show it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Divergence {
    /// The first step that shows it.
    pub step: u64,
    /// That step's loss was finite but blown up, not NaN or inf.
    pub blew_up: bool,
}

impl Divergence {
    /// What happened from [`Divergence::step`] on, for messages: "its loss ... from step N".
    pub fn what(&self) -> String {
        if self.blew_up {
            format!(
                "its loss blew up (past {} times a uniform guess's)",
                shardrun_models::BLOWN_UP_FACTOR
            )
        } else {
            "its loss or gradients were not finite (NaN or inf)".to_string()
        }
    }
}

/// The step at which the run of `steps` (in step order), by `step`, had diverged
/// ([`StepRecord::diverged`]): its first blown-up step, or its first non-finite step without
/// an fp16 loss scaler (whatever the gradients were was applied, and a loss or gradient norm that overflows
/// while the weights stay finite is a run blown up all the same: `status` and the end of the
/// run call it diverged from there), or where the steps up to `step` have all been
/// non-finite (fp16 steps the scaler skips one after another: the weights are gone). An fp16
/// overflow that the scaler skipped, finite again by a later logged step, is not divergence.
pub fn diverged_at(steps: &[StepRecord], step: u64) -> Option<u64> {
    let upto = &steps[..steps.partition_point(|r| r.step <= step)];
    // A blown-up loss is no overflow a loss scaler skips: its weights are gone already.
    let applied = upto
        .iter()
        .find(|r| r.diverged() && (r.loss_scale.is_none() || r.loss_blew_up));
    let ongoing = upto.iter().rev().take_while(|r| r.diverged()).last();
    applied.into_iter().chain(ongoing).map(|r| r.step).min()
}

/// The step of the last step record in `path`, read from the file's end only: cheap for the
/// `status` of many running runs, whose files grow long. `None` before the first record.
pub fn latest_step(path: &Path) -> Option<u64> {
    latest_progress(path).map(|p| p.step)
}

/// Where a run stands and how fast it goes, from the end of its metrics file.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RecentPace {
    /// The step of the last step record.
    pub step: u64,
    /// The oldest step record at the file's end since the run last resumed, and the
    /// wall-clock seconds from it to the last (evaluations and saves between them included,
    /// as they take the run's time); `None` with fewer than two such records.
    pub since: Option<(u64, f64)>,
}

impl RecentPace {
    /// Seconds per step over [`RecentPace::since`].
    pub fn seconds_per_step(&self) -> Option<f64> {
        let (first, elapsed) = self.since?;
        Some(elapsed / self.step.checked_sub(first).filter(|&n| n > 0)? as f64)
    }
}

/// [`RecentPace`] from the last 16 KiB of `path` (a few dozen records).
pub fn latest_progress(path: &Path) -> Option<RecentPace> {
    use std::io::{Read, Seek, SeekFrom};
    const TAIL: u64 = 16 * 1024;
    let mut file = std::fs::File::open(path).ok()?;
    let len = file.metadata().ok()?.len();
    file.seek(SeekFrom::Start(len.saturating_sub(TAIL))).ok()?;
    let mut tail = Vec::new();
    file.read_to_end(&mut tail).ok()?;
    let mut step = None;
    // The newest and the oldest step record (step, time) of the attempt at the end.
    let mut newest: Option<(u64, f64)> = None;
    let mut oldest: Option<(u64, f64)> = None;
    for line in String::from_utf8_lossy(&tail).lines().rev() {
        match serde_json::from_str::<Line>(line) {
            Ok(Line::Step(record)) => {
                step = step.or(Some(record.step));
                newest = newest.or(Some((record.step, record.time)));
                oldest = Some((record.step, record.time));
            }
            // Per-rank records of older runs carry no job time.
            Ok(Line::Rank(record)) => {
                step = step.or(Some(record.step));
                break;
            }
            // Steps before a resume are another attempt's, with a gap between.
            Ok(Line::Resume(_)) if step.is_some() => break,
            Ok(Line::Eval(_) | Line::Resume(_)) | Err(_) => {}
        }
    }
    let since = match (oldest, newest) {
        (Some((s0, t0)), Some((s1, t1))) if s1 > s0 && t1 > t0 => Some((s0, t1 - t0)),
        _ => None,
    };
    Some(RecentPace { step: step?, since })
}

/// What to change so that a run clipping its gradients at `grad_clip` (the optimizer's) does
/// not diverge again: "a lower LR, gradient clipping (`optimizer.grad_clip`) or a longer
/// warm-up", tighter clipping where it clips.
pub fn divergence_remedies(grad_clip: Option<f64>) -> String {
    let clipping = match grad_clip {
        Some(max_norm) => {
            format!("tighter gradient clipping (`optimizer.grad_clip` is {max_norm})")
        }
        None => "gradient clipping (`optimizer.grad_clip`)".to_string(),
    };
    format!("a lower LR, {clipping} or a longer warm-up")
}

/// Whether the run of `steps` (in step order) had diverged by its last logged step.
pub fn has_diverged(steps: &[StepRecord]) -> bool {
    steps
        .last()
        .is_some_and(|last| diverged_at(steps, last.step).is_some())
}

/// A line of a file from before step records: one rank's record.
#[derive(Deserialize)]
#[serde(untagged)]
enum Line {
    Resume(ResumeMark),
    Step(StepRecord),
    Rank(StepMetrics),
    Eval(EvalRecord),
}

/// Reads `metrics.jsonl`. A resumed run repeats the steps after its checkpoint, appending
/// them again: the later attempt's records replace the earlier ones from the step it resumed
/// at. Its resume mark drops the earlier attempt's step and evaluation records after the
/// checkpoint at once, so an evaluation of discarded weights is not shown beside the new
/// attempt's steps; an attempt that restored nothing drops them when it logs a step again. A line that does not parse is
/// skipped, and counted ([`RunMetrics::damage`]) unless it is the last one, without its end
/// (being written).
pub fn read(path: &Path) -> Result<RunMetrics, MetricsFileError> {
    let text = std::fs::read_to_string(path).map_err(|source| MetricsFileError::Read {
        path: path.display().to_string(),
        source,
    })?;
    let mut per_rank: BTreeMap<u64, Vec<StepMetrics>> = BTreeMap::new();
    let mut steps = Vec::new();
    let mut evals = Vec::new();
    let mut unreadable_lines = Vec::new();
    let mut partial_last_line = None;
    let mut warm_ups = BTreeSet::new();
    // The step an attempt starts with, until its first record: a warm-up when logged (with
    // `log_every` > 1 the first record may be of a later, ordinary step).
    let mut attempt_starts: Option<u64> = Some(1);
    let mut lines = text.lines().enumerate().peekable();
    while let Some((at, line)) = lines.next() {
        match serde_json::from_str::<Line>(line) {
            Ok(Line::Resume(mark)) => {
                let kept = |step: u64| step <= mark.resumed_at_step;
                steps.retain(|r: &StepRecord| kept(r.step));
                evals.retain(|r: &EvalRecord| kept(r.step));
                warm_ups.retain(|&step| kept(step));
                attempt_starts = Some(mark.resumed_at_step + 1);
                for records in per_rank.values_mut() {
                    records.retain(|r| kept(r.step));
                }
            }
            Ok(Line::Step(record)) => {
                // A step logged again without a resume mark is an attempt that restored
                // nothing (no checkpoint yet, or `resume: false`): it started over, and the
                // earlier attempt's evaluations from that step on are of discarded weights.
                if steps
                    .last()
                    .is_some_and(|r: &StepRecord| r.step >= record.step)
                {
                    evals.retain(|e: &EvalRecord| e.step < record.step);
                    warm_ups.retain(|&step| step < record.step);
                    attempt_starts = Some(1);
                }
                if attempt_starts.take() == Some(record.step) {
                    warm_ups.insert(record.step);
                }
                later_wins(&mut steps, record, |r| r.step)
            }
            Ok(Line::Rank(record)) => {
                later_wins(per_rank.entry(record.rank).or_default(), record, |r| r.step)
            }
            Ok(Line::Eval(record)) => later_wins(&mut evals, record, |r| r.step),
            Err(_) if lines.peek().is_none() && !text.ends_with('\n') => {
                partial_last_line = Some(at + 1)
            }
            Err(_) if line.trim().is_empty() => {}
            Err(_) => unreadable_lines.push(at + 1),
        }
    }
    if !per_rank.is_empty() {
        // Records of the old layout come first in a file that has both (runs resumed after
        // an upgrade): fold them by step, then let the newer step records win over them.
        let mut by_step: BTreeMap<u64, Vec<StepMetrics>> = BTreeMap::new();
        for record in per_rank.into_values().flatten() {
            by_step.entry(record.step).or_default().push(record);
        }
        let mut folded: Vec<StepRecord> = by_step
            .into_values()
            .map(|records| StepRecord::fold(&records, f64::NAN))
            .collect();
        for record in steps {
            later_wins(&mut folded, record, |r| r.step);
        }
        steps = folded;
    }
    Ok(RunMetrics {
        steps,
        evals,
        warm_ups,
        unreadable_lines,
        partial_last_line,
    })
}

/// Appends `record`, first dropping the kept records from its step on (a replayed step).
/// `kept` is in step order (every record is appended past the ones it keeps), so the cut
/// is a binary search: a file of 100,000 steps is read in linear time, not quadratic.
fn later_wins<T>(kept: &mut Vec<T>, record: T, step: impl Fn(&T) -> u64) {
    let at = step(&record);
    kept.truncate(kept.partition_point(|k| step(k) < at));
    kept.push(record);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rank_line(rank: u64, step: u64, loss: f64, step_time: f64) -> String {
        format!(
            r#"{{"rank":{rank},"step":{step},"loss":{loss},"lr":0.1,"grad_norm":1.0,"step_time_s":{step_time},"tokens_per_s":5.0,"mfu":null,"model_state_bytes":1,"peak_memory_bytes":{},"loss_scale":null}}"#,
            10 + rank
        )
    }

    fn step_losses(metrics: &RunMetrics) -> Vec<(u64, f64)> {
        metrics.steps.iter().map(|r| (r.step, r.loss)).collect()
    }

    fn step_line(step: u64, loss: f64) -> String {
        let rank_record: StepMetrics =
            serde_json::from_str(&rank_line(0, step, loss, 0.1)).unwrap();
        serde_json::to_string(&StepRecord::fold(&[rank_record], 1.0)).unwrap()
    }

    /// The first step of each attempt is a warm-up: the run's first, the first after a resume
    /// mark, the first of an attempt that started over; a warm-up replayed by a later attempt
    /// is not one any more. An attempt's first record of a later step (`log_every` > 1) is an
    /// ordinary step.
    #[test]
    fn the_first_step_of_each_attempt_is_a_warm_up() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("metrics.jsonl");
        let lines = |steps: std::ops::RangeInclusive<u64>| -> String {
            steps.map(|s| step_line(s, 2.5) + "\n").collect()
        };
        let mut text = lines(1..=6);
        text.push_str("{\"resumed_at_step\":3}\n");
        text.push_str(&lines(4..=8));
        std::fs::write(&path, &text).unwrap();
        let warm_ups = |text: &str| {
            std::fs::write(&path, text).unwrap();
            read(&path)
                .unwrap()
                .warm_ups
                .into_iter()
                .collect::<Vec<_>>()
        };
        assert_eq!(warm_ups(&text), [1, 4]);
        // Started over without a checkpoint: step 1 again.
        text.push_str(&lines(1..=9));
        assert_eq!(warm_ups(&text), [1]);
        // Resumed from step 1, before the warm-up at step 2.
        text.push_str("{\"resumed_at_step\":1}\n");
        text.push_str(&lines(2..=3));
        assert_eq!(warm_ups(&text), [1, 2]);
        text.push_str("{\"resumed_at_step\":2}\n");
        text.push_str(&lines(3..=3));
        assert_eq!(warm_ups(&text), [1, 2, 3]);
        // Every fifth step logged: the attempts' first steps are not in the file.
        let fifths =
            |from: u64| -> String { (from..=4).map(|k| step_line(5 * k, 2.5) + "\n").collect() };
        let mut text = fifths(1);
        assert_eq!(warm_ups(&text), [] as [u64; 0]);
        text.push_str("{\"resumed_at_step\":10}\n");
        text.push_str(&fifths(3));
        assert_eq!(warm_ups(&text), [] as [u64; 0]);
    }

    /// The pace is that of the attempt at the file's end: the records before its resume mark
    /// are another attempt's, with the wait for a requeue between.
    #[test]
    fn the_latest_pace_is_that_of_the_attempt_at_the_files_end() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("metrics.jsonl");
        let timed = |step: u64, time: f64| {
            let rank_record: StepMetrics =
                serde_json::from_str(&rank_line(0, step, 2.5, 0.1)).unwrap();
            serde_json::to_string(&StepRecord::fold(&[rank_record], time)).unwrap() + "\n"
        };
        let mut text: String = (1..=10u64)
            .map(|s| timed(s, 100.0 + 2.0 * s as f64))
            .collect();
        std::fs::write(&path, &text).unwrap();
        assert_eq!(
            latest_progress(&path).map(|p| (p.step, p.seconds_per_step())),
            Some((10, Some(2.0)))
        );
        text.push_str("{\"resumed_at_step\":5}\n");
        std::fs::write(&path, &text).unwrap();
        text.push_str(&timed(6, 5000.0));
        std::fs::write(&path, &text).unwrap();
        assert_eq!(
            latest_progress(&path).map(|p| (p.step, p.seconds_per_step())),
            Some((6, None))
        );
        text.push_str(&timed(7, 5003.0));
        text.push_str("{\"step\":7,\"eval_loss\":2.4}\n");
        text.push_str(&timed(8, 5006.0));
        std::fs::write(&path, &text).unwrap();
        assert_eq!(
            latest_progress(&path).map(|p| (p.step, p.seconds_per_step())),
            Some((8, Some(3.0)))
        );
    }

    #[test]
    fn the_latest_step_is_read_from_the_files_end() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("metrics.jsonl");
        assert_eq!(latest_step(&path), None);
        // Many steps (past the tail read), then an evaluation and a line being written.
        let mut text = String::new();
        for step in 1..=2000u64 {
            text.push_str(&step_line(step, 2.5));
            text.push('\n');
        }
        text.push_str("{\"step\":2000,\"eval_loss\":2.4}\n{\"step\":20");
        std::fs::write(&path, &text).unwrap();
        assert!(text.len() > 16 * 1024);
        assert_eq!(latest_step(&path), Some(2000));
        std::fs::write(&path, "{\"resumed_at_step\":10}\n").unwrap();
        assert_eq!(latest_step(&path), None);
    }

    #[test]
    fn the_remedies_for_divergence_do_not_offer_clipping_a_run_already_clips() {
        assert_eq!(
            divergence_remedies(None),
            "a lower LR, gradient clipping (`optimizer.grad_clip`) or a longer warm-up"
        );
        assert_eq!(
            divergence_remedies(Some(1.0)),
            "a lower LR, tighter gradient clipping (`optimizer.grad_clip` is 1) or a longer warm-up"
        );
    }

    #[test]
    fn a_run_is_diverged_at_a_step_when_its_losses_were_not_finite_from_an_earlier_one_on() {
        let record = |step: u64, loss: f64, grad_norm: f64, loss_scale: Option<f64>| {
            let rank: StepMetrics = serde_json::from_str(&rank_line(0, step, 1.0, 0.1)).unwrap();
            StepRecord {
                loss,
                grad_norm,
                loss_scale,
                ..StepRecord::fold(&[rank], 1.0)
            }
        };
        let metrics = RunMetrics {
            steps: vec![
                record(1, 3.0, 1.0, None),
                // An fp16 overflow the loss scaler skipped: finite again at the next step.
                record(2, f64::INFINITY, f64::INFINITY, Some(512.0)),
                record(3, 2.5, f64::NAN, Some(256.0)),
                record(4, 2.4, 1.0, Some(256.0)),
                // NaN gradients applied: the weights are gone before the loss shows it.
                record(5, 2.3, f64::NAN, None),
                record(6, f64::NAN, f64::NAN, None),
            ],
            ..RunMetrics::default()
        };
        let at: Vec<_> = (1..=7)
            .map(|step| diverged_at(&metrics.steps, step))
            .collect();
        assert_eq!(at, [None, Some(2), None, None, Some(5), Some(5), Some(5)]);

        // A loss that overflows now and then while the weights stay finite (an LR far too
        // high): diverged from its first non-finite step on, finite steps after it or not.
        let blown = RunMetrics {
            steps: vec![
                record(1, 3.0, 1.0, None),
                record(2, f64::INFINITY, f64::INFINITY, None),
                record(3, 1e25, 1e20, None),
                record(4, f64::NAN, f64::INFINITY, None),
                record(5, 9e27, 1e21, None),
            ],
            ..RunMetrics::default()
        };
        let at: Vec<_> = (1..=5)
            .map(|step| diverged_at(&blown.steps, step))
            .collect();
        assert_eq!(at, [None, Some(2), Some(2), Some(2), Some(2)]);
        assert_eq!(
            metrics.diverged_from(),
            Some(Divergence {
                step: 5,
                blew_up: false
            })
        );

        // A loss blown up while finite, in an fp16 run: no overflow its loss scaler skips,
        // so diverged from there, though a later loss looks like a fresh model's.
        let fp16 = RunMetrics {
            steps: vec![
                record(1, 3.0, 1.0, Some(512.0)),
                StepRecord {
                    loss_blew_up: true,
                    ..record(2, 8.9e5, 40.0, Some(512.0))
                },
                record(3, 6.9, 0.0, Some(512.0)),
            ],
            ..RunMetrics::default()
        };
        let at: Vec<_> = (1..=3).map(|step| diverged_at(&fp16.steps, step)).collect();
        assert_eq!(at, [None, Some(2), Some(2)]);
        let divergence = fp16.diverged_from().unwrap();
        assert_eq!(
            (divergence.step, divergence.what()),
            (
                2,
                "its loss blew up (past 10 times a uniform guess's)".to_string()
            )
        );
    }

    #[test]
    fn a_long_run_is_read_in_few_comparisons_per_record() {
        // Steps 1..n, then a resumed attempt replaying from n/2: the cut is found by
        // bisection, not by walking the records (n²/2 looks: minutes at 200,000 steps).
        let n = 100_000u64;
        let looks = std::cell::Cell::new(0u64);
        let step = |r: &u64| {
            looks.set(looks.get() + 1);
            *r
        };
        let mut kept = Vec::new();
        for record in (1..=n).chain(n / 2..=n) {
            later_wins(&mut kept, record, step);
        }
        assert_eq!(kept, (1..=n).collect::<Vec<_>>());
        let records = n + n / 2 + 1;
        assert!(
            looks.get() < 20 * records,
            "{} looks at steps for {records} records",
            looks.get()
        );
    }

    #[test]
    fn step_and_eval_lines_are_told_apart_and_partial_lines_skipped() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("metrics.jsonl");
        let eval = r#"{"rank":0,"step":2,"eval_loss":2.5,"eval_perplexity":12.18,"eval_tokens":100,"eval_time_s":0.5}"#;
        // A diverged run's evaluation reads back as NaN, not as no evaluation.
        let nan_eval = r#"{"rank":0,"step":3,"eval_loss":null,"eval_perplexity":null,"eval_tokens":100,"eval_time_s":0.5}"#;
        let text = format!(
            "{}\n{}\n{eval}\n{nan_eval}\n{{\"step\":3,\"ti",
            step_line(1, 9.0),
            step_line(2, 8.0)
        );
        std::fs::write(&path, text).unwrap();
        let got = read(&path).unwrap();
        assert_eq!(step_losses(&got), vec![(1, 9.0), (2, 8.0)]);
        assert_eq!(
            got.evals[0],
            EvalRecord {
                step: 2,
                eval_loss: 2.5,
                eval_perplexity: Some(12.18)
            }
        );
        let diverged = &got.evals[1..];
        assert!(
            diverged.len() == 1 && diverged[0].step == 3 && diverged[0].eval_loss.is_nan(),
            "{:?}",
            got.evals
        );
        // The line being written is no damage while the run goes on; once it has ended,
        // it was cut short.
        assert_eq!(got.partial_last_line, Some(5));
        assert_eq!(got.damage(true), None);
        assert!(
            got.damage(false)
                .is_some_and(|d| d.starts_with("its last line (5) is cut short")),
            "{:?}",
            got.damage(false)
        );
    }

    #[test]
    fn whole_lines_that_are_not_records_are_named_as_damage() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("metrics.jsonl");
        let text = format!(
            "{}\n{{\"step\":2,\"lo\n{}\n\n{}\n",
            step_line(1, 9.0),
            step_line(3, 7.0),
            step_line(4, 6.0)
        );
        std::fs::write(&path, text).unwrap();
        let got = read(&path).unwrap();
        assert_eq!(step_losses(&got), vec![(1, 9.0), (3, 7.0), (4, 6.0)]);
        // A blank line is no record and no damage either.
        assert_eq!(
            (got.unreadable_lines.clone(), got.partial_last_line),
            (vec![2], None)
        );
        assert!(
            got.damage(true)
                .is_some_and(|d| d.starts_with("line 2 is not a metrics record")),
            "{:?}",
            got.damage(true)
        );
        std::fs::write(&path, format!("{}\n", step_line(1, 9.0))).unwrap();
        assert_eq!(read(&path).unwrap().damage(false), None);
    }

    #[test]
    fn a_resumed_run_replaces_the_steps_it_repeated() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("metrics.jsonl");
        // Steps 1-4, stopped; resumed from the checkpoint of step 2.
        let lines = [
            step_line(1, 9.0),
            step_line(2, 8.0),
            step_line(3, 7.5),
            step_line(4, 7.4),
            step_line(3, 7.0),
            step_line(4, 6.0),
        ];
        std::fs::write(&path, lines.join("\n")).unwrap();
        let got: Vec<(u64, f64)> = read(&path)
            .unwrap()
            .steps
            .iter()
            .map(|m| (m.step, m.loss))
            .collect();
        assert_eq!(got, vec![(1, 9.0), (2, 8.0), (3, 7.0), (4, 6.0)]);
    }

    #[test]
    fn a_resume_mark_drops_what_the_discarded_attempt_logged_after_the_checkpoint() {
        // Evaluated at 2 and 3, stopped at 4, resumed from the checkpoint of step 2: until
        // it evaluates again, the evaluation of step 3 belongs to weights thrown away.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("metrics.jsonl");
        let eval = |step: u64, loss: f64| {
            format!(
                r#"{{"rank":0,"step":{step},"eval_loss":{loss},"eval_perplexity":1.0,"eval_tokens":10,"eval_time_s":0.1}}"#
            )
        };
        let mark = serde_json::to_string(&ResumeMark { resumed_at_step: 2 }).unwrap();
        let lines = [
            step_line(1, 9.0),
            step_line(2, 8.0),
            eval(2, 8.5),
            step_line(3, 7.0),
            eval(3, 7.5),
            step_line(4, 6.0),
            mark,
            step_line(3, 6.9),
        ];
        std::fs::write(&path, lines.join("\n")).unwrap();
        let got = read(&path).unwrap();
        assert_eq!(step_losses(&got), vec![(1, 9.0), (2, 8.0), (3, 6.9)]);
        assert_eq!(
            got.evals.iter().map(|e| e.step).collect::<Vec<_>>(),
            vec![2],
            "the checkpoint's own evaluation stays"
        );
    }

    #[test]
    fn an_attempt_that_starts_over_drops_the_evaluations_it_replays() {
        // Evaluated at 2 and 3, stopped before any checkpoint: the next attempt starts at
        // step 1, and no evaluation of the first attempt's weights stays beside it.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("metrics.jsonl");
        let eval = |step: u64| {
            format!(
                r#"{{"rank":0,"step":{step},"eval_loss":1.0,"eval_perplexity":1.0,"eval_tokens":10,"eval_time_s":0.1}}"#
            )
        };
        let lines = [
            step_line(1, 9.0),
            step_line(2, 8.0),
            eval(2),
            step_line(3, 7.0),
            eval(3),
            step_line(1, 9.5),
            step_line(2, 8.5),
            eval(2),
        ];
        std::fs::write(&path, lines[..6].join("\n")).unwrap();
        let got = read(&path).unwrap();
        assert_eq!(step_losses(&got), vec![(1, 9.5)]);
        assert!(got.evals.is_empty(), "{:?}", got.evals);
        std::fs::write(&path, lines.join("\n")).unwrap();
        let got = read(&path).unwrap();
        assert_eq!(step_losses(&got), vec![(1, 9.5), (2, 8.5)]);
        assert_eq!(
            got.evals.iter().map(|e| e.step).collect::<Vec<_>>(),
            vec![2]
        );
    }

    #[test]
    fn every_rank_records_of_older_runs_are_folded_by_step() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("metrics.jsonl");
        let lines = [
            rank_line(1, 1, 9.0, 0.3),
            rank_line(0, 1, 9.0, 0.1),
            rank_line(0, 2, 8.0, 0.1),
            rank_line(1, 2, 8.0, 0.2),
            // Resumed from step 1 (both ranks log step 2 again), then step records follow.
            rank_line(0, 2, 7.0, 0.4),
            rank_line(1, 2, 7.0, 0.1),
            step_line(3, 6.0),
        ];
        std::fs::write(&path, lines.join("\n")).unwrap();
        let got = read(&path).unwrap().steps;
        assert_eq!(
            got.iter()
                .map(|r| (r.step, r.loss, r.ranks, r.slowest_rank))
                .collect::<Vec<_>>(),
            vec![(1, 9.0, 2, 1), (2, 7.0, 2, 0), (3, 6.0, 1, 0)]
        );
        assert_eq!(got[1].peak_memory_max_rank, 1);
    }
}
