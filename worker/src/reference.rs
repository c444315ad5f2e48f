//! Plain single-process training of the unsharded model: the same initialisation, data,
//! loss, AdamW, clipping and schedule as the sharded engine, written the obvious way
//! (whole-model forward, one `backward`). The ground truth sharded runs must equal.

use crate::data::{first_sample, TrainingData};
use crate::fsdp::FsdpError;
use crate::model::{self, Params};
use crate::optim::{adamw_step, AdamWState};
use crate::report::Reporter;
use crate::train::{device_of, dtype_kind, TrainError};
use shardrun_models::source::ParamSource;
use shardrun_protocol::config::{DType, TrainConfig};
use shardrun_protocol::messages::{LogLevel, StepMetrics};
use shardrun_protocol::schedule::Schedule;
use std::collections::HashMap;
use std::time::Instant;
use tch::{Kind, Tensor};

/// Trains `config` in one process on the whole global batch; returns the final parameters
/// in model order.
pub fn train_reference(
    config: &TrainConfig,
    reporter: &dyn Reporter,
) -> Result<Vec<(String, Tensor)>, TrainError> {
    let mp = &config.fsdp.mixed_precision;
    if mp.param_dtype != DType::F32 || mp.reduce_dtype != DType::F32 {
        return Err(TrainError::Config(
            "reference training runs in fp32: set mixed_precision param_dtype and reduce_dtype to f32".into(),
        ));
    }
    crate::train::check_config(config)?;
    let device = device_of(config.device)?;
    let model = model::build(&config.model, dtype_kind(mp.buffer_dtype));
    let specs = model.params();
    let source = ParamSource::for_model(&config.model, config.seed).map_err(FsdpError::from)?;
    // On CPU the step lines say the peak's growth over this, as the sharded engine's do.
    let rss_before_model = (device == tch::Device::Cpu).then(crate::metrics::rss_bytes);
    let params =
        model::full_parameters(model.as_ref(), &source, device).map_err(FsdpError::from)?;
    let mut states: HashMap<String, AdamWState> = params
        .iter()
        .map(|(name, p)| (name.clone(), AdamWState::zeros_like(&p.detach())))
        .collect();
    let dataset = TrainingData::new(config)?;
    let schedule = Schedule::of(config);
    // The whole global micro-batch at once: every rank's samples.
    let global_batch = config.batch.batch_size_per_device * config.batch.world_size;
    let accum = config.batch.grad_accum_steps;
    for step in 0..config.steps {
        let started = Instant::now();
        let lr = schedule.lr(step);
        let step_start = step * config.batch.total_batch_size;
        let batches = (0..accum)
            .map(|m| {
                dataset.samples(
                    first_sample(step_start, m, global_batch, 1, 0),
                    global_batch,
                )
            })
            .collect::<Result<Vec<_>, _>>()?;
        // The mean over the step's target tokens: micro-batch i weighs n_i / N.
        let tokens: u64 = batches.iter().map(|b| b.loss_tokens).sum();
        let mut loss_sum = 0.0;
        for batch in batches {
            let batch = batch.upload(device);
            let loss = model::forward(model.as_ref(), &Params::new(&params), &batch);
            if batch.loss_tokens > 0 {
                loss_sum += loss.double_value(&[]) * batch.loss_tokens as f64;
                (loss * (batch.loss_tokens as f64 / tokens as f64)).backward();
            }
        }
        let grad_norm = specs
            .iter()
            .map(|s| {
                params[&s.name]
                    .grad()
                    .square()
                    .sum(Kind::Double)
                    .double_value(&[])
            })
            .sum::<f64>()
            .sqrt();
        let coef = config
            .optimizer
            .grad_clip
            .map_or(1.0, |max| max / (grad_norm + 1e-6));
        for spec in &specs {
            let mut p = params[&spec.name].shallow_clone();
            let mut grad = p.grad();
            if coef < 1.0 {
                let _ = tch::no_grad(|| grad.g_mul_scalar_(coef));
            }
            let state = states.get_mut(&spec.name).expect("one state per parameter");
            let whole = 0..spec.numel();
            let decayed: &[std::ops::Range<i64>] = if config.optimizer.decays(spec.kind) {
                std::slice::from_ref(&whole)
            } else {
                &[]
            };
            adamw_step(
                &config.optimizer,
                lr,
                step + 1,
                &mut p,
                &grad,
                state,
                decayed,
            );
            p.zero_grad();
        }
        let loss = loss_sum / tokens.max(1) as f64;
        let step_time = started.elapsed().as_secs_f64();
        reporter.metrics(&StepMetrics {
            rank: 0,
            step: step + 1,
            loss,
            lr,
            grad_norm,
            step_time_s: step_time,
            tokens_per_s: config.tokens_per_step() as f64 / step_time,
            trained_tokens_per_s: dataset.documents().map(|_| tokens as f64 / step_time),
            mfu: None,
            model_state_bytes: config.model.num_params() * 16,
            peak_memory_bytes: crate::metrics::peak_rss_bytes(),
            rss_before_model_bytes: rss_before_model,
            loss_blew_up: config.model.blown_up_limit_passed_by(loss).is_some(),
            peak_reserved_bytes: None,
            device_used_bytes: None,
            device_total_bytes: None,
            loss_scale: None,
            epoch: dataset.documents().map(|d| {
                (step_start + config.batch.total_batch_size) as f64 / d.samples_per_epoch() as f64
            }),
            data_time_s: None,
            busy_time_s: None,
        });
        if (step + 1) % config.log_every.max(1) == 0 {
            reporter.log(
                LogLevel::Info,
                &format!(
                    "reference step {}/{} | loss {loss:.4} | grad norm {grad_norm:.3}",
                    step + 1,
                    config.steps
                ),
            );
        }
    }
    Ok(specs
        .iter()
        .map(|s| (s.name.clone(), params[&s.name].detach()))
        .collect())
}
