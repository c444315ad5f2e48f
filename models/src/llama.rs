//! The Llama architecture as `transformers` builds it (`LlamaForCausalLM`), with the flags
//! that make Mistral, Qwen2 and Qwen3 the same model:
//!
//! ```text
//! h = model.embed_tokens(ids)
//! for layer in model.layers:                           # LlamaDecoderLayer
//!     h = h + self_attn(input_layernorm(h))            # RMSNorm; q/k/v/o projections, RoPE,
//!                                                      # grouped-query causal attention
//!                                                      # (Qwen3: RMSNorm of each q and k
//!                                                      # head before RoPE)
//!     h = h + mlp(post_attention_layernorm(h))         # down(silu(gate(x)) * up(x))
//! logits = lm_head(model.norm(h))                      # lm_head = embed_tokens when tied
//! ```
//!
//! Parameter names are `transformers`' own (`model.layers.0.self_attn.q_proj.weight`), so a
//! Hugging Face folder loads by name and a full checkpoint is a state dict `transformers`
//! reads. From-scratch initialisation is `transformers`' `_init_weights`: normal with
//! `initializer_range` for linear and embedding weights (the padding row zero), zeros for
//! biases, ones for norms.

use crate::footprint::{Activations, F32};
use crate::param::{Builder, Init, ModelDescription, ParamKind, ParamSpec, SegmentSpec, TiedParam};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// The `model_type` a folder declares; each is this architecture with its own flags.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LlamaFamily {
    /// Llama 1-3, CodeLlama, SmolLM, TinyLlama: biases only if the config asks for them.
    Llama,
    /// Mistral: no biases; a sliding attention window (full attention up to its length).
    Mistral,
    /// Qwen2: biases on the q, k and v projections.
    Qwen2,
    /// Qwen3: each query and key head RMS-normalised before RoPE; biases as Llama's.
    Qwen3,
}

impl LlamaFamily {
    pub fn model_type(self) -> &'static str {
        match self {
            LlamaFamily::Llama => "llama",
            LlamaFamily::Mistral => "mistral",
            LlamaFamily::Qwen2 => "qwen2",
            LlamaFamily::Qwen3 => "qwen3",
        }
    }

    /// The `transformers` class a folder of this type loads as.
    pub fn architecture(self) -> &'static str {
        match self {
            LlamaFamily::Llama => "LlamaForCausalLM",
            LlamaFamily::Mistral => "MistralForCausalLM",
            LlamaFamily::Qwen2 => "Qwen2ForCausalLM",
            LlamaFamily::Qwen3 => "Qwen3ForCausalLM",
        }
    }
}

/// How rotary frequencies are scaled (`rope_type`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(tag = "rope_type", rename_all = "snake_case", deny_unknown_fields)]
pub enum RopeScaling {
    /// `1 / theta^(2i/d)`.
    Default,
    /// Position interpolation: every frequency divided by `factor`.
    Linear { factor: f64 },
    /// Llama 3.1's: low frequencies divided by `factor`, high ones kept, smoothed between.
    Llama3 {
        factor: f64,
        low_freq_factor: f64,
        high_freq_factor: f64,
        original_max_position_embeddings: u64,
    },
    /// Dynamic NTK: the base grows with sequences longer than `max_position_embeddings`,
    /// and is the default one up to there. Only that range is supported (see
    /// [`LlamaConfig::validate`]), so the frequencies are the default ones.
    Dynamic { factor: f64 },
    /// YaRN (the long-context setting of Qwen2.5 and Qwen3): wavelengths that fit the
    /// original context `beta_fast` times or more keep their frequency, those that fit fewer
    /// than `beta_slow` times are divided by `factor`, a linear ramp between; cos and sin are
    /// multiplied by [`RopeScaling::attention_factor`]. Left out, the options take
    /// transformers' defaults.
    Yarn {
        factor: f64,
        original_max_position_embeddings: u64,
        /// `None`: `0.1 ln(factor) + 1` (1 for factors up to 1), as transformers derives it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        attention_factor: Option<f64>,
        #[serde(default = "yarn_beta_fast")]
        beta_fast: f64,
        #[serde(default = "yarn_beta_slow")]
        beta_slow: f64,
        /// Rounds the ramp's ends to whole dimensions.
        #[serde(default = "yarn_truncate")]
        truncate: bool,
    },
}

fn yarn_beta_fast() -> f64 {
    RopeScaling::YARN_BETA_FAST
}

fn yarn_beta_slow() -> f64 {
    RopeScaling::YARN_BETA_SLOW
}

fn yarn_truncate() -> bool {
    RopeScaling::YARN_TRUNCATE
}

impl RopeScaling {
    /// transformers' defaults for the YaRN options a config leaves out.
    pub const YARN_BETA_FAST: f64 = 32.0;
    pub const YARN_BETA_SLOW: f64 = 1.0;
    pub const YARN_TRUNCATE: bool = true;

    /// YaRN with the defaults for every option.
    #[cfg(test)]
    pub(crate) fn yarn(factor: f64, original_max_position_embeddings: u64) -> Self {
        RopeScaling::Yarn {
            factor,
            original_max_position_embeddings,
            attention_factor: None,
            beta_fast: Self::YARN_BETA_FAST,
            beta_slow: Self::YARN_BETA_SLOW,
            truncate: Self::YARN_TRUNCATE,
        }
    }

    /// What cos and sin are multiplied by: YaRN's attention factor; 1 for every other type.
    pub fn attention_factor(&self) -> f64 {
        match *self {
            RopeScaling::Yarn {
                factor,
                attention_factor,
                ..
            } => attention_factor.unwrap_or_else(|| yarn_mscale(factor, 1.0)),
            _ => 1.0,
        }
    }
}

/// YaRN's `0.1 mscale ln(factor) + 1`, 1 for factors up to 1.
pub fn yarn_mscale(factor: f64, mscale: f64) -> f64 {
    if factor <= 1.0 {
        1.0
    } else {
        0.1 * mscale * factor.ln() + 1.0
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rope {
    pub theta: f64,
    pub scaling: RopeScaling,
}

/// Every size and flag of one Llama-family model, explicit.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LlamaConfig {
    pub model_type: LlamaFamily,
    pub vocab_size: u64,
    /// `hidden_size`.
    pub dim: u64,
    /// `num_hidden_layers`.
    pub n_layers: u64,
    /// `num_attention_heads`.
    pub n_heads: u64,
    /// `num_key_value_heads`: fewer than `n_heads` is grouped-query attention, 1 multi-query.
    pub n_kv_heads: u64,
    pub head_dim: u64,
    /// `intermediate_size` of the SwiGLU MLP.
    pub ffn_dim: u64,
    /// `rms_norm_eps`.
    pub norm_eps: f64,
    pub rope: Rope,
    pub max_position_embeddings: u64,
    /// `tie_word_embeddings`: the output head is the token embedding.
    pub tie_embeddings: bool,
    /// Biases on the q, k and v projections (Llama's `attention_bias`, always on in Qwen2).
    pub qkv_bias: bool,
    /// A bias on the output projection (Llama's `attention_bias`).
    pub o_proj_bias: bool,
    /// Biases in the MLP (Llama's `mlp_bias`).
    pub mlp_bias: bool,
    pub initializer_range: f64,
    /// The embedding row `transformers` treats as padding: zero at init, no gradient.
    pub pad_token_id: Option<u64>,
    /// Mistral's (or Qwen2's) attention window. Attention is full, and exact, as long as
    /// sequences are no longer than this; longer ones would need sliding-window attention.
    pub sliding_window: Option<u64>,
}

/// A Llama-family model: its architecture and where its initial weights come from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LlamaModel {
    pub architecture: LlamaConfig,
    /// Hugging Face folder whose weights the model starts from (and whose tokenizer and
    /// generation files an export copies); `None` initialises from scratch.
    pub pretrained: Option<PathBuf>,
}

/// Packed documents that attend through a dense (batch, 1, seq, seq) mask have its rows
/// laid out a multiple of this many values apart: CUDA's memory-efficient attention kernel
/// copies any other mask in every call. The memory plan counts the mask as laid out.
pub const MASK_ROW_ALIGNMENT: u64 = 8;

/// Values one row of the dense mask over `seq_len` tokens takes, as laid out.
pub fn mask_row_values(seq_len: u64) -> u64 {
    seq_len.div_ceil(MASK_ROW_ALIGNMENT) * MASK_ROW_ALIGNMENT
}

/// Values of the dense mask of `rows` sequences of `seq_len` tokens, as laid out.
pub fn dense_mask_values(rows: u64, seq_len: u64) -> u64 {
    rows * seq_len * mask_row_values(seq_len)
}

/// Whether flash attention's variable-length kernel can keep packed documents apart (no
/// dense mask): on CUDA, in fp16 or bf16, for heads of at most 256 values in multiples of 8,
/// on GPUs of compute capability 8.0 or more (which only the device can tell).
pub fn flash_varlen_takes(cuda: bool, half_precision: bool, head_dim: u64) -> bool {
    cuda && half_precision && head_dim <= 256 && head_dim.is_multiple_of(8)
}

pub const EMBED_TOKENS: &str = "model.embed_tokens.weight";
pub const LM_HEAD: &str = "lm_head.weight";

impl LlamaConfig {
    /// Qwen3's `q_norm` and `k_norm`: an RMSNorm over each query and key head (weights of
    /// `head_dim`) between the projection and RoPE.
    pub fn qk_norm(&self) -> bool {
        self.model_type == LlamaFamily::Qwen3
    }

    /// Query heads per key/value head.
    pub fn kv_groups(&self) -> u64 {
        self.n_heads / self.n_kv_heads.max(1)
    }

    /// What must hold for the model to be built and trained on sequences of `seq_len`; each
    /// error names the `config.json` key (or job-spec key) to change.
    pub fn validate(&self, seq_len: u64) -> Result<(), String> {
        self.validate_architecture()?;
        self.validate_sequences(seq_len)
    }

    /// What must hold for the model to be built, whatever it trains on.
    pub fn validate_architecture(&self) -> Result<(), String> {
        for (key, v) in [
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.dim),
            ("num_hidden_layers", self.n_layers),
            ("num_attention_heads", self.n_heads),
            ("num_key_value_heads", self.n_kv_heads),
            ("head_dim", self.head_dim),
            ("intermediate_size", self.ffn_dim),
        ] {
            if v == 0 {
                return Err(format!("{key} is 0"));
            }
        }
        let biases = (self.qkv_bias, self.o_proj_bias, self.mlp_bias);
        match (self.model_type, biases) {
            (LlamaFamily::Llama, (qkv, o, _)) if qkv == o => {}
            (LlamaFamily::Mistral, (false, false, false)) => {}
            (LlamaFamily::Qwen2, (true, false, false)) => {}
            (LlamaFamily::Qwen3, (qkv, o, false)) if qkv == o => {}
            (family, _) => {
                return Err(format!(
                    "biases (q/k/v {}, o_proj {}, mlp {}) are not those of model_type {}: Llama has attention_bias on all four projections or none, Mistral none, Qwen2 q/k/v only, Qwen3 attention_bias on all four or none and none in the MLP",
                    biases.0,
                    biases.1,
                    biases.2,
                    family.model_type()
                ))
            }
        }
        if !self.n_heads.is_multiple_of(self.n_kv_heads) {
            return Err(format!(
                "num_attention_heads {} is not a multiple of num_key_value_heads {}",
                self.n_heads, self.n_kv_heads
            ));
        }
        if !self.head_dim.is_multiple_of(2) {
            return Err(format!(
                "head_dim {} is odd: rotary embeddings rotate pairs of dimensions",
                self.head_dim
            ));
        }
        if let Some(pad) = self.pad_token_id.filter(|&p| p >= self.vocab_size) {
            return Err(format!(
                "pad_token_id {pad} is outside the vocabulary of {}",
                self.vocab_size
            ));
        }
        if !(self.norm_eps.is_finite() && self.norm_eps > 0.0) {
            return Err(format!("rms_norm_eps {} is not positive", self.norm_eps));
        }
        if !(self.rope.theta.is_finite() && self.rope.theta > 0.0) {
            return Err(format!("rope_theta {} is not positive", self.rope.theta));
        }
        match self.rope.scaling {
            RopeScaling::Default => {}
            RopeScaling::Linear { factor } | RopeScaling::Dynamic { factor } if factor > 0.0 => {}
            RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings,
            } if factor > 0.0
                && low_freq_factor > 0.0
                && high_freq_factor > low_freq_factor
                && original_max_position_embeddings > 0 => {}
            RopeScaling::Yarn {
                factor,
                original_max_position_embeddings,
                attention_factor,
                beta_fast,
                beta_slow,
                ..
            } if factor > 0.0
                && original_max_position_embeddings > 0
                && attention_factor.is_none_or(|a| a > 0.0)
                && beta_fast > beta_slow
                && beta_slow > 0.0 => {}
            scaling => {
                return Err(format!(
                    "rope scaling {scaling:?} needs positive factors (llama3: high_freq_factor > low_freq_factor; yarn: beta_fast > beta_slow > 0)"
                ))
            }
        }
        Ok(())
    }

    /// What must hold for the model to train on sequences of `seq_len`.
    pub fn validate_sequences(&self, seq_len: u64) -> Result<(), String> {
        if matches!(self.rope.scaling, RopeScaling::Dynamic { .. })
            && seq_len > self.max_position_embeddings
        {
            return Err(format!(
                "rope_type dynamic rescales the rotary frequencies for sequences longer than max_position_embeddings ({}), which shardrun does not implement; up to it they are the default ones. Train on seq_len <= {}",
                self.max_position_embeddings, self.max_position_embeddings
            ));
        }
        if let Some(window) = self.sliding_window.filter(|&w| seq_len > w) {
            return Err(format!(
                "sequences of {seq_len} tokens are longer than the sliding_window of {window}: that needs sliding-window attention, which shardrun does not implement. Train on seq_len <= {window}"
            ));
        }
        Ok(())
    }

    fn decoder_layer(&self, b: &Builder) -> Vec<ParamSpec> {
        let (d, hd) = (self.dim as i64, self.head_dim as i64);
        let q_out = self.n_heads as i64 * hd;
        let kv_out = self.n_kv_heads as i64 * hd;
        let normal = Init::normal(self.initializer_range);
        let attn = b.pp("self_attn");
        let mlp = b.pp("mlp");
        let mut specs = Vec::new();
        specs.extend(attn.linear("q_proj", d, q_out, self.qkv_bias, normal, Init::Zeros));
        specs.extend(attn.linear("k_proj", d, kv_out, self.qkv_bias, normal, Init::Zeros));
        specs.extend(attn.linear("v_proj", d, kv_out, self.qkv_bias, normal, Init::Zeros));
        specs.extend(attn.linear("o_proj", q_out, d, self.o_proj_bias, normal, Init::Zeros));
        if self.qk_norm() {
            specs.extend(attn.norm("q_norm", hd, false));
            specs.extend(attn.norm("k_norm", hd, false));
        }
        let f = self.ffn_dim as i64;
        specs.extend(mlp.linear("gate_proj", d, f, self.mlp_bias, normal, Init::Zeros));
        specs.extend(mlp.linear("up_proj", d, f, self.mlp_bias, normal, Init::Zeros));
        specs.extend(mlp.linear("down_proj", f, d, self.mlp_bias, normal, Init::Zeros));
        specs.extend(b.norm("input_layernorm", d, false));
        specs.extend(b.norm("post_attention_layernorm", d, false));
        specs
    }

    /// Parameters in `LlamaForCausalLM.named_parameters()` order, and the segments: the
    /// embedding, one per decoder layer, and the head (final norm, output projection, loss).
    pub fn describe(&self) -> ModelDescription {
        let names = |specs: &[ParamSpec]| specs.iter().map(|s| s.name.clone()).collect();
        let model = Builder::root().pp("model");
        let embed = model.embedding(
            "embed_tokens",
            self.vocab_size as i64,
            self.dim as i64,
            Init::Normal {
                std: self.initializer_range,
                zero_row: self.pad_token_id,
            },
        );
        debug_assert_eq!(embed.name, EMBED_TOKENS);
        let mut segments = vec![SegmentSpec {
            name: "embeddings".into(),
            params: vec![embed.name.clone()],
            is_block: false,
        }];
        let mut params = vec![embed];
        for i in 0..self.n_layers {
            let name = model.path(&format!("layers.{i}"));
            let layer = self.decoder_layer(&Builder::root().pp(&name));
            segments.push(SegmentSpec {
                name,
                params: names(&layer),
                is_block: true,
            });
            params.extend(layer);
        }
        let norm = model.norm("norm", self.dim as i64, false);
        let mut head_params: Vec<String> = names(&norm);
        params.extend(norm);
        let mut tied = Vec::new();
        if self.tie_embeddings {
            head_params.push(EMBED_TOKENS.into());
            tied.push(TiedParam {
                alias: LM_HEAD.into(),
                param: EMBED_TOKENS.into(),
            });
        } else {
            let head = ParamSpec::new(
                LM_HEAD,
                vec![self.vocab_size as i64, self.dim as i64],
                Init::normal(self.initializer_range),
                ParamKind::Weight,
            );
            head_params.push(head.name.clone());
            params.push(head);
        }
        segments.push(SegmentSpec {
            name: "head".into(),
            params: head_params,
            is_block: false,
        });
        ModelDescription {
            params,
            segments,
            tied,
            output_weight: Some(
                if self.tie_embeddings {
                    EMBED_TOKENS
                } else {
                    LM_HEAD
                }
                .into(),
            ),
            attention_flops_per_token_per_position: 12
                * self.n_layers
                * self.n_heads
                * self.head_dim,
        }
    }

    /// Activation bytes per token of each segment when computing in `c`-byte floats, and the
    /// batch's bytes per token (for the memory plan, [`crate::footprint`]), read off the
    /// worker's forward (`worker/src/model/llama.rs`).
    pub fn activations(&self, c: u64) -> (Vec<Activations>, u64) {
        let d = self.dim;
        let q = self.n_heads * self.head_dim;
        let kv = self.n_kv_heads * self.head_dim;
        let f = self.ffn_dim;
        // RMSNorm keeps its input in fp32 for backward (a copy when computing in a narrower
        // dtype; the input itself in fp32, which for the first norm is the segment's input),
        // its rsqrt, and the normalised value before the weight.
        let narrow = c < F32;
        // Qwen3's q/k norms: per token, the normalised values and outputs of every query and
        // key head, their fp32 input copies when narrower, one rsqrt per head.
        let qk_norm = if self.qk_norm() {
            2 * c * (q + kv)
                + if narrow { (q + kv) * F32 } else { 0 }
                + (self.n_heads + self.n_kv_heads) * F32
        } else {
            0
        };
        let mut segments = vec![Activations {
            // The lookup keeps only the token ids (the batch).
            saved: 0,
            output: d * c,
            transient: 0,
            chunked: 0,
        }];
        for _ in 0..self.n_layers {
            segments.push(Activations {
                // Per token: each norm's normalised value and output (4·dim); q, k, v, the
                // rotated halves and the rotated q and k RoPE's products keep (2·q + 2·kv),
                // attention's output and its contiguous copy for o_proj (2·q), q's and k's
                // and v's projections (q + 2·kv); the MLP's gate, silu(gate), up and their
                // product (4·ffn). In fp32: the norms' inputs (two copies when narrower, the
                // residual sum alone in fp32), their rsqrt, attention's log-sum-exp per head.
                saved: c * (4 * d + 5 * q + 4 * kv + 4 * f)
                    + if narrow { 2 * d * F32 } else { d * F32 }
                    + 2 * F32
                    + self.n_heads * F32
                    + qk_norm,
                output: d * c,
                // Backward of the MLP: the upstream gradient and the gradients of the
                // product, silu's output, up and gate; forward of RoPE: its two products.
                transient: (3 * f + d).max(3 * q) * c,
                chunked: 0,
            });
        }
        segments.push(Activations {
            // The final norm's normalised value and output (read by lm_head), its fp32 input
            // copy and rsqrt.
            saved: 2 * d * c + if narrow { d * F32 } else { 0 } + F32,
            output: 0,
            // The gradient of the normed output, in chunks and then joined.
            transient: 2 * d * c,
            // The loss, a chunk of tokens at a time: the logits in the compute dtype and
            // cast up to fp32, which become their gradient in place, cast back down.
            chunked: self.vocab_size * F32 + if narrow { self.vocab_size * c } else { 0 },
        });
        // int64 token ids and targets.
        (segments, 16)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn tiny(tie: bool) -> LlamaConfig {
        LlamaConfig {
            model_type: LlamaFamily::Llama,
            vocab_size: 100,
            dim: 16,
            n_layers: 2,
            n_heads: 4,
            n_kv_heads: 2,
            head_dim: 4,
            ffn_dim: 40,
            norm_eps: 1e-6,
            rope: Rope {
                theta: 10000.0,
                scaling: RopeScaling::Default,
            },
            max_position_embeddings: 64,
            tie_embeddings: tie,
            qkv_bias: false,
            o_proj_bias: false,
            mlp_bias: false,
            initializer_range: 0.02,
            pad_token_id: None,
            sliding_window: None,
        }
    }

    #[test]
    fn parameter_count_is_transformers_count() {
        // sum(p.numel() for p in LlamaForCausalLM(LlamaConfig(vocab_size=100, hidden_size=16,
        // intermediate_size=40, num_hidden_layers=2, num_attention_heads=4,
        // num_key_value_heads=2, tie_word_embeddings=False)).parameters()) == 8656
        // (7056 with tie_word_embeddings=True)
        let untied = tiny(false).describe();
        untied.validate().unwrap();
        let layer = 16 * 16 + 2 * (16 * 8) + 16 * 16 + 3 * (16 * 40) + 2 * 16;
        assert_eq!(untied.num_params(), 100 * 16 * 2 + 2 * layer + 16);
        assert_eq!(untied.num_params(), 8656);
        let tied = tiny(true).describe();
        tied.validate().unwrap();
        assert_eq!(tied.num_params(), 7056);
        assert_eq!(tied.segments.last().unwrap().params[1], EMBED_TOKENS);
        // The tied head still multiplies by the embedding: same FLOPs as untied.
        assert_eq!(untied.flops_per_token(8), tied.flops_per_token(8));
        assert_eq!(
            untied.flops_per_token(8),
            6.0 * (8656 - 1600) as f64 + (12 * 2 * 4 * 4 * 8) as f64
        );
    }

    #[test]
    fn qwen2_biases_and_names() {
        let mut c = tiny(false);
        c.model_type = LlamaFamily::Qwen2;
        c.qkv_bias = true;
        let d = c.describe();
        let names: Vec<&str> = d.segments[1].params.iter().map(String::as_str).collect();
        assert_eq!(
            names,
            [
                "model.layers.0.self_attn.q_proj.weight",
                "model.layers.0.self_attn.q_proj.bias",
                "model.layers.0.self_attn.k_proj.weight",
                "model.layers.0.self_attn.k_proj.bias",
                "model.layers.0.self_attn.v_proj.weight",
                "model.layers.0.self_attn.v_proj.bias",
                "model.layers.0.self_attn.o_proj.weight",
                "model.layers.0.mlp.gate_proj.weight",
                "model.layers.0.mlp.up_proj.weight",
                "model.layers.0.mlp.down_proj.weight",
                "model.layers.0.input_layernorm.weight",
                "model.layers.0.post_attention_layernorm.weight",
            ]
        );
        let bias = d.param("model.layers.1.self_attn.k_proj.bias").unwrap();
        assert_eq!(
            (bias.kind, bias.init, &bias.shape),
            (ParamKind::Bias, Init::Zeros, &vec![8])
        );
    }

    #[test]
    fn qwen3_normalises_each_query_and_key_head() {
        let mut c = tiny(true);
        c.model_type = LlamaFamily::Qwen3;
        c.validate(8).unwrap();
        let d = c.describe();
        let names: Vec<&str> = d.segments[1].params.iter().map(String::as_str).collect();
        // Qwen3Attention's order: the four projections, then q_norm and k_norm.
        assert_eq!(
            names[3..6],
            [
                "model.layers.0.self_attn.o_proj.weight",
                "model.layers.0.self_attn.q_norm.weight",
                "model.layers.0.self_attn.k_norm.weight",
            ]
        );
        let norm = d.param("model.layers.1.self_attn.k_norm.weight").unwrap();
        assert_eq!(
            (norm.kind, norm.init, &norm.shape),
            (ParamKind::Norm, Init::Ones, &vec![4])
        );
        // sum(p.numel() for p in Qwen3ForCausalLM(Qwen3Config(vocab_size=100, hidden_size=16,
        // intermediate_size=40, num_hidden_layers=2, num_attention_heads=4,
        // num_key_value_heads=2, head_dim=4, tie_word_embeddings=True)).parameters()) == 7072
        assert_eq!(d.num_params(), 7072);
        // The norms' activations count in the memory plan.
        assert!(c.activations(2).0[1].saved > tiny(true).activations(2).0[1].saved);

        // Only Qwen3 normalises query and key heads.
        assert!(!tiny(false).qk_norm());
        c.mlp_bias = true;
        assert!(c.validate(8).unwrap_err().contains("none in the MLP"));
    }

    #[test]
    fn validation_names_what_is_wrong() {
        let mut c = tiny(false);
        c.n_kv_heads = 3;
        assert!(c.validate(8).unwrap_err().contains("num_key_value_heads 3"));
        let mut c = tiny(false);
        c.sliding_window = Some(16);
        assert!(c.validate(16).is_ok());
        assert!(c.validate(17).unwrap_err().contains("sliding_window of 16"));
    }
}
