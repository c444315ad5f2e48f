//! Which ranks hold a job back, from its step records alone: how often each rank had the
//! longest step, by how much, and how far the slowest rank's step time sits above the
//! median rank's over the run. In a job without a straggler every rank is the slowest about
//! `1 / ranks` of the time by chance and the spread is small; a straggler is the slowest far
//! more often, by a margin that persists.

use crate::step_record::StepRecord;
use serde::Serialize;
use std::collections::BTreeMap;

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StragglerReport {
    /// Step records read.
    pub steps: u64,
    /// Ranks in the latest record.
    pub ranks: u64,
    /// The slowest rank's step time over the median rank's, minus one (0.05: 5% slower), at
    /// the median and the 90th percentile of the steps.
    pub spread_median: f64,
    pub spread_p90: f64,
    /// The step where the slowest rank lagged the most.
    pub worst: Option<WorstStep>,
    /// Ranks that were the slowest at least once, most often first.
    pub slowest_ranks: Vec<SlowRank>,
    /// The rank with the largest peak memory at the latest step.
    pub peak_memory_max_rank: Option<u64>,
    pub peak_memory_max_bytes: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WorstStep {
    pub step: u64,
    pub rank: u64,
    pub step_time_max_s: f64,
    pub step_time_median_s: f64,
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

pub fn analyse(records: &[StepRecord]) -> StragglerReport {
    let spread = |r: &StepRecord| {
        if r.step_time_median_s > 0.0 {
            r.step_time_max_s / r.step_time_median_s - 1.0
        } else {
            0.0
        }
    };
    // Records of one rank say nothing about the others.
    let multi: Vec<&StepRecord> = records.iter().filter(|r| r.ranks > 1).collect();
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
            step_time_max_s: r.step_time_max_s,
            step_time_median_s: r.step_time_median_s,
        });
    let mut by_rank: BTreeMap<u64, (u64, f64, u64)> = BTreeMap::new();
    for r in &multi {
        let entry = by_rank.entry(r.slowest_rank).or_insert((0, 0.0, 0));
        entry.0 += 1;
        entry.1 += r.step_time_max_s - r.step_time_median_s;
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
        ranks: latest.map_or(0, |r| r.ranks),
        spread_median: quantile(0.5),
        spread_p90: quantile(0.9),
        worst,
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
        let report = analyse(&records);
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
    fn a_single_rank_has_no_stragglers() {
        let report = analyse(&[step(1, &[1.0]), step(2, &[2.0])]);
        assert!(report.slowest_ranks.is_empty());
        assert_eq!((report.spread_median, report.worst), (0.0, None));
    }
}
