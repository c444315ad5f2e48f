//! `events.jsonl`: what happened to a run, one JSON object per line, appended by its
//! controllers (every start, re-run and requeue adds to the same file): starts, resumes,
//! checkpoints, preemptions, requeues, stops, failures and the finish. `shardrun plot` draws
//! them as markers, so a resumed run's curve shows where it picked up.
//!
//! ```json
//! {"time":1764000000.5,"event":"started","world_size":2}
//! {"time":1764000003.1,"event":"checkpoint","step":100,"path":"runs/demo/checkpoints/step-100"}
//! {"time":1764000004.0,"event":"stopped","step":150,"by":"SIGINT"}
//! {"time":1764000010.2,"event":"resumed","step":100,"path":"runs/demo/checkpoints/step-100"}
//! ```

use crate::job_controller::notice::Notice;
use serde::{Deserialize, Serialize};
use std::path::Path;

/// One line of `events.jsonl`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EventRecord {
    /// Unix seconds.
    pub time: f64,
    #[serde(flatten)]
    pub event: RunEvent,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum RunEvent {
    /// A controller took the run over: its first start, a re-run, a requeued job.
    Started {
        world_size: u64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        slurm_job_id: Option<String>,
    },
    /// Training continues after the checkpoint of `step` (rank 0 loaded it).
    Resumed { step: u64, path: String },
    /// A checkpoint of `step` was committed.
    Checkpoint { step: u64, path: String },
    /// Slurm announced preemption or the time limit (SIGUSR2; `notice`: which): the ranks
    /// checkpoint at their next step boundary.
    PreemptRequested {
        #[serde(default)]
        notice: Notice,
    },
    /// The ranks checkpointed after `step` and stopped for the notice.
    Preempted {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        step: Option<u64>,
        #[serde(default)]
        notice: Notice,
    },
    /// The controller requeued the Slurm job, which resumes from the checkpoint of `step`.
    Requeued {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        step: Option<u64>,
        slurm_job_id: String,
        /// This requeue's number, and how many the job allows.
        requeue: u32,
        max_requeues: u32,
    },
    /// The ranks stopped after `step` on request (`by`: a signal, a cancel).
    Stopped {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        step: Option<u64>,
        by: String,
    },
    /// The job failed; `step`: the last step every rank had completed, as far as the
    /// controller knew.
    Failed {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        step: Option<u64>,
        reason: String,
    },
    /// Training ran to its last step.
    Finished { step: u64 },
}

impl RunEvent {
    /// The step the event happened at, where it has one.
    pub fn step(&self) -> Option<u64> {
        match self {
            RunEvent::Started { .. } | RunEvent::PreemptRequested { .. } => None,
            RunEvent::Resumed { step, .. }
            | RunEvent::Checkpoint { step, .. }
            | RunEvent::Finished { step } => Some(*step),
            RunEvent::Preempted { step, .. }
            | RunEvent::Requeued { step, .. }
            | RunEvent::Stopped { step, .. }
            | RunEvent::Failed { step, .. } => *step,
        }
    }
}

/// Every event of a run in file order; none when the file does not exist (runs from before
/// it was written). A line that does not parse (the last one, while it is written) is
/// skipped.
pub fn read(path: &Path) -> std::io::Result<Vec<EventRecord>> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    Ok(text
        .lines()
        .filter_map(|line| serde_json::from_str(line).ok())
        .collect())
}

/// Whether `events[at]` is a requeue that took place: not one Slurm refused, after which the
/// controller wrote the attempt's failure (before any later start).
pub fn requeued_at(events: &[EventRecord], at: usize) -> bool {
    matches!(events[at].event, RunEvent::Requeued { .. })
        && !events[at + 1..]
            .iter()
            .take_while(|later| !matches!(later.event, RunEvent::Started { .. }))
            .any(|later| matches!(later.event, RunEvent::Failed { .. }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_round_trip_as_flat_objects() {
        let mut events = vec![
            RunEvent::Started {
                world_size: 2,
                slurm_job_id: None,
            },
            RunEvent::Checkpoint {
                step: 10,
                path: "c/step-10".into(),
            },
            RunEvent::PreemptRequested {
                notice: Notice::TimeLimit,
            },
            RunEvent::Requeued {
                step: Some(12),
                slurm_job_id: "77".into(),
                requeue: 1,
                max_requeues: 3,
            },
            RunEvent::Resumed {
                step: 10,
                path: "c/step-10".into(),
            },
            RunEvent::Finished { step: 20 },
        ];
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("events.jsonl");
        let mut text = String::new();
        for (i, event) in events.iter().enumerate() {
            let line = serde_json::to_string(&EventRecord {
                time: i as f64,
                event: event.clone(),
            })
            .unwrap();
            text.push_str(&line);
            text.push('\n');
        }
        assert!(text.starts_with(r#"{"time":0.0,"event":"started","world_size":2}"#));
        assert!(text.contains(r#"{"time":2.0,"event":"preempt_requested","notice":"time_limit"}"#));
        // Lines from before the notice was named read back as a plain SIGUSR2.
        text.push_str("{\"time\":5,\"event\":\"preempted\",\"step\":12}\n");
        events.push(RunEvent::Preempted {
            step: Some(12),
            notice: Notice::Signal,
        });
        text.push_str(r#"{"time":9,"event":"che"#);
        std::fs::write(&path, text).unwrap();
        let back = read(&path).unwrap();
        assert_eq!(
            back.iter().map(|e| e.event.clone()).collect::<Vec<_>>(),
            events
        );
        assert_eq!(back[3].event.step(), Some(12));
        assert!(read(&dir.path().join("none.jsonl")).unwrap().is_empty());
    }
}
