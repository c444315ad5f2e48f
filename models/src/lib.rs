//! The models shardrun trains, described once for the orchestrator (no libtorch) and the
//! worker: which parameters a model has (names, shapes, initialisation, kind), how forward is
//! cut into segments, how many parameters and FLOPs it has, and how a Hugging Face folder maps
//! onto it. The worker adds only the forward code (`worker/src/model/`).
//!
//! * [`param`]: parameter and segment descriptions, counted and checked;
//! * [`init`]: from-scratch values as a counter-based generator (any element range alone);
//! * [`footprint`]: parameters, segments and activation bytes for the memory plan;
//! * [`loss`]: how many tokens of a language model's loss are computed at once;
//! * [`source`]: where a run's initial values come from (the generator or a folder);
//! * [`transformer`], [`mlp`], [`llama`]: the architectures;
//! * [`hf`]: Hugging Face folders: `config.json` in both dialects, safetensors weights
//!   (single file or sharded index) checked against the architecture and read by byte range,
//!   and written back;
//! * [`partial`]: folders written under a hidden name, renamed into place once complete, and
//!   removed by a stop signal instead.
//!
//! Adding an architecture: a module here with its config, `describe()` (parameters and
//! segments) and `activations()` (bytes per token of each segment, for the memory plan), a
//! variant of [`ModelConfig`], its forward file in the worker (`worker/src/model/`), and a
//! job in `tests/tests/memory_plan.rs` checking its activation figures against a real run.

pub mod footprint;
pub mod hf;
pub mod init;
pub mod llama;
pub mod loss;
pub mod mlp;
pub mod param;
pub mod partial;
pub mod source;
pub mod transformer;

pub use llama::{LlamaConfig, LlamaFamily, LlamaModel, Rope, RopeScaling};
pub use param::{Builder, Init, ModelDescription, ParamKind, ParamSpec, SegmentSpec, TiedParam};

use serde::{Deserialize, Serialize};

/// How many times a uniform guess's loss counts as blown up ([`ModelConfig::blown_up_loss`]).
pub const BLOWN_UP_FACTOR: f64 = 10.0;

/// The model of a job, fully resolved (every size explicit). Parameter names follow the
/// PyTorch modules the architectures mirror, so checkpoints map 1:1 to their state dicts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum ModelConfig {
    /// PyTorch's FSDP2-example transformer ([`transformer`]).
    Transformer {
        vocab_size: u64,
        dim: u64,
        n_layers: u64,
        n_heads: u64,
        max_seq_len: u64,
    },
    /// The MLP of PyTorch's FSDP tutorial ([`mlp`]), trained with MSE loss.
    Mlp {
        input_dim: u64,
        hidden_dim: u64,
        output_dim: u64,
    },
    /// A Llama-family causal language model ([`llama`]), from scratch or from a Hugging Face
    /// folder.
    Llama(LlamaModel),
}

impl ModelConfig {
    /// Parameters, segments and tied names: everything but the forward code.
    pub fn describe(&self) -> ModelDescription {
        match self {
            ModelConfig::Transformer {
                vocab_size,
                dim,
                n_layers,
                n_heads,
                max_seq_len,
            } => transformer::TransformerSizes {
                vocab_size: *vocab_size as i64,
                dim: *dim as i64,
                n_layers: *n_layers as i64,
                n_heads: *n_heads as i64,
                max_seq_len: *max_seq_len as i64,
            }
            .describe(),
            ModelConfig::Mlp {
                input_dim,
                hidden_dim,
                output_dim,
            } => mlp::MlpSizes {
                input_dim: *input_dim as i64,
                hidden_dim: *hidden_dim as i64,
                output_dim: *output_dim as i64,
            }
            .describe(),
            ModelConfig::Llama(m) => m.architecture.describe(),
        }
    }

    /// Number of parameters of the unsharded model.
    pub fn num_params(&self) -> u64 {
        self.describe().num_params()
    }

    /// FLOPs per token (per sample for the MLP) of forward + backward at `seq_len`.
    pub fn flops_per_token(&self, seq_len: u64) -> f64 {
        self.describe().flops_per_token(seq_len)
    }

    /// Vocabulary of a language model; `None` for the MLP, whose samples are vectors.
    pub fn vocab_size(&self) -> Option<u64> {
        match self {
            ModelConfig::Transformer { vocab_size, .. } => Some(*vocab_size),
            ModelConfig::Llama(m) => Some(m.architecture.vocab_size),
            ModelConfig::Mlp { .. } => None,
        }
    }

    /// The loss past which a language model has blown up: ten times a uniform guess's,
    /// ln(vocabulary). Weights loaded right or initialised at random score near or below a
    /// uniform guess; ten times it is confidently wrong everywhere, where a diverging run
    /// gets before (or instead of) its numbers overflowing. `None` for the MLP, whose MSE
    /// has no such scale.
    pub fn blown_up_loss(&self) -> Option<f64> {
        self.vocab_size()
            .map(|vocab| BLOWN_UP_FACTOR * (vocab.max(2) as f64).ln())
    }

    /// The limit of [`ModelConfig::blown_up_loss`] when `loss` is past it: the step blew up.
    pub fn blown_up_limit_passed_by(&self, loss: f64) -> Option<f64> {
        self.blown_up_loss().filter(|&limit| loss > limit)
    }

    /// Whether the model reads per-document `position_ids` and `document_ids` (positions
    /// restarting per document, attention kept within it): what `data.document_mask` needs.
    /// The FSDP2-example transformer has learned absolute positions and a plain causal mask.
    pub fn supports_document_mask(&self) -> bool {
        match self {
            ModelConfig::Llama(_) => true,
            ModelConfig::Transformer { .. } | ModelConfig::Mlp { .. } => false,
        }
    }

    /// The Hugging Face folder the weights start from, which also holds the tokenizer.
    pub fn pretrained_folder(&self) -> Option<&std::path::Path> {
        match self {
            ModelConfig::Llama(m) => m.pretrained.as_deref(),
            ModelConfig::Transformer { .. } | ModelConfig::Mlp { .. } => None,
        }
    }

    /// One line for people (`shardrun plan`).
    pub fn summary(&self) -> String {
        match self {
            ModelConfig::Transformer {
                vocab_size,
                dim,
                n_layers,
                n_heads,
                max_seq_len,
            } => format!(
                "transformer: dim {dim}, {n_layers} layers, {n_heads} heads, vocab {vocab_size}, max_seq_len {max_seq_len}"
            ),
            ModelConfig::Mlp {
                input_dim,
                hidden_dim,
                output_dim,
            } => format!("mlp: {input_dim} → {hidden_dim} → {output_dim}"),
            ModelConfig::Llama(m) => {
                let c = &m.architecture;
                let rope = match c.rope.scaling {
                    RopeScaling::Default => String::new(),
                    RopeScaling::Linear { factor } => format!(" linear ×{factor}"),
                    RopeScaling::Llama3 { factor, .. } => format!(" llama3 ×{factor}"),
                    RopeScaling::Dynamic { factor } => format!(" dynamic ×{factor}"),
                    RopeScaling::Yarn { factor, .. } => format!(" yarn ×{factor}"),
                };
                let from = match &m.pretrained {
                    Some(dir) => format!(" from {}", dir.display()),
                    None => " from scratch".to_string(),
                };
                format!(
                    "{}{from}: dim {}, {} layers, {} heads ({} key/value) of {}, ffn {}, vocab {}, rope θ {}{rope}{}",
                    c.model_type.model_type(),
                    c.dim,
                    c.n_layers,
                    c.n_heads,
                    c.n_kv_heads,
                    c.head_dim,
                    c.ffn_dim,
                    c.vocab_size,
                    c.rope.theta,
                    if c.tie_embeddings { ", tied embeddings" } else { "" }
                )
            }
        }
    }

    /// What the forward code would otherwise find out deep inside libtorch: sizes that do not
    /// divide, sequences longer than the model takes, empty layers.
    pub fn validate(&self, seq_len: u64) -> Result<(), String> {
        match *self {
            ModelConfig::Transformer {
                vocab_size,
                dim,
                n_layers,
                n_heads,
                max_seq_len,
            } => {
                if vocab_size == 0 || dim == 0 || n_layers == 0 || n_heads == 0 || max_seq_len == 0
                {
                    return Err(
                        "vocab_size, dim, n_layers, n_heads and max_seq_len must be positive"
                            .into(),
                    );
                }
                if !dim.is_multiple_of(n_heads) {
                    return Err(format!("dim {dim} is not divisible by n_heads {n_heads}"));
                }
                if seq_len > max_seq_len {
                    return Err(format!(
                        "seq_len {seq_len} exceeds the model's max_seq_len {max_seq_len} (the position table)"
                    ));
                }
                Ok(())
            }
            ModelConfig::Mlp {
                input_dim,
                hidden_dim,
                output_dim,
            } => {
                if input_dim == 0 || hidden_dim == 0 || output_dim == 0 {
                    return Err("the MLP's dimensions must be positive".into());
                }
                Ok(())
            }
            ModelConfig::Llama(ref m) => m.architecture.validate(seq_len),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_language_model_blows_up_at_ten_times_a_uniform_guess() {
        let transformer = ModelConfig::Transformer {
            vocab_size: 32_000,
            dim: 64,
            n_layers: 1,
            n_heads: 2,
            max_seq_len: 16,
        };
        // ln(32000) = 10.373: a uniform guess's cross-entropy.
        let limit = transformer.blown_up_loss().unwrap();
        assert!((limit - 103.73).abs() < 0.01, "{limit}");
        let mlp = ModelConfig::Mlp {
            input_dim: 4,
            hidden_dim: 8,
            output_dim: 4,
        };
        assert_eq!(mlp.blown_up_loss(), None, "MSE has no uniform guess");
    }

    #[test]
    fn transformer_param_count_matches_pytorch() {
        // Module by module, as in PyTorch's FSDP2 example model.py: bias-free attention
        // projections, biased MLP, LayerNorms with weight and bias, untied output.
        let m = ModelConfig::Transformer {
            vocab_size: 8192,
            dim: 256,
            n_layers: 8,
            n_heads: 8,
            max_seq_len: 256,
        };
        let block = 4 * 256 * 256 + (256 * 1024 + 1024 + 1024 * 256 + 256) + 4 * 256;
        assert_eq!(m.num_params(), 8192 * 256 * 2 + 256 * 256 + 8 * block + 512);
        // torchtitan's 6·N (N without the embedding tables) + 12·L·d·T.
        let n = m.num_params() - 8192 * 256 - 256 * 256;
        assert_eq!(
            m.flops_per_token(256),
            6.0 * n as f64 + 12.0 * (8 * 256 * 256) as f64
        );
    }

    #[test]
    fn mlp_param_count() {
        let m = ModelConfig::Mlp {
            input_dim: 1024,
            hidden_dim: 4096,
            output_dim: 1024,
        };
        assert_eq!(m.num_params(), 1024 * 4096 + 4096 + 4096 * 1024 + 1024);
        assert_eq!(m.flops_per_token(1), 6.0 * m.num_params() as f64);
    }
}
