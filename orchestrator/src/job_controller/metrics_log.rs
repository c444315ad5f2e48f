//! The metrics files of a run: `metrics.jsonl`, one [`StepRecord`] per logged step with
//! every rank folded in (its size grows with the steps, not the ranks), and
//! `logs/rank-N.metrics.jsonl`, each rank's own [`StepMetrics`] as it sent them. Other
//! records (evaluations) go to `metrics.jsonl` as they are.

use crate::metrics_file::ResumeMark;
use crate::rundir::line_files::append_lines;
use crate::step_record::{StepAggregator, StepRecord};
use serde::Serialize;
use shardrun_protocol::messages::StepMetrics;
use std::collections::HashMap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

pub struct MetricsLog {
    file: BufWriter<File>,
    logs_dir: PathBuf,
    per_rank: HashMap<u64, BufWriter<File>>,
    steps: StepAggregator,
    /// The last step each rank reported.
    last_step: HashMap<u64, u64>,
    /// `metrics.jsonl` holds an earlier attempt's records, and this attempt has not said yet
    /// from which step it goes on.
    unmarked_attempt: bool,
}

impl MetricsLog {
    pub fn open(path: &Path, logs_dir: &Path, world_size: u64) -> std::io::Result<MetricsLog> {
        std::fs::create_dir_all(logs_dir)?;
        let unmarked_attempt = std::fs::metadata(path).is_ok_and(|m| m.len() > 0);
        Ok(MetricsLog {
            unmarked_attempt,
            file: BufWriter::new(append_lines(path)?),
            logs_dir: logs_dir.to_path_buf(),
            per_rank: HashMap::new(),
            steps: StepAggregator::new(world_size),
            last_step: HashMap::new(),
        })
    }

    /// One rank's record: into its own file now, into `metrics.jsonl` once every rank has
    /// reported the step. Returns the steps completed.
    pub fn rank_record(&mut self, m: &StepMetrics, now: f64) -> std::io::Result<Vec<StepRecord>> {
        let file = match self.per_rank.get_mut(&m.rank) {
            Some(file) => file,
            None => {
                let path = self.logs_dir.join(format!("rank-{}.metrics.jsonl", m.rank));
                let file = BufWriter::new(append_lines(&path)?);
                self.per_rank.entry(m.rank).or_insert(file)
            }
        };
        serde_json::to_writer(&mut *file, m)?;
        file.write_all(b"\n")?;
        self.last_step.insert(m.rank, m.step);
        let done = self.steps.add(m.clone(), now);
        if !done.is_empty() && self.unmarked_attempt {
            // An attempt that restored no checkpoint (none yet, or `resume: false`) starts
            // over: readers drop every step the earlier attempts logged.
            self.resumed_at(0)?;
        }
        for record in &done {
            self.record(record)?;
        }
        Ok(done)
    }

    /// This attempt goes on from the checkpoint of `step` (0: from the start): what earlier
    /// attempts logged after it is not the run's.
    pub fn resumed_at(&mut self, step: u64) -> std::io::Result<()> {
        self.unmarked_attempt = false;
        self.record(&ResumeMark {
            resumed_at_step: step,
        })
    }

    /// The last step every rank that reported has reported, in this session.
    pub fn last_step_of_all(&self) -> Option<u64> {
        self.last_step.values().min().copied()
    }

    /// One line of `metrics.jsonl` as it is.
    pub fn record<T: Serialize>(&mut self, m: &T) -> std::io::Result<()> {
        serde_json::to_writer(&mut self.file, m)?;
        self.file.write_all(b"\n")
    }

    /// The job is over: steps some rank never reported are written with the ranks they have.
    pub fn finish(&mut self, now: f64) -> std::io::Result<()> {
        for record in self.steps.finish(now) {
            self.record(&record)?;
        }
        self.flush()
    }

    pub fn flush(&mut self) -> std::io::Result<()> {
        self.file.flush()?;
        for file in self.per_rank.values_mut() {
            file.flush()?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rank_files_get_every_record_and_the_job_file_one_per_step() {
        let dir = tempfile::tempdir().unwrap();
        let mut log = MetricsLog::open(
            &dir.path().join("metrics.jsonl"),
            &dir.path().join("logs"),
            2,
        )
        .unwrap();
        let record = |rank: u64, step: u64| StepMetrics {
            rank,
            step,
            loss: 1.0,
            lr: 0.1,
            grad_norm: 1.0,
            step_time_s: 0.1 * (rank + 1) as f64,
            tokens_per_s: 10.0,
            model_state_bytes: 1,
            peak_memory_bytes: 1,
            ..Default::default()
        };
        for step in 1..=3 {
            for rank in 0..2 {
                log.rank_record(&record(rank, step), 0.0).unwrap();
            }
        }
        // Step 4 from rank 0 only: the job ended before rank 1 reported it.
        log.rank_record(&record(0, 4), 0.0).unwrap();
        log.finish(0.0).unwrap();
        let job = std::fs::read_to_string(dir.path().join("metrics.jsonl")).unwrap();
        let steps: Vec<StepRecord> = job
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(
            steps
                .iter()
                .map(|s| (s.step, s.ranks, s.slowest_rank))
                .collect::<Vec<_>>(),
            vec![(1, 2, 1), (2, 2, 1), (3, 2, 1), (4, 1, 0)]
        );
        for (rank, n) in [(0, 4), (1, 3)] {
            let own =
                std::fs::read_to_string(dir.path().join(format!("logs/rank-{rank}.metrics.jsonl")))
                    .unwrap();
            assert_eq!(own.lines().count(), n, "{own}");
        }
    }

    #[test]
    fn an_attempt_that_starts_over_or_resumes_says_from_which_step_before_its_steps() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("metrics.jsonl");
        let record = |step: u64| StepMetrics {
            rank: 0,
            step,
            loss: 1.0,
            ..Default::default()
        };
        let attempt = |resumed: Option<u64>, steps: std::ops::RangeInclusive<u64>| {
            let mut log = MetricsLog::open(&path, &dir.path().join("logs"), 1).unwrap();
            if let Some(step) = resumed {
                log.resumed_at(step).unwrap();
            }
            for step in steps {
                log.rank_record(&record(step), 0.0).unwrap();
            }
            log.finish(0.0).unwrap();
        };
        // The first attempt has nothing before it; the second restored no checkpoint; the
        // third resumed from one.
        attempt(None, 1..=3);
        attempt(None, 1..=2);
        attempt(Some(2), 3..=4);
        let lines: Vec<String> = std::fs::read_to_string(&path)
            .unwrap()
            .lines()
            .map(|l| {
                let v: serde_json::Value = serde_json::from_str(l).unwrap();
                match v.get("resumed_at_step") {
                    Some(step) => format!("resumed at {step}"),
                    None => format!("step {}", v["step"]),
                }
            })
            .collect();
        assert_eq!(
            lines,
            [
                "step 1",
                "step 2",
                "step 3",
                "resumed at 0",
                "step 1",
                "step 2",
                "resumed at 2",
                "step 3",
                "step 4"
            ]
        );
    }
}
