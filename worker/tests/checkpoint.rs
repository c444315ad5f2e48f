//! Checkpoints with the real worker: real rank processes over real sockets write, resume,
//! fall back and reshard.
//!
//! * 20 steps straight = 10 steps, resume from the step-10 checkpoint, 10 steps: losses and
//!   final parameters bitwise equal on CPU fp32, sharded and full format;
//! * a damaged newest checkpoint: the worker says so and resumes from the previous one;
//! * saved on 2 ranks with FULL_SHARD, resumed on 1, 3 and 4 ranks and with SHARD_GRAD_OP:
//!   the next step's loss is the uninterrupted run's (≤ 1e-6).

mod common;

use common::*;
use shardrun_protocol::config::{CheckpointFormat, ShardingStrategy, TrainConfig};
use std::path::Path;

fn with_checkpoints(mut config: TrainConfig, dir: &Path, format: CheckpointFormat) -> TrainConfig {
    config.checkpoint.dir = Some(dir.to_owned());
    config.checkpoint.interval_steps = Some(10);
    config.checkpoint.keep = 3;
    config.checkpoint.format = format;
    config.checkpoint.resume = true;
    config
}

/// The tiny transformer on 2 ranks, FULL_SHARD, with sharded checkpoints in
/// `dir/checkpoints`: the folder and the config.
fn sharded_on_two_ranks(dir: &Path) -> (std::path::PathBuf, TrainConfig) {
    let ckpt = dir.join("checkpoints");
    let config = with_checkpoints(
        config(tiny_transformer(), ShardingStrategy::FullShard, 2),
        &ckpt,
        CheckpointFormat::Sharded,
    );
    (ckpt, config)
}

fn rank0_log(dir: &Path) -> String {
    std::fs::read_to_string(dir.join("rank0.log")).unwrap_or_default()
}

fn assert_bitwise_resume(format: CheckpointFormat) {
    let tmp = temp_dir();
    let ckpt = tmp.path().join("checkpoints");
    let config = with_checkpoints(
        config(tiny_transformer(), ShardingStrategy::FullShard, 2),
        &ckpt,
        format,
    );
    let straight = run_sharded(tmp.path(), "straight", &config);
    assert_eq!(straight.losses.len(), 20);
    assert!(ckpt.join("step-10/COMPLETE").exists() && ckpt.join("step-20/COMPLETE").exists());

    // Make step 10 the newest valid checkpoint: damage step 20 (sharded) or remove it (full).
    match format {
        CheckpointFormat::Sharded => {
            let shard = ckpt.join("step-20/rank-1-of-2.safetensors");
            let mut bytes = std::fs::read(&shard).unwrap();
            let last = bytes.len() - 1;
            bytes[last] ^= 0x40;
            std::fs::write(&shard, bytes).unwrap();
        }
        CheckpointFormat::Full => std::fs::remove_dir_all(ckpt.join("step-20")).unwrap(),
    }
    let resumed = run_sharded(tmp.path(), "resumed", &config);
    let log = rank0_log(tmp.path());
    assert!(
        log.contains("resumed from checkpoint") && log.contains("step-10"),
        "{log}"
    );
    if format == CheckpointFormat::Sharded {
        assert!(
            log.contains("skipping checkpoint")
                && log.contains("rank-1-of-2.safetensors")
                && log.contains("falling back"),
            "{log}"
        );
        // The damaged checkpoint is kept, set aside, and the step saved anew.
        assert!(
            log.contains("aside as step-20.damaged")
                && log.contains(
                    "resumes from the checkpoint of step 10 instead; steps 11 to 20 train again"
                ),
            "{log}"
        );
        assert!(ckpt
            .join("step-20.damaged/rank-1-of-2.safetensors")
            .exists());
        assert!(ckpt.join("step-20/COMPLETE").exists());
    }
    let resumed_steps: Vec<u64> = resumed.metrics.iter().map(|m| m.step).collect();
    assert_eq!(resumed_steps, (11..=20).collect::<Vec<_>>());
    for (a, b) in straight.losses[10..].iter().zip(&resumed.losses) {
        assert_eq!(a.to_bits(), b.to_bits(), "losses {a} vs {b}");
    }
    for (name, a) in &straight.params {
        let b = &resumed.params[name];
        let same = a
            .values
            .iter()
            .zip(&b.values)
            .all(|(x, y)| x.to_bits() == y.to_bits());
        assert!(same, "final {name} differs after resume");
    }
}

#[test]
fn sharded_resume_is_bitwise_identical_and_falls_back_past_a_damaged_checkpoint() {
    assert_bitwise_resume(CheckpointFormat::Sharded);
}

/// A run whose every checkpoint fails to load stops, naming them, instead of training
/// from step 1 again over them; nothing of them is touched.
#[test]
fn a_run_whose_checkpoints_all_fail_to_load_is_refused_not_started_over() {
    let tmp = temp_dir();
    let (ckpt, mut config) = sharded_on_two_ranks(tmp.path());
    config.steps = 10;
    run_sharded(tmp.path(), "first", &config);
    let shard = ckpt.join("step-10/rank-0-of-2.safetensors");
    let mut bytes = std::fs::read(&shard).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x01;
    std::fs::write(&shard, &bytes).unwrap();

    config.steps = 20;
    let children = spawn_sharded(tmp.path(), "again", &config, &[]);
    let failed: Vec<u64> = children
        .into_iter()
        .filter_map(|(rank, mut child)| (!child.wait().unwrap().success()).then_some(rank))
        .collect();
    assert!(failed.contains(&0), "rank 0 must fail");
    let log = rank0_log(tmp.path());
    assert!(
        log.contains("no checkpoint of this run loads (step-10; the newest,")
            && log.contains("would start over at step 1")
            && log.contains("--force"),
        "{log}"
    );
    assert!(
        !tmp.path().join("again.metrics.jsonl").exists() || {
            let m = std::fs::read_to_string(tmp.path().join("again.metrics.jsonl")).unwrap();
            m.trim().is_empty()
        }
    );
    assert_eq!(std::fs::read(&shard).unwrap(), bytes, "left as it was");
    assert!(!ckpt.join("step-10.damaged").exists());
}

#[test]
fn full_resume_is_bitwise_identical() {
    assert_bitwise_resume(CheckpointFormat::Full);
}

#[test]
fn saved_on_two_ranks_resumes_on_one_three_four_and_under_shard_grad_op() {
    let tmp = temp_dir();
    let saved = tmp.path().join("saved");
    let config = with_checkpoints(
        config(tiny_transformer(), ShardingStrategy::FullShard, 2),
        &saved,
        CheckpointFormat::Sharded,
    );
    let straight = run_sharded(tmp.path(), "straight", &config);
    for (world, strategy) in [
        (1, ShardingStrategy::FullShard),
        (3, ShardingStrategy::FullShard),
        (4, ShardingStrategy::FullShard),
        (2, ShardingStrategy::ShardGradOp),
    ] {
        let run = tmp.path().join(format!("{world}-{strategy:?}"));
        std::fs::create_dir_all(run.join("checkpoints")).unwrap();
        copy_dir(&saved.join("step-10"), &run.join("checkpoints/step-10"));
        let config = with_checkpoints(
            self::config(tiny_transformer(), strategy, world),
            &run.join("checkpoints"),
            CheckpointFormat::Sharded,
        );
        let resumed = run_sharded(&run, "resumed", &config);
        assert!(
            rank0_log(&run).contains("saved by 2 rank(s)"),
            "{}",
            rank0_log(&run)
        );
        assert_eq!(resumed.metrics[0].step, 11);
        let (next, expected) = (resumed.losses[0], straight.losses[10]);
        assert!(
            (next - expected).abs() <= 1e-6,
            "{world} ranks {strategy:?}: step 11 loss {next} vs uninterrupted {expected}"
        );
    }
}

#[test]
fn hybrid_and_no_shard_saves_resume_under_full_shard() {
    for (saved_world, saved_strategy, load_world) in [
        (4, ShardingStrategy::HybridShard, 2),
        (2, ShardingStrategy::NoShard, 3),
    ] {
        let tmp = temp_dir();
        let saved = tmp.path().join("saved");
        let config = with_checkpoints(
            config(tiny_transformer(), saved_strategy, saved_world),
            &saved,
            CheckpointFormat::Sharded,
        );
        let straight = run_sharded(tmp.path(), "straight", &config);
        // Only the first replica writes shards; every rank reports.
        let files = std::fs::read_dir(saved.join("step-10")).unwrap().count();
        let writers = if saved_strategy == ShardingStrategy::NoShard {
            1
        } else {
            2
        };
        assert_eq!(
            files,
            writers + 2,
            "{saved_strategy:?}: shards + metadata + COMPLETE"
        );

        let run = tmp.path().join("resumed");
        std::fs::create_dir_all(run.join("checkpoints")).unwrap();
        copy_dir(&saved.join("step-10"), &run.join("checkpoints/step-10"));
        let config = with_checkpoints(
            self::config(tiny_transformer(), ShardingStrategy::FullShard, load_world),
            &run.join("checkpoints"),
            CheckpointFormat::Sharded,
        );
        let resumed = run_sharded(&run, "resumed", &config);
        let (next, expected) = (resumed.losses[0], straight.losses[10]);
        assert!(
            (next - expected).abs() <= 1e-6,
            "{saved_strategy:?} on {saved_world} → FULL_SHARD on {load_world}: step 11 loss {next} vs {expected}"
        );
    }
}

/// A run resumed from weights that are already not finite (saved after it diverged) is told
/// so at its first step, before any update could be blamed: not a learning rate too high.
#[test]
fn a_loss_not_finite_before_any_update_is_not_blamed_on_the_learning_rate() {
    let tmp = temp_dir();
    let (_, mut config) = sharded_on_two_ranks(tmp.path());
    config.optimizer.lr = 1e30;
    config.steps = 10;
    let diverged = run_sharded(tmp.path(), "diverged", &config);
    assert!(diverged.losses.iter().any(|l| !l.is_finite()));
    assert!(rank0_log(tmp.path()).contains("training diverged (a learning rate too high"));

    config.steps = 12;
    run_sharded(tmp.path(), "resumed", &config);
    let log = rank0_log(tmp.path());
    assert!(
        log.contains(
            "step 11: the loss is NaN: not from training: at the first step after resuming"
        ),
        "{log}"
    );
}
