//! The training loop's hooks in one process (world size 1): preemption agreed at a step
//! boundary calls the checkpoint hook and stops; shards exported from one engine and
//! imported into another continue identically.

mod common;

use common::*;
use shardrun_protocol::config::ShardingStrategy;
use shardrun_protocol::messages::{LogLevel, StepMetrics, TrainSummary};
use shardrun_worker::checkpointing::CheckpointingError;
use shardrun_worker::fsdp::ProcessGroups;
use shardrun_worker::report::Reporter;
use shardrun_worker::train::{CheckpointHook, SaveFailure, SaveReason, Trainer};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Asks for preemption once `after` metrics records have been seen.
struct PreemptAfter {
    after: u64,
    seen: AtomicU64,
}

impl Reporter for PreemptAfter {
    fn log(&self, _: LogLevel, _: &str) {}
    fn metrics(&self, _: &StepMetrics) {
        self.seen.fetch_add(1, Ordering::SeqCst);
    }
    fn checkpoint_saved(&self, _: u64, _: &str) {}
    fn summary(&self, _: &TrainSummary) {}
    fn preempt_requested(&self) -> bool {
        self.seen.load(Ordering::SeqCst) >= self.after
    }
}

#[derive(Default)]
struct Recorder(Mutex<Vec<(SaveReason, u64)>>);

impl CheckpointHook for &Recorder {
    fn save(
        &mut self,
        trainer: &Trainer,
        reason: SaveReason,
    ) -> Result<Option<String>, SaveFailure> {
        self.0
            .lock()
            .map_err(|e| SaveFailure {
                root: "recorder".into(),
                source: CheckpointingError::Other(e.to_string()),
            })?
            .push((reason, trainer.train_state().step));
        Ok(Some(format!("step-{}", trainer.train_state().step)))
    }
}

fn single() -> ProcessGroups {
    ProcessGroups::single_process(ShardingStrategy::FullShard).unwrap()
}

#[test]
fn preemption_checkpoints_at_the_step_boundary_and_stops() {
    let cfg = config(tiny_transformer(), ShardingStrategy::FullShard, 1);
    let reporter = Arc::new(PreemptAfter {
        after: 3,
        seen: AtomicU64::new(0),
    });
    let mut trainer = Trainer::new(cfg, single(), reporter).expect("trainer");
    let recorder = Recorder::default();
    let mut hook = &recorder;
    let outcome = trainer.run(Some(&mut hook)).expect("run");
    assert!(outcome.preempted);
    assert_eq!(trainer.train_state().step, 3);
    assert_eq!(*recorder.0.lock().unwrap(), vec![(SaveReason::Preempt, 3)]);
}

#[test]
fn exported_shards_and_state_resume_to_the_same_weights() {
    let mut cfg = config(tiny_transformer(), ShardingStrategy::FullShard, 1);
    cfg.steps = 6;
    let quiet = || {
        Arc::new(PreemptAfter {
            after: u64::MAX,
            seen: AtomicU64::new(0),
        })
    };
    // Straight through: 6 steps.
    let mut straight = Trainer::new(cfg.clone(), single(), quiet()).expect("trainer");
    straight.run(None).expect("run");
    // 3 steps (preempted), then a fresh trainer imports the shards and the state and finishes.
    let mut first = Trainer::new(
        cfg.clone(),
        single(),
        Arc::new(PreemptAfter {
            after: 3,
            seen: AtomicU64::new(0),
        }),
    )
    .expect("trainer");
    assert!(first.run(None).expect("run").preempted);
    let state = first.train_state();
    let shards: Vec<_> = (0..first.engine().layouts().len())
        .map(|u| first.engine().export_unit(u).expect("export"))
        .collect();
    let mut resumed = Trainer::new(cfg, single(), quiet()).expect("trainer");
    resumed.restore(&state).expect("restore");
    for (u, shard) in shards.iter().enumerate() {
        resumed.engine_mut().import_unit(u, shard).expect("import");
    }
    resumed.run(None).expect("run");
    let a = straight.engine().full_parameters().expect("params");
    let b = resumed.engine().full_parameters().expect("params");
    for ((name, x), (_, y)) in a.iter().zip(&b) {
        assert!(x.equal(y), "{name} differs after resuming");
    }
}
