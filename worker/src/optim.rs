//! AdamW with PyTorch's semantics (`torch.optim.AdamW`): [`adamw_step`] is the single-tensor
//! path, one flat fp32 tensor at a time (a whole parameter in the reference trainer);
//! [`adamw_step_fused`] is the fused path the FSDP engine takes for all its shards at once
//! (one multi-tensor kernel launch on CUDA instead of about ten kernels per unit).
//!
//! Parameter groups: weight decay applies only to the element ranges of the parameters whose
//! kind decays (`optimizer.no_weight_decay`, biases and norms by default), which is
//! `torch.optim.AdamW` with two groups, one of them at `weight_decay = 0`. The decay is
//! decoupled (applied to the parameter before the Adam update), so the engine applies it by
//! range and runs the fused update without it.

use crate::fsdp::FlatLayout;
use crate::shim::{self, AdamWStep, ShimError};
use shardrun_protocol::config::{OptimizerConfig, ParamKind};
use std::ops::Range;
use tch::{Kind, Tensor};

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

/// AdamW's decoupled weight decay, `param *= 1 - lr · weight_decay`, on the elements in
/// `decayed` (ranges of the flattened `param`) only.
pub fn decay_weights(config: &OptimizerConfig, lr: f64, param: &Tensor, decayed: &[Range<i64>]) {
    let factor = 1.0 - lr * config.weight_decay;
    if factor == 1.0 {
        return;
    }
    tch::no_grad(|| {
        let flat = param.view([-1]);
        for r in decayed {
            let _ = flat
                .narrow(0, r.start, r.end - r.start)
                .g_mul_scalar_(factor);
        }
    });
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
    decay_weights(config, lr, param, decayed);
    tch::no_grad(|| {
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

/// [`adamw_step`] on every `(param, grad, state)` at once, through libtorch's fused AdamW
/// (`torch.optim.AdamW(fused=True)`): the same update, up to the rounding of the fused
/// kernel's arithmetic, with `config.weight_decay` on every element (callers that exempt
/// some parameters apply [`decay_weights`] first and pass a config without decay). All
/// tensors are fp32 on one device.
pub fn adamw_step_fused(
    config: &OptimizerConfig,
    lr: f64,
    step: u64,
    tensors: &[(&Tensor, &Tensor, &AdamWState)],
) -> Result<(), ShimError> {
    let Some(first) = tensors.first() else {
        return Ok(());
    };
    // The step count as the fused kernel reads it: a float scalar on the tensors' device
    // (made by a fill on the device, no copy from the host).
    let step = Tensor::scalar_tensor(step as f64, (Kind::Float, first.0.device()));
    let lists: Vec<_> = tensors
        .iter()
        .map(|(p, g, s)| (*p, *g, &s.exp_avg, &s.exp_avg_sq))
        .collect();
    shim::fused_adamw(
        &lists,
        &step,
        AdamWStep {
            lr,
            beta1: config.beta1,
            beta2: config.beta2,
            weight_decay: config.weight_decay,
            eps: config.eps,
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> OptimizerConfig {
        OptimizerConfig {
            lr: 3e-3,
            beta1: 0.9,
            beta2: 0.95,
            eps: 1e-8,
            weight_decay: 0.1,
            grad_clip: None,
            no_weight_decay: Vec::new(),
        }
    }

    /// The fused path makes the single-tensor path's update: several tensors (sizes that
    /// are not multiples of any vector width), several steps with a changing learning rate.
    /// `n` values in [-1, 1) from `seed` alone (splitmix64): not from libtorch's global
    /// generator, which the tests running beside these draw from at the same time.
    fn values(n: i64, seed: u64) -> Tensor {
        let values: Vec<f32> = (0..n as u64)
            .map(|i| {
                let mut z = seed
                    .wrapping_mul(0x9E37_79B9_7F4A_7C15)
                    .wrapping_add(i.wrapping_mul(0xD1B5_4A32_D192_ED03));
                z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
                z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
                z ^= z >> 31;
                (z >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
            })
            .collect();
        Tensor::from_slice(&values)
    }

    #[test]
    fn fused_adamw_matches_the_single_tensor_semantics() {
        let sizes = [1i64, 7, 1000, 4099];
        let start: Vec<Tensor> = sizes.iter().map(|&n| values(n, n as u64)).collect();
        let mut single: Vec<Tensor> = start.iter().map(Tensor::copy).collect();
        let fused: Vec<Tensor> = start.iter().map(Tensor::copy).collect();
        let mut single_state: Vec<AdamWState> = single.iter().map(AdamWState::zeros_like).collect();
        let fused_state: Vec<AdamWState> = fused.iter().map(AdamWState::zeros_like).collect();
        let cfg = config();
        for step in 1..=6u64 {
            let lr = cfg.lr * step as f64 / 6.0;
            let grads: Vec<Tensor> = sizes
                .iter()
                .map(|&n| values(n, 1000 * step + n as u64) * (step as f64))
                .collect();
            for ((p, g), s) in single.iter_mut().zip(&grads).zip(single_state.iter_mut()) {
                let whole = 0..p.numel() as i64;
                adamw_step(&cfg, lr, step, p, g, s, std::slice::from_ref(&whole));
            }
            let list: Vec<_> = fused
                .iter()
                .zip(&grads)
                .zip(&fused_state)
                .map(|((p, g), s)| (p, g, s))
                .collect();
            adamw_step_fused(&cfg, lr, step, &list).unwrap();
        }
        for (i, (a, b)) in single.iter().zip(&fused).enumerate() {
            let moved = (a - &start[i]).abs().max().double_value(&[]);
            let diff = (a - b).abs().max().double_value(&[]);
            assert!(moved > 1e-3, "tensor {i} barely moved ({moved})");
            assert!(
                diff.is_finite() && diff <= 1e-6 * moved.max(1.0),
                "tensor {i}: {diff}"
            );
            let m = (&single_state[i].exp_avg - &fused_state[i].exp_avg)
                .abs()
                .max()
                .double_value(&[]);
            let v = (&single_state[i].exp_avg_sq - &fused_state[i].exp_avg_sq)
                .abs()
                .max()
                .double_value(&[]);
            assert!(
                m <= 1e-6 && v <= 1e-6,
                "tensor {i}: moments differ by {m}, {v}"
            );
        }
    }

    /// Several steps of [`adamw_step`] (moments, bias correction by step, decoupled decay,
    /// a learning rate that changes every step) make libtorch's own `torch::optim::AdamW`'s
    /// update, the C++ twin of `torch.optim.AdamW`.
    #[test]
    fn adamw_over_several_steps_equals_libtorchs_adamw() {
        use tch::nn::OptimizerConfig as _;
        let sizes = [3i64, 1000];
        let cfg = config();
        let vs = tch::nn::VarStore::new(tch::Device::Cpu);
        let theirs: Vec<Tensor> = sizes
            .iter()
            .map(|&n| {
                vs.root()
                    .var_copy(&format!("p{n}"), &values(n, 5 + n as u64))
            })
            .collect();
        let mut ours: Vec<Tensor> = theirs.iter().map(|t| t.detach().copy()).collect();
        let start: Vec<Tensor> = ours.iter().map(Tensor::copy).collect();
        let mut states: Vec<AdamWState> = ours.iter().map(AdamWState::zeros_like).collect();
        let mut torch = tch::nn::AdamW {
            beta1: cfg.beta1,
            beta2: cfg.beta2,
            wd: cfg.weight_decay,
            eps: cfg.eps,
            amsgrad: false,
        }
        .build(&vs, cfg.lr)
        .unwrap();
        for step in 1..=8u64 {
            let lr = cfg.lr * [1.0, 0.5, 0.25, 1.0][step as usize % 4];
            let grads: Vec<Tensor> = sizes
                .iter()
                .map(|&n| values(n, 2000 * step + n as u64) * step as f64)
                .collect();
            // libtorch's gradient is `grads` itself: d/dp of sum(p * g).
            torch.zero_grad();
            let loss = theirs
                .iter()
                .zip(&grads)
                .map(|(p, g)| (p * g).sum(Kind::Float))
                .fold(Tensor::from(0f32), |a, b| a + b);
            loss.backward();
            torch.set_lr(lr);
            torch.step();
            for ((p, g), state) in ours.iter_mut().zip(&grads).zip(states.iter_mut()) {
                let whole = 0..p.numel() as i64;
                adamw_step(&cfg, lr, step, p, g, state, std::slice::from_ref(&whole));
            }
        }
        for (i, (a, b)) in ours.iter().zip(&theirs).enumerate() {
            let moved = (a - &start[i]).abs().max().double_value(&[]);
            let diff = (a - b).abs().max().double_value(&[]);
            assert!(moved > 1e-3, "tensor {i} barely moved ({moved})");
            assert!(diff.is_finite() && diff <= 1e-6, "tensor {i}: {diff}");
        }
    }

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
        let cfg = OptimizerConfig {
            no_weight_decay: vec![ParamKind::Bias, ParamKind::Norm],
            ..config()
        };
        assert_eq!(decayed_ranges(&layout, &kinds, 0, &cfg), vec![0..6]);
        assert_eq!(decayed_ranges(&layout, &kinds, 1, &cfg), vec![3..8]);
        let all = OptimizerConfig {
            no_weight_decay: Vec::new(),
            ..cfg
        };
        assert_eq!(decayed_ranges(&layout, &kinds, 0, &all), vec![0..8]);
        assert_eq!(decayed_ranges(&layout, &kinds, 1, &all), vec![0..8]);
    }
}
