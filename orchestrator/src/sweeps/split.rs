//! How a sweep's points are split into job arrays the cluster accepts: no array longer than
//! the most tasks one array may have, and no more points at once than the tightest limit on
//! queued jobs leaves room for (Slurm counts every array task as one job). Points beyond that
//! room wait for a later `shardrun sweep`. Pure, so every combination is tested here.

use crate::slurm::limits::{ClusterLimits, QueueLimit};
use crate::spec::SweepLimits;
use std::ops::Range;

/// Slurm's own `MaxArraySize`, assumed when neither the cluster nor the spec says.
pub const SLURM_DEFAULT_MAX_ARRAY_SIZE: u64 = 1001;

/// The limits one submission keeps to, each with what imposes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubmitLimits {
    /// Most tasks in one array.
    pub array_size: u64,
    pub array_size_from: String,
    /// The tightest limit on jobs queued at once, if any is known.
    pub queue: Option<QueueLimit>,
    /// What could not be read or does not apply.
    pub notes: Vec<String>,
}

impl SubmitLimits {
    /// Points that may be queued now (`None`: no limit known).
    pub fn room(&self) -> Option<u64> {
        self.queue.as_ref().map(QueueLimit::room)
    }

    /// One line per limit, for people.
    pub fn describe(&self) -> Vec<String> {
        let mut lines = vec![format!(
            "arrays of at most {} tasks: {}",
            self.array_size, self.array_size_from
        )];
        match &self.queue {
            Some(limit) => lines.push(format!(
                "room for {} more queued jobs: {} is {}{}, {} in use",
                limit.room(),
                limit.what,
                limit.max,
                if limit.below {
                    " (a job is accepted while fewer are held)"
                } else {
                    ""
                },
                limit.used
            )),
            None => lines.push("no limit on queued jobs is known".to_string()),
        }
        lines.extend(self.notes.iter().map(|n| format!("note: {n}")));
        lines
    }
}

/// The cluster's limits with the spec's `sweep.limits` on top: for each, the smaller wins.
pub fn submit_limits(cluster: &ClusterLimits, spec: Option<&SweepLimits>) -> SubmitLimits {
    let spec = spec.cloned().unwrap_or_default();
    let mut sizes: Vec<(u64, String)> = cluster.array_size.iter().cloned().collect();
    if let Some(n) = spec.max_array_size {
        sizes.push((n, format!("sweep.limits.max_array_size={n} (job spec)")));
    }
    let (array_size, array_size_from) = sizes
        .into_iter()
        .min_by_key(|(n, _)| *n)
        .unwrap_or_else(|| {
            (
                SLURM_DEFAULT_MAX_ARRAY_SIZE,
                format!(
                    "Slurm's default MaxArraySize={SLURM_DEFAULT_MAX_ARRAY_SIZE} (the cluster does not say; set sweep.limits.max_array_size)"
                ),
            )
        });
    let mut queue = cluster.queue.clone();
    if let Some(max) = spec.max_queued {
        queue.push(QueueLimit {
            what: "sweep.limits.max_queued (job spec), your jobs".into(),
            max,
            used: cluster.queued_by_me,
            below: false,
        });
    }
    SubmitLimits {
        array_size,
        array_size_from,
        queue: queue.into_iter().min_by_key(QueueLimit::room),
        notes: cluster.notes.clone(),
    }
}

/// The arrays of one submission: ranges of indices into the points to submit, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArrayPlan {
    pub arrays: Vec<Range<usize>>,
    /// Points left for a later `shardrun sweep` (no room for them now).
    pub waiting: usize,
}

impl ArrayPlan {
    pub fn submitted(&self) -> usize {
        self.arrays.last().map(|a| a.end).unwrap_or(0)
    }
}

/// Split points into arrays within `limits`. `groups` are the sizes of consecutive runs of
/// points that may share an array (one allocation shape each); no array spans two.
pub fn plan_arrays(groups: &[usize], limits: &SubmitLimits) -> ArrayPlan {
    let total: usize = groups.iter().sum();
    let room = limits
        .room()
        .map(|r| usize::try_from(r).unwrap_or(usize::MAX))
        .unwrap_or(usize::MAX);
    let now = total.min(room);
    let size = usize::try_from(limits.array_size.max(1)).unwrap_or(usize::MAX);
    let mut arrays = Vec::new();
    let mut group_start = 0;
    for &group in groups {
        let end = (group_start + group).min(now);
        let mut start = group_start;
        while start < end {
            let stop = (start + size).min(end);
            arrays.push(start..stop);
            start = stop;
        }
        group_start += group;
    }
    ArrayPlan {
        arrays,
        waiting: total - now,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cluster(array_size: Option<u64>, queue: Vec<QueueLimit>) -> ClusterLimits {
        ClusterLimits {
            array_size: array_size.map(|n| (n, format!("MaxArraySize={n}"))),
            queue,
            queued_by_me: 7,
            notes: Vec::new(),
        }
    }

    fn limit(what: &str, max: u64, used: u64) -> QueueLimit {
        QueueLimit {
            what: what.into(),
            max,
            used,
            below: what == "MaxJobCount",
        }
    }

    #[test]
    fn twenty_five_points_with_max_array_size_ten_are_three_arrays() {
        let limits = submit_limits(&cluster(Some(10), vec![]), None);
        let plan = plan_arrays(&[25], &limits);
        assert_eq!(plan.arrays, vec![0..10, 10..20, 20..25]);
        assert_eq!(plan.waiting, 0);
        assert_eq!(plan.submitted(), 25);
    }

    #[test]
    fn fifteen_hundred_points_past_slurms_default() {
        let limits = submit_limits(&cluster(Some(1001), vec![]), None);
        let plan = plan_arrays(&[1500], &limits);
        assert_eq!(plan.arrays, vec![0..1001, 1001..1500]);
        // Indices stay below MaxArraySize: the largest is 1000.
        assert!(plan.arrays.iter().all(|a| a.len() <= 1001));
    }

    #[test]
    fn the_tightest_queue_limit_holds_points_back() {
        let limits = submit_limits(
            &cluster(
                Some(1001),
                vec![
                    limit("MaxJobCount", 10_000, 9_000),
                    limit("MaxSubmitJobs", 100, 88),
                ],
            ),
            None,
        );
        assert_eq!(limits.room(), Some(12));
        // MaxJobCount is never reached: 250 held of 250 refuses, so 150 leave room for 99.
        assert_eq!(limit("MaxJobCount", 250, 150).room(), 99);
        assert_eq!(limit("MaxJobCount", 250, 260).room(), 0);
        assert_eq!(limits.queue.as_ref().unwrap().what, "MaxSubmitJobs");
        let plan = plan_arrays(&[25], &limits);
        assert_eq!(plan.arrays, vec![0..12]);
        assert_eq!(plan.waiting, 13);
    }

    #[test]
    fn a_full_queue_submits_nothing() {
        let limits = submit_limits(&cluster(Some(10), vec![limit("MaxSubmitJobs", 5, 9)]), None);
        let plan = plan_arrays(&[3], &limits);
        assert!(plan.arrays.is_empty());
        assert_eq!((plan.submitted(), plan.waiting), (0, 3));
    }

    #[test]
    fn the_spec_lowers_limits_but_cannot_raise_them() {
        let spec = SweepLimits {
            max_array_size: Some(4),
            max_queued: Some(50),
        };
        let limits = submit_limits(&cluster(Some(10), vec![]), Some(&spec));
        assert_eq!(limits.array_size, 4);
        assert!(limits.array_size_from.contains("job spec"));
        // max_queued counts the user's jobs already queued (7).
        assert_eq!(limits.room(), Some(43));
        let spec = SweepLimits {
            max_array_size: Some(5000),
            max_queued: None,
        };
        assert_eq!(
            submit_limits(&cluster(Some(10), vec![]), Some(&spec)).array_size,
            10
        );
    }

    #[test]
    fn points_of_different_shapes_never_share_an_array() {
        let limits = submit_limits(
            &cluster(Some(10), vec![limit("MaxSubmitJobs", 30, 0)]),
            None,
        );
        let plan = plan_arrays(&[12, 3, 25], &limits);
        assert_eq!(plan.arrays, vec![0..10, 10..12, 12..15, 15..25, 25..30]);
        assert_eq!(plan.waiting, 10);
    }

    #[test]
    fn a_cluster_that_hides_its_limits() {
        let limits = submit_limits(&cluster(None, vec![]), None);
        assert_eq!(limits.array_size, SLURM_DEFAULT_MAX_ARRAY_SIZE);
        assert_eq!(limits.room(), None);
        assert_eq!(plan_arrays(&[2500], &limits).arrays.len(), 3);
        let spec = SweepLimits {
            max_array_size: Some(2000),
            max_queued: Some(2100),
        };
        let limits = submit_limits(&cluster(None, vec![]), Some(&spec));
        let plan = plan_arrays(&[2500], &limits);
        assert_eq!(plan.arrays, vec![0..2000, 2000..2093]);
        assert_eq!(plan.waiting, 407);
    }
}
