//! AdamW's hyper-parameters and the learning-rate schedule.

use super::{defaults, ResolveError, Section};
use shardrun_protocol::config::{default_no_weight_decay, LrDecay, LrSchedule, OptimizerConfig};
use std::cmp::Ordering;

pub fn resolve_optimizer(s: &Section) -> Result<OptimizerConfig, ResolveError> {
    let o = &s.spec().training.optimizer;
    let optimizer = OptimizerConfig {
        lr: o.lr.unwrap_or(defaults::LR),
        beta1: o.beta1.unwrap_or(defaults::BETA1),
        beta2: o.beta2.unwrap_or(defaults::BETA2),
        eps: o.eps.unwrap_or(defaults::EPS),
        weight_decay: o.weight_decay.unwrap_or(defaults::WEIGHT_DECAY),
        grad_clip: o.grad_clip,
        no_weight_decay: o
            .no_weight_decay
            .clone()
            .unwrap_or_else(default_no_weight_decay),
    };
    if !(optimizer.lr.is_finite() && optimizer.lr > 0.0) {
        return Err(s.err(
            "training.optimizer.lr",
            format!("lr {} is not a positive number", optimizer.lr),
            "use e.g. `lr: 3.0e-4`",
        ));
    }
    for (field, beta) in [
        ("training.optimizer.beta1", optimizer.beta1),
        ("training.optimizer.beta2", optimizer.beta2),
    ] {
        if !(0.0..1.0).contains(&beta) {
            return Err(s.err(
                field,
                format!("{beta} is outside [0, 1)"),
                "use a value like 0.9 or 0.999",
            ));
        }
    }
    if optimizer.eps.partial_cmp(&0.0) != Some(Ordering::Greater) {
        return Err(s.err(
            "training.optimizer.eps",
            format!("`eps` is {}; it must be above 0", optimizer.eps),
            "use e.g. `eps: 1.0e-8` (AdamW's default)",
        ));
    }
    if optimizer
        .weight_decay
        .partial_cmp(&0.0)
        .is_none_or(|o| o.is_lt())
    {
        return Err(s.err(
            "training.optimizer.weight_decay",
            format!(
                "`weight_decay` is {}; it must be 0 or more",
                optimizer.weight_decay
            ),
            "use e.g. `weight_decay: 0.01`, or 0 for none",
        ));
    }
    if let Some(clip) = optimizer
        .grad_clip
        .filter(|c| c.partial_cmp(&0.0) != Some(Ordering::Greater))
    {
        return Err(s.err(
            "training.optimizer.grad_clip",
            format!("grad_clip {clip} is not positive"),
            "use e.g. `grad_clip: 1.0`, or remove it to disable clipping",
        ));
    }
    Ok(optimizer)
}

pub fn resolve_schedule(s: &Section) -> Result<LrSchedule, ResolveError> {
    let t = &s.spec().training;
    let sched = &t.schedule;
    let schedule = LrSchedule {
        warmup_steps: sched.warmup_steps.unwrap_or(0),
        decay: sched.decay.unwrap_or(LrDecay::Cosine),
        min_lr_ratio: sched.min_lr_ratio.unwrap_or(defaults::MIN_LR_RATIO),
    };
    if schedule.warmup_steps > t.steps {
        return Err(s.err(
            "training.schedule.warmup_steps",
            format!(
                "{} warmup steps but only {} steps",
                schedule.warmup_steps, t.steps
            ),
            format!("use at most {} warmup steps", t.steps),
        ));
    }
    if !(0.0..=1.0).contains(&schedule.min_lr_ratio) {
        return Err(s.err(
            "training.schedule.min_lr_ratio",
            format!("{} is outside [0, 1]", schedule.min_lr_ratio),
            "use e.g. `min_lr_ratio: 0.1`",
        ));
    }
    Ok(schedule)
}
