//! The job spec's types, one struct per YAML section. `None` means "not written": the plan
//! applies the documented default.

use serde::{Deserialize, Serialize};
use serde_norway::Value;
use shardrun_protocol::config::{
    CheckpointFormat, DType, LrDecay, OnBadRecord, OnDivergence, Packing, ParamKind,
    ShardingStrategy, TokenDtype, WrapPolicy,
};
use shardrun_protocol::config::{LlamaFamily, RopeScaling};
use std::collections::BTreeMap;
use std::path::PathBuf;

/// The keys of [`JobSpec`], as the spec writes them at its top level.
pub const TOP_LEVEL_KEYS: [&str; 6] = [
    "name",
    "run_root",
    "resources",
    "preemption",
    "training",
    "sweep",
];

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobSpec {
    /// Job name: run directory name, Slurm job name, log prefix.
    pub name: String,
    /// Folder under which run directories are created (default `runs/`, relative to the
    /// directory `shardrun` is started from).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_root: Option<PathBuf>,
    #[serde(default)]
    pub resources: Resources,
    #[serde(default)]
    pub preemption: Preemption,
    pub training: TrainingSpec,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sweep: Option<SweepSpec>,
}

/// What to ask Slurm for. `gpus_per_node: 0` (the default) means CPU ranks:
/// `tasks_per_node` ranks per node, each with `cpus_per_task` threads.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Resources {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nodes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpus_per_node: Option<u64>,
    /// The GPUs' type as the site's GRES names it (`h100`: `--gres=gpu:h100:8`), where
    /// several kinds share a partition.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_type: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tasks_per_node: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpus_per_task: Option<u64>,
    /// Memory per node in Slurm syntax (`16G`, `4000M`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mem: Option<String>,
    /// Memory of one GPU, only used to warn when the model state will not fit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_memory_gb: Option<f64>,
    /// Wall-clock limit in Slurm syntax (`MM`, `HH:MM:SS`, `D-HH:MM:SS`, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partition: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub account: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub qos: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reservation: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub constraint: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exclusive: Option<bool>,
    /// Extra `#SBATCH` options, written as on the command line (`--mail-type=END`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub extra_sbatch: Vec<String>,
    /// Shell lines run before the controller starts (`module load cuda/12.4`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub setup: Vec<String>,
    /// Environment variables for every rank (`NCCL_SOCKET_IFNAME: ib0`, `NCCL_DEBUG: WARN`).
    /// `NCCL_*` variables of the shell that submits the job are passed too, unless these or
    /// the job's own environment (its set-up lines, modules) set them otherwise.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
}

/// How the job reacts to the end of its time limit or to preemption.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Preemption {
    /// Seconds before the time limit at which Slurm sends USR2 (the controller then
    /// checkpoints and stops cleanly).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal_seconds: Option<u64>,
    /// Let Slurm requeue the job after preemption or a node failure.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requeue: Option<bool>,
    /// Give up after this many requeues.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_requeues: Option<u32>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrainingSpec {
    pub model: ModelSpec,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<DataSpec>,
    pub steps: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<u64>,
    /// Samples per optimizer step, over all ranks and accumulation steps.
    pub total_batch_size: u64,
    /// Samples per rank per micro-step.
    pub batch_size_per_device: u64,
    #[serde(default)]
    pub optimizer: OptimizerSpec,
    #[serde(default)]
    pub schedule: ScheduleSpec,
    #[serde(default)]
    pub fsdp: FsdpSpec,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint: Option<CheckpointSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub threads_per_rank: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub log_every: Option<u64>,
    /// `continue` (the default) or `stop` once the loss or gradients are not finite, or the
    /// loss blew up.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_divergence: Option<OnDivergence>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum ModelSpec {
    Transformer {
        vocab_size: u64,
        dim: u64,
        n_layers: u64,
        n_heads: u64,
        /// Defaults to the data's `seq_len`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        max_seq_len: Option<u64>,
    },
    Mlp {
        input_dim: u64,
        hidden_dim: u64,
        output_dim: u64,
    },
    /// A Llama-family model from scratch (`transformers`' initialisation).
    Llama(LlamaSpec),
    /// A Hugging Face model folder: architecture from its `config.json`, initial weights
    /// from its safetensors files.
    Hf {
        /// Relative paths are relative to the spec file.
        path: PathBuf,
    },
}

/// A Llama-family architecture, in the job spec's words; unset keys take `transformers`'
/// defaults (docs/job-spec.md lists them).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LlamaSpec {
    /// `llama` (default), `mistral` or `qwen2` (q/k/v biases).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_type: Option<LlamaFamily>,
    pub vocab_size: u64,
    pub dim: u64,
    pub n_layers: u64,
    pub n_heads: u64,
    /// Key/value heads: fewer than `n_heads` is grouped-query attention. Default `n_heads`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub n_kv_heads: Option<u64>,
    /// Default `dim / n_heads`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub head_dim: Option<u64>,
    pub ffn_dim: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub norm_eps: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rope_theta: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rope_scaling: Option<RopeScaling>,
    /// Default: the data's `seq_len`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_position_embeddings: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tie_embeddings: Option<bool>,
    /// Biases on the q, k, v and o projections (`model_type: llama` only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attention_bias: Option<bool>,
    /// Biases in the MLP (`model_type: llama` only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mlp_bias: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initializer_range: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pad_token_id: Option<u64>,
}

/// `training.data`: one flat section whose keys depend on `kind` (the plan refuses keys
/// that do not apply to it, naming the kinds they do apply to).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DataSpec {
    pub kind: DataKind,
    /// Tokens per sample; defaults to the model's `max_seq_len`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seq_len: Option<u64>,
    /// Paths or glob patterns, relative to the spec file.
    #[serde(
        default,
        deserialize_with = "paths_or_one",
        skip_serializing_if = "Option::is_none"
    )]
    pub files: Option<Vec<PathBuf>>,
    /// `text`: one document per `file` (default), `line`, or `separator`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub split: Option<TextSplitKind>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub separator: Option<String>,
    /// `jsonl`: the text field (default `text`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
    /// `jsonl`: prompt and completion fields (loss on the completion only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_field: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion_field: Option<String>,
    /// `chat`: the list of messages (default `messages`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub messages_field: Option<String>,
    /// `chat`: a Jinja template instead of the tokenizer folder's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chat_template: Option<PathBuf>,
    /// `chat`: further variables the template sees (`apply_chat_template(**kwargs)`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chat_template_kwargs: Option<BTreeMap<String, serde_json::Value>>,
    /// `tokens`: `u16` (default, nanoGPT) or `u32`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dtype: Option<TokenDtype>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokenizer: Option<TokenizerSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub packing: Option<Packing>,
    /// `whole_documents`: a document longer than `seq_len` keeps its first `seq_len` tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub truncate: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub document_mask: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shuffle: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub validation: Option<ValidationSpec>,
    /// Where tokenized data is cached (default `<run_root>/data-cache`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_dir: Option<PathBuf>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_bad_record: Option<OnBadRecord>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DataKind {
    Synthetic,
    Text,
    Jsonl,
    Chat,
    Tokens,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TextSplitKind {
    File,
    Line,
    Separator,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenizerSpec {
    /// `hf` (default): a Hugging Face tokenizer folder; `bytes`: UTF-8 bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<TokenizerKind>,
    /// The folder holding `tokenizer.json` (or the file); defaults to the model's folder.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<PathBuf>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bos_token: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eos_token: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TokenizerKind {
    Hf,
    Bytes,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ValidationSpec {
    /// Hold out this fraction of the documents...
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fraction: Option<f64>,
    /// ...or evaluate on these files.
    #[serde(
        default,
        deserialize_with = "paths_or_one",
        skip_serializing_if = "Option::is_none"
    )]
    pub files: Option<Vec<PathBuf>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub every_steps: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_batches: Option<u64>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OptimizerSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lr: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub beta1: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub beta2: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eps: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight_decay: Option<f64>,
    /// Clip the global gradient norm to this; absent means no clipping.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grad_clip: Option<f64>,
    /// Parameter kinds (`weight`, `bias`, `norm`, `embedding`) without weight decay; default
    /// `[bias, norm]`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub no_weight_decay: Option<Vec<ParamKind>>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScheduleSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warmup_steps: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decay: Option<LrDecay>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_lr_ratio: Option<f64>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FsdpSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub strategy: Option<ShardingStrategy>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wrap: Option<WrapPolicy>,
    #[serde(default)]
    pub mixed_precision: MixedPrecisionSpec,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub activation_checkpointing: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefetch: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_gathers_in_flight: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shard_group_size: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loss_chunk_tokens: Option<u64>,
}

/// FSDP's `MixedPrecision`. `reduce_dtype` defaults to `param_dtype` and `buffer_dtype` to
/// `f32` (buffers uncast), as in PyTorch.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MixedPrecisionSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub param_dtype: Option<DType>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reduce_dtype: Option<DType>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub buffer_dtype: Option<DType>,
}

/// Present = checkpointing on.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CheckpointSpec {
    /// Relative paths are relative to the run directory (default `checkpoints`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dir: Option<PathBuf>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interval_steps: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interval_minutes: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keep: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub format: Option<CheckpointFormat>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resume: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<PathBuf>,
}

/// Parameter sweep over dotted paths of this spec (`training.optimizer.lr`).
/// Points = every entry of `list` (one empty entry when absent) × the cartesian product of
/// `grid`; a grid value overrides a list value of the same path.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SweepSpec {
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub grid: BTreeMap<String, Vec<Value>>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub list: Vec<BTreeMap<String, Value>>,
    /// At most this many array tasks running at once, across all of the sweep's arrays.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub throttle: Option<u32>,
    /// Submission limits for sites whose `scontrol`/`sacctmgr` do not show them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<SweepLimits>,
}

/// Limits a sweep's submission keeps to, besides those read from the cluster (the smaller
/// wins).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SweepLimits {
    /// Most tasks in one job array (Slurm's `MaxArraySize`: indices stay below it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_array_size: Option<u64>,
    /// Most of your jobs queued (pending or running) at once, each array task counted
    /// (Slurm's `MaxSubmitJobs`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_queued: Option<u64>,
}

/// A list of paths, or one path written alone (`files: train.jsonl`), as `datasets` takes
/// its `data_files`.
fn paths_or_one<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<Vec<PathBuf>>, D::Error> {
    struct PathsOrOne;
    impl<'de> serde::de::Visitor<'de> for PathsOrOne {
        type Value = Option<Vec<PathBuf>>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a list of paths or glob patterns, or one")
        }
        fn visit_none<E: serde::de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_some<D: serde::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
            d.deserialize_any(self)
        }
        fn visit_unit<E: serde::de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_str<E: serde::de::Error>(self, path: &str) -> Result<Self::Value, E> {
            Ok(Some(vec![PathBuf::from(path)]))
        }
        // A name YAML types otherwise (`files: 2024`), read as its text as in a list.
        fn visit_u64<E: serde::de::Error>(self, name: u64) -> Result<Self::Value, E> {
            self.visit_str(&name.to_string())
        }
        fn visit_i64<E: serde::de::Error>(self, name: i64) -> Result<Self::Value, E> {
            self.visit_str(&name.to_string())
        }
        fn visit_bool<E: serde::de::Error>(self, name: bool) -> Result<Self::Value, E> {
            self.visit_str(&name.to_string())
        }
        fn visit_seq<A: serde::de::SeqAccess<'de>>(
            self,
            mut seq: A,
        ) -> Result<Self::Value, A::Error> {
            let mut paths = Vec::new();
            while let Some(path) = seq.next_element()? {
                paths.push(path);
            }
            Ok(Some(paths))
        }
    }
    deserializer.deserialize_option(PathsOrOne)
}
