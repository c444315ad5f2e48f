//! Typed messages, one enum per direction. Sent as JSON inside length-delimited frames (see
//! [`crate::connection`]) after the handshake.

use serde::{Deserialize, Deserializer, Serialize};

/// A measured value that may be NaN or infinite (a diverged loss, an overflowed gradient
/// norm). JSON has no such numbers: serde_json writes them as `null`, read back here as NaN,
/// so a record of a diverged step reaches the controller instead of breaking the connection.
fn non_finite<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    Ok(Option::<f64>::deserialize(d)?.unwrap_or(f64::NAN))
}

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
    /// Liveness while no other message is due (e.g. inside a long step), with the number of
    /// optimizer steps this rank has completed and a count of work done (micro-batches,
    /// evaluation batches, checkpoint units): a rank that keeps heartbeating but stops making
    /// progress (blocked in a collective, stuck in I/O) is seen by neither moving, while a
    /// long evaluation or checkpoint save still moves the count. `collectives`: how many
    /// collective calls this rank has entered, on every communicator; every rank enters the
    /// same ones in the same order, so when the job stands still the ranks that entered
    /// fewer are the ones the others wait for.
    Heartbeat {
        step: u64,
        work: u64,
        collectives: u64,
    },
    /// A checkpoint of `step` was committed (rank 0 sends this).
    CheckpointSaved { step: u64, path: String },
    /// End-of-training summary (rank 0 sends this).
    Summary(TrainSummary),
    /// Last message before a clean exit. `preempted`: stopped early after checkpointing
    /// because the controller asked ([`ToWorker::Preempt`]).
    Finished { preempted: bool },
    /// Last message before exiting on request at a step boundary, without finishing:
    /// every rank agreed to stop after optimizer step `step` (a cancel, a signal, a failed
    /// peer). Nothing is wrong with this rank; `reason` says who asked.
    Stopped { step: u64, reason: StopReason },
    /// The worker hit an error and is about to exit non-zero. `because_of`: the rank its
    /// collective error names (the peer that closed the connection, aborted the ring or
    /// never joined before the timeout): this failure likely follows from that rank's.
    Failed {
        error: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        because_of: Option<u64>,
    },
    /// Training continues from the checkpoint of `step` at `path` (rank 0 sends this once,
    /// after loading it): the run's records mark where a resumed curve picks up.
    Resumed { step: u64, path: String },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Registration {
    pub rank: u64,
    pub local_rank: u64,
    pub world_size: u64,
    pub host: String,
    pub pid: u32,
    /// `cpu` or `cuda:<visible index>` (plus the GPU name and what the rank was given).
    pub device: String,
    /// Set when this rank cannot use the device the job asks for (CUDA on a node
    /// without a usable GPU): the controller fails the job once, naming the node, instead of
    /// every rank failing on its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_error: Option<String>,
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
/// `Default` is for records made up by tests and simulated ranks (zeros, nothing measured);
/// the worker fills every field.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StepMetrics {
    pub rank: u64,
    pub step: u64,
    #[serde(deserialize_with = "non_finite")]
    pub loss: f64,
    #[serde(deserialize_with = "non_finite")]
    pub lr: f64,
    /// Global gradient norm (whole model, before clipping).
    #[serde(deserialize_with = "non_finite")]
    pub grad_norm: f64,
    #[serde(deserialize_with = "non_finite")]
    pub step_time_s: f64,
    /// Tokens per second of the whole job (all ranks).
    #[serde(deserialize_with = "non_finite")]
    pub tokens_per_s: f64,
    /// The tokens the loss counts, per second (whole job): `tokens_per_s` without padding
    /// and masked positions (prompts, other roles' turns). `None` for synthetic data, where
    /// every token counts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trained_tokens_per_s: Option<f64>,
    /// Model FLOPs utilisation on GPU (torchtitan's formula); `None` on CPU.
    pub mfu: Option<f64>,
    /// This rank's resident parameter, gradient and optimizer tensors.
    pub model_state_bytes: u64,
    /// Peak RSS on CPU; on GPU, the peak bytes libtorch's allocator handed out
    /// (`torch.cuda.max_memory_allocated`).
    pub peak_memory_bytes: u64,
    /// CPU: this rank's resident memory before its shards were allocated (libtorch, threads,
    /// sockets). The peak's growth over it is what the job's memory plan predicts, and unlike
    /// the peak it does not vary with how much of libtorch a process happens to have paged in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rss_before_model_bytes: Option<u64>,
    /// The loss is finite but past the model's blown-up limit (ten times a uniform guess's,
    /// `ModelConfig::blown_up_loss`): the run diverged as surely as a NaN would say. The
    /// worker decides, as it knows the vocabulary.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub loss_blew_up: bool,
    /// GPU: the peak bytes libtorch's allocator reserved from the device
    /// (`torch.cuda.max_memory_reserved`), which is what other users of the GPU cannot have.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peak_reserved_bytes: Option<u64>,
    /// GPU: bytes in use on the device now by everyone (the CUDA context, NCCL's buffers,
    /// libtorch's cache, other processes), and the device's total.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_used_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_total_bytes: Option<u64>,
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
    /// CPU ranks: the step's time less this rank's wait for collectives to finish, its own
    /// work. Every rank leaves a step together, so step times are alike on every rank; the
    /// rank that holds the others back is the one that waits least. `None` on GPUs, where a
    /// collective blocks no host thread.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub busy_time_s: Option<f64>,
}

/// The loss on the validation data after `step`, over every validation token (all ranks).
/// Its field names differ from [`StepMetrics`]' so the two kinds of `metrics.jsonl` lines
/// never read as each other.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EvalMetrics {
    pub rank: u64,
    pub step: u64,
    /// Mean cross-entropy per target token.
    #[serde(deserialize_with = "non_finite")]
    pub eval_loss: f64,
    /// `exp(eval_loss)`.
    #[serde(deserialize_with = "non_finite")]
    pub eval_perplexity: f64,
    /// Target tokens evaluated.
    pub eval_tokens: u64,
    #[serde(deserialize_with = "non_finite")]
    pub eval_time_s: f64,
}

/// End-of-training summary: strategy, memory saved by sharding, first and last loss.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainSummary {
    pub strategy: String,
    pub world_size: u64,
    pub steps: u64,
    /// The first step this process trained, whose loss `first_loss` is: 1 for a run from
    /// the start, later for one resumed from a checkpoint.
    #[serde(default = "first_step")]
    pub first_step: u64,
    #[serde(deserialize_with = "non_finite")]
    pub first_loss: f64,
    #[serde(deserialize_with = "non_finite")]
    pub last_loss: f64,
    /// The steps whose losses `first_loss` and `last_loss` are, where not `first_step` and
    /// `steps`: a step whose batch holds no target token has no loss (it is logged as 0), so
    /// these are of the first and last steps that had one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_loss_step: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_loss_step: Option<u64>,
    /// No step this process trained had a target token: there is no loss to report, and
    /// `first_loss` and `last_loss` are NaN only as placeholders (not a divergence).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub no_loss: bool,
    /// Steps of the run (resumed ones included) whose update the fp16 loss scaler skipped
    /// because the gradients overflowed: `steps` less the updates applied.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub skipped_steps: u64,
    /// The most model state this rank held at a step's end (shards, and whatever stays
    /// gathered between steps: NO_SHARD's low-precision copy of the parameters).
    pub model_state_bytes_per_rank: u64,
    /// What one rank would hold unsharded (params + grads + AdamW state).
    pub unsharded_model_state_bytes: u64,
    /// As in [`StepMetrics::peak_memory_bytes`]: peak RSS on CPU, allocated on GPU; of the
    /// rank with the highest in a finished run's summary.
    pub peak_memory_bytes: u64,
    /// GPU: the allocator's peak reserved bytes (the highest of any rank, taken apart from
    /// the allocated peak, as `shardrun metrics` does); `None` on CPU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peak_reserved_bytes: Option<u64>,
    #[serde(deserialize_with = "non_finite")]
    pub mean_tokens_per_s: f64,
    /// The last evaluation, when the data has a validation split.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eval_loss: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eval_perplexity: Option<f64>,
}

fn first_step() -> u64 {
    1
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl StepMetrics {
    /// The step's loss, `None` for a step whose batch held no target token (every example
    /// truncated before what it trains): it has no loss, and 0 stands in the record.
    pub fn loss(&self) -> Option<f64> {
        has_loss(self.trained_tokens_per_s).then_some(self.loss)
    }
}

/// Whether a step of `trained_tokens_per_s` (the whole batch's target tokens a second) had a
/// loss: `None` (every token a target) or more than none.
pub fn has_loss(trained_tokens_per_s: Option<f64>) -> bool {
    trained_tokens_per_s != Some(0.0)
}

/// `2.3456`, `9.018e27` for a loss blown up (a column stays narrow), or `-` for a step
/// without a loss ([`StepMetrics::loss`]).
pub fn loss_text(loss: Option<f64>) -> String {
    match loss {
        None => "-".into(),
        Some(l) if l.abs() >= 1e6 => format!("{l:.3e}"),
        Some(l) => format!("{l:.4}"),
    }
}

/// A gradient norm for people: a blown-up one in scientific notation, as the loss is, not
/// as seventeen digits that widen a table's column.
pub fn grad_norm_text(norm: f64) -> String {
    if norm.abs() >= 1e6 {
        format!("{norm:.3e}")
    } else {
        format!("{norm:.3}")
    }
}

impl TrainSummary {
    /// The steps this process trained, in words: "200 steps", or "steps 301-3000 (resumed
    /// at step 300)" when it resumed.
    pub fn steps_words(&self) -> String {
        let steps = if self.first_step > 1 && self.first_step == self.steps {
            format!(
                "step {} (resumed at step {})",
                self.steps,
                self.first_step - 1
            )
        } else if self.first_step > 1 {
            format!(
                "steps {}-{} (resumed at step {})",
                self.first_step,
                self.steps,
                self.first_step - 1
            )
        } else {
            format!("{} steps", self.steps)
        };
        match self.skipped_steps {
            0 => steps,
            skipped => format!("{steps}, {skipped} of them skipped (fp16 gradients overflowed)"),
        }
    }

    /// What `first_loss` is the loss of: the run's "Initial loss", or after a resume the
    /// first step of this attempt, not the run's first.
    pub fn first_loss_label(&self) -> String {
        match self.first_loss_step {
            Some(step) => format!("Loss at step {step} (the first with target tokens)"),
            None if self.first_step > 1 => format!("Loss at step {}", self.first_step),
            None => "Initial loss".to_string(),
        }
    }

    /// The first and last losses, in words: `8.3456 -> 5.1523`, or why there are none.
    pub fn losses_words(&self) -> String {
        if self.no_loss {
            "no loss (no step had target tokens)".into()
        } else {
            format!("loss {:.4} -> {:.4}", self.first_loss, self.last_loss)
        }
    }

    /// What `last_loss` is the loss of: the last step's, or the last one with target tokens.
    pub fn last_loss_label(&self) -> String {
        match self.last_loss_step {
            Some(step) => format!("Final loss (step {step}, the last with target tokens)"),
            None => "Final loss".to_string(),
        }
    }

    /// The peak memory per rank in words that say which memory it is: "530 MiB resident
    /// (RSS)" on CPU, "1234 MiB allocated, 2345 MiB reserved" on GPU.
    pub fn peak_memory_words(&self) -> String {
        use crate::mib;
        match self.peak_reserved_bytes {
            Some(reserved) => format!(
                "{:.0} MiB allocated, {:.0} MiB reserved",
                mib(self.peak_memory_bytes),
                mib(reserved)
            ),
            None => format!("{:.0} MiB resident (RSS)", mib(self.peak_memory_bytes)),
        }
    }
}

/// Why a rank stopped at a step boundary before the end ([`FromWorker::Stopped`]). In words
/// (`Display`) as the rank says it and the controller repeats it: `"SIGTERM"`, `"lost the
/// controller (closed)"`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    /// A signal to the rank's own process (SIGINT, SIGTERM).
    Signal { signal: i32 },
    /// The controller asked, in its words ("the job was cancelled (SIGINT)").
    Controller { reason: String },
    /// The connection to the controller broke; what broke it.
    LostController { why: String },
    /// Another rank was asked to stop (learned when the ranks agreed).
    Peer,
    /// Training diverged at optimizer step `step` (`what` was not finite, or blew up) and the job asks
    /// to stop there (`training.on_divergence: stop`). Every rank decides it alike, from
    /// the step's all-reduced loss and gradient norm.
    Diverged { step: u64, what: String },
}

impl std::fmt::Display for StopReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StopReason::Signal { signal } => {
                f.write_str(signal_name(*signal).unwrap_or("a signal"))
            }
            StopReason::Controller { reason } => f.write_str(reason),
            StopReason::LostController { why } => write!(f, "lost the controller ({why})"),
            StopReason::Peer => f.write_str("another rank was asked to stop"),
            StopReason::Diverged { step, what } => {
                write!(f, "training diverged at step {step} ({what})")
            }
        }
    }
}

/// The name of a signal that may end or stop a rank (`"SIGTERM"`), for the ones this
/// platform numbers; `None` for others.
pub fn signal_name(signal: i32) -> Option<&'static str> {
    Some(match signal {
        libc::SIGHUP => "SIGHUP",
        libc::SIGINT => "SIGINT",
        libc::SIGQUIT => "SIGQUIT",
        libc::SIGILL => "SIGILL",
        libc::SIGABRT => "SIGABRT",
        libc::SIGBUS => "SIGBUS",
        libc::SIGFPE => "SIGFPE",
        libc::SIGKILL => "SIGKILL",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGPIPE => "SIGPIPE",
        libc::SIGTERM => "SIGTERM",
        libc::SIGUSR1 => "SIGUSR1",
        libc::SIGUSR2 => "SIGUSR2",
        _ => return None,
    })
}

/// Exit status of a worker that stopped at a step boundary on the controller's request
/// (after [`FromWorker::Stopped`]). One stopped by SIGINT or SIGTERM exits with 128 + the
/// signal's number instead, as shells report it; a failed worker exits with 1.
pub const EXIT_STOPPED: i32 = 3;

impl StopReason {
    /// The exit status of a rank that stopped for this reason: 128 + the signal's number for
    /// a signal to it, as shells report it, else [`EXIT_STOPPED`].
    pub fn exit_code(&self) -> i32 {
        match self {
            StopReason::Signal { signal } => 128 + signal,
            _ => EXIT_STOPPED,
        }
    }
}

/// Whether a worker's exit status says it stopped on request rather than failed: the
/// statuses [`StopReason::exit_code`] gives (a rank is stopped by SIGINT or SIGTERM).
pub fn is_stop_status(code: i32) -> bool {
    code == EXIT_STOPPED || code == 128 + libc::SIGINT || code == 128 + libc::SIGTERM
}

/// Controller → worker.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum ToWorker {
    /// The world is complete and consistent: build the collectives and train.
    Start(StartInfo),
    /// Preemption or time limit: agree on the next step boundary, checkpoint, exit cleanly
    /// with [`FromWorker::Finished`] `{ preempted: true }`.
    Preempt,
    /// Stop (another rank failed, or the job was cancelled): at the next step boundary,
    /// answered with [`FromWorker::Stopped`]; a rank that cannot get there is killed.
    Shutdown { reason: String },
    /// The job is cancelled and its end comes anyway (Slurm kills it after its SIGTERM):
    /// checkpoint at the next step boundary as for [`ToWorker::Preempt`], then answer with
    /// [`FromWorker::Stopped`] for `reason`, as for a shutdown.
    CheckpointAndStop { reason: String },
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Through JSON and back, as frames carry messages.
    fn round_trip(msg: &FromWorker) -> FromWorker {
        serde_json::from_str(&serde_json::to_string(msg).unwrap()).expect("decodes")
    }

    #[test]
    fn records_of_a_diverged_run_travel_with_their_non_finite_values() {
        let step = FromWorker::Metrics(StepMetrics {
            step: 7,
            loss: f64::NAN,
            grad_norm: f64::INFINITY,
            lr: 1e-4,
            ..Default::default()
        });
        let FromWorker::Metrics(back) = round_trip(&step) else {
            panic!("not a metrics record")
        };
        assert!(
            back.loss.is_nan() && !back.grad_norm.is_finite(),
            "{back:?}"
        );
        assert_eq!((back.step, back.lr), (7, 1e-4));

        let eval = FromWorker::Eval(EvalMetrics {
            rank: 0,
            step: 7,
            eval_loss: f64::NAN,
            eval_perplexity: f64::INFINITY,
            eval_tokens: 10,
            eval_time_s: 0.5,
        });
        let FromWorker::Eval(back) = round_trip(&eval) else {
            panic!("not an evaluation")
        };
        assert!(back.eval_loss.is_nan() && back.eval_perplexity.is_nan());

        // A run resumed at its last step trained nothing: its summary has no first loss.
        let summary = FromWorker::Summary(TrainSummary {
            strategy: "FULL_SHARD".into(),
            world_size: 2,
            steps: 10,
            first_step: 11,
            first_loss: f64::NAN,
            last_loss: f64::NAN,
            first_loss_step: None,
            last_loss_step: None,
            no_loss: true,
            skipped_steps: 0,
            model_state_bytes_per_rank: 1,
            unsharded_model_state_bytes: 2,
            peak_memory_bytes: 3,
            peak_reserved_bytes: None,
            mean_tokens_per_s: 0.0,
            eval_loss: None,
            eval_perplexity: None,
        });
        let FromWorker::Summary(back) = round_trip(&summary) else {
            panic!("not a summary")
        };
        assert!(back.first_loss.is_nan() && back.mean_tokens_per_s == 0.0);
    }

    #[test]
    fn a_summary_says_which_memory_its_peak_is() {
        let cpu = TrainSummary {
            strategy: "FULL_SHARD".into(),
            world_size: 2,
            steps: 10,
            first_step: 1,
            first_loss: 1.0,
            last_loss: 0.5,
            first_loss_step: None,
            last_loss_step: None,
            no_loss: false,
            skipped_steps: 0,
            model_state_bytes_per_rank: 1,
            unsharded_model_state_bytes: 2,
            peak_memory_bytes: 530 << 20,
            peak_reserved_bytes: None,
            mean_tokens_per_s: 1.0,
            eval_loss: None,
            eval_perplexity: None,
        };
        assert_eq!(cpu.peak_memory_words(), "530 MiB resident (RSS)");
        let gpu = TrainSummary {
            peak_memory_bytes: 1234 << 20,
            peak_reserved_bytes: Some(2345 << 20),
            ..cpu
        };
        assert_eq!(
            gpu.peak_memory_words(),
            "1234 MiB allocated, 2345 MiB reserved"
        );
    }

    #[test]
    fn a_step_without_target_tokens_has_no_loss() {
        let step = |trained| StepMetrics {
            loss: 0.0,
            trained_tokens_per_s: trained,
            ..Default::default()
        };
        assert_eq!(step(Some(0.0)).loss(), None);
        assert_eq!(step(Some(12.0)).loss(), Some(0.0));
        assert_eq!(step(None).loss(), Some(0.0), "every token a target");
        assert_eq!(loss_text(None), "-");
        assert_eq!(loss_text(Some(2.34567)), "2.3457");
        assert_eq!(loss_text(Some(9018308584998454692946116608.0)), "9.018e27");
    }

    #[test]
    fn a_resumed_summary_says_its_first_loss_is_not_the_runs() {
        let fresh = TrainSummary {
            strategy: "FULL_SHARD".into(),
            world_size: 2,
            steps: 3000,
            first_step: 1,
            first_loss: 6.25,
            last_loss: 0.28,
            first_loss_step: None,
            last_loss_step: None,
            no_loss: false,
            skipped_steps: 0,
            model_state_bytes_per_rank: 1,
            unsharded_model_state_bytes: 2,
            peak_memory_bytes: 3,
            peak_reserved_bytes: None,
            mean_tokens_per_s: 1.0,
            eval_loss: None,
            eval_perplexity: None,
        };
        assert_eq!(fresh.steps_words(), "3000 steps");
        assert_eq!(fresh.first_loss_label(), "Initial loss");
        let resumed = TrainSummary {
            first_step: 301,
            ..fresh.clone()
        };
        assert_eq!(
            resumed.steps_words(),
            "steps 301-3000 (resumed at step 300)"
        );
        assert_eq!(resumed.first_loss_label(), "Loss at step 301");
        let one_more = TrainSummary {
            steps: 301,
            ..resumed.clone()
        };
        assert_eq!(one_more.steps_words(), "step 301 (resumed at step 300)");
        let skipping = TrainSummary {
            skipped_steps: 7,
            ..resumed.clone()
        };
        assert_eq!(
            skipping.steps_words(),
            "steps 301-3000 (resumed at step 300), 7 of them skipped (fp16 gradients overflowed)"
        );
        // A summary without the field is of a run from the start.
        let mut json = serde_json::to_value(&resumed).unwrap();
        json.as_object_mut().unwrap().remove("first_step");
        let old: TrainSummary = serde_json::from_value(json).unwrap();
        assert_eq!(old.first_step, 1);
        // Steps without target tokens have no loss: the losses are of those that had one.
        let empty_ends = TrainSummary {
            first_loss_step: Some(302),
            last_loss_step: Some(2999),
            no_loss: false,
            ..resumed
        };
        assert_eq!(
            empty_ends.first_loss_label(),
            "Loss at step 302 (the first with target tokens)"
        );
        assert_eq!(
            empty_ends.last_loss_label(),
            "Final loss (step 2999, the last with target tokens)"
        );
        assert_eq!(fresh.last_loss_label(), "Final loss");
    }

    #[test]
    fn a_stop_reason_travels_typed_and_reads_as_the_rank_says_it() {
        for (reason, words) in [
            (StopReason::Signal { signal: 15 }, "SIGTERM"),
            (StopReason::Signal { signal: 2 }, "SIGINT"),
            (StopReason::Signal { signal: 1000 }, "a signal"),
            (
                StopReason::Controller {
                    reason: "the job was cancelled (SIGINT)".into(),
                },
                "the job was cancelled (SIGINT)",
            ),
            (
                StopReason::LostController {
                    why: "closed".into(),
                },
                "lost the controller (closed)",
            ),
            (StopReason::Peer, "another rank was asked to stop"),
        ] {
            assert_eq!(reason.to_string(), words);
            let stopped = FromWorker::Stopped {
                step: 7,
                reason: reason.clone(),
            };
            assert_eq!(round_trip(&stopped), stopped, "{words}");
        }
        // The wire form names the kind, so a controller never parses words back.
        assert_eq!(
            serde_json::to_value(FromWorker::Stopped {
                step: 3,
                reason: StopReason::Signal { signal: 15 },
            })
            .unwrap(),
            serde_json::json!({"Stopped": {"step": 3, "reason": {"signal": {"signal": 15}}}})
        );
    }

    #[test]
    fn signal_names_are_the_shells() {
        assert_eq!(signal_name(1), Some("SIGHUP"));
        assert_eq!(signal_name(2), Some("SIGINT"));
        assert_eq!(signal_name(9), Some("SIGKILL"));
        assert_eq!(signal_name(15), Some("SIGTERM"));
        assert_eq!(signal_name(1000), None);
    }
}
