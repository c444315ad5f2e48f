//! The preemption path in one process: the reporter asks for preemption (as the controller
//! client does on SIGUSR2), the trainer agrees at the next step boundary, the checkpointer
//! saves and training stops; a new trainer resumes and ends bitwise where an uninterrupted
//! run ends. Wall-time interval saves are exercised too.

mod common;

use common::*;
use shardrun_checkpoint::{find_latest, Verify};
use shardrun_protocol::config::{CheckpointFormat, ShardingStrategy, TrainConfig};
use shardrun_protocol::messages::{LogLevel, StepMetrics, TrainSummary};
use shardrun_worker::checkpointing::Checkpointer;
use shardrun_worker::fsdp::ProcessGroups;
use shardrun_worker::report::Reporter;
use shardrun_worker::train::{CheckpointHook, Trainer};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Asks for preemption from its `preempt_at`-th question on (once per step boundary).
struct PreemptingReporter {
    asked: AtomicU64,
    preempt_at: u64,
    losses: Mutex<Vec<(u64, f64)>>,
    lines: Mutex<Vec<String>>,
}

impl Reporter for PreemptingReporter {
    fn log(&self, _level: LogLevel, text: &str) {
        self.lines.lock().unwrap().push(text.to_string());
    }
    fn metrics(&self, m: &StepMetrics) {
        self.losses.lock().unwrap().push((m.step, m.loss));
    }
    fn checkpoint_saved(&self, step: u64, path: &str) {
        self.log(LogLevel::Info, &format!("saved {step} {path}"));
    }
    fn summary(&self, _summary: &TrainSummary) {}
    fn preempt_requested(&self) -> bool {
        self.asked.fetch_add(1, Ordering::SeqCst) + 1 >= self.preempt_at
    }
}

fn reporter(preempt_at: u64) -> Arc<PreemptingReporter> {
    Arc::new(PreemptingReporter {
        asked: AtomicU64::new(0),
        preempt_at,
        losses: Mutex::new(Vec::new()),
        lines: Mutex::new(Vec::new()),
    })
}

fn trainer(config: &TrainConfig, reporter: Arc<PreemptingReporter>) -> Trainer {
    let groups = ProcessGroups::single_process(config.fsdp.strategy).unwrap();
    Trainer::new(config.clone(), groups, reporter).unwrap()
}

fn params(trainer: &Trainer) -> Vec<(String, Vec<f32>)> {
    trainer
        .engine()
        .full_parameters()
        .unwrap()
        .into_iter()
        .map(|(name, t)| (name, Vec::<f32>::try_from(t.flatten(0, -1)).unwrap()))
        .collect()
}

#[test]
fn preempted_run_saves_stops_and_resumes_to_the_same_end() {
    let tmp = temp_dir();
    let mut config = config(tiny_transformer(), ShardingStrategy::FullShard, 1);
    config.steps = 12;
    config.checkpoint.dir = Some(tmp.path().join("checkpoints"));
    config.checkpoint.resume = true;
    config.checkpoint.format = CheckpointFormat::Sharded;

    let straight_reporter = reporter(u64::MAX);
    let mut straight = trainer(&config, straight_reporter.clone());
    straight.run(None).unwrap();

    // Preemption asked before step 6: steps 1..=5 run, step 5 is saved, training stops.
    let first_reporter = reporter(6);
    let mut first = trainer(&config, first_reporter.clone());
    let mut checkpointer = Checkpointer::from_config(&config).unwrap();
    assert_eq!(
        checkpointer.restore(&mut first).unwrap(),
        None,
        "nothing to resume yet"
    );
    let outcome = first
        .run(Some(&mut checkpointer as &mut dyn CheckpointHook))
        .unwrap();
    assert!(outcome.preempted);
    assert_eq!(first_reporter.losses.lock().unwrap().len(), 5);
    let found = find_latest(&tmp.path().join("checkpoints"), Verify::Checksums).unwrap();
    assert_eq!(found.checkpoint.unwrap().step(), 5);

    // The requeued run.
    let second_reporter = reporter(u64::MAX);
    let mut second = trainer(&config, second_reporter.clone());
    let mut checkpointer = Checkpointer::from_config(&config).unwrap();
    let restored = checkpointer.restore(&mut second).unwrap().unwrap();
    assert_eq!((restored.step, restored.weights_only), (5, false));
    let outcome = second
        .run(Some(&mut checkpointer as &mut dyn CheckpointHook))
        .unwrap();
    assert!(!outcome.preempted);

    let straight_losses = straight_reporter.losses.lock().unwrap().clone();
    let resumed_losses = second_reporter.losses.lock().unwrap().clone();
    assert_eq!(resumed_losses.first().map(|l| l.0), Some(6));
    for (step, loss) in &resumed_losses {
        let expected = straight_losses[*step as usize - 1].1;
        assert_eq!(
            loss.to_bits(),
            expected.to_bits(),
            "step {step}: {loss} vs {expected}"
        );
    }
    assert_eq!(
        params(&second),
        params(&straight),
        "final parameters bitwise equal"
    );
    // Final save of step 12 exists too.
    let found = find_latest(&tmp.path().join("checkpoints"), Verify::Checksums).unwrap();
    assert_eq!(found.checkpoint.unwrap().step(), 12);
}

#[test]
fn wall_time_interval_saves_between_steps() {
    let tmp = temp_dir();
    let mut config = config(tiny_transformer(), ShardingStrategy::FullShard, 1);
    config.steps = 4;
    config.checkpoint.dir = Some(tmp.path().join("checkpoints"));
    config.checkpoint.keep = 10;
    // A tiny interval: due after every step.
    config.checkpoint.interval_minutes = Some(1e-9);
    let reporter = reporter(u64::MAX);
    let mut trainer = trainer(&config, reporter.clone());
    let mut checkpointer = Checkpointer::from_config(&config).unwrap();
    trainer
        .run(Some(&mut checkpointer as &mut dyn CheckpointHook))
        .unwrap();
    let mut steps: Vec<String> = std::fs::read_dir(tmp.path().join("checkpoints"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("step-"))
        .collect();
    steps.sort();
    assert_eq!(steps, ["step-1", "step-2", "step-3", "step-4"]);
    let lines = reporter.lines.lock().unwrap();
    assert!(
        lines
            .iter()
            .any(|l| l.contains("interval checkpoint of step 1 saved to")),
        "{lines:?}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.contains("final checkpoint of step 4 saved to")),
        "{lines:?}"
    );
}

#[test]
fn from_loads_weights_only_then_the_run_resumes_its_own_checkpoints() {
    let tmp = temp_dir();
    let mut base = config(tiny_transformer(), ShardingStrategy::FullShard, 1);
    base.steps = 3;
    base.checkpoint.dir = Some(tmp.path().join("pretrain"));
    let mut pretrained = trainer(&base, reporter(u64::MAX));
    let mut checkpointer = Checkpointer::from_config(&base).unwrap();
    pretrained
        .run(Some(&mut checkpointer as &mut dyn CheckpointHook))
        .unwrap();

    // Fine-tuning run: its own folder is empty, so `from` gives the weights (not the step,
    // not the moments).
    let mut tune = base.clone();
    tune.checkpoint.dir = Some(tmp.path().join("finetune"));
    tune.checkpoint.resume = true;
    tune.checkpoint.from = Some(tmp.path().join("pretrain"));
    let mut first = trainer(&tune, reporter(u64::MAX));
    let mut checkpointer = Checkpointer::from_config(&tune).unwrap();
    let restored = checkpointer.restore(&mut first).unwrap().unwrap();
    assert!(restored.weights_only);
    assert_eq!(restored.dir, tmp.path().join("pretrain/step-3"));
    assert_eq!(first.train_state().step, 0);
    assert_eq!(params(&first), params(&pretrained));
    first
        .run(Some(&mut checkpointer as &mut dyn CheckpointHook))
        .unwrap();

    // Requeued: the run's own checkpoint wins over `from`.
    let mut again = trainer(&tune, reporter(u64::MAX));
    let mut checkpointer = Checkpointer::from_config(&tune).unwrap();
    let restored = checkpointer.restore(&mut again).unwrap().unwrap();
    assert!(!restored.weights_only);
    assert_eq!(restored.dir, tmp.path().join("finetune/step-3"));
    assert_eq!(params(&again), params(&first));
}
