//! Typed messages, one enum per direction. Sent as JSON inside length-delimited frames (see
//! [`crate::connection`]) after the handshake.

use serde::{Deserialize, Serialize};

/// First frame on every connection, from the connecting side.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Hello {
    /// Always [`Hello::MAGIC`]; anything else is garbage and the connection is dropped.
    pub magic: String,
    pub version: u32,
    pub role: Role,
    /// The per-job secret (see [`crate::env::SECRET_FILE`]).
    pub secret: String,
}

impl Hello {
    pub const MAGIC: &'static str = "shardrun";
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    Worker,
    /// A `shardrun` client (status queries, preemption requests).
    Client,
}

/// The accepting side's answer to [`Hello`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum HelloReply {
    Accepted,
    Rejected { reason: String },
}

/// Worker → controller.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum FromWorker {
    /// Sent once, right after the handshake.
    Register(Registration),
    /// One log line of this rank.
    Log(LogLine),
    /// One metrics record (every `log_every` steps).
    Metrics(StepMetrics),
    /// One evaluation on the validation data (rank 0 sends this).
    Eval(EvalMetrics),
    /// Liveness while no other message is due (e.g. inside a long step).
    Heartbeat,
    /// A checkpoint of `step` was committed (rank 0 sends this).
    CheckpointSaved { step: u64, path: String },
    /// End-of-training summary (rank 0 sends this).
    Summary(TrainSummary),
    /// Last message before a clean exit. `preempted`: stopped early after checkpointing
    /// because the controller asked ([`ToWorker::Preempt`]).
    Finished { preempted: bool },
    /// The worker hit an error and is about to exit non-zero.
    Failed { error: String },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Registration {
    pub rank: u64,
    pub local_rank: u64,
    pub world_size: u64,
    pub host: String,
    pub pid: u32,
    /// `cpu` or `cuda:<visible index>` (plus the GPU name when known).
    pub device: String,
    /// [`crate::TrainConfig::config_hash`] of the config this worker loaded.
    pub config_hash: String,
    /// `host:port` where this rank's CPU collective backend accepts peers (CPU runs).
    pub collective_addr: Option<String>,
    /// NCCL unique id, sent by rank 0 of a GPU run (128 bytes).
    pub nccl_unique_id: Option<Vec<u8>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LogLevel {
    Debug,
    Info,
    Warn,
    Error,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LogLine {
    pub level: LogLevel,
    /// Seconds since the Unix epoch at the worker when the line was written.
    pub time: f64,
    pub text: String,
}

/// One metrics record. `loss` is the global mean over the whole batch (all ranks).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepMetrics {
    pub rank: u64,
    pub step: u64,
    pub loss: f64,
    pub lr: f64,
    /// Global gradient norm (whole model, before clipping).
    pub grad_norm: f64,
    pub step_time_s: f64,
    /// Tokens per second of the whole job (all ranks).
    pub tokens_per_s: f64,
    /// Model FLOPs utilisation on GPU (torchtitan's formula); `None` on CPU.
    pub mfu: Option<f64>,
    /// This rank's resident parameter, gradient and optimizer tensors.
    pub model_state_bytes: u64,
    /// Peak RSS on CPU, peak device memory on GPU.
    pub peak_memory_bytes: u64,
    /// fp16 dynamic loss scale, when used.
    pub loss_scale: Option<f64>,
    /// Epochs of the training data done after this step (1.5: half-way through the second);
    /// `None` for synthetic data, which has no epochs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub epoch: Option<f64>,
    /// Seconds of the step spent making this rank's batches (reading the token cache,
    /// packing, building tensors): the data loader's cost, as torchtitan reports it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_time_s: Option<f64>,
}

/// The loss on the validation data after `step`, over every validation token (all ranks).
/// Its field names differ from [`StepMetrics`]' so the two kinds of `metrics.jsonl` lines
/// never read as each other.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EvalMetrics {
    pub rank: u64,
    pub step: u64,
    /// Mean cross-entropy per target token.
    pub eval_loss: f64,
    /// `exp(eval_loss)`.
    pub eval_perplexity: f64,
    /// Target tokens evaluated.
    pub eval_tokens: u64,
    pub eval_time_s: f64,
}

/// End-of-training summary in the spirit of seed 001's milestone output.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainSummary {
    pub strategy: String,
    pub world_size: u64,
    pub steps: u64,
    pub first_loss: f64,
    pub last_loss: f64,
    pub model_state_bytes_per_rank: u64,
    /// What one rank would hold unsharded (params + grads + AdamW state).
    pub unsharded_model_state_bytes: u64,
    pub peak_memory_bytes: u64,
    pub mean_tokens_per_s: f64,
    /// The last evaluation, when the data has a validation split.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eval_loss: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eval_perplexity: Option<f64>,
}

/// Controller → worker.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum ToWorker {
    /// The world is complete and consistent: build the collectives and train.
    Start(StartInfo),
    /// Preemption or time limit: agree on the next step boundary, checkpoint, exit cleanly
    /// with [`FromWorker::Finished`] `{ preempted: true }`.
    Preempt,
    /// Stop now (another rank failed, or the job was cancelled).
    Shutdown { reason: String },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StartInfo {
    pub world_size: u64,
    /// Every rank, indexed by rank.
    pub peers: Vec<PeerInfo>,
    /// Rank 0's NCCL unique id for GPU runs.
    pub nccl_unique_id: Option<Vec<u8>>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PeerInfo {
    pub rank: u64,
    pub local_rank: u64,
    pub host: String,
    pub collective_addr: Option<String>,
}
