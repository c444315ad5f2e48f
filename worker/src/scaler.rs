//! Dynamic loss scaling for fp16 (PyTorch's `GradScaler` defaults): scale the loss so small
//! gradients survive fp16, skip the step and halve the scale when any rank saw inf/NaN,
//! double it after `growth_interval` clean steps.

#[derive(Debug, Clone, PartialEq)]
pub struct LossScaler {
    pub scale: f64,
    /// Clean steps since the last change of scale.
    pub growth_tracker: u64,
    growth_factor: f64,
    backoff_factor: f64,
    growth_interval: u64,
}

impl Default for LossScaler {
    fn default() -> Self {
        LossScaler {
            scale: 65536.0,
            growth_tracker: 0,
            growth_factor: 2.0,
            backoff_factor: 0.5,
            growth_interval: 2000,
        }
    }
}

impl LossScaler {
    /// Records one step's outcome; `found_inf` must already agree across ranks.
    pub fn update(&mut self, found_inf: bool) {
        if found_inf {
            self.scale *= self.backoff_factor;
            self.growth_tracker = 0;
        } else {
            self.growth_tracker += 1;
            if self.growth_tracker == self.growth_interval {
                self.scale *= self.growth_factor;
                self.growth_tracker = 0;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backs_off_on_overflow_and_grows_after_the_interval() {
        let mut s = LossScaler {
            growth_interval: 2,
            ..LossScaler::default()
        };
        s.update(true);
        assert_eq!(s.scale, 32768.0);
        s.update(false);
        s.update(false);
        assert_eq!((s.scale, s.growth_tracker), (65536.0, 0));
    }
}
