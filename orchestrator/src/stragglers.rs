//! Which ranks hold a job back, from its step records alone: how often each rank had the
//! longest step, by how much, and how far the slowest rank's step time sits above the
//! median rank's over the run. In a job without a straggler every rank is the slowest about
//! `1 / ranks` of the time by chance and the spread is small; a straggler is the slowest far
//! more often, by a margin that persists.
//!
//! The first step of each attempt is not judged: its time holds the attempt's warm-up (the
//! first allocations and collectives, loading a checkpoint), which differs between ranks
//! for reasons that say nothing about the steps after.
//!
//! Only the steps of the current world size are judged: a run resumed on another number of
//! ranks numbers other processes (on other machines) with the same ranks, so the steps
//! before say nothing about the ranks now. Which start of the run logged a step, and on how
//! many ranks, comes from its `events.jsonl`.

use crate::events_file::{EventRecord, RunEvent};
use crate::step_record::StepRecord;
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StragglerReport {
    /// The step records of the current world size (the latest ones).
    pub steps: u64,
    /// The current world size.
    pub ranks: u64,
    /// The first of them.
    pub first_step: Option<u64>,
    /// Steps before, run on other world sizes: not judged.
    pub earlier: Vec<WorldSegment>,
    /// Warm-up steps of the current world size (the first of each attempt): not judged.
    pub warm_ups_not_judged: Vec<u64>,
    /// The slowest rank's step time over the median rank's, minus one (0.05: 5% slower), at
    /// the median and the 90th percentile of the steps.
    pub spread_median: f64,
    pub spread_p90: f64,
    /// The step where the slowest rank lagged the most.
    pub worst: Option<WorstStep>,
    /// What the ranks are compared by.
    pub judged_by: JudgedBy,
    /// Ranks that were the slowest at least once, most often first.
    pub slowest_ranks: Vec<SlowRank>,
    /// The rank with the largest peak memory at the latest step.
    pub peak_memory_max_rank: Option<u64>,
    pub peak_memory_max_bytes: Option<u64>,
}

/// Consecutive steps run on one world size.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WorldSegment {
    pub first_step: u64,
    pub last_step: u64,
    pub ranks: u64,
}

/// A start of the run (its first, a re-run, a requeue) and its world size.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct WorldStart {
    /// Unix seconds, on the clock of the controller that also timed the step records.
    pub time: f64,
    pub world_size: u64,
}

/// The starts among a run's events.
pub fn starts(events: &[EventRecord]) -> Vec<WorldStart> {
    events
        .iter()
        .filter_map(|e| match e.event {
            RunEvent::Started { world_size, .. } => Some(WorldStart {
                time: e.time,
                world_size,
            }),
            _ => None,
        })
        .collect()
}

/// The world size a step ran on: its start's, the latest start before the step's record
/// (else, for runs without events, the ranks that reported it).
fn world_of(record: &StepRecord, starts: &[WorldStart]) -> u64 {
    starts
        .iter()
        .rev()
        .find(|s| s.time <= record.time)
        .map_or(record.ranks, |s| s.world_size)
}

/// `records` cut where the world size changes, in step order.
fn segments<'a>(records: &'a [StepRecord], starts: &[WorldStart]) -> Vec<(u64, &'a [StepRecord])> {
    records
        .chunk_by(|a, b| world_of(a, starts) == world_of(b, starts))
        .map(|steps| (world_of(&steps[0], starts), steps))
        .collect()
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WorstStep {
    pub step: u64,
    pub rank: u64,
    /// The slowest rank's time and the median rank's, as [`JudgedBy`] says.
    pub time_max_s: f64,
    pub time_median_s: f64,
}

/// What ranks are compared by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum JudgedBy {
    /// A rank's step less its wait for the others (CPU ranks): its own work, which a
    /// straggler has most of.
    BusyTime,
    /// The step time: ranks leave a step together, so a straggler hardly shows (GPU ranks,
    /// whose collectives block no host thread to time; runs from before busy times).
    StepTime,
}

/// A step's slowest and median rank times, by busy time where the record has it.
fn times_of(r: &StepRecord) -> (f64, f64, JudgedBy) {
    match (r.busy_time_max_s, r.busy_time_median_s) {
        (Some(max), Some(median)) => (max, median, JudgedBy::BusyTime),
        _ => (r.step_time_max_s, r.step_time_median_s, JudgedBy::StepTime),
    }
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SlowRank {
    pub rank: u64,
    /// Steps it was the slowest in, and their share of all steps.
    pub times: u64,
    pub share: f64,
    /// Mean of (its step time − the median rank's) over those steps.
    pub mean_excess_s: f64,
    pub last_step: u64,
}

/// Judges the steps of the current world size among `records` (a run's step records in
/// step order) but its `warm_ups`; `starts` tell which world size each step ran on.
pub fn analyse(
    records: &[StepRecord],
    starts: &[WorldStart],
    warm_ups: &BTreeSet<u64>,
) -> StragglerReport {
    let mut segments = segments(records, starts);
    let (world, records) = segments.pop().unwrap_or_default();
    let earlier = segments
        .iter()
        .map(|(ranks, steps)| WorldSegment {
            first_step: steps.first().map_or(0, |r| r.step),
            last_step: steps.last().map_or(0, |r| r.step),
            ranks: *ranks,
        })
        .collect();
    let spread = |r: &StepRecord| {
        let (max, median, _) = times_of(r);
        if median > 0.0 {
            max / median - 1.0
        } else {
            0.0
        }
    };
    // Records of one rank say nothing about the others.
    let mut multi: Vec<&StepRecord> = records.iter().filter(|r| r.ranks > 1).collect();
    // Warm-ups left out, unless they are all there is to judge.
    let mut warm_ups_not_judged = Vec::new();
    if multi.iter().any(|r| !warm_ups.contains(&r.step)) {
        multi.retain(|r| match warm_ups.contains(&r.step) {
            true => {
                warm_ups_not_judged.push(r.step);
                false
            }
            false => true,
        });
    }
    // By busy time only when every step judged has it.
    let judged_by = match multi.iter().all(|r| times_of(r).2 == JudgedBy::BusyTime) {
        true if !multi.is_empty() => JudgedBy::BusyTime,
        _ => JudgedBy::StepTime,
    };
    let times_of = |r: &StepRecord| match judged_by {
        JudgedBy::BusyTime => times_of(r),
        JudgedBy::StepTime => (r.step_time_max_s, r.step_time_median_s, judged_by),
    };
    let mut spreads: Vec<f64> = multi.iter().map(|r| spread(r)).collect();
    spreads.sort_by(f64::total_cmp);
    let quantile = |q: f64| {
        if spreads.is_empty() {
            0.0
        } else {
            spreads[((spreads.len() - 1) as f64 * q).round() as usize]
        }
    };
    let worst = multi
        .iter()
        // The first of equally bad steps.
        .max_by(|a, b| spread(a).total_cmp(&spread(b)).then(b.step.cmp(&a.step)))
        .map(|r| WorstStep {
            step: r.step,
            rank: r.slowest_rank,
            time_max_s: times_of(r).0,
            time_median_s: times_of(r).1,
        });
    let mut by_rank: BTreeMap<u64, (u64, f64, u64)> = BTreeMap::new();
    for r in &multi {
        let entry = by_rank.entry(r.slowest_rank).or_insert((0, 0.0, 0));
        entry.0 += 1;
        let (max, median, _) = times_of(r);
        entry.1 += max - median;
        entry.2 = entry.2.max(r.step);
    }
    let total = multi.len().max(1) as f64;
    let mut slowest_ranks: Vec<SlowRank> = by_rank
        .into_iter()
        .map(|(rank, (times, excess, last_step))| SlowRank {
            rank,
            times,
            share: times as f64 / total,
            mean_excess_s: excess / times as f64,
            last_step,
        })
        .collect();
    slowest_ranks.sort_by(|a, b| b.times.cmp(&a.times).then(a.rank.cmp(&b.rank)));
    let latest = records.last();
    StragglerReport {
        steps: records.len() as u64,
        ranks: world,
        first_step: records.first().map(|r| r.step),
        earlier,
        warm_ups_not_judged,
        spread_median: quantile(0.5),
        spread_p90: quantile(0.9),
        worst,
        judged_by,
        slowest_ranks,
        peak_memory_max_rank: latest.map(|r| r.peak_memory_max_rank),
        peak_memory_max_bytes: latest.map(|r| r.peak_memory_max_bytes),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use shardrun_protocol::messages::StepMetrics;

    fn step(step: u64, times: &[f64]) -> StepRecord {
        let records: Vec<StepMetrics> = times
            .iter()
            .enumerate()
            .map(|(rank, &t)| StepMetrics {
                rank: rank as u64,
                step,
                loss: 1.0,
                lr: 0.1,
                grad_norm: 1.0,
                step_time_s: t,
                tokens_per_s: 1.0 / t,
                model_state_bytes: 1,
                peak_memory_bytes: 10 + rank as u64,
                ..Default::default()
            })
            .collect();
        StepRecord::fold(&records, 0.0)
    }

    #[test]
    fn a_rank_that_is_always_slowest_stands_out() {
        // Rank 2 of 4 is 50% slower in 8 of 10 steps; rank 0 is slightly slower in the rest.
        let records: Vec<StepRecord> = (1..=10)
            .map(|s| {
                if s <= 8 {
                    step(s, &[1.0, 1.0, 1.5, 1.0])
                } else {
                    step(s, &[1.1, 1.0, 1.0, 1.0])
                }
            })
            .collect();
        let report = analyse(&records, &[], &BTreeSet::new());
        assert_eq!((report.steps, report.ranks), (10, 4));
        assert_eq!(report.slowest_ranks[0].rank, 2);
        assert_eq!(report.slowest_ranks[0].times, 8);
        assert!((report.slowest_ranks[0].share - 0.8).abs() < 1e-12);
        assert!((report.slowest_ranks[0].mean_excess_s - 0.5).abs() < 1e-12);
        assert_eq!(report.slowest_ranks[1].rank, 0);
        assert!((report.spread_median - 0.5).abs() < 1e-12);
        let worst = report.worst.unwrap();
        assert_eq!((worst.rank, worst.step), (2, 1));
        assert_eq!(report.peak_memory_max_rank, Some(3));
    }

    #[test]
    fn busy_times_name_the_rank_the_others_wait_for() {
        // Every rank's step takes 1 s (they leave it together); rank 1 works 0.9 s of it,
        // the others 0.5 s and wait the rest.
        let busy_step = |s: u64| {
            let records: Vec<StepMetrics> = (0..3)
                .map(|rank| StepMetrics {
                    rank,
                    step: s,
                    step_time_s: 1.0,
                    tokens_per_s: 1.0,
                    busy_time_s: Some(if rank == 1 { 0.9 } else { 0.5 }),
                    ..Default::default()
                })
                .collect();
            StepRecord::fold(&records, 0.0)
        };
        let records: Vec<StepRecord> = (1..=4).map(busy_step).collect();
        let report = analyse(&records, &[], &BTreeSet::new());
        assert_eq!(report.judged_by, JudgedBy::BusyTime);
        assert_eq!(
            (report.slowest_ranks[0].rank, report.slowest_ranks[0].times),
            (1, 4)
        );
        assert!((report.slowest_ranks[0].mean_excess_s - 0.4).abs() < 1e-12);
        assert!((report.spread_median - 0.8).abs() < 1e-12);
        // A step without busy times (GPU ranks, older records): step times for all.
        let mut mixed = records.clone();
        mixed.push(step(5, &[1.0, 1.0, 1.2]));
        let report = analyse(&mixed, &[], &BTreeSet::new());
        assert_eq!(report.judged_by, JudgedBy::StepTime);
    }

    #[test]
    fn the_warm_up_step_of_each_attempt_is_not_judged() {
        // Rank 0 loads slowly in the first step of each attempt (1 and 4); rank 1 is the
        // slower one in every other step.
        let records: Vec<StepRecord> = (1..=6)
            .map(|s| match s {
                1 | 4 => step(s, &[5.0, 1.0, 1.0]),
                _ => step(s, &[1.0, 1.2, 1.0]),
            })
            .collect();
        let warm_ups = BTreeSet::from([1, 4]);
        let report = analyse(&records, &[], &warm_ups);
        assert_eq!(report.warm_ups_not_judged, [1, 4]);
        assert_eq!(report.slowest_ranks.len(), 1, "{:?}", report.slowest_ranks);
        assert_eq!(
            (report.slowest_ranks[0].rank, report.slowest_ranks[0].times),
            (1, 4)
        );
        let worst = report.worst.unwrap();
        assert_eq!((worst.rank, worst.step), (1, 2));
        assert!((report.spread_median - 0.2).abs() < 1e-12);

        // A run of warm-ups only is judged on them: there is nothing else.
        let report = analyse(&records[..1], &[], &BTreeSet::from([1]));
        assert!(report.warm_ups_not_judged.is_empty());
        assert_eq!(report.worst.map(|w| (w.rank, w.step)), Some((0, 1)));
    }

    #[test]
    fn a_single_rank_has_no_stragglers() {
        let report = analyse(&[step(1, &[1.0]), step(2, &[2.0])], &[], &BTreeSet::new());
        assert!(report.slowest_ranks.is_empty());
        assert_eq!((report.spread_median, report.worst), (0.0, None));
    }

    #[test]
    fn only_the_steps_of_the_current_world_size_are_judged() {
        // Steps 1-6 on 2 ranks (rank 1 always slower), then resumed at step 4 on 3 ranks
        // (rank 2 slower): the resume's records replaced steps 4-6.
        let at = |mut r: StepRecord, time: f64| {
            r.time = time;
            r
        };
        let mut records: Vec<StepRecord> = (1..=3)
            .map(|s| at(step(s, &[1.0, 1.5]), 10.0 + s as f64))
            .collect();
        records.extend((4..=8).map(|s| at(step(s, &[1.0, 1.0, 1.2]), 100.0 + s as f64)));
        let starts = [
            WorldStart {
                time: 10.0,
                world_size: 2,
            },
            WorldStart {
                time: 100.0,
                world_size: 3,
            },
        ];
        let report = analyse(&records, &starts, &BTreeSet::new());
        assert_eq!((report.steps, report.ranks), (5, 3));
        assert_eq!(report.first_step, Some(4));
        assert_eq!(
            report.earlier,
            [WorldSegment {
                first_step: 1,
                last_step: 3,
                ranks: 2
            }]
        );
        assert_eq!(report.slowest_ranks.len(), 1, "{:?}", report.slowest_ranks);
        assert_eq!(
            (report.slowest_ranks[0].rank, report.slowest_ranks[0].times),
            (2, 5)
        );

        // Resumed on one rank: nothing left to compare, whatever the steps before showed.
        let mut records = records[..3].to_vec();
        records.extend((4..=8).map(|s| at(step(s, &[1.0]), 100.0 + s as f64)));
        let starts = [
            starts[0],
            WorldStart {
                time: 100.0,
                world_size: 1,
            },
        ];
        let report = analyse(&records, &starts, &BTreeSet::new());
        assert_eq!((report.steps, report.ranks), (5, 1));
        assert!(
            report.slowest_ranks.is_empty(),
            "{:?}",
            report.slowest_ranks
        );
        assert_eq!(report.worst, None);
    }
}
