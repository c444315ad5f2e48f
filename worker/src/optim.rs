//! AdamW with PyTorch's semantics (`torch.optim.AdamW`): [`adamw_step`] is the single-tensor
//! path, one flat fp32 tensor at a time (a whole parameter in the reference trainer);
//! [`adamw_step_fused`] is the fused path the FSDP engine takes for all its shards at once
//! (one multi-tensor kernel launch on CUDA instead of about ten kernels per unit).

use crate::fsdp::shim::{self, AdamWStep, ShimError};
use shardrun_protocol::config::OptimizerConfig;
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

/// Updates `param` in place from `grad`; `step` counts from 1 (bias correction).
pub fn adamw_step(
    config: &OptimizerConfig,
    lr: f64,
    step: u64,
    param: &mut Tensor,
    grad: &Tensor,
    state: &mut AdamWState,
) {
    tch::no_grad(|| {
        let _ = param.g_mul_scalar_(1.0 - lr * config.weight_decay);
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
/// kernel's arithmetic. All tensors are fp32 on one device.
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
        }
    }

    /// The fused path makes the single-tensor path's update: several tensors (sizes that
    /// are not multiples of any vector width), several steps with a changing learning rate.
    #[test]
    fn fused_adamw_matches_the_single_tensor_semantics() {
        tch::manual_seed(3);
        let sizes = [1i64, 7, 1000, 4099];
        let start: Vec<Tensor> = sizes
            .iter()
            .map(|&n| Tensor::randn([n], (Kind::Float, tch::Device::Cpu)))
            .collect();
        let mut single: Vec<Tensor> = start.iter().map(Tensor::copy).collect();
        let fused: Vec<Tensor> = start.iter().map(Tensor::copy).collect();
        let mut single_state: Vec<AdamWState> = single.iter().map(AdamWState::zeros_like).collect();
        let fused_state: Vec<AdamWState> = fused.iter().map(AdamWState::zeros_like).collect();
        let cfg = config();
        for step in 1..=6u64 {
            let lr = cfg.lr * step as f64 / 6.0;
            let grads: Vec<Tensor> = sizes
                .iter()
                .map(|&n| Tensor::randn([n], (Kind::Float, tch::Device::Cpu)) * (step as f64))
                .collect();
            for ((p, g), s) in single.iter_mut().zip(&grads).zip(single_state.iter_mut()) {
                adamw_step(&cfg, lr, step, p, g, s);
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
}
