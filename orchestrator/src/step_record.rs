//! One line of a run's `metrics.jsonl`: a logged step of the whole job, every rank's record
//! of it folded into one, so the file grows with the steps and not with the ranks (about
//! 500 bytes a step whatever the world size: 100,000 steps of 512 ranks stay under 100 MB).
//! Each rank's own records go to `logs/rank-N.metrics.jsonl`.
//!
//! Loss, learning rate and gradient norm are agreed across ranks before they are reported,
//! so any rank's value is the job's. What differs between ranks is kept as its spread: step
//! time min / median / max and the slowest rank (a straggler shows as the same rank at the
//! max step after step), and the largest peak memory with its rank (the one that runs out
//! first).

use serde::{Deserialize, Deserializer, Serialize};
use shardrun_protocol::messages::StepMetrics;
use std::collections::BTreeMap;

/// A step of the job as every rank saw it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepRecord {
    /// Optimizer steps completed.
    pub step: u64,
    /// Unix seconds when the controller had the step from every rank.
    pub time: f64,
    /// Ranks whose record of the step is folded in: the world size, fewer only when ranks
    /// died before reporting the step.
    pub ranks: u64,
    /// Global mean loss over the whole batch (all ranks).
    #[serde(deserialize_with = "nan_if_null")]
    pub loss: f64,
    #[serde(deserialize_with = "nan_if_null")]
    pub lr: f64,
    /// Global gradient norm (whole model, before clipping).
    #[serde(deserialize_with = "nan_if_null")]
    pub grad_norm: f64,
    /// Tokens per second of the whole job: the step's tokens over the slowest rank's time.
    #[serde(deserialize_with = "nan_if_null")]
    pub tokens_per_s: f64,
    /// The tokens the loss counts, per second, at the same pace: without padding and masked
    /// positions (real data only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trained_tokens_per_s: Option<f64>,
    /// Model FLOPs utilisation at that rate (GPU runs with a known peak).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mfu: Option<f64>,
    #[serde(deserialize_with = "nan_if_null")]
    pub step_time_min_s: f64,
    #[serde(deserialize_with = "nan_if_null")]
    pub step_time_median_s: f64,
    #[serde(deserialize_with = "nan_if_null")]
    pub step_time_max_s: f64,
    /// The rank that holds the job back: with the most busy time where every rank reports
    /// one (CPU ranks), else with the longest step time (the lowest such rank on a tie).
    pub slowest_rank: u64,
    /// CPU ranks: the median and the largest busy time (a rank's step less its wait for the
    /// others): ranks leave a step together, so this is where a straggler shows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub busy_time_median_s: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub busy_time_max_s: Option<f64>,
    /// The largest peak memory of any rank (CPU: peak RSS; GPU: allocator peak).
    pub peak_memory_max_bytes: u64,
    pub peak_memory_max_rank: u64,
    /// Parameters, gradients and optimizer state resident on the rank holding the most.
    pub model_state_max_bytes: u64,
    /// GPU: the largest allocator reservation of any rank.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peak_reserved_max_bytes: Option<u64>,
    /// GPU: the most device memory in use on any rank's GPU, and that GPU's total.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_used_max_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_total_bytes: Option<u64>,
    /// fp16 dynamic loss scale, when used.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loss_scale: Option<f64>,
    /// Epochs of the training data done after this step (documents only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub epoch: Option<f64>,
    /// The longest time any rank spent making its batches during the step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_time_max_s: Option<f64>,
    /// The loss is finite but blown up, past ten times a uniform guess's (the ranks decide,
    /// alike, from the all-reduced loss).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub loss_blew_up: bool,
}

/// JSON has no NaN: serde_json writes a non-finite number as `null`, and a diverged run's
/// records must still read back (as NaN) rather than vanish.
pub(crate) fn nan_if_null<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    Ok(Option::<f64>::deserialize(d)?.unwrap_or(f64::NAN))
}

/// Fields metrics.jsonl leaves out when they have no value (to keep lines short).
const OPTIONAL_FIELDS: [&str; 10] = [
    "trained_tokens_per_s",
    "mfu",
    "peak_reserved_max_bytes",
    "device_used_max_bytes",
    "device_total_bytes",
    "loss_scale",
    "epoch",
    "data_time_max_s",
    "busy_time_median_s",
    "busy_time_max_s",
];

impl StepRecord {
    /// The step's loss, `None` for a step whose batch held no target token (0 stands in
    /// the record): plots and tables leave it out.
    pub fn loss(&self) -> Option<f64> {
        shardrun_protocol::messages::has_loss(self.trained_tokens_per_s).then_some(self.loss)
    }

    /// Whether the step shows the weights diverged: its loss was NaN or inf, or blown up
    /// while finite, or its gradients were not finite and were applied (an fp16 loss scaler
    /// skips such a step, and says so with its `loss_scale`). The loss of a step is computed
    /// before its update: the gradients tell a step sooner.
    pub fn diverged(&self) -> bool {
        !self.loss.is_finite()
            || self.loss_blew_up
            || (!self.grad_norm.is_finite() && self.loss_scale.is_none())
    }

    /// Whether the fp16 loss scaler skipped the step's update: its gradients overflowed.
    pub fn skipped_update(&self) -> bool {
        self.loss.is_finite() && !self.grad_norm.is_finite() && self.loss_scale.is_some()
    }

    /// As a JSON object with every field present, absent ones as null: documents printed
    /// for scripts keep one shape whatever the run.
    pub fn to_json_complete(&self) -> serde_json::Value {
        let mut value = serde_json::to_value(self).unwrap_or_default();
        if let Some(map) = value.as_object_mut() {
            for key in OPTIONAL_FIELDS {
                map.entry(key).or_insert(serde_json::Value::Null);
            }
            map.entry("loss_blew_up")
                .or_insert(serde_json::Value::Bool(false));
        }
        value
    }

    /// Folds the records of one step (at least one, any order) into the job's record.
    pub fn fold(records: &[StepMetrics], time: f64) -> StepRecord {
        let first = records
            .iter()
            .min_by_key(|m| m.rank)
            .expect("a step record folds at least one rank's record");
        let mut times: Vec<f64> = records.iter().map(|m| m.step_time_s).collect();
        times.sort_by(f64::total_cmp);
        let median = median_of_sorted(&times);
        // Busy times only where every rank has one: a straggler is judged among all ranks.
        let mut busy: Vec<f64> = records.iter().filter_map(|m| m.busy_time_s).collect();
        busy.sort_by(f64::total_cmp);
        let busy = (busy.len() == records.len()).then_some(busy);
        // Highest value wins; on a tie, the lowest rank.
        let argmax = |key: &dyn Fn(&StepMetrics) -> f64| {
            records
                .iter()
                .max_by(|a, b| key(a).total_cmp(&key(b)).then(b.rank.cmp(&a.rank)))
                .expect("not empty")
        };
        let slowest = match busy {
            Some(_) => argmax(&|m| m.busy_time_s.unwrap_or(f64::NAN)),
            None => argmax(&|m| m.step_time_s),
        };
        let fullest = argmax(&|m| m.peak_memory_bytes as f64);
        let max_of = |get: fn(&StepMetrics) -> Option<u64>| records.iter().filter_map(get).max();
        // The job moves at its slowest rank's pace.
        let min_of = |get: fn(&StepMetrics) -> Option<f64>| {
            records.iter().filter_map(get).min_by(|a, b| a.total_cmp(b))
        };
        StepRecord {
            step: first.step,
            time,
            ranks: records.len() as u64,
            loss: first.loss,
            lr: first.lr,
            grad_norm: first.grad_norm,
            tokens_per_s: min_of(|m| Some(m.tokens_per_s)).unwrap_or(f64::NAN),
            trained_tokens_per_s: min_of(|m| m.trained_tokens_per_s),
            mfu: min_of(|m| m.mfu),
            step_time_min_s: times[0],
            step_time_median_s: median,
            step_time_max_s: times[times.len() - 1],
            slowest_rank: slowest.rank,
            busy_time_median_s: busy.as_deref().map(median_of_sorted),
            busy_time_max_s: busy.as_deref().and_then(|b| b.last().copied()),
            peak_memory_max_bytes: fullest.peak_memory_bytes,
            peak_memory_max_rank: fullest.rank,
            model_state_max_bytes: max_of(|m| Some(m.model_state_bytes)).unwrap_or(0),
            peak_reserved_max_bytes: max_of(|m| m.peak_reserved_bytes),
            device_used_max_bytes: max_of(|m| m.device_used_bytes),
            device_total_bytes: max_of(|m| m.device_total_bytes),
            loss_scale: first.loss_scale,
            epoch: first.epoch,
            data_time_max_s: records
                .iter()
                .filter_map(|m| m.data_time_s)
                .max_by(|a, b| a.total_cmp(b)),
            loss_blew_up: records.iter().any(|m| m.loss_blew_up),
        }
    }
}

/// The median of sorted values (at least one).
fn median_of_sorted(sorted: &[f64]) -> f64 {
    let middle = sorted.len() / 2;
    if sorted.len() % 2 == 1 {
        sorted[middle]
    } else {
        (sorted[middle - 1] + sorted[middle]) / 2.0
    }
}

/// How long a step waits for the rest of its ranks. Ranks agree on every step before
/// reporting it, but their reports travel on separate connections that the kernel batches
/// (a fast rank can be dozens of millisecond-steps ahead): a step waits for all of them,
/// and only a step still incomplete this long after its first report (a rank stopped
/// reporting) is written with the ranks it has.
const MAX_WAIT_S: f64 = 60.0;
/// Steps held at most, whatever their age (bounds memory if reports stall).
const MAX_PENDING_STEPS: usize = 4096;

/// Collects every rank's records and hands out one [`StepRecord`] per step once the step is
/// complete. Pure: the writer thread owns it and writes what it returns.
#[derive(Debug)]
pub struct StepAggregator {
    world_size: u64,
    /// Steps waiting for ranks: when their first report came, and the reports.
    pending: BTreeMap<u64, (f64, Vec<StepMetrics>)>,
    /// The last step handed out: a late record of it (after it was written without that
    /// rank) is dropped rather than written as a second record of the step.
    written: Option<u64>,
}

impl StepAggregator {
    pub fn new(world_size: u64) -> StepAggregator {
        StepAggregator {
            world_size: world_size.max(1),
            pending: BTreeMap::new(),
            written: None,
        }
    }

    /// Adds one rank's record; returns the steps it completed, oldest first.
    pub fn add(&mut self, record: StepMetrics, now: f64) -> Vec<StepRecord> {
        if self.written.is_some_and(|w| record.step <= w) {
            return Vec::new();
        }
        let step = record.step;
        let (_, ranks) = self.pending.entry(step).or_insert((now, Vec::new()));
        // A rank reporting a step twice replaces its first report.
        ranks.retain(|m| m.rank != record.rank);
        ranks.push(record);
        let mut done = Vec::new();
        // Complete steps, and the steps before them (ranks report in step order: a step
        // older than a complete one will not get more ranks).
        if ranks.len() as u64 >= self.world_size {
            while let Some(oldest) = self.pending.keys().next().copied() {
                if oldest > step {
                    break;
                }
                done.push(self.emit(oldest, now));
            }
        }
        while let Some((&oldest, &(since, _))) = self.pending.iter().next() {
            if now - since <= MAX_WAIT_S && self.pending.len() <= MAX_PENDING_STEPS {
                break;
            }
            done.push(self.emit(oldest, now));
        }
        done
    }

    /// Every step still waiting, with the ranks it has (the job is over).
    pub fn finish(&mut self, now: f64) -> Vec<StepRecord> {
        let steps: Vec<u64> = self.pending.keys().copied().collect();
        steps.into_iter().map(|s| self.emit(s, now)).collect()
    }

    fn emit(&mut self, step: u64, now: f64) -> StepRecord {
        let (_, records) = self.pending.remove(&step).unwrap_or_default();
        self.written = Some(step);
        StepRecord::fold(&records, now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rank_record(rank: u64, step: u64, step_time_s: f64, peak: u64) -> StepMetrics {
        StepMetrics {
            rank,
            step,
            loss: 2.5,
            lr: 1e-3,
            grad_norm: 0.75,
            step_time_s,
            tokens_per_s: 1000.0 / step_time_s,
            model_state_bytes: 100 + rank,
            peak_memory_bytes: peak,
            ..Default::default()
        }
    }

    #[test]
    fn a_step_is_written_once_every_rank_reported_it() {
        let mut agg = StepAggregator::new(4);
        let times = [0.30, 0.10, 0.50, 0.20];
        let peaks = [7, 9, 8, 9];
        for rank in [2, 0, 3] {
            let r = rank_record(rank, 1, times[rank as usize], peaks[rank as usize]);
            assert!(
                agg.add(r, 5.0).is_empty(),
                "rank {rank} alone completes nothing"
            );
        }
        let done = agg.add(rank_record(1, 1, times[1], peaks[1]), 6.0);
        assert_eq!(done.len(), 1);
        let r = &done[0];
        assert_eq!((r.step, r.ranks, r.time), (1, 4, 6.0));
        assert_eq!(
            (r.step_time_min_s, r.step_time_median_s, r.step_time_max_s),
            (0.10, 0.25, 0.50)
        );
        assert_eq!(r.slowest_rank, 2);
        // Ranks 1 and 3 share the largest peak: the lower rank is named.
        assert_eq!((r.peak_memory_max_bytes, r.peak_memory_max_rank), (9, 1));
        assert_eq!(r.model_state_max_bytes, 103);
        assert_eq!(
            r.tokens_per_s,
            1000.0 / 0.50,
            "the slowest rank sets the pace"
        );
        assert_eq!((r.loss, r.lr, r.grad_norm), (2.5, 1e-3, 0.75));
        assert!(agg.finish(7.0).is_empty());
    }

    #[test]
    fn a_fast_rank_far_ahead_waits_for_the_slow_one() {
        let mut agg = StepAggregator::new(2);
        // Rank 0's reports of 100 steps arrive before rank 1's first (batched by the kernel).
        for step in 1..=100 {
            assert!(agg
                .add(rank_record(0, step, 0.1, 1), 0.01 * step as f64)
                .is_empty());
        }
        let done: Vec<StepRecord> = (1..=100)
            .flat_map(|step| agg.add(rank_record(1, step, 0.2, 1), 1.0 + 0.01 * step as f64))
            .collect();
        assert_eq!(done.len(), 100);
        assert!(done.iter().all(|r| r.ranks == 2 && r.slowest_rank == 1));
    }

    #[test]
    fn a_step_a_rank_never_reported_is_written_with_the_ranks_it_has() {
        let mut agg = StepAggregator::new(2);
        assert!(agg.add(rank_record(0, 1, 0.1, 1), 0.0).is_empty());
        // Rank 1 stopped reporting; rank 0's next report comes after the wait.
        let written = agg.add(rank_record(0, 2, 0.1, 1), MAX_WAIT_S + 1.0);
        assert_eq!(
            written
                .iter()
                .map(|r| (r.step, r.ranks))
                .collect::<Vec<_>>(),
            vec![(1, 1)]
        );
        // A late record of a written step is not written again.
        assert!(agg
            .add(rank_record(1, 1, 0.1, 1), MAX_WAIT_S + 2.0)
            .is_empty());
        let rest = agg.finish(MAX_WAIT_S + 3.0);
        assert_eq!(
            rest.iter().map(|r| (r.step, r.ranks)).collect::<Vec<_>>(),
            vec![(2, 1)]
        );
    }

    #[test]
    fn a_complete_step_flushes_the_incomplete_ones_before_it() {
        let mut agg = StepAggregator::new(2);
        agg.add(rank_record(0, 1, 0.1, 1), 0.0);
        agg.add(rank_record(0, 2, 0.1, 1), 0.0);
        let done = agg.add(rank_record(1, 2, 0.1, 1), 0.0);
        assert_eq!(
            done.iter().map(|r| (r.step, r.ranks)).collect::<Vec<_>>(),
            vec![(1, 1), (2, 2)]
        );
    }

    /// The size budget: 100,000 steps of 512 ranks in under 100 MB, i.e. under 1,000 bytes a
    /// record with every field at its longest (the ingest benchmark measures real files).
    #[test]
    fn a_record_of_512_ranks_stays_small() {
        let records: Vec<StepMetrics> = (0..512)
            .map(|rank| StepMetrics {
                rank,
                step: 100_000,
                loss: 2.345_678_901_234_567,
                lr: 1e-3 / 3.0,
                grad_norm: 1.234_567_890_123_456_7,
                step_time_s: 0.123_456_789_012_345_67 + rank as f64 * 1e-9,
                tokens_per_s: 123_456.789_012_345_67,
                mfu: Some(0.456_789_012_345_678_9),
                model_state_bytes: 1_234_567_890_123,
                peak_memory_bytes: 81_234_567_890 + rank,
                peak_reserved_bytes: Some(81_234_567_890),
                device_used_bytes: Some(81_234_567_890),
                device_total_bytes: Some(85_899_345_920),
                loss_scale: Some(65_536.0),
                ..Default::default()
            })
            .collect();
        let line = serde_json::to_string(&StepRecord::fold(&records, 1_764_000_000.123_456))
            .unwrap()
            + "\n";
        assert!(line.len() < 1000, "{} bytes: {line}", line.len());
        let back: StepRecord = serde_json::from_str(&line).unwrap();
        assert_eq!((back.ranks, back.slowest_rank), (512, 511));
    }

    #[test]
    fn a_non_finite_loss_reads_back_as_nan() {
        let mut r = StepRecord::fold(&[rank_record(0, 1, 0.1, 1)], 0.0);
        r.loss = f64::NAN;
        let line = serde_json::to_string(&r).unwrap();
        assert!(line.contains("\"loss\":null"), "{line}");
        let back: StepRecord = serde_json::from_str(&line).unwrap();
        assert!(back.loss.is_nan());
        let complete = back.to_json_complete();
        for key in OPTIONAL_FIELDS {
            assert_eq!(complete[key], serde_json::Value::Null, "{key}");
        }
    }
}
