//! AdamW with PyTorch's semantics (`torch.optim.AdamW`, single-tensor path), applied to one
//! flat fp32 tensor at a time: a unit's shard under FSDP, a whole parameter in the reference.

use shardrun_protocol::config::OptimizerConfig;
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
