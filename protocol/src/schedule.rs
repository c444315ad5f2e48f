//! Learning-rate schedule: linear warmup to the peak, then cosine, linear or constant decay
//! to `lr · min_lr_ratio` at the last step.

use crate::config::{LrDecay, LrSchedule, TrainConfig};

#[derive(Debug, Clone)]
pub struct Schedule {
    peak: f64,
    config: LrSchedule,
    total_steps: u64,
}

impl Schedule {
    pub fn new(peak: f64, config: LrSchedule, total_steps: u64) -> Self {
        Schedule {
            peak,
            config,
            total_steps,
        }
    }

    /// The schedule a job trains with: its optimizer's peak LR over its `steps`.
    pub fn of(config: &TrainConfig) -> Self {
        Schedule::new(config.optimizer.lr, config.schedule.clone(), config.steps)
    }

    /// Learning rate of optimizer step `step` (0-based).
    pub fn lr(&self, step: u64) -> f64 {
        let warmup = self.config.warmup_steps;
        if step < warmup {
            return self.peak * (step + 1) as f64 / warmup as f64;
        }
        let min = self.peak * self.config.min_lr_ratio;
        let decay_steps = self.total_steps.saturating_sub(1).saturating_sub(warmup);
        // A decay of one update starts at the peak, as every decay does: the floor is for
        // the last of several (HF's schedules give a one-step run its full LR too).
        let progress = if decay_steps == 0 {
            0.0
        } else {
            ((step - warmup) as f64 / decay_steps as f64).min(1.0)
        };
        match self.config.decay {
            LrDecay::Constant => self.peak,
            LrDecay::Linear => self.peak - (self.peak - min) * progress,
            LrDecay::Cosine => {
                min + (self.peak - min) * 0.5 * (1.0 + (std::f64::consts::PI * progress).cos())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn schedule(decay: LrDecay) -> Schedule {
        Schedule::new(
            1.0,
            LrSchedule {
                warmup_steps: 2,
                decay,
                min_lr_ratio: 0.1,
            },
            12,
        )
    }

    #[test]
    fn warmup_then_decay_to_the_floor_at_the_last_step() {
        let s = schedule(LrDecay::Cosine);
        assert_eq!(s.lr(0), 0.5);
        assert_eq!(s.lr(1), 1.0);
        assert_eq!(s.lr(2), 1.0);
        assert!((s.lr(11) - 0.1).abs() < 1e-12);
        assert!((schedule(LrDecay::Linear).lr(11) - 0.1).abs() < 1e-12);
        assert!((schedule(LrDecay::Linear).lr(8) - (1.0 - 0.9 * 6.0 / 9.0)).abs() < 1e-12);
        assert_eq!(schedule(LrDecay::Constant).lr(11), 1.0);
    }

    #[test]
    fn a_decay_of_one_update_trains_at_the_peak() {
        for decay in [LrDecay::Cosine, LrDecay::Linear] {
            let no_warmup = LrSchedule {
                warmup_steps: 0,
                decay,
                min_lr_ratio: 0.1,
            };
            assert_eq!(Schedule::new(1.0, no_warmup.clone(), 1).lr(0), 1.0);
            let two = Schedule::new(1.0, no_warmup, 2);
            assert!(two.lr(0) == 1.0 && (two.lr(1) - 0.1).abs() < 1e-12);
            // Warmup 2 of 3 steps: 0.5, 1.0, then the one decay update at the peak.
            let three = Schedule::new(
                1.0,
                LrSchedule {
                    warmup_steps: 2,
                    decay,
                    min_lr_ratio: 0.1,
                },
                3,
            );
            assert_eq!([three.lr(0), three.lr(1), three.lr(2)], [0.5, 1.0, 1.0]);
        }
    }
}
