//! The resolved training configuration: what one worker process needs to train.
//!
//! The orchestrator builds it from the YAML job spec (after validation and the batch-split
//! arithmetic) and writes it as `train_config.json` into the run directory; the worker reads
//! it from there (or from [`crate::env::CONFIG_FILE`]). Every field is explicit here: defaults
//! are applied by the orchestrator, so a run directory fully describes what ran.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::path::PathBuf;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrainConfig {
    /// Job (or sweep point) name, used in log lines and summaries.
    pub name: String,
    pub model: ModelConfig,
    pub data: DataConfig,
    /// Optimizer steps to run (each made of `batch.grad_accum_steps` micro-steps).
    pub steps: u64,
    /// Seed for parameter init and synthetic data; the same seed gives the same weights on
    /// any world size and strategy.
    pub seed: u64,
    pub batch: BatchPlan,
    pub optimizer: OptimizerConfig,
    pub schedule: LrSchedule,
    pub fsdp: FsdpConfig,
    pub checkpoint: CheckpointConfig,
    pub device: DeviceKind,
    /// Intra-op threads per rank (`torch.set_num_threads`).
    pub threads_per_rank: usize,
    /// Emit a metrics record every this many optimizer steps (1 = every step).
    pub log_every: u64,
    /// What a step whose loss or gradients are not finite, or whose loss blew up, does to the
    /// run. Left out of the
    /// JSON when `continue`, so configs (and their hashes) from before it stay as they were.
    #[serde(default, skip_serializing_if = "OnDivergence::is_continue")]
    pub on_divergence: OnDivergence,
}

/// What training does once an update was not finite (its loss or gradient norm NaN or inf,
/// and no fp16 loss scaler skipped it): the weights are not finite from then on. A language
/// model's loss past ten times a uniform guess's (`ModelConfig::blown_up_loss`) counts the
/// same: its weights are blown, whether or not their numbers have overflowed yet.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnDivergence {
    /// Train on to the last step and say so at the end, as PyTorch and Hugging Face's
    /// Trainer do.
    #[default]
    Continue,
    /// Stop after that step, without a checkpoint of it, and fail the job (as Megatron-LM's
    /// NaN check does): no more GPU hours on weights that are not finite or blown up.
    Stop,
}

impl OnDivergence {
    pub fn is_continue(&self) -> bool {
        *self == OnDivergence::Continue
    }
}

impl TrainConfig {
    /// Stable hash of the config; every rank of a job must present the same one at
    /// rendezvous, and sweeps key their points by it.
    pub fn config_hash(&self) -> String {
        let json = serde_json::to_vec(self).expect("TrainConfig serializes");
        hex::encode(&Sha256::digest(&json)[..8])
    }

    /// Tokens (or samples, for the MLP) processed by the whole job per optimizer step.
    pub fn tokens_per_step(&self) -> u64 {
        self.batch.total_batch_size * self.data.sequence_length(&self.model)
    }

    /// Tokens (or samples, for the MLP) one rank processes per micro-step.
    pub fn tokens_per_micro_batch(&self) -> u64 {
        self.batch.batch_size_per_device * self.data.sequence_length(&self.model)
    }

    /// Tokens of a language model's loss computed at once, at most a micro-batch's
    /// (`fsdp.loss_chunk_tokens`, else the default for its vocabulary); `None` for the MLP.
    pub fn loss_chunk_tokens(&self) -> Option<u64> {
        let vocab = self.model.vocab_size()?;
        let chunk = shardrun_models::loss::chunk_tokens(self.fsdp.loss_chunk_tokens, vocab);
        Some(chunk.min(self.tokens_per_micro_batch()))
    }
}

/// The model, described once in the `shardrun-models` crate (parameters, segments,
/// parameter count, FLOPs) for the orchestrator and the worker alike.
pub use shardrun_models::{
    LlamaConfig, LlamaFamily, LlamaModel, ModelConfig, ParamKind, Rope, RopeScaling,
};

/// Where training data comes from. Each rank reads its own disjoint part of every global
/// batch (rank r takes samples `r*per_device .. (r+1)*per_device` of each micro-batch).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum DataConfig {
    /// Deterministic random data generated from the seed and the global sample index, so any
    /// world size sees the same global batches. Transformer: random tokens, next-token
    /// targets. MLP: random inputs and targets.
    Synthetic { seq_len: u64 },
    /// Documents from files: tokenized once into a cache, packed into fixed-length
    /// sequences, shuffled per epoch (crate `shardrun-data`).
    Dataset(Box<DatasetConfig>),
}

impl DataConfig {
    /// Tokens per sample (1 for the MLP, whose samples are vectors).
    pub fn sequence_length(&self, model: &ModelConfig) -> u64 {
        match (self, model) {
            (_, ModelConfig::Mlp { .. }) => 1,
            (DataConfig::Synthetic { seq_len }, _) => *seq_len,
            (DataConfig::Dataset(d), _) => d.seq_len,
        }
    }
}

/// A dataset of documents, everything explicit (the orchestrator applies the defaults).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DatasetConfig {
    pub source: DataSource,
    /// Tokens per training sequence (the model's context for one sample).
    pub seq_len: u64,
    pub tokenizer: TokenizerConfig,
    pub packing: Packing,
    /// With `whole_documents`, a document longer than `seq_len` keeps its first `seq_len`
    /// tokens (TRL's `truncation_mode="keep_start"`) instead of being a bad record.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub truncate: bool,
    /// Positions restart at every document and attention stays within it (the model gets
    /// `position_ids` and `document_ids`); the token after a document's end is not a target.
    pub document_mask: bool,
    /// A seeded permutation of the sequences per epoch (else file order).
    pub shuffle: bool,
    pub validation: Option<ValidationConfig>,
    /// Folder of tokenized caches, one sub-folder per (files, tokenizer, options).
    pub cache_dir: PathBuf,
    pub on_bad_record: OnBadRecord,
}

/// The files and how to read documents out of them. `files` are absolute paths or glob
/// patterns (`/data/**/*.jsonl`), matched in sorted order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum DataSource {
    /// Plain UTF-8 text: one document per file, per line, or per separator.
    Text {
        files: Vec<PathBuf>,
        split: TextSplit,
    },
    /// One JSON object per line.
    Jsonl {
        files: Vec<PathBuf>,
        text: JsonlText,
    },
    /// One JSON object per line holding a list of `{role, content}` messages, rendered with
    /// the tokenizer's chat template; the loss covers the assistant turns only (or, for
    /// `prompt` and `completion` lists of messages, what follows the prompt).
    Chat {
        files: Vec<PathBuf>,
        messages_field: String,
        /// A Jinja file instead of the tokenizer folder's own template.
        chat_template: Option<PathBuf>,
        /// Further variables the template sees, as `apply_chat_template(messages, **kwargs)`
        /// passes them (`date_string`, `enable_thinking`, ...).
        #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
        chat_template_kwargs: BTreeMap<String, serde_json::Value>,
    },
    /// Pre-tokenized files of little-endian ids (nanoGPT's `.bin` is `u16`); one document
    /// per file, used as they are (no end-of-document token added).
    Tokens {
        files: Vec<PathBuf>,
        dtype: TokenDtype,
    },
}

impl DataSource {
    pub fn files(&self) -> &[PathBuf] {
        match self {
            DataSource::Text { files, .. }
            | DataSource::Jsonl { files, .. }
            | DataSource::Chat { files, .. }
            | DataSource::Tokens { files, .. } => files,
        }
    }

    /// The same reading rules over other files (separate validation files).
    pub fn with_files(&self, files: Vec<PathBuf>) -> DataSource {
        let mut other = self.clone();
        match &mut other {
            DataSource::Text { files: f, .. }
            | DataSource::Jsonl { files: f, .. }
            | DataSource::Chat { files: f, .. }
            | DataSource::Tokens { files: f, .. } => *f = files,
        }
        other
    }

    /// The spec's name of the kind (`text`, `jsonl`, `chat`, `tokens`).
    pub fn kind_name(&self) -> &'static str {
        match self {
            DataSource::Text { .. } => "text",
            DataSource::Jsonl { .. } => "jsonl",
            DataSource::Chat { .. } => "chat",
            DataSource::Tokens { .. } => "tokens",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "by", rename_all = "snake_case", deny_unknown_fields)]
pub enum TextSplit {
    /// A whole file is one document.
    File,
    /// Every non-blank line is a document.
    Line,
    /// Documents are separated by this string (blank pieces are dropped).
    Separator { separator: String },
}

/// Which fields of a JSONL record hold the text.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "format", rename_all = "snake_case", deny_unknown_fields)]
pub enum JsonlText {
    /// One text field, trained on in full. A dotted name reaches into nested objects.
    Field { field: String },
    /// `prompt + completion` is the document; the loss covers the completion only.
    PromptCompletion { prompt: String, completion: String },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TokenDtype {
    U16,
    U32,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum TokenizerConfig {
    /// A Hugging Face tokenizer: `tokenizer.json` in `path` (a folder, or the file itself),
    /// with `tokenizer_config.json`, `config.json` and `generation_config.json` next to it
    /// for the special tokens. The overrides name special tokens by their text.
    HuggingFace {
        path: PathBuf,
        bos_token: Option<String>,
        eos_token: Option<String>,
    },
    /// UTF-8 bytes as ids 0..=255 and 256 as the end of a document.
    Bytes,
    /// `tokens` data: the ids are already in the files.
    PreTokenized,
}

/// How documents become fixed-length sequences.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Packing {
    /// Documents (each ending with the end-of-document token) are concatenated and cut
    /// into sequences; a document may continue into the next sequence (GPT-style
    /// pre-training, torchtitan, nanoGPT). Only the last sequence is padded.
    Stream,
    /// Whole documents are placed into sequences (best-fit decreasing) and never split;
    /// the rest of a sequence is padding. A document longer than a sequence is a bad record,
    /// unless `truncate` cuts it to one.
    WholeDocuments,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnBadRecord {
    /// The first bad record stops the preparation with an error naming it.
    Stop,
    /// Bad records are skipped, counted and the first ones named.
    Skip,
}

/// Evaluation on held-out data.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ValidationConfig {
    pub held_out: HeldOut,
    /// Evaluate every this many optimizer steps (and always after the last step).
    pub every_steps: Option<u64>,
    /// At most this many global batches per evaluation (all of the validation set if
    /// `None`).
    pub max_batches: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum HeldOut {
    /// This fraction of the documents (the nearest whole number, at least one, chosen by a
    /// fixed hash of the document index, so the same documents whatever the seed) never
    /// trains and is evaluated on.
    Fraction { fraction: f64 },
    /// Separate files, read with the same rules as the training files.
    Files { files: Vec<PathBuf> },
}

/// The batch arithmetic, already checked: `total = per_device × world_size × grad_accum_steps`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BatchPlan {
    pub total_batch_size: u64,
    pub batch_size_per_device: u64,
    pub world_size: u64,
    pub grad_accum_steps: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OptimizerConfig {
    /// Peak learning rate.
    pub lr: f64,
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    pub weight_decay: f64,
    /// Clip the global gradient norm (of the whole model, across shards) to this; `None`
    /// disables clipping (the norm is still computed and reported).
    pub grad_clip: Option<f64>,
    /// Kinds of parameters AdamW applies no weight decay to (a second parameter group, as
    /// `transformers`' Trainer makes one for biases and norms; torchtitan decays all).
    /// Absent in a config: biases and norms.
    #[serde(default = "default_no_weight_decay")]
    pub no_weight_decay: Vec<ParamKind>,
}

/// Biases and normalisation weights: what `transformers`' Trainer leaves undecayed.
pub fn default_no_weight_decay() -> Vec<ParamKind> {
    vec![ParamKind::Bias, ParamKind::Norm]
}

impl OptimizerConfig {
    /// Whether parameters of `kind` are decayed.
    pub fn decays(&self, kind: ParamKind) -> bool {
        !self.no_weight_decay.contains(&kind)
    }
}

/// Linear warmup over `warmup_steps` (update k, from 0, at `lr * (k + 1) / warmup_steps`: the
/// first at `lr / warmup_steps`, the last at `lr`), then `decay` from `lr` down to
/// `lr * min_lr_ratio` at the last step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LrSchedule {
    pub warmup_steps: u64,
    pub decay: LrDecay,
    pub min_lr_ratio: f64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LrDecay {
    Cosine,
    Linear,
    Constant,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FsdpConfig {
    pub strategy: ShardingStrategy,
    pub wrap: WrapPolicy,
    pub mixed_precision: MixedPrecision,
    /// Recompute each block's activations in backward instead of keeping them.
    pub activation_checkpointing: bool,
    /// Issue the next unit's all-gather before the current unit computes.
    pub prefetch: bool,
    /// At most this many units' gathered parameters alive at once (FSDP's
    /// `limit_all_gathers`); at least 1.
    pub max_gathers_in_flight: usize,
    /// HYBRID_SHARD only: ranks per shard group (a "node"); parameters are sharded within a
    /// group and replicated across groups. Defaults to the ranks per node.
    pub shard_group_size: Option<u64>,
    /// Tokens of a language model's loss computed at once (its logits, cross-entropy and
    /// their gradient); `None`: as many as fill 1 GiB of fp32 logits
    /// (`shardrun_models::loss::chunk_tokens`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loss_chunk_tokens: Option<u64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ShardingStrategy {
    /// ZeRO-3: parameters, gradients and optimizer state sharded; parameters gathered for
    /// forward, freed, gathered again for backward.
    FullShard,
    /// ZeRO-2: like FULL_SHARD but gathered parameters stay from forward until backward.
    ShardGradOp,
    /// DDP-like: everything replicated, gradients all-reduced.
    NoShard,
    /// FULL_SHARD within a shard group, replicated (all-reduced) across groups.
    HybridShard,
}

impl ShardingStrategy {
    /// The name as the spec and PyTorch write it (`FULL_SHARD`).
    pub fn name(self) -> &'static str {
        match self {
            ShardingStrategy::FullShard => "FULL_SHARD",
            ShardingStrategy::ShardGradOp => "SHARD_GRAD_OP",
            ShardingStrategy::NoShard => "NO_SHARD",
            ShardingStrategy::HybridShard => "HYBRID_SHARD",
        }
    }

    /// Bytes of model state per rank (fp32 params + grads + AdamW's two moments) for a model
    /// of `num_params` on `world_size` ranks (`shard_group` ranks per group for HYBRID_SHARD).
    pub fn model_state_bytes_per_rank(
        self,
        num_params: u64,
        world_size: u64,
        shard_group: u64,
    ) -> u64 {
        let per_param = 4 * 4; // param, grad, exp_avg, exp_avg_sq in fp32
        let n = match self {
            ShardingStrategy::FullShard | ShardingStrategy::ShardGradOp => world_size,
            ShardingStrategy::HybridShard => shard_group.max(1),
            ShardingStrategy::NoShard => 1,
        };
        num_params.div_ceil(n.max(1)) * per_param
    }
}

/// How the model is split into FSDP units. Parameters a policy does not claim form one unit
/// per segment that reads them first (the embeddings, a block, the head), see
/// [`crate::units`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum WrapPolicy {
    /// One unit per segment: the embeddings, each transformer block, the head (torchtitan's
    /// `fully_shard` on `tok_embeddings`, on each block and on `norm` + `output`).
    Block,
    /// Any module with at least `min_params` parameters (not already inside a unit) becomes
    /// a unit, innermost first (`size_based_auto_wrap_policy`).
    SizeBased { min_params: u64 },
    /// Modules whose PyTorch path matches one of these glob patterns (`layers.*`).
    ModuleNames { patterns: Vec<String> },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DType {
    F32,
    Bf16,
    F16,
}

impl DType {
    pub fn size_bytes(self) -> u64 {
        match self {
            DType::F32 => 4,
            DType::Bf16 | DType::F16 => 2,
        }
    }
}

/// FSDP's `MixedPrecision`: shards and optimizer state stay fp32; parameters are cast to
/// `param_dtype` for gather and compute, gradients reduced in `reduce_dtype`, buffers (the
/// Llama model's rotary frequencies) held in `buffer_dtype`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MixedPrecision {
    pub param_dtype: DType,
    pub reduce_dtype: DType,
    pub buffer_dtype: DType,
}

/// Checkpoints. "Off" (no `checkpoint:` block in the spec) means no periodic saves: `dir` is
/// `None`, but a rank started by the controller still knows its run directory and saves
/// there the checkpoints a re-run needs (at the end and on preemption), and resumes from
/// them: see [`CheckpointConfig::root`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CheckpointConfig {
    /// Folder of `step-N/` checkpoints; `None`: `<run dir>/checkpoints` under a controller,
    /// no checkpoints at all for a rank started without one.
    pub dir: Option<PathBuf>,
    pub interval_steps: Option<u64>,
    pub interval_minutes: Option<f64>,
    /// Keep this many newest complete checkpoints.
    pub keep: usize,
    pub format: CheckpointFormat,
    /// Resume from the newest valid checkpoint of the run if there is one (a re-run, a
    /// requeue after preemption). `false` is the only way to opt out.
    pub resume: bool,
    /// Start from this checkpoint instead (fine-tuning) while the run has none of its own.
    pub from: Option<PathBuf>,
}

/// The folder of a run's checkpoints when the config does not name one.
pub const RUN_CHECKPOINTS: &str = "checkpoints";

/// The folder under a checkpoint root that `shardrun export` writes into by default.
pub const EXPORTS: &str = "export";

impl CheckpointConfig {
    /// Where the run's checkpoints live: `dir`, else `<run_dir>/checkpoints` when the run
    /// directory is known (a rank under the controller, the orchestrator), else nowhere.
    pub fn root(&self, run_dir: Option<&std::path::Path>) -> Option<PathBuf> {
        self.dir
            .clone()
            .or_else(|| run_dir.map(|run| run.join(RUN_CHECKPOINTS)))
    }

    /// Whether checkpoints are saved as the run trains (the spec has a `checkpoint:`
    /// section); without, only the end of training and a preemption save one.
    pub fn saves_periodically(&self) -> bool {
        self.interval_steps.is_some() || self.interval_minutes.is_some()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CheckpointFormat {
    Sharded,
    Full,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DeviceKind {
    Cpu,
    Cuda,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dataset_configs_round_trip_as_tagged_json() {
        let data = DataConfig::Dataset(Box::new(DatasetConfig {
            source: DataSource::Jsonl {
                files: vec!["/d/*.jsonl".into()],
                text: JsonlText::PromptCompletion {
                    prompt: "q".into(),
                    completion: "a".into(),
                },
            },
            seq_len: 128,
            tokenizer: TokenizerConfig::Bytes,
            packing: Packing::WholeDocuments,
            truncate: true,
            document_mask: false,
            shuffle: true,
            validation: Some(ValidationConfig {
                held_out: HeldOut::Fraction { fraction: 0.05 },
                every_steps: Some(10),
                max_batches: None,
            }),
            cache_dir: "/runs/data-cache".into(),
            on_bad_record: OnBadRecord::Skip,
        }));
        let json = serde_json::to_value(&data).unwrap();
        assert_eq!(json["kind"], "dataset");
        assert_eq!(json["source"]["kind"], "jsonl");
        assert_eq!(json["source"]["text"]["format"], "prompt_completion");
        assert_eq!(
            serde_json::from_value::<DataConfig>(json.clone()).unwrap(),
            data
        );
        // Written only when on: a config from before `truncate` reads as off, and one with
        // it off is written as before (sweep point keys and config hashes stand).
        let mut before = json.clone();
        before.as_object_mut().unwrap().remove("truncate");
        let DataConfig::Dataset(read) = serde_json::from_value::<DataConfig>(before).unwrap()
        else {
            panic!("a dataset")
        };
        assert!(!read.truncate);
        let off = DataConfig::Dataset(read);
        assert!(serde_json::to_value(&off)
            .unwrap()
            .get("truncate")
            .is_none());
        let mut typo = json;
        typo["shufle"] = serde_json::json!(true);
        assert!(serde_json::from_value::<DataConfig>(typo).is_err());
    }
}
