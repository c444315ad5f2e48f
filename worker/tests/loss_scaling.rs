//! fp16 dynamic loss scaling and the LR schedule, with the real worker (2 CPU ranks): a step
//! whose gradients overflow is skipped, and a skipped step moves neither the LR schedule nor
//! AdamW's step count (Hugging Face Trainer / accelerate: no `scheduler.step()` when the
//! optimizer step was skipped). Every applied update `k` (0-based) runs at the schedule's LR
//! `k`, and a resumed run continues exactly, from the checkpoint's count of applied updates.
//!
//! Overflows are forced by starting the scaler at 2^23 (`SHARDRUN_FP16_INITIAL_SCALE`): the
//! scaled gradients overflow fp16 until the scale has been halved enough times.

mod common;

use common::*;
use shardrun_protocol::config::{DType, LrDecay, ShardingStrategy, TrainConfig};
use shardrun_protocol::messages::StepMetrics;
use std::path::Path;

const INITIAL_SCALE: f64 = 8388608.0; // 2^23
const PEAK_LR: f64 = 1e-2;
const WARMUP: u64 = 8;
const STEPS: u64 = 16;
const MIN_LR_RATIO: f64 = 0.1;

fn fp16_config() -> TrainConfig {
    let mut cfg = config(tiny_transformer(), ShardingStrategy::FullShard, 2);
    cfg.steps = STEPS;
    cfg.optimizer.lr = PEAK_LR;
    cfg.schedule.warmup_steps = WARMUP;
    cfg.schedule.decay = LrDecay::Linear;
    cfg.schedule.min_lr_ratio = MIN_LR_RATIO;
    cfg.fsdp.mixed_precision.param_dtype = DType::F16;
    cfg
}

fn env() -> Vec<(&'static str, String)> {
    vec![("SHARDRUN_FP16_INITIAL_SCALE", INITIAL_SCALE.to_string())]
}

fn run(dir: &Path, name: &str, cfg: &TrainConfig) -> RunResult {
    let env = env();
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    run_sharded_with_env(dir, name, cfg, &env)
}

/// The LR of applied update `k` (0-based): linear warmup over `WARMUP` updates to the peak,
/// then linear decay to `PEAK_LR · MIN_LR_RATIO` at update `STEPS - 1`.
fn expected_lr(k: u64) -> f64 {
    if k < WARMUP {
        return PEAK_LR * (k + 1) as f64 / WARMUP as f64;
    }
    let progress = ((k - WARMUP) as f64 / (STEPS - 1 - WARMUP) as f64).min(1.0);
    PEAK_LR - PEAK_LR * (1.0 - MIN_LR_RATIO) * progress
}

/// A skipped step reports a non-finite gradient norm (as torch's `clip_grad_norm_` returns it).
fn skipped(m: &StepMetrics) -> bool {
    !m.grad_norm.is_finite()
}

fn pattern(metrics: &[StepMetrics]) -> String {
    metrics
        .iter()
        .map(|m| format!("{}{}", m.step, if skipped(m) { "s" } else { "" }))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Every logged step's LR is the schedule at the number of updates applied before it, and the
/// loss scale halves exactly on the skipped steps.
fn assert_schedule_follows_applied_updates(metrics: &[StepMetrics], first_applied: u64) {
    let mut applied = first_applied;
    let mut scale = None;
    for m in metrics {
        let want = expected_lr(applied);
        assert!(
            (m.lr - want).abs() <= 1e-12 * PEAK_LR,
            "step {}: lr {} but {applied} update(s) were applied before it, so the schedule \
             gives {want} (steps, s = skipped: {})",
            m.step,
            m.lr,
            pattern(metrics)
        );
        let now = m.loss_scale.expect("fp16 reports its loss scale");
        if let Some(before) = scale {
            let want = if skipped(m) { before / 2.0 } else { before };
            assert_eq!(now, want, "step {}: loss scale", m.step);
        }
        scale = Some(now);
        if !skipped(m) {
            applied += 1;
        }
    }
}

#[test]
fn skipped_steps_leave_the_lr_schedule_where_it_was() {
    let dir = temp_dir();
    let result = run(dir.path(), "fp16", &fp16_config());
    let metrics = &result.metrics;
    assert_eq!(metrics.len() as u64, STEPS);
    let skips = metrics.iter().filter(|m| skipped(m)).count();
    assert!(
        (3..STEPS as usize - 4).contains(&skips),
        "a scale of 2^23 skips several early steps, not all: {}",
        pattern(metrics)
    );
    // The first step overflowed: its scale was halved once.
    assert!(skipped(&metrics[0]), "{}", pattern(metrics));
    assert_eq!(metrics[0].loss_scale, Some(INITIAL_SCALE / 2.0));
    assert_schedule_follows_applied_updates(metrics, 0);
    let log = std::fs::read_to_string(dir.path().join("rank0.log")).unwrap_or_default();
    assert_eq!(
        log.matches("step skipped").count(),
        skips,
        "one line per skipped step:\n{log}"
    );
    // Every rank skips on the same agreed overflow: rank 0 alone says so.
    let other = std::fs::read_to_string(dir.path().join("rank1.log")).unwrap();
    assert!(!other.contains("step skipped"), "{other}");
    assert!(
        result
            .params
            .values()
            .all(|p| p.values.iter().all(|v| v.is_finite())),
        "non-finite weights"
    );
}

/// The `trainer` block of a checkpoint's metadata.json.
fn trainer_metadata(dir: &Path) -> serde_json::Value {
    let text = std::fs::read_to_string(dir.join("metadata.json")).expect("metadata.json");
    let meta: serde_json::Value = serde_json::from_str(&text).expect("metadata parses");
    meta["trainer"].clone()
}

#[test]
fn resume_after_skipped_steps_continues_the_schedule_and_the_updates() {
    let tmp = temp_dir();
    let ckpt = tmp.path().join("checkpoints");
    let mut cfg = fp16_config();
    cfg.checkpoint.dir = Some(ckpt.clone());
    cfg.checkpoint.interval_steps = Some(2);
    cfg.checkpoint.keep = 100;
    cfg.checkpoint.resume = true;
    let straight = run(tmp.path(), "straight", &cfg);
    let metrics = &straight.metrics;
    assert_eq!(metrics.len() as u64, STEPS);
    assert_schedule_follows_applied_updates(metrics, 0);
    let applied_after = |step: u64| {
        metrics
            .iter()
            .filter(|m| m.step <= step && !skipped(m))
            .count() as u64
    };
    // Resume from the last checkpoint inside the run of skipped steps (the resumed run skips
    // more), and from the first one after it (the count of applied updates differs from the
    // step).
    let saved: Vec<u64> = (1..STEPS / 2).map(|i| 2 * i).collect();
    let inside = saved
        .iter()
        .rev()
        .copied()
        .find(|&s| skipped(&metrics[s as usize]) && applied_after(s) < s);
    let after = saved.iter().copied().find(|&s| {
        inside.is_some_and(|inside| s > inside) && applied_after(s) > 0 && applied_after(s) < s
    });
    let (Some(inside), Some(after)) = (inside, after) else {
        panic!(
            "no checkpoint inside and after the skipped steps: {}",
            pattern(metrics)
        );
    };
    for &step in &saved {
        let trainer = trainer_metadata(&ckpt.join(format!("step-{step}")));
        let applied = applied_after(step);
        assert_eq!(
            trainer["optimizer_step"],
            applied,
            "step-{step}: AdamW counts applied updates ({})",
            pattern(metrics)
        );
        assert_eq!(
            trainer["scheduler"]["step"],
            applied,
            "step-{step}: the schedule counts applied updates ({})",
            pattern(metrics)
        );
        let last_lr = trainer["scheduler"]["last_lr"].as_f64().unwrap();
        let want = expected_lr(applied.saturating_sub(1));
        assert!(
            (last_lr - want).abs() <= 1e-12 * PEAK_LR,
            "step-{step}: last_lr {last_lr}, want {want}"
        );
    }
    let all_checkpoints = tmp.path().join("all-checkpoints");
    std::fs::rename(&ckpt, &all_checkpoints).unwrap();
    for from in [inside, after] {
        // Only the checkpoints up to `from`: the resumed run continues from it.
        let _ = std::fs::remove_dir_all(&ckpt);
        std::fs::create_dir_all(&ckpt).unwrap();
        for step in saved.iter().filter(|&&s| s <= from) {
            let name = format!("step-{step}");
            copy_dir(&all_checkpoints.join(&name), &ckpt.join(&name));
        }
        let name = format!("resumed-{from}");
        let resumed = run(tmp.path(), &name, &cfg);
        let log = std::fs::read_to_string(tmp.path().join("rank0.log")).unwrap_or_default();
        assert!(
            log.contains("resumed from checkpoint") && log.contains(&format!("step-{from}")),
            "{log}"
        );
        let steps: Vec<u64> = resumed.metrics.iter().map(|m| m.step).collect();
        assert_eq!(steps, (from + 1..=STEPS).collect::<Vec<_>>());
        assert_schedule_follows_applied_updates(&resumed.metrics, applied_after(from));
        for (a, b) in metrics[from as usize..].iter().zip(&resumed.metrics) {
            assert_eq!(
                (a.loss.to_bits(), a.lr.to_bits(), a.loss_scale),
                (b.loss.to_bits(), b.lr.to_bits(), b.loss_scale),
                "{name}: step {} differs from the uninterrupted run",
                a.step
            );
            assert_eq!(skipped(a), skipped(b), "{name}: step {} skipped", a.step);
        }
        for (param, a) in &straight.params {
            let b = &resumed.params[param];
            let same = a
                .values
                .iter()
                .zip(&b.values)
                .all(|(x, y)| x.to_bits() == y.to_bits());
            assert!(
                same,
                "{name}: final {param} differs from the uninterrupted run"
            );
        }
    }
}
