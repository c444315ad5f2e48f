//! Evaluation on the validation data: the mean loss per target token over the validation
//! sequences (all of them, or the first `max_batches` batches of the total batch size, a
//! training step's: the same sequences on any number of ranks and micro-batch size), and its
//! perplexity, every `every_steps` optimizer steps and after the last one.
//!
//! Ranks split the sequences in rounds of one micro-batch each, as in training (rank `r`
//! takes sequences `g·b·W + r·b ..` in round `g`), so every rank runs the same number of
//! forward passes (the FSDP gathers are collective); rows past the end of the validation
//! set are padding without targets.

use crate::data::{Batch, TrainingData};
use crate::fsdp::FsdpEngine;
use crate::train::TrainError;
use crate::{control, host};
use shardrun_protocol::config::{DataConfig, TrainConfig};
use shardrun_protocol::messages::EvalMetrics;
use std::time::Instant;
use tch::{Device, Kind, Tensor};

pub struct Evaluator {
    every_steps: Option<u64>,
    max_batches: Option<u64>,
    per_device: u64,
    total_batch: u64,
}

impl Evaluator {
    /// `None` when the data has no validation split.
    pub fn from_config(config: &TrainConfig) -> Option<Evaluator> {
        let DataConfig::Dataset(d) = &config.data else {
            return None;
        };
        let v = d.validation.as_ref()?;
        Some(Evaluator {
            every_steps: v.every_steps.filter(|&n| n > 0),
            max_batches: v.max_batches,
            per_device: config.batch.batch_size_per_device,
            total_batch: config.batch.total_batch_size,
        })
    }

    /// Whether to evaluate after optimizer step `step` (1-based) of `last`.
    pub fn due(&self, step: u64, last: u64) -> bool {
        step == last || self.every_steps.is_some_and(|n| step.is_multiple_of(n))
    }

    /// The validation loss after `step`, agreed by every rank: the losses stay on the
    /// device until one read at the end, summed across ranks on the control communicator.
    pub fn evaluate(
        &self,
        engine: &mut FsdpEngine,
        data: &TrainingData,
        step: u64,
        device: Device,
    ) -> Result<EvalMetrics, TrainError> {
        let started = Instant::now();
        let (rank, size) = {
            let world = &engine.groups().control;
            (world.rank() as u64, world.world_size() as u64)
        };
        let Some(documents) = data.documents() else {
            return Err(TrainError::Config("evaluation needs document data".into()));
        };
        let mut sequences = documents.validation().map_or(0, |v| v.sequences());
        if let Some(max) = self.max_batches {
            sequences = sequences.min(max.max(1).saturating_mul(self.total_batch));
        }
        // The total batch is a whole number of rounds (`per_device × world × accumulation`),
        // so a round never reaches past the first `max_batches` batches into real rows.
        let round = self.per_device * size;
        let mut loss_sum = Tensor::zeros([], (Kind::Double, device));
        let mut tokens = 0u64;
        for g in 0..sequences.div_ceil(round) {
            let first = g * round + rank * self.per_device;
            let host_batch = documents.validation_batch(first, self.per_device);
            let batch = Batch::from_host(&host_batch).upload(device);
            let loss = engine.forward_only(&batch)?;
            crate::progress::advance();
            // A batch of padding only has no loss (its mean is NaN).
            if host_batch.loss_tokens > 0 {
                loss_sum += loss * host_batch.loss_tokens as f64;
                tokens += host_batch.loss_tokens;
            }
        }
        let local = host::read(&loss_sum)?[0];
        let agreed = control::sum(engine.groups().control.as_ref(), &[local, tokens as f64])?;
        let eval_loss = agreed[0] / agreed[1].max(1.0);
        Ok(EvalMetrics {
            rank,
            step,
            eval_loss,
            eval_perplexity: eval_loss.exp(),
            eval_tokens: agreed[1] as u64,
            eval_time_s: started.elapsed().as_secs_f64(),
        })
    }
}
