//! The training loop on top of the FSDP engine: micro-steps with gradient accumulation,
//! fp16 loss scaling agreed across ranks, global-norm clipping, AdamW, the LR schedule,
//! metrics every `log_every` steps, stops and preemption agreed at step boundaries, and a
//! summary when training finishes.
//!
//! One host read per optimizer step: the micro-steps' losses and the gradient norm stay on
//! the device until the end of backward, are read together ([`crate::host::read`]), and are
//! agreed across ranks on the control communicator (CPU). Clipping and the fp16 scaler's
//! decision then come from those host numbers, without reading the device again.

use crate::checkpointing::CheckpointingError;
use crate::collectives::CommError;
use crate::data::{first_sample, Batch, BatchLog, TrainingData, TrainingDataError};
use crate::evaluate::Evaluator;
use crate::fsdp::{EngineOptions, FsdpEngine, FsdpError, ProcessGroups};
use crate::report::{Reporter, ReporterObserver};
use crate::scaler::LossScaler;
use crate::stop::{self, StopReason, StopRequest};
use crate::{control, host, metrics};
use shardrun_data::dataset::thousands;
use shardrun_models::source::ParamSource;
use shardrun_models::BLOWN_UP_FACTOR;
use shardrun_protocol::config::{DType, DeviceKind, OnDivergence, TrainConfig};
use shardrun_protocol::messages::{
    grad_norm_text, loss_text, signal_name, EvalMetrics, LogLevel, StepMetrics, TrainSummary,
};
use shardrun_protocol::mib;
use shardrun_protocol::schedule::Schedule;
use std::sync::Arc;
use std::time::Instant;
use tch::{Device, Kind, Tensor};

#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    #[error(transparent)]
    Fsdp(#[from] FsdpError),
    #[error(transparent)]
    Data(#[from] TrainingDataError),
    #[error("control communicator: {0}")]
    Control(#[from] CommError),
    #[error("{0}")]
    Injected(String),
    #[error("checkpoint: {0}")]
    Checkpoint(String),
    #[error(transparent)]
    Save(#[from] SaveFailure),
    #[error("{0}")]
    Config(String),
}

/// A checkpoint that could not be saved under `root`, and why: the error keeps its type, so
/// a collective's error still names the peer rank the job is blamed on.
#[derive(Debug, thiserror::Error)]
#[error("{}", self.describe())]
pub struct SaveFailure {
    pub root: std::path::PathBuf,
    pub source: CheckpointingError,
}

impl SaveFailure {
    fn describe(&self) -> String {
        match &self.source {
            // Not a failed save: the checkpoint is there, and a resume uses it.
            saved @ CheckpointingError::AfterSave { .. } => format!("checkpoint: {saved}"),
            source => format!(
                "checkpoint: saving to {} failed: {source}",
                self.root.display()
            ),
        }
    }
}

impl TrainError {
    /// The other rank this error follows from, when a collective names one.
    pub fn peer_at_fault(&self) -> Option<usize> {
        match self {
            TrainError::Fsdp(e) => e.peer_at_fault(),
            TrainError::Control(e) => e.peer_at_fault(),
            TrainError::Save(e) => e.source.peer_at_fault(),
            _ => None,
        }
    }
}

/// Everything beyond the engine's shards that a resumed run needs to continue exactly.
/// The LR schedule is a function of `optimizer_steps`, the data of `samples_done`; training
/// draws no random numbers (no dropout), so the seed is the whole RNG state.
#[derive(Debug, Clone, PartialEq)]
pub struct TrainState {
    /// Optimizer steps completed (the next step to run).
    pub step: u64,
    /// Updates applied: AdamW's step count (bias correction) and the LR schedule's position.
    /// Less than `step` when fp16 overflows skipped some.
    pub optimizer_steps: u64,
    pub loss_scale: Option<f64>,
    pub growth_tracker: u64,
    pub seed: u64,
    /// Global micro-batches consumed.
    pub micro_batches_done: u64,
    /// Global samples consumed: the data position (whatever the world size).
    pub samples_done: u64,
    /// Identifies the training data's sample stream ([`shardrun_data::Dataset::fingerprint`]);
    /// `None` for synthetic data.
    pub data_fingerprint: Option<String>,
    /// Epochs of the training documents completed (`None` for synthetic data).
    pub epoch: Option<u64>,
    /// The step at which the run diverged (its update left the weights not finite).
    pub diverged_at: Option<u64>,
}

/// Why the checkpoint hook is called.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SaveReason {
    Interval,
    /// A preemption or time-limit notice (or a SIGTERM from Slurm not known to be a cancel).
    Preempt,
    /// The controller asks for one before a stop: a cancel under Slurm (whose kill follows
    /// its SIGTERM), a run directory that cannot be written.
    Stop,
    Final,
}

impl SaveReason {
    /// What kind of checkpoint this makes, for its log line (`interval checkpoint of step 20
    /// saved to …`).
    pub fn in_words(self) -> &'static str {
        match self {
            SaveReason::Interval => "interval",
            SaveReason::Preempt => "preemption",
            SaveReason::Stop => "stop",
            SaveReason::Final => "final",
        }
    }
}

/// Saves checkpoints; every rank calls it at the same step boundary (it may run collectives).
/// Returns the committed path (rank 0) for `Reporter::checkpoint_saved`.
pub trait CheckpointHook {
    fn save(
        &mut self,
        trainer: &Trainer,
        reason: SaveReason,
    ) -> Result<Option<String>, SaveFailure>;
    /// `Some(true)` when a wall-time interval has passed on this rank (rank 0's answer is
    /// the one acted on); `None` when saves are not timed.
    fn time_due(&self) -> Option<bool> {
        None
    }
}

/// How long a rank that learns of a stop from a peer waits for its own copy of the request
/// (the controller asks every rank), to say why in its own words.
const PEER_CAUSE_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// How long a rank that checkpointed for Slurm's SIGTERM waits for the controller's word that
/// the job is cancelled, not preempted: the controller asks Slurm first whether the job is
/// being requeued, which may take its 5 s limit.
const CANCEL_WORD_WAIT: std::time::Duration = std::time::Duration::from_secs(7);

pub fn dtype_kind(dtype: DType) -> Kind {
    match dtype {
        DType::F32 => Kind::Float,
        DType::Bf16 => Kind::BFloat16,
        DType::F16 => Kind::Half,
    }
}

/// This rank's device: the CPU, or its own GPU (chosen from the launcher's variables by
/// [`crate::device::select_cuda`], normally at start-up, before anything touched CUDA).
pub fn device_of(kind: DeviceKind) -> Result<Device, TrainError> {
    match kind {
        DeviceKind::Cpu => Ok(Device::Cpu),
        DeviceKind::Cuda => {
            let local_rank = crate::launch::RankEnv::from_env()
                .map(|e| e.local_rank)
                .unwrap_or(0);
            crate::device::select_cuda(local_rank)
                .map(|chosen| Device::Cuda(chosen.index))
                .map_err(TrainError::Config)
        }
    }
}

/// What must hold before training starts; each failure says which field to fix.
pub fn check_config(config: &TrainConfig) -> Result<(), TrainError> {
    let b = &config.batch;
    if b.batch_size_per_device == 0 || b.grad_accum_steps == 0 || b.world_size == 0 {
        return Err(TrainError::Config(
            "batch: sizes and grad_accum_steps must be positive".into(),
        ));
    }
    if b.batch_size_per_device * b.world_size * b.grad_accum_steps != b.total_batch_size {
        return Err(TrainError::Config(format!(
            "batch: total_batch_size {} != batch_size_per_device {} × world_size {} × grad_accum_steps {}",
            b.total_batch_size, b.batch_size_per_device, b.world_size, b.grad_accum_steps
        )));
    }
    if config.fsdp.max_gathers_in_flight == 0 {
        return Err(TrainError::Config(
            "fsdp.max_gathers_in_flight must be at least 1".into(),
        ));
    }
    config
        .model
        .validate(config.data.sequence_length(&config.model))
        .map_err(|why| TrainError::Config(format!("model: {why}")))
}

pub struct Trainer {
    pub config: TrainConfig,
    engine: FsdpEngine,
    dataset: TrainingData,
    schedule: Schedule,
    scaler: Option<LossScaler>,
    reporter: Arc<dyn Reporter>,
    rank: u64,
    device: Device,
    /// The step at which the run diverged, in this session or one it resumed.
    diverged_at: Option<u64>,
    /// Optimizer steps completed.
    step: u64,
    /// Global samples consumed (the next step starts at this sample).
    samples_done: u64,
    /// The step of the last checkpoint this session saved: a notice right after an interval
    /// save has that step on disk already, and a second save of it would spend the time
    /// before the kill.
    saved_step: Option<u64>,
    evaluator: Option<Evaluator>,
    last_eval: Option<EvalMetrics>,
    /// The most model state held at a step's end this session: what the summary reports,
    /// as the step lines did (an eval or checkpoint after the last step may free a copy).
    model_state_peak_bytes: u64,
    batch_log: Option<BatchLog>,
    /// A failure to inject (`SHARDRUN_INJECT_FAILURE`), for failure-handling tests.
    fault: Option<crate::fault::Injected>,
}

/// How a run ended.
pub struct TrainOutcome {
    pub summary: TrainSummary,
    /// Checkpointed and stopped early on a preemption request.
    pub preempted: bool,
    /// Stopped early on request without a checkpoint, and why (this rank's cause, or
    /// [`StopReason::Peer`]).
    pub stopped: Option<StopReason>,
    /// Optimizer steps completed when it ended.
    pub step: u64,
}

impl Trainer {
    /// A trainer whose model starts from its own source: the from-scratch generator, or
    /// its pretrained folder.
    pub fn new(
        config: TrainConfig,
        groups: ProcessGroups,
        reporter: Arc<dyn Reporter>,
    ) -> Result<Trainer, TrainError> {
        Trainer::starting_from(config, groups, reporter, None)
    }

    /// A trainer whose shards are filled from `source` (`None`: the model's own source).
    pub fn starting_from(
        config: TrainConfig,
        groups: ProcessGroups,
        reporter: Arc<dyn Reporter>,
        source: Option<ParamSource>,
    ) -> Result<Trainer, TrainError> {
        let world = groups.control.world_size() as u64;
        if config.batch.world_size != world {
            return Err(TrainError::Config(format!(
                "the config's batch plan is for {} ranks but this job has {world}: re-plan the batch for this world size",
                config.batch.world_size
            )));
        }
        check_config(&config)?;
        let device = device_of(config.device)?;
        let mp = &config.fsdp.mixed_precision;
        let options = EngineOptions {
            strategy: config.fsdp.strategy,
            param_kind: dtype_kind(mp.param_dtype),
            reduce_kind: dtype_kind(mp.reduce_dtype),
            activation_checkpointing: config.fsdp.activation_checkpointing,
            prefetch: config.fsdp.prefetch,
            max_gathers_in_flight: config.fsdp.max_gathers_in_flight,
            loss_chunk_tokens: config.fsdp.loss_chunk_tokens,
            device,
        };
        let rank = groups.control.rank() as u64;
        let model = crate::model::build(&config.model, dtype_kind(mp.buffer_dtype));
        let source = match source {
            Some(source) => source,
            None => ParamSource::for_model(&config.model, config.seed).map_err(FsdpError::from)?,
        };
        let engine = FsdpEngine::new(model, &config.fsdp.wrap, &source, groups, options)?;
        let l = engine.loading;
        reporter.log(
            LogLevel::Info,
            &format!(
                "rank {rank}: shards of {} parameters {} in {:.2} s; resident memory {:.0} MiB before, peak {:.0} MiB while loading",
                thousands(l.shard_elements),
                source.describe(),
                l.seconds,
                mib(l.rss_before_bytes),
                mib(l.peak_rss_bytes),
            ),
        );
        let dataset = TrainingData::open(&config, &ReporterObserver::new(reporter.as_ref(), rank))?;
        // Every rank reads the same data: rank 0 describes it, unless the controller has.
        let describe = rank == 0 && !reporter.data_described();
        if let Some(documents) = dataset.documents().filter(|_| describe) {
            for line in documents.summary() {
                match line.strip_prefix("warning: ") {
                    Some(warning) => reporter.log(LogLevel::Warn, warning),
                    None => reporter.log(LogLevel::Info, line),
                }
            }
        }
        let evaluator = Evaluator::from_config(&config);
        let batch_log = BatchLog::from_env(rank).map_err(TrainError::Config)?;
        let schedule = Schedule::of(&config);
        let scaler = (mp.param_dtype == DType::F16).then(LossScaler::default);
        let fault = crate::fault::Injected::from_env().map_err(TrainError::Config)?;
        Ok(Trainer {
            config,
            engine,
            dataset,
            schedule,
            scaler,
            reporter,
            rank,
            device,
            diverged_at: None,
            step: 0,
            samples_done: 0,
            saved_step: None,
            evaluator,
            last_eval: None,
            model_state_peak_bytes: 0,
            batch_log,
            fault,
        })
    }

    /// Starts fp16 loss scaling at `scale` instead of GradScaler's 2^16 (no effect otherwise).
    pub fn set_initial_loss_scale(&mut self, scale: f64) {
        if let Some(scaler) = self.scaler.as_mut() {
            scaler.scale = scale;
        }
    }

    /// Where this rank's lines and metrics go.
    pub fn reporter(&self) -> &Arc<dyn Reporter> {
        &self.reporter
    }

    pub fn engine(&self) -> &FsdpEngine {
        &self.engine
    }

    pub fn engine_mut(&mut self) -> &mut FsdpEngine {
        &mut self.engine
    }

    pub fn train_state(&self) -> TrainState {
        TrainState {
            step: self.step,
            optimizer_steps: self.engine.optimizer_steps,
            loss_scale: self.scaler.as_ref().map(|s| s.scale),
            growth_tracker: self.scaler.as_ref().map_or(0, |s| s.growth_tracker),
            seed: self.config.seed,
            micro_batches_done: self.step * self.config.batch.grad_accum_steps,
            samples_done: self.samples_done,
            data_fingerprint: self.data_fingerprint(),
            epoch: self
                .dataset
                .documents()
                .map(|d| d.epoch_of(self.samples_done)),
            diverged_at: self.diverged_at,
        }
    }

    fn data_fingerprint(&self) -> Option<String> {
        self.dataset
            .documents()
            .map(|d| d.fingerprint().to_string())
    }

    /// Continues from a checkpoint's state (the engine's shards are imported separately).
    pub fn restore(&mut self, state: &TrainState) -> Result<(), TrainError> {
        if state.seed != self.config.seed {
            return Err(TrainError::Checkpoint(format!(
                "checkpoint was trained with seed {} but the config says {}",
                state.seed, self.config.seed
            )));
        }
        let current = self.data_fingerprint();
        if let (Some(saved), Some(now)) = (&state.data_fingerprint, &current) {
            if saved != now {
                return Err(TrainError::Checkpoint(format!(
                    "the training data changed since this checkpoint was saved (data {saved}, \
                     now {now}: other tokens, split, seq_len, packing or truncation), so the run would not \
                     see the samples an uninterrupted run sees; restore the data and settings, \
                     or start a new run from these weights with `checkpoint.from`"
                )));
            }
        }
        self.step = state.step;
        self.samples_done = state.samples_done;
        self.diverged_at = state.diverged_at;
        self.engine.optimizer_steps = state.optimizer_steps;
        if let (Some(scaler), Some(scale)) = (self.scaler.as_mut(), state.loss_scale) {
            scaler.scale = scale;
            scaler.growth_tracker = state.growth_tracker;
        }
        Ok(())
    }

    /// The largest of every rank's `value`, on the control communicator.
    fn agree_max(&self, value: f64) -> Result<f64, TrainError> {
        Ok(control::max(self.engine.groups().control.as_ref(), &[value])?[0])
    }

    /// Trains until `config.steps` or an agreed preemption.
    pub fn run(
        &mut self,
        mut hook: Option<&mut dyn CheckpointHook>,
    ) -> Result<TrainOutcome, TrainError> {
        let cfg = self.config.clone();
        let (b, accum, world) = (
            cfg.batch.batch_size_per_device,
            cfg.batch.grad_accum_steps,
            cfg.batch.world_size,
        );
        let tokens_per_step = cfg.tokens_per_step() as f64;
        let seq_len = cfg.data.sequence_length(&cfg.model);
        let peak_flops = metrics::PeakFlops::of(self.device, cfg.fsdp.mixed_precision.param_dtype);
        if let Some(note) = peak_flops.note() {
            self.log(LogLevel::Info, &note);
        }
        let peak_flops = peak_flops.flops();
        // (step, loss) of the first and last steps with target tokens.
        let (mut first_loss, mut last_loss) = (None, None);
        let mut diverged = false;
        let mut step_times = Vec::new();
        let mut preempted = false;
        let mut stopped = None;
        let first_step = self.step;
        let span = match self.step {
            0 => format!("for {} steps", cfg.steps),
            done => format!("from step {} to {}", done + 1, cfg.steps),
        };
        self.log(
            LogLevel::Info,
            &format!(
                "training {} {span}: {} over {world} rank(s), {} parameters, {} unit(s)",
                cfg.name,
                cfg.fsdp.strategy.name(),
                thousands(cfg.model.num_params()),
                self.engine.layouts().len()
            ),
        );
        // Step times run from one step's host read to the next: the device has then run
        // everything queued in between, the optimizer of the step before included, without a
        // synchronisation of its own.
        let mut clock = StepClock::now();
        while self.step < cfg.steps {
            match self.agree_on_stop()? {
                None => {}
                Some(StopRequest::Preempt) => {
                    preempted = true;
                    if self.step == first_step {
                        // Nothing trained since the start or the restored checkpoint.
                        if let Some(cause) = self.stop_for_a_cancel() {
                            preempted = false;
                            stopped = Some(cause);
                        } else {
                            self.log(
                                LogLevel::Warn,
                                &format!(
                                    "preemption or time-limit notice at step {}: stopping",
                                    self.step
                                ),
                            );
                        }
                        break;
                    }
                    let switch = stop::process();
                    let (by, reason) =
                        match (switch.asked_after_checkpoint(), switch.preempt_signal()) {
                            (Some(cause), _) => (cause.to_string(), SaveReason::Stop),
                            (None, Some(signal)) => (
                                signal_from_slurm(signal),
                                // Not named a preemption's: a cancel's SIGTERM is the same.
                                match signal {
                                    libc::SIGTERM => SaveReason::Stop,
                                    _ => SaveReason::Preempt,
                                },
                            ),
                            (None, None) => (
                                "preemption or time-limit notice".to_string(),
                                SaveReason::Preempt,
                            ),
                        };
                    if self.saved_step == Some(self.step) {
                        self.log(
                            LogLevel::Warn,
                            &format!(
                                "{by}: stopping after step {}, whose checkpoint is saved already",
                                self.step
                            ),
                        );
                    } else {
                        self.log(
                            LogLevel::Warn,
                            &format!("{by}: checkpointing after step {} and stopping", self.step),
                        );
                        self.save(&mut hook, reason)?;
                    }
                    // Slurm's SIGTERM reaches the controller too when the whole job is
                    // cancelled (`scancel`), which asks every rank for this checkpoint and
                    // then a stop: the job ends cancelled (its checkpoint kept), not
                    // preempted and requeued.
                    if let Some(cause) = self.stop_for_a_cancel() {
                        preempted = false;
                        stopped = Some(cause);
                    }
                    break;
                }
                Some(StopRequest::Stop(cause)) => {
                    // One line per rank: each says who asked it (or that a peer was asked).
                    self.log(
                        LogLevel::Warn,
                        &format!("stopping after step {}: {cause}", self.step),
                    );
                    stopped = Some(cause);
                    break;
                }
            }
            let step = self.step;
            // Diagnostics of the step (collectives, a checkpoint after it) carry its number.
            let _step_span = tracing::info_span!("step", step = step + 1).entered();
            if let Some(fault) = &self.fault {
                fault
                    .check(self.rank, step + 1)
                    .map_err(TrainError::Injected)?;
            }
            // The schedule counts applied updates, as AdamW's bias correction does: a step
            // skipped for an fp16 overflow leaves both where they were (Hugging Face's
            // Trainer steps its scheduler only when the optimizer stepped), so early skips
            // while the loss scale comes down do not eat the warmup.
            let lr = self.schedule.lr(self.engine.optimizer_steps);
            let scale = self.scaler.as_ref().map_or(1.0, |s| s.scale);
            self.note_epoch(step, step == first_step);
            let step_start = self.samples_done;
            let loading = Instant::now();
            let mut batches = Vec::with_capacity(accum as usize);
            for m in 0..accum {
                let first = first_sample(step_start, m, b, world, self.rank);
                let batch = self.dataset.samples(first, b)?;
                if let Some(log) = &self.batch_log {
                    log.record(step + 1, m, first, &batch);
                }
                batches.push(batch.upload(self.device));
            }
            let data_time = loading.elapsed().as_secs_f64();
            // The loss is a mean over the step's target tokens (all ranks, all micro-batches),
            // so micro-batch i weighs n_i / N whatever the world size or accumulation: with
            // padding and loss masks, micro-batches hold different numbers of targets.
            let local_tokens: u64 = batches.iter().map(|b| b.loss_tokens).sum();
            let global_tokens = if self.dataset.documents().is_some() {
                control::sum(
                    self.engine.groups().control.as_ref(),
                    &[local_tokens as f64],
                )?[0]
            } else {
                (local_tokens * world) as f64
            };
            let mut local_loss = Tensor::zeros([], (Kind::Double, self.device));
            // Each micro-batch is dropped once its backward is queued: what it made for its
            // layers (a packed batch's dense mask) must not pile up over the accumulation.
            for (m, batch) in batches.into_iter().enumerate() {
                let factor = token_share(scale, world, &batch, global_tokens);
                let loss = self
                    .engine
                    .forward_backward(&batch, factor, m as u64 + 1 == accum)?;
                crate::progress::advance();
                // A micro-batch without targets has no gradient and a NaN mean.
                if batch.loss_tokens > 0 {
                    local_loss += loss * batch.loss_tokens as f64;
                }
            }
            // The step's one host read: this rank's loss and gradient norm² together.
            let stats = Tensor::stack(&[local_loss, self.engine.local_grad_norm_sq()], 0);
            let stats = host::read(&stats)?;
            let (local_loss, local_norm_sq) = (stats[0], stats[1]);
            let (step_time, wait_time) = clock.lap();
            // One replica of each shard counts towards the norm; a non-finite norm is an
            // overflow (fp16) on this rank.
            let counted = self.engine.groups().replicate.rank() == 0;
            let agreed = control::sum(
                self.engine.groups().control.as_ref(),
                &[
                    local_loss,
                    if counted { local_norm_sq } else { 0.0 },
                    if local_norm_sq.is_finite() { 0.0 } else { 1.0 },
                ],
            )?;
            // Agreed over every rank: one line says it.
            if global_tokens == 0.0 && self.rank == 0 {
                self.log(
                    LogLevel::Warn,
                    &format!("step {}: no target tokens in the whole batch", step + 1),
                );
            }
            let loss = agreed[0] / global_tokens.max(1.0);
            self.samples_done = step_start + cfg.batch.total_batch_size;
            // Gradients carry the fp16 loss scale until they are unscaled below.
            // Non-finite on an fp16 overflow, and reported so (torch's clip_grad_norm_ returns
            // it the same way): a skipped step is not a clean one.
            let grad_norm = agreed[1].sqrt() / scale;
            let mut skipped = false;
            if let Some(scaler) = self.scaler.as_mut() {
                let found_inf = agreed[2] > 0.0;
                scaler.update(found_inf);
                skipped = found_inf;
            }
            // Every rank skips on the same agreed overflow: one line says it.
            if skipped {
                if self.rank == 0 {
                    self.log(LogLevel::Warn, &format!(
                        "step {}: fp16 gradients overflowed on some rank; step skipped, loss scale now {}",
                        step + 1, self.scaler.as_ref().map_or(0.0, |s| s.scale)
                    ));
                }
            } else {
                // Unscaling and clipping in one multiplication.
                let mut factor = 1.0 / scale;
                if let Some(max_norm) = cfg.optimizer.grad_clip {
                    let coef = max_norm / (grad_norm + 1e-6);
                    if coef < 1.0 {
                        factor *= coef;
                    }
                }
                if factor != 1.0 {
                    self.engine.scale_grads(factor);
                }
                self.engine.optimizer_step(&cfg.optimizer, lr)?;
            }
            self.engine.zero_grads();
            self.step += 1;
            // Read once a step: the step's record reports it, the summary its most.
            let state_bytes = self.engine.model_state_bytes();
            self.model_state_peak_bytes = self.model_state_peak_bytes.max(state_bytes);
            self.reporter.step_done(self.step);
            if self.step == first_step + 1 {
                if let Some(note) = crate::model::llama::document_attention_note() {
                    self.log(LogLevel::Info, note);
                }
            }

            let tokens_per_s = tokens_per_step / step_time;
            step_times.push(step_time);
            // Non-finite gradients that were applied (no loss scaler skipped the step) leave
            // the weights non-finite before the loss shows it. A loss far past a uniform
            // guess's says the weights are blown before their numbers overflow.
            let blown_up = cfg.model.blown_up_limit_passed_by(loss);
            let bad = if !loss.is_finite() {
                Some(format!("the loss is {loss}"))
            } else if !grad_norm.is_finite() && !skipped {
                Some(format!("the gradient norm is {grad_norm}"))
            } else {
                blown_up.map(|limit| {
                    format!(
                        "the loss is {loss:.4e}, past {limit:.1}, {BLOWN_UP_FACTOR} times a \
                         uniform guess's (ln of the vocabulary)"
                    )
                })
            };
            // Every rank sees the same all-reduced loss and norm, so all decide this alike.
            let mut stop_diverged = None;
            let mut divergence_warning = None;
            if let (Some(bad), false) = (&bad, skipped && blown_up.is_none()) {
                // Updated with what is not finite, the weights are not either from here on.
                self.diverged_at.get_or_insert(self.step);
                if cfg.on_divergence == OnDivergence::Stop {
                    stop_diverged = Some(StopReason::Diverged {
                        step: self.step,
                        what: bad.clone(),
                    });
                }
            }
            // Said once, and again where the run stops for it (after fp16 overflows said).
            if let (Some(bad), true) = (bad, !diverged || stop_diverged.is_some()) {
                diverged = true;
                // A first loss that is not finite, or blown up, comes before any update of
                // this session: no learning rate made it.
                let first =
                    self.step == first_step + 1 && (!loss.is_finite() || blown_up.is_some());
                let why = match (first, self.step, blown_up.is_some()) {
                    (true, 1, false) => {
                        "not from training: before any update, the weights it starts from \
                         (the model folder) or the data hold a value that is not finite"
                    }
                    (true, 1, true) => {
                        "not from training: before any update, the weights it starts from \
                         score far worse than guessing (weights that do not fit the model's \
                         config, or data tokenized for another model?)"
                    }
                    (true, _, false) => {
                        "not from training: at the first step after resuming, before any \
                         update, the checkpoint it resumed from holds weights that are not \
                         finite"
                    }
                    (true, _, true) => {
                        "not from training: at the first step after resuming, before any \
                         update, the checkpoint it resumed from scores far worse than guessing"
                    }
                    (false, _, _) => {
                        "training diverged (a learning rate too high for this model and batch?)"
                    }
                };
                let then = match (&stop_diverged, skipped && blown_up.is_none()) {
                    (Some(_), _) => "stopping here, as `training.on_divergence: stop` asks",
                    // The loss scaler skipped the update: the weights are still finite.
                    (None, true) => "the run goes on, as PyTorch's would",
                    (None, false) => {
                        "the run goes on, as PyTorch's would (`training.on_divergence: stop` \
                         ends such a run here)"
                    }
                };
                // Every rank decided it from the same values: one says it for all, after the
                // step's own line.
                if self.rank == 0 {
                    divergence_warning = Some(format!("step {}: {bad}: {why}; {then}", self.step));
                }
            }
            if global_tokens > 0.0 {
                first_loss.get_or_insert((self.step, loss));
                last_loss = Some((self.step, loss));
            }
            // The step a run stops at is recorded whatever `log_every` says: re-runs and
            // sweeps read from metrics.jsonl that it diverged.
            if self.step.is_multiple_of(cfg.log_every.max(1))
                || self.step == cfg.steps
                || stop_diverged.is_some()
            {
                let memory = metrics::Memory::of(self.device);
                let record = StepMetrics {
                    rank: self.rank,
                    step: self.step,
                    loss,
                    lr,
                    grad_norm,
                    step_time_s: step_time,
                    tokens_per_s,
                    trained_tokens_per_s: self
                        .dataset
                        .documents()
                        .map(|_| global_tokens / step_time),
                    mfu: peak_flops.map(|peak| {
                        metrics::mfu(&cfg.model, seq_len, tokens_per_s / world as f64, peak)
                    }),
                    model_state_bytes: state_bytes,
                    peak_memory_bytes: memory.peak,
                    rss_before_model_bytes: (!matches!(self.device, Device::Cuda(_)))
                        .then_some(self.engine.loading.rss_before_bytes),
                    loss_blew_up: blown_up.is_some(),
                    peak_reserved_bytes: memory.peak_reserved,
                    device_used_bytes: memory.device_used,
                    device_total_bytes: memory.device_total,
                    loss_scale: self.scaler.as_ref().map(|s| s.scale),
                    epoch: self
                        .dataset
                        .documents()
                        .map(|d| self.samples_done as f64 / d.samples_per_epoch() as f64),
                    data_time_s: Some(data_time),
                    // CPU ranks: the step less its wait for the other ranks. (A wait on
                    // NCCL blocks no host thread: no such split there.)
                    busy_time_s: (!matches!(self.device, Device::Cuda(_)))
                        .then_some((step_time - wait_time).max(0.0)),
                };
                self.reporter.metrics(&record);
                self.log(LogLevel::Info, &format_metrics(&record, cfg.steps));
            }
            if let Some(warning) = divergence_warning {
                self.log(LogLevel::Warn, &warning);
            }
            if stop_diverged.is_some() {
                // Without a checkpoint or an evaluation of weights that are not finite.
                stopped = stop_diverged;
                break;
            }
            if self
                .evaluator
                .as_ref()
                .is_some_and(|e| e.due(self.step, cfg.steps))
            {
                // The evaluation is not the next step's time; the optimizer step before it is
                // (the clock is moved on by the pause, not restarted after it).
                let paused = StepClock::now();
                self.evaluate()?;
                clock.leave_out(paused);
            }
            if cfg
                .checkpoint
                .interval_steps
                .is_some_and(|n| n > 0 && self.step.is_multiple_of(n))
                && self.step < cfg.steps
            {
                let paused = StepClock::now();
                self.save(&mut hook, SaveReason::Interval)?;
                clock.leave_out(paused);
            } else if self.step < cfg.steps {
                // Wall-time interval: rank 0's clock decides, all ranks follow together.
                if let Some(due) = hook.as_ref().and_then(|h| h.time_due()) {
                    let due = if self.rank == 0 && due { 1.0 } else { 0.0 };
                    let paused = StepClock::now();
                    if self.agree_max(due)? > 0.0 {
                        self.save(&mut hook, SaveReason::Interval)?;
                        clock.leave_out(paused);
                    }
                }
            }
        }
        let finished = !preempted && stopped.is_none();
        // A run resumed at its last step trained nothing: its final checkpoint is on disk.
        let trained = self.step > first_step;
        if finished && trained && hook.is_some() {
            self.save(&mut hook, SaveReason::Final)?;
        }
        let mut summary = self.summary(
            first_step + 1,
            first_loss,
            last_loss,
            tokens_per_step,
            &step_times,
        );
        if finished && trained {
            // Rank 0 reports for all: the highest peaks of any rank, as `shardrun metrics`,
            // in one all-reduce.
            let peaks = control::max(
                self.engine.groups().control.as_ref(),
                &[
                    summary.peak_memory_bytes as f64,
                    summary.peak_reserved_bytes.unwrap_or(0) as f64,
                ],
            )?;
            summary.peak_memory_bytes = peaks[0] as u64;
            if summary.peak_reserved_bytes.is_some() {
                summary.peak_reserved_bytes = Some(peaks[1] as u64);
            }
        }
        if finished && self.rank == 0 {
            if trained {
                self.reporter.summary(&summary);
                self.reporter.log(LogLevel::Info, &format_summary(&summary));
            } else {
                self.reporter.log(
                    LogLevel::Info,
                    &format!(
                        "nothing to train: already at step {} of {}",
                        self.step, cfg.steps
                    ),
                );
            }
        }
        Ok(TrainOutcome {
            summary,
            preempted,
            stopped,
            step: self.step,
        })
    }

    /// The cancel a stop for a preemption notice turns out to be (the controller's word,
    /// [`stop::StopSwitch::stop_after_checkpoint`]), said in this rank's stop line.
    fn stop_for_a_cancel(&self) -> Option<StopReason> {
        let cause = stop::process().stop_after_checkpoint(CANCEL_WORD_WAIT)?;
        self.log(
            LogLevel::Warn,
            &format!("stopping after step {}: {cause}", self.step),
        );
        Some(cause)
    }

    /// Whether to stop at this step boundary, agreed by all ranks (one all-reduce), so that
    /// they all stop after the same step: any rank asked (by a signal, the controller, or its
    /// reporter's preemption request) is enough.
    fn agree_on_stop(&self) -> Result<Option<StopRequest>, TrainError> {
        let own = stop::process().requested().or_else(|| {
            self.reporter
                .preempt_requested()
                .then_some(StopRequest::Preempt)
        });
        if let Some(own) = &own {
            tracing::debug!(step = self.step, request = ?own, "stop requested on this rank");
        }
        let code = self.agree_max(StopRequest::code(own.as_ref()))?;
        if code > 0.0 {
            tracing::debug!(step = self.step, code, "the ranks agreed to stop");
        }
        Ok(match StopRequest::agreed(code, own) {
            Some(StopRequest::Stop(StopReason::Peer)) => Some(StopRequest::Stop(
                stop::process()
                    .wait_for_cause(PEER_CAUSE_WAIT)
                    .unwrap_or(StopReason::Peer),
            )),
            agreed => agreed,
        })
    }

    /// Evaluates on the validation data; rank 0 reports it.
    fn evaluate(&mut self) -> Result<(), TrainError> {
        let Some(evaluator) = self.evaluator.as_ref() else {
            return Ok(());
        };
        let result = evaluator.evaluate(&mut self.engine, &self.dataset, self.step, self.device)?;
        if self.rank == 0 {
            self.reporter.eval(&result);
            self.reporter.log(LogLevel::Info, &format_eval(&result));
        }
        self.last_eval = Some(result);
        Ok(())
    }

    /// Says when an epoch of the training data begins (and where a resumed run is).
    fn note_epoch(&self, step: u64, first_of_run: bool) {
        let Some(documents) = self.dataset.documents() else {
            return;
        };
        let per_epoch = documents.samples_per_epoch();
        let samples = self.samples_done..self.samples_done + self.config.batch.total_batch_size;
        if let Some(line) = epochs_line(
            &epochs_begun(samples, per_epoch, first_of_run),
            step,
            per_epoch,
        ) {
            self.log(LogLevel::Info, &line);
        }
    }

    fn save(
        &mut self,
        hook: &mut Option<&mut dyn CheckpointHook>,
        reason: SaveReason,
    ) -> Result<(), TrainError> {
        let Some(hook) = hook.as_mut() else {
            if matches!(reason, SaveReason::Preempt | SaveReason::Stop) {
                self.log(
                    LogLevel::Warn,
                    "no checkpoint directory configured: stopping without a checkpoint",
                );
            }
            return Ok(());
        };
        if let Some(path) = hook.save(self, reason)? {
            self.reporter.checkpoint_saved(self.step, &path);
        }
        self.saved_step = Some(self.step);
        Ok(())
    }

    fn summary(
        &self,
        first_step: u64,
        first_loss: Option<(u64, f64)>,
        last_loss: Option<(u64, f64)>,
        tokens_per_step: f64,
        step_times: &[f64],
    ) -> TrainSummary {
        let cfg = &self.config;
        // Skip the first step (warm-up allocations) when there are others.
        let steady = if step_times.len() > 1 {
            &step_times[1..]
        } else {
            step_times
        };
        let memory = metrics::Memory::of(self.device);
        TrainSummary {
            strategy: cfg.fsdp.strategy.name().to_string(),
            world_size: cfg.batch.world_size,
            steps: self.step,
            first_step,
            first_loss: first_loss.map_or(f64::NAN, |(_, loss)| loss),
            last_loss: last_loss.map_or(f64::NAN, |(_, loss)| loss),
            first_loss_step: first_loss
                .map(|(step, _)| step)
                .filter(|&step| step != first_step),
            last_loss_step: last_loss
                .map(|(step, _)| step)
                .filter(|&step| step != self.step),
            no_loss: first_loss.is_none(),
            skipped_steps: self.step.saturating_sub(self.engine.optimizer_steps),
            model_state_bytes_per_rank: self
                .model_state_peak_bytes
                .max(self.engine.model_state_bytes()),
            unsharded_model_state_bytes: cfg.model.num_params() * 16,
            peak_memory_bytes: memory.peak,
            peak_reserved_bytes: memory.peak_reserved,
            // Tokens over time, not a mean of per-step rates (which slow steps pull less).
            mean_tokens_per_s: mean_throughput(tokens_per_step, steady),
            eval_loss: self.last_eval.as_ref().map(|e| e.eval_loss),
            eval_perplexity: self.last_eval.as_ref().map(|e| e.eval_perplexity),
        }
    }

    /// Info lines from rank 0 only; warnings and errors from every rank.
    pub fn log(&self, level: LogLevel, text: &str) {
        if self.rank == 0 || level != LogLevel::Info {
            self.reporter.log(level, text);
        }
    }
}

/// Where a step's time starts: one step's host read, and what this process had waited for
/// collectives until then.
struct StepClock {
    start: Instant,
    waited: std::time::Duration,
}

impl StepClock {
    fn now() -> StepClock {
        StepClock {
            start: Instant::now(),
            waited: crate::collectives::waited(),
        }
    }

    /// The step that ends now, in seconds: its time, and its wait for collectives; the next
    /// one starts now.
    fn lap(&mut self) -> (f64, f64) {
        let now = StepClock::now();
        let step = now.start.duration_since(self.start);
        let wait = now.waited.saturating_sub(self.waited);
        *self = now;
        (step.as_secs_f64(), wait.as_secs_f64())
    }

    /// Leaves out of the step what happened since `paused` (an evaluation, a checkpoint):
    /// the clock is moved on by the pause, not restarted after it.
    fn leave_out(&mut self, paused: StepClock) {
        let now = StepClock::now();
        self.start += now.start.duration_since(paused.start);
        self.waited += now.waited.saturating_sub(paused.waited);
    }
}

/// Tokens per second over `step_times` (0 when there are none).
fn mean_throughput(tokens_per_step: f64, step_times: &[f64]) -> f64 {
    let seconds: f64 = step_times.iter().sum();
    if seconds > 0.0 {
        tokens_per_step * step_times.len() as f64 / seconds
    } else {
        0.0
    }
}

/// Loss factor of one micro-batch: its share of the step's target tokens, times the world
/// size (the reduce-scatter averages over ranks) and the fp16 loss scale.
fn token_share(scale: f64, world: u64, batch: &Batch, global_tokens: f64) -> f64 {
    if global_tokens > 0.0 {
        scale * world as f64 * batch.loss_tokens as f64 / global_tokens
    } else {
        0.0
    }
}

pub fn format_eval(e: &EvalMetrics) -> String {
    format!(
        "eval after step {} | loss {:.4} | perplexity {:.2} | {} tokens | {:.2} s",
        e.step, e.eval_loss, e.eval_perplexity, e.eval_tokens, e.eval_time_s
    )
}

/// One step's line. On CPU the peak is said with its growth over the resident memory the
/// process had before its shards were allocated (libtorch and the runtime).
pub fn format_metrics(m: &StepMetrics, steps: u64) -> String {
    let trained = m
        .trained_tokens_per_s
        .map(|t| format!(" ({t:.0} trained)"))
        .unwrap_or_default();
    let mut line = format!(
        "step {}/{steps} | loss {} | lr {:.3e} | grad norm {} | {:.3} s | {:.0} tok/s{trained} | state {:.1} MiB",
        m.step, loss_text(m.loss()), m.lr, grad_norm_text(m.grad_norm), m.step_time_s, m.tokens_per_s, mib(m.model_state_bytes)
    );
    match (m.peak_reserved_bytes, m.rss_before_model_bytes) {
        (Some(reserved), _) => line.push_str(&format!(
            " | peak {:.0} MiB allocated, {:.0} MiB reserved",
            mib(m.peak_memory_bytes),
            mib(reserved)
        )),
        // The plan's memory figures leave the baseline out: the growth is what compares.
        (None, Some(baseline)) => line.push_str(&format!(
            " | peak RSS {:.0} MiB (+{:.0} MiB over the {:.0} MiB before the model)",
            mib(m.peak_memory_bytes),
            mib(m.peak_memory_bytes.saturating_sub(baseline)),
            mib(baseline)
        )),
        // A GPU whose allocator cannot say reports the process's RSS (`Memory::of`).
        (None, None) => line.push_str(&format!(" | peak RSS {:.0} MiB", mib(m.peak_memory_bytes))),
    }
    if let (Some(used), Some(total)) = (m.device_used_bytes, m.device_total_bytes) {
        let gib = |b: u64| b as f64 / f64::from(1u32 << 30);
        line.push_str(&format!(
            " | GPU {:.1}/{:.1} GiB in use",
            gib(used),
            gib(total)
        ));
    }
    if let Some(mfu) = m.mfu {
        line.push_str(&format!(" | MFU {:.1}%", mfu * 100.0));
    }
    if let Some(scale) = m.loss_scale {
        line.push_str(&format!(" | loss scale {scale}"));
    }
    line
}

/// The end-of-training summary people read: strategy, memory per rank against unsharded,
/// first and last loss, throughput.
pub fn format_summary(s: &TrainSummary) -> String {
    let savings = 100.0
        * (1.0 - s.model_state_bytes_per_rank as f64 / s.unsharded_model_state_bytes.max(1) as f64);
    // NO_SHARD with a low-precision param_dtype holds its copy of the parameters on top.
    let savings = match savings < 0.0 {
        false => format!("{savings:.1}%"),
        true => format!("none ({:.1}% more than unsharded)", -savings),
    };
    let rule = "=".repeat(60);
    format!(
        "\n{rule}\nFSDP training complete\nSharding strategy: {} ({} rank(s), {})\n\
         Model state per rank: {:.1} MiB (vs {:.1} MiB unsharded)\nModel state savings: {}\n\
         Peak memory per rank (highest): {}\n{}{}\
         Mean throughput: {:.0} tokens/s{}\n{rule}",
        s.strategy,
        s.world_size,
        s.steps_words(),
        mib(s.model_state_bytes_per_rank),
        mib(s.unsharded_model_state_bytes),
        savings,
        s.peak_memory_words(),
        if s.no_loss {
            "Loss: none, no step had target tokens (see the warnings above)\n".to_string()
        } else {
            // "Final loss:" aligned under "Initial loss: ".
            format!(
                "{:<13} {:.4}\n{:<13} {:.4}\n",
                format!("{}:", s.first_loss_label()),
                s.first_loss,
                format!("{}:", s.last_loss_label()),
                s.last_loss
            )
        },
        match (s.eval_loss, s.eval_perplexity) {
            (Some(loss), Some(ppl)) => {
                format!("Validation loss: {loss:.4} (perplexity {ppl:.2})\n")
            }
            _ => String::new(),
        },
        s.mean_tokens_per_s,
        // The first step's allocations and warm-up are left out when there are others.
        match s.steps.saturating_sub(s.first_step) {
            0 => String::new(),
            1 => format!(" (step {}; step {} warms up)", s.steps, s.first_step),
            _ => format!(
                " (steps {}-{}; step {} warms up)",
                s.first_step + 1,
                s.steps,
                s.first_step
            ),
        }
    )
}

/// What the log says of the epochs `begun` in `step` (from 0): data smaller than a step
/// begins several in one, said in one line.
fn epochs_line(begun: &[(u64, u64)], step: u64, per_epoch: u64) -> Option<String> {
    let (&(first, from), &(last, to)) = (begun.first()?, begun.last()?);
    let which = if first == last {
        format!(
            "epoch {} of the training data at step {} (sample {}",
            first + 1,
            step + 1,
            thousands(from)
        )
    } else {
        format!(
            "epochs {} to {} of the training data at step {} (samples {} to {}",
            first + 1,
            last + 1,
            step + 1,
            thousands(from),
            thousands(to)
        )
    };
    let plural = if per_epoch == 1 { "" } else { "s" };
    Some(format!(
        "{which}; {} sequence{plural} per epoch)",
        thousands(per_epoch)
    ))
}

/// The epochs (from 0) that begin within a step's global `samples`, with the sample each
/// begins at; on a run's first step also the epoch it starts in, at its first sample.
fn epochs_begun(
    samples: std::ops::Range<u64>,
    per_epoch: u64,
    first_of_run: bool,
) -> Vec<(u64, u64)> {
    let per_epoch = per_epoch.max(1);
    let first = samples.start / per_epoch;
    let mut begun: Vec<(u64, u64)> = (first..)
        .map(|epoch| (epoch, epoch * per_epoch))
        .skip_while(|&(_, sample)| sample < samples.start)
        .take_while(|&(_, sample)| sample < samples.end)
        .collect();
    if first_of_run && begun.first().map(|&(_, sample)| sample) != Some(samples.start) {
        begun.insert(0, (first, samples.start));
    }
    begun
}

/// A stop signal the rank had from Slurm, and what sends it: `SIGTERM from Slurm (a
/// preemption, a cancel or the job's end)`. The job's own notices go to its batch script
/// (`--signal=B:USR2`): a rank has SIGUSR2 from `scancel --signal=USR2`.
fn signal_from_slurm(signal: i32) -> String {
    let sent_by = match signal {
        libc::SIGTERM => "a preemption, a cancel or the job's end",
        _ => "a notice, as `scancel --signal=USR2` sends the ranks",
    };
    format!(
        "{} from Slurm ({sent_by})",
        signal_name(signal).unwrap_or("a signal")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_signal_from_slurm_names_what_sends_it() {
        assert_eq!(
            signal_from_slurm(libc::SIGUSR2),
            "SIGUSR2 from Slurm (a notice, as `scancel --signal=USR2` sends the ranks)"
        );
        assert_eq!(
            signal_from_slurm(libc::SIGTERM),
            "SIGTERM from Slurm (a preemption, a cancel or the job's end)"
        );
    }

    #[test]
    fn an_epoch_is_said_at_the_step_and_sample_it_begins() {
        // 100 sequences per epoch, 16 samples per step: epoch 2 begins at sample 100, in the
        // step reading 96..112.
        assert_eq!(epochs_begun(96..112, 100, false), vec![(1, 100)]);
        assert_eq!(epochs_begun(80..96, 100, false), vec![]);
        assert_eq!(epochs_begun(400..416, 100, false), vec![(4, 400)]);
        // A run's first step says where it is, and an epoch beginning later in that step.
        assert_eq!(epochs_begun(0..16, 100, true), vec![(0, 0)]);
        assert_eq!(epochs_begun(96..112, 100, true), vec![(0, 96), (1, 100)]);
        // Epochs shorter than a step: every one that begins is said.
        assert_eq!(
            epochs_begun(16..32, 5, false),
            vec![(4, 20), (5, 25), (6, 30)]
        );
        assert_eq!(
            epochs_begun(15..30, 5, false),
            vec![(3, 15), (4, 20), (5, 25)]
        );
    }

    #[test]
    fn epochs_begun_in_one_step_are_said_in_one_line() {
        assert_eq!(epochs_line(&[], 3, 100), None);
        assert_eq!(
            epochs_line(&[(1, 100)], 6, 100).unwrap(),
            "epoch 2 of the training data at step 7 (sample 100; 100 sequences per epoch)"
        );
        assert_eq!(
            epochs_line(&epochs_begun(0..4, 1, true), 0, 1).unwrap(),
            "epochs 1 to 4 of the training data at step 1 (samples 0 to 3; 1 sequence per epoch)"
        );
    }

    #[test]
    fn a_collective_error_names_the_peer_it_follows_from_through_every_wrapper() {
        let closed = CommError::Peer {
            rank: 1,
            addr: "node1:9".into(),
            what: "closed the connection".into(),
        };
        assert_eq!(
            TrainError::Fsdp(FsdpError::Comm(closed)).peer_at_fault(),
            Some(1)
        );
        let timeout = CommError::Timeout { rank: 2, secs: 300 };
        assert_eq!(TrainError::Control(timeout).peer_at_fault(), Some(2));
        assert_eq!(TrainError::Injected("x".into()).peer_at_fault(), None);
        let save = |source| {
            TrainError::Save(SaveFailure {
                root: "/runs/a/checkpoints".into(),
                source,
            })
        };
        let gather = CommError::Timeout { rank: 3, secs: 300 };
        assert_eq!(
            save(CheckpointingError::Comm(gather)).peer_at_fault(),
            Some(3)
        );
        assert_eq!(
            save(CheckpointingError::Other("disk full".into())).peer_at_fault(),
            None
        );
        // A rank that died just after the commit: the checkpoint is not said to have failed.
        let after = save(CheckpointingError::AfterSave {
            step: 440,
            source: CommError::Timeout { rank: 1, secs: 300 },
        });
        assert_eq!(after.peer_at_fault(), Some(1));
        let said = after.to_string();
        assert!(
            said.starts_with("checkpoint: the checkpoint of step 440 is saved, but a rank left")
                && !said.contains("failed:"),
            "{said}"
        );
        let invalid = CommError::Invalid("sizes differ".into());
        assert_eq!(
            TrainError::Fsdp(FsdpError::Comm(invalid)).peer_at_fault(),
            None
        );
    }

    #[test]
    fn mean_throughput_is_tokens_over_time() {
        // 100 tokens a step, steps of 1 s and 3 s: 200 tokens in 4 s, not the mean of the
        // rates (66.7).
        assert_eq!(mean_throughput(100.0, &[1.0, 3.0]), 50.0);
        assert_eq!(mean_throughput(100.0, &[]), 0.0);
    }

    #[test]
    fn the_summary_says_which_steps_its_throughput_is_of() {
        let mut s = TrainSummary {
            strategy: "FULL_SHARD".into(),
            world_size: 2,
            steps: 200,
            first_step: 1,
            first_loss: 8.0,
            last_loss: 5.0,
            first_loss_step: None,
            last_loss_step: None,
            no_loss: false,
            skipped_steps: 0,
            model_state_bytes_per_rank: 1 << 20,
            unsharded_model_state_bytes: 2 << 20,
            peak_memory_bytes: 1 << 29,
            peak_reserved_bytes: None,
            mean_tokens_per_s: 2697.4,
            eval_loss: None,
            eval_perplexity: None,
        };
        let line = |s: &TrainSummary| {
            let text = format_summary(s);
            let line = text.lines().find(|l| l.starts_with("Mean throughput"));
            line.unwrap().to_string()
        };
        assert_eq!(
            line(&s),
            "Mean throughput: 2697 tokens/s (steps 2-200; step 1 warms up)"
        );
        (s.first_step, s.steps) = (301, 302);
        assert_eq!(
            line(&s),
            "Mean throughput: 2697 tokens/s (step 302; step 301 warms up)"
        );
        s.steps = 301;
        assert_eq!(line(&s), "Mean throughput: 2697 tokens/s");
        let text = format_summary(&s);
        assert!(
            text.contains("\nLoss at step 301: 8.0000\nFinal loss:   5.0000\n"),
            "{text}"
        );
    }

    #[test]
    fn a_blown_up_step_is_said_in_scientific_notation() {
        let m = StepMetrics {
            step: 2,
            loss: 9_954_520.5,
            grad_norm: 1.692_916_097_956_767_4e16,
            ..Default::default()
        };
        let line = format_metrics(&m, 12);
        assert!(
            line.starts_with("step 2/12 | loss 9.955e6 | lr 0.000e0 | grad norm 1.693e16 |"),
            "{line}"
        );
        let calm = format_metrics(
            &StepMetrics {
                grad_norm: 0.5594,
                ..m
            },
            12,
        );
        assert!(calm.contains("| grad norm 0.559 |"), "{calm}");
    }

    #[test]
    fn the_step_line_puts_trained_tokens_beside_all_tokens() {
        let m = StepMetrics {
            step: 3,
            loss: 2.5,
            tokens_per_s: 1000.0,
            trained_tokens_per_s: Some(800.0),
            ..Default::default()
        };
        let line = format_metrics(&m, 10);
        assert!(
            line.contains("| 1000 tok/s (800 trained) | state"),
            "{line}"
        );
        assert!(line.starts_with("step 3/10 | loss 2.5000 |"), "{line}");
        let synthetic = format_metrics(
            &StepMetrics {
                trained_tokens_per_s: None,
                ..m.clone()
            },
            10,
        );
        assert!(synthetic.contains("| 1000 tok/s | state"), "{synthetic}");
        assert!(
            synthetic.starts_with("step 3/10 | loss 2.5000 |"),
            "{synthetic}"
        );
        // A batch without target tokens has no loss (0 stands in the record).
        let empty = format_metrics(
            &StepMetrics {
                loss: 0.0,
                trained_tokens_per_s: Some(0.0),
                ..m
            },
            10,
        );
        assert!(empty.starts_with("step 3/10 | loss - |"), "{empty}");
    }

    #[test]
    fn the_step_line_says_what_its_peak_memory_is() {
        const MIB: u64 = 1 << 20;
        let cpu = StepMetrics {
            step: 3,
            peak_memory_bytes: 381 * MIB,
            rss_before_model_bytes: Some(349 * MIB),
            ..Default::default()
        };
        // CPU: the process's resident peak, and its growth over the baseline, which is what
        // the plan's figure compares with.
        let line = format_metrics(&cpu, 10);
        assert!(
            line.ends_with("| peak RSS 381 MiB (+32 MiB over the 349 MiB before the model)"),
            "{line}"
        );
        let gpu = StepMetrics {
            peak_reserved_bytes: Some(512 * MIB),
            rss_before_model_bytes: None,
            ..cpu.clone()
        };
        let line = format_metrics(&gpu, 10);
        assert!(
            line.ends_with("| peak 381 MiB allocated, 512 MiB reserved"),
            "{line}"
        );
        // A GPU whose allocator could not say: its process's RSS, said so.
        let unknown = StepMetrics {
            rss_before_model_bytes: None,
            ..cpu
        };
        let line = format_metrics(&unknown, 10);
        assert!(line.ends_with("| peak RSS 381 MiB"), "{line}");
    }
}
