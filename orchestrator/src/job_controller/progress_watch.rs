//! Is a rank still making progress? Judged from its heartbeats, which carry the optimizer
//! step and a count of work done (micro-batches, evaluation batches, checkpoint units).
//!
//! Ranks wait on one another: while rank 0 writes a full checkpoint the others sit in a
//! barrier, and their counts stand still for as long as the write takes. So a rank is judged
//! stuck only when it and the whole job have both stood still past the progress timeout;
//! a rank that truly hangs soon holds every other rank in a collective, and the job stands
//! still with it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What one heartbeat says about a rank's progress.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Beat {
    /// A new optimizer step.
    Advanced,
    /// The same step, more work done in it (or in an evaluation or checkpoint after it).
    Worked,
    Same,
    /// Neither this rank nor the job moved for this many seconds, past the progress
    /// timeout (reported once).
    Stalled(u64),
}

/// When any rank of the job last moved, shared by every connection's reader.
#[derive(Debug, Clone)]
pub(super) struct JobActivity {
    origin: Instant,
    last_ms: Arc<AtomicU64>,
}

impl JobActivity {
    pub(super) fn new(now: Instant) -> JobActivity {
        JobActivity {
            origin: now,
            last_ms: Arc::new(AtomicU64::new(0)),
        }
    }

    fn moved(&self, now: Instant) {
        let ms = now.saturating_duration_since(self.origin).as_millis() as u64;
        self.last_ms.fetch_max(ms, Ordering::Relaxed);
    }

    fn last(&self) -> Instant {
        self.origin + Duration::from_millis(self.last_ms.load(Ordering::Relaxed))
    }
}

/// One rank's last step and work count, and since when they stand.
#[derive(Debug, Default)]
pub(super) struct RankProgress {
    step: Option<u64>,
    work: u64,
    since: Option<Instant>,
    reported: bool,
}

impl RankProgress {
    pub(super) fn beat(
        &mut self,
        (step, work): (u64, u64),
        now: Instant,
        timeout: Option<Duration>,
        job: &JobActivity,
    ) -> Beat {
        if self.step != Some(step) {
            *self = RankProgress {
                step: Some(step),
                work,
                since: Some(now),
                reported: false,
            };
            job.moved(now);
            return Beat::Advanced;
        }
        if self.work != work {
            self.work = work;
            self.since = Some(now);
            job.moved(now);
            return Beat::Worked;
        }
        // Before its first step a rank builds, restores and warms up: not judged here.
        let held = self.since.map_or(Duration::ZERO, |t| now.duration_since(t));
        let job_quiet = now.saturating_duration_since(job.last());
        match timeout {
            Some(limit) if step > 0 && !self.reported && held >= limit && job_quiet >= limit => {
                self.reported = true;
                Beat::Stalled(held.as_secs())
            }
            _ => Beat::Same,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMIT: Option<Duration> = Some(Duration::from_secs(60));

    /// A job that starts now, and the instant `s` seconds later.
    fn started() -> (JobActivity, impl Fn(u64) -> Instant) {
        let t0 = Instant::now();
        (JobActivity::new(t0), move |s| t0 + Duration::from_secs(s))
    }

    #[test]
    fn a_step_held_past_the_timeout_is_reported_once() {
        let (job, at) = started();
        let limit = LIMIT;
        let mut p = RankProgress::default();
        assert_eq!(p.beat((0, 0), at(0), limit, &job), Beat::Advanced);
        assert_eq!(
            p.beat((0, 0), at(500), limit, &job),
            Beat::Same,
            "step 0 is not judged"
        );
        assert_eq!(p.beat((1, 4), at(501), limit, &job), Beat::Advanced);
        assert_eq!(p.beat((1, 4), at(560), limit, &job), Beat::Same);
        assert_eq!(p.beat((1, 4), at(562), limit, &job), Beat::Stalled(61));
        assert_eq!(p.beat((1, 4), at(900), limit, &job), Beat::Same, "once");
        assert_eq!(p.beat((2, 8), at(901), limit, &job), Beat::Advanced);
        assert_eq!(p.beat((2, 8), at(5000), None, &job), Beat::Same, "no limit");
    }

    #[test]
    fn work_within_a_step_is_progress() {
        // A long evaluation or checkpoint after step 1: the step stands, the work moves.
        let (job, at) = started();
        let limit = LIMIT;
        let mut p = RankProgress::default();
        assert_eq!(p.beat((1, 4), at(0), limit, &job), Beat::Advanced);
        for (i, s) in (50..600).step_by(50).enumerate() {
            let work = 5 + i as u64;
            assert_eq!(p.beat((1, work), at(s), limit, &job), Beat::Worked, "{s}");
        }
        assert_eq!(p.beat((1, 15), at(600), limit, &job), Beat::Same);
        assert_eq!(p.beat((1, 15), at(611), limit, &job), Beat::Stalled(61));
    }

    #[test]
    fn a_rank_waiting_on_a_working_peer_is_not_stalled() {
        // Rank 1 waits in a barrier while rank 0 writes a full checkpoint unit by unit.
        let (job, at) = started();
        let limit = LIMIT;
        let (mut writer, mut waiter) = (RankProgress::default(), RankProgress::default());
        assert_eq!(writer.beat((3, 12), at(0), limit, &job), Beat::Advanced);
        assert_eq!(waiter.beat((3, 12), at(0), limit, &job), Beat::Advanced);
        for s in (30..300).step_by(30) {
            assert_eq!(writer.beat((3, 12 + s), at(s), limit, &job), Beat::Worked);
            assert_eq!(
                waiter.beat((3, 12), at(s + 1), limit, &job),
                Beat::Same,
                "{s}"
            );
        }
        // The writer hangs too (a stuck file system): after a quiet minute the job is judged.
        // The writer's last unit was at 270 s.
        assert_eq!(waiter.beat((3, 12), at(329), limit, &job), Beat::Same);
        assert_eq!(
            waiter.beat((3, 12), at(331), limit, &job),
            Beat::Stalled(331)
        );
        assert_eq!(
            writer.beat((3, 282), at(331), limit, &job),
            Beat::Stalled(61)
        );
    }
}
