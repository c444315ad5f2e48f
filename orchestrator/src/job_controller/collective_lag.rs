//! Which ranks the others wait for, from the count of collective calls each rank has entered
//! (carried by its heartbeats).
//!
//! Every rank enters the same collectives in the same order. When a job stands still, ranks
//! that entered fewer than the rest never reached the collective the others sit in: they are
//! stuck outside it (in computation, data loading, I/O) and the others wait for them. This is
//! what tells the culprit from its victims when the victims are the ones whose collectives
//! time out (PyTorch's flight recorder compares collective sequence numbers the same way).

use serde::Serialize;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Ranks that entered fewer collectives than the rest and entered none for a while.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Lag {
    /// The ranks behind, ascending: those that entered the fewest collectives.
    pub ranks: Vec<u64>,
    /// How many collectives they entered.
    pub entered: u64,
    /// The fewest and the most any other rank entered.
    pub others_entered: (u64, u64),
    /// Seconds since the ranks behind last entered one (as their heartbeats showed).
    pub still_secs: u64,
}

impl Lag {
    /// One sentence about the lag, for a failure that names `rank`.
    pub fn describe(&self, rank: Option<u64>) -> String {
        let (low, high) = self.others_entered;
        let others = if low == high {
            low.to_string()
        } else {
            format!("{low} to {high}")
        };
        let (entered, still) = (self.entered, self.still_secs);
        if rank.is_some_and(|r| self.ranks == [r]) {
            return format!(
                "it entered {entered} collectives and no more for {still} s while the other \
                 ranks entered {others}: they wait for it, stuck outside a collective \
                 (computation, data loading or I/O)"
            );
        }
        let first = self.ranks.first().copied().unwrap_or_default();
        let (noun, them) = match self.ranks.len() {
            1 => ("rank", "it"),
            _ => ("ranks", "them"),
        };
        format!(
            "{noun} {} entered {entered} collectives and no more for {still} s while the \
             other ranks entered {others}: the others wait for {them} (logs/rank-{first}.log)",
            rank_list(&self.ranks)
        )
    }
}

/// Ranks as a short list, runs collapsed: `0-7, 9`.
pub fn rank_list(ranks: &[u64]) -> String {
    let mut parts = Vec::new();
    let mut i = 0;
    while i < ranks.len() {
        let start = ranks[i];
        let mut end = start;
        while i + 1 < ranks.len() && ranks[i + 1] == end + 1 {
            i += 1;
            end += 1;
        }
        parts.push(if end > start {
            format!("{start}-{end}")
        } else {
            start.to_string()
        });
        i += 1;
    }
    parts.join(", ")
}

/// Every rank's count and since when it stands, shared by the connections' readers.
#[derive(Debug, Clone, Default)]
pub struct CollectiveCounts {
    by_rank: Arc<Mutex<HashMap<u64, (u64, Instant)>>>,
}

impl CollectiveCounts {
    /// A heartbeat of `rank` said it entered `entered` collectives.
    pub fn record(&self, rank: u64, entered: u64, now: Instant) {
        let mut all = self.by_rank.lock().unwrap_or_else(|e| e.into_inner());
        match all.get_mut(&rank) {
            Some((count, _)) if *count == entered => {}
            _ => {
                all.insert(rank, (entered, now));
            }
        }
    }

    /// The ranks behind, if some ranks entered fewer collectives than others and none of
    /// those entered one for at least `still_for`.
    pub fn lag(&self, now: Instant, still_for: Duration) -> Option<Lag> {
        let all = self.by_rank.lock().unwrap_or_else(|e| e.into_inner());
        let fewest = all.values().map(|(count, _)| *count).min()?;
        let mut behind = Vec::new();
        let mut others: Option<(u64, u64)> = None;
        // The latest change among the ranks behind bounds how long they all stood.
        let mut last_change: Option<Instant> = None;
        for (&rank, &(count, at)) in all.iter() {
            if count == fewest {
                behind.push(rank);
                last_change = Some(last_change.map_or(at, |last| last.max(at)));
            } else {
                let (low, high) = others.unwrap_or((count, count));
                others = Some((low.min(count), high.max(count)));
            }
        }
        let others_entered = others?;
        let still = now.saturating_duration_since(last_change?);
        if still < still_for {
            return None;
        }
        behind.sort_unstable();
        Some(Lag {
            ranks: behind,
            entered: fewest,
            others_entered,
            still_secs: still.as_secs(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(t0: Instant, s: u64) -> Instant {
        t0 + Duration::from_secs(s)
    }

    #[test]
    fn the_ranks_that_entered_fewest_are_behind_once_they_stood_long_enough() {
        let t0 = Instant::now();
        let counts = CollectiveCounts::default();
        for rank in 0..4 {
            counts.record(rank, 40, at(t0, 0));
        }
        assert_eq!(counts.lag(at(t0, 1), Duration::ZERO), None, "all equal");
        // Ranks 0, 2 and 3 enter collective 41 and wait in it; rank 1 does not come.
        for rank in [0, 2, 3] {
            counts.record(rank, 41, at(t0, 2));
        }
        counts.record(1, 40, at(t0, 4)); // the same count again: still since 0 s
        assert_eq!(counts.lag(at(t0, 5), Duration::from_secs(10)), None);
        let lag = counts.lag(at(t0, 30), Duration::from_secs(10)).unwrap();
        assert_eq!(
            lag,
            Lag {
                ranks: vec![1],
                entered: 40,
                others_entered: (41, 41),
                still_secs: 30,
            }
        );
        assert_eq!(
            lag.describe(Some(0)),
            "rank 1 entered 40 collectives and no more for 30 s while the other ranks \
             entered 41: the others wait for it (logs/rank-1.log)"
        );
        assert!(lag
            .describe(Some(1))
            .starts_with("it entered 40 collectives"));
    }

    #[test]
    fn a_rank_moving_again_is_not_behind() {
        let t0 = Instant::now();
        let counts = CollectiveCounts::default();
        counts.record(0, 12, at(t0, 0));
        counts.record(1, 10, at(t0, 0));
        counts.record(2, 10, at(t0, 25));
        // Rank 2 entered its 10th at 25 s: the ranks behind stood 5 s, not 30.
        assert_eq!(counts.lag(at(t0, 30), Duration::from_secs(10)), None);
        let lag = counts.lag(at(t0, 40), Duration::from_secs(10)).unwrap();
        assert_eq!(
            (lag.ranks, lag.others_entered, lag.still_secs),
            (vec![1, 2], (12, 12), 15)
        );
        assert_eq!(CollectiveCounts::default().lag(t0, Duration::ZERO), None);
    }

    #[test]
    fn rank_lists_collapse_runs() {
        assert_eq!(rank_list(&[0, 1, 2, 3, 5, 7, 8]), "0-3, 5, 7-8");
        assert_eq!(rank_list(&[4]), "4");
        assert_eq!(rank_list(&[]), "");
    }
}
