//! AdamW with PyTorch's semantics (`torch.optim.AdamW`, single-tensor path), applied to one
//! flat fp32 tensor at a time: a unit's shard under FSDP, a whole parameter in the reference.
//!
//! Parameter groups: weight decay applies only to the element ranges of the parameters whose
//! kind decays (`optimizer.no_weight_decay`, biases and norms by default), which is
//! `torch.optim.AdamW` with two groups, one of them at `weight_decay = 0`.

use crate::fsdp::FlatLayout;
use shardrun_protocol::config::{OptimizerConfig, ParamKind};
use std::ops::Range;
use tch::Tensor;

/// One parameter tensor's AdamW state.
pub struct AdamWState {
    pub exp_avg: Tensor,
    pub exp_avg_sq: Tensor,
}

impl AdamWState {
    pub fn zeros_like(param: &Tensor) -> Self {
        AdamWState {
            exp_avg: param.zeros_like(),
            exp_avg_sq: param.zeros_like(),
        }
    }

    pub fn bytes(&self) -> u64 {
        let bytes = |t: &Tensor| (t.numel() * t.kind().elt_size_in_bytes()) as u64;
        bytes(&self.exp_avg) + bytes(&self.exp_avg_sq)
    }
}

/// The element ranges of shard `shard_index` of `layout` that belong to parameters of a
/// decayed kind (`kinds[i]` is the kind of `layout.params[i]`), adjacent ranges merged.
pub fn decayed_ranges(
    layout: &FlatLayout,
    kinds: &[ParamKind],
    shard_index: i64,
    config: &OptimizerConfig,
) -> Vec<Range<i64>> {
    let (start, end) = layout.shard_range(shard_index);
    let mut ranges: Vec<Range<i64>> = Vec::new();
    for (p, &kind) in layout.params.iter().zip(kinds) {
        if !config.decays(kind) {
            continue;
        }
        if let Some((_, in_shard, len)) = FlatLayout::overlap(p, start, end) {
            match ranges.last_mut() {
                Some(last) if last.end == in_shard => last.end = in_shard + len,
                _ => ranges.push(in_shard..in_shard + len),
            }
        }
    }
    ranges
}

/// Updates `param` in place from `grad`; `step` counts from 1 (bias correction). Weight
/// decay applies to the elements in `decayed` only (ranges of the flattened `param`).
pub fn adamw_step(
    config: &OptimizerConfig,
    lr: f64,
    step: u64,
    param: &mut Tensor,
    grad: &Tensor,
    state: &mut AdamWState,
    decayed: &[Range<i64>],
) {
    tch::no_grad(|| {
        let factor = 1.0 - lr * config.weight_decay;
        if factor != 1.0 {
            let flat = param.view([-1]);
            for r in decayed {
                let _ = flat
                    .narrow(0, r.start, r.end - r.start)
                    .g_mul_scalar_(factor);
            }
        }
        let _ = state.exp_avg.lerp_(grad, 1.0 - config.beta1);
        let _ = state.exp_avg_sq.g_mul_scalar_(config.beta2);
        let _ = state
            .exp_avg_sq
            .addcmul_(&(grad * (1.0 - config.beta2)), grad);
        let bias_correction1 = 1.0 - config.beta1.powi(step as i32);
        let bias_correction2_sqrt = (1.0 - config.beta2.powi(step as i32)).sqrt();
        let step_size = lr / bias_correction1;
        let denom = (state.exp_avg_sq.sqrt() / bias_correction2_sqrt) + config.eps;
        let _ = param.addcdiv_(&(&state.exp_avg * -step_size), &denom);
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decayed_ranges_follow_kinds_and_the_shard() {
        // w (6 elements, decayed), b (3, bias), n (2, norm), v (5, decayed); 2 shards of 8.
        let layout = FlatLayout::new(
            "u",
            [
                ("w".to_string(), vec![2, 3]),
                ("b".to_string(), vec![3]),
                ("n".to_string(), vec![2]),
                ("v".to_string(), vec![5]),
            ],
            2,
        );
        let kinds = [
            ParamKind::Weight,
            ParamKind::Bias,
            ParamKind::Norm,
            ParamKind::Weight,
        ];
        let config = OptimizerConfig {
            lr: 1e-3,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.1,
            grad_clip: None,
            no_weight_decay: vec![ParamKind::Bias, ParamKind::Norm],
        };
        assert_eq!(decayed_ranges(&layout, &kinds, 0, &config), vec![0..6]);
        assert_eq!(decayed_ranges(&layout, &kinds, 1, &config), vec![3..8]);
        let all = OptimizerConfig {
            no_weight_decay: Vec::new(),
            ..config
        };
        assert_eq!(decayed_ranges(&layout, &kinds, 0, &all), vec![0..8]);
        assert_eq!(decayed_ranges(&layout, &kinds, 1, &all), vec![0..8]);
    }
}
