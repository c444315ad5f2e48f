//! Forward of the Llama architecture (described in `shardrun_models::llama`), one type per
//! layer as in `transformers`' `modeling_llama.py`; Mistral, Qwen2 and Qwen3 are the same
//! code with their flags (biases; Qwen3's per-head q/k norms) from the config.
//!
//! ```text
//! LlamaForCausalLM
//!   model.embed_tokens      embedding (the pad row gets no gradient)
//!   model.layers.i          LlamaDecoderLayer:
//!       h = h + self_attn(input_layernorm(h))            RMSNorm, q/k/v/o, RoPE, causal GQA
//!       h = h + mlp(post_attention_layernorm(h))         down(silu(gate(x)) * up(x))
//!   model.norm, lm_head     RMSNorm, projection to the vocabulary (the embedding when tied)
//! ```
//!
//! Packed sequences: when the batch carries `document_ids`, attention stays within each
//! document (a block-diagonal causal mask); `position_ids` give each token's RoPE position.

use super::{linear, token_loss, Model, ModelDescription, Params};
use crate::data::Batch;
use shardrun_models::llama::{EMBED_TOKENS, LM_HEAD};
use shardrun_models::{LlamaConfig, RopeScaling};
use std::sync::{Mutex, PoisonError};
use tch::{Device, Kind, Tensor};

/// `LlamaRMSNorm`: normalised in fp32, scaled in the compute dtype.
pub struct RmsNorm {
    eps: f64,
}

impl RmsNorm {
    pub fn forward(&self, p: &Params, x: &Tensor) -> Tensor {
        let kind = x.kind();
        let h = x.to_kind(Kind::Float);
        let variance = h.square().mean_dim(-1, true, Kind::Float);
        let h = h * (variance + self.eps).rsqrt();
        p.get("weight") * h.to_kind(kind)
    }
}

/// `LlamaRotaryEmbedding`: the inverse frequencies are the model's buffer, held in
/// `buffer_dtype`; cos and sin are computed from them in fp32 and cast to the compute dtype.
pub struct RotaryEmbedding {
    /// The buffer's values (rounded through `buffer_dtype`) as fp32.
    inv_freq: Vec<f32>,
    /// `inv_freq` on the device the model last ran on, made once: copied from host memory
    /// in every layer, it would make the host wait for the GPU's queue each time.
    on_device: Mutex<Option<Tensor>>,
    /// What cos and sin are multiplied by (YaRN's attention factor; 1 otherwise).
    attention_scaling: f64,
}

impl RotaryEmbedding {
    pub fn new(config: &LlamaConfig, buffer_kind: Kind) -> Self {
        let inv_freq = inverse_frequencies(config)
            .to_kind(buffer_kind)
            .to_kind(Kind::Float);
        RotaryEmbedding {
            inv_freq: Vec::<f32>::try_from(&inv_freq).expect("a 1-d fp32 tensor"),
            on_device: Mutex::new(None),
            attention_scaling: config.rope.scaling.attention_factor(),
        }
    }

    fn inv_freq_on(&self, device: Device) -> Tensor {
        let mut cached = self
            .on_device
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        match &*cached {
            Some(t) if t.device() == device => t.shallow_clone(),
            _ => {
                let t = Tensor::from_slice(&self.inv_freq).to_device(device);
                *cached = Some(t.shallow_clone());
                t
            }
        }
    }

    /// cos and sin of shape (batch or 1, seq, head_dim) for `positions` (batch or 1, seq).
    pub fn cos_sin(&self, positions: &Tensor, kind: Kind) -> (Tensor, Tensor) {
        let inv_freq = self.inv_freq_on(positions.device());
        let freqs = positions.unsqueeze(-1).to_kind(Kind::Float) * inv_freq;
        let emb = Tensor::cat(&[&freqs, &freqs], -1);
        let (cos, sin) = if self.attention_scaling == 1.0 {
            (emb.cos(), emb.sin())
        } else {
            (
                emb.cos() * self.attention_scaling,
                emb.sin() * self.attention_scaling,
            )
        };
        (cos.to_kind(kind), sin.to_kind(kind))
    }
}

/// `transformers`' rope init functions, op for op in fp32 (`default`, `linear`, `llama3`,
/// `yarn`; `dynamic` within max_position_embeddings).
fn inverse_frequencies(config: &LlamaConfig) -> Tensor {
    let dim = config.head_dim as i64;
    let exponents = Tensor::arange_start_step(0, dim, 2, (Kind::Int64, Device::Cpu))
        .to_kind(Kind::Float)
        / dim as f64;
    let pos_freqs = Tensor::pow_scalar(config.rope.theta, &exponents);
    let inv_freq = pos_freqs.reciprocal();
    match config.rope.scaling {
        // Dynamic NTK is the default rope up to max_position_embeddings, the only lengths
        // `LlamaConfig::validate` lets it train on.
        RopeScaling::Default | RopeScaling::Dynamic { .. } => inv_freq,
        RopeScaling::Linear { factor } => inv_freq / factor,
        RopeScaling::Llama3 {
            factor,
            low_freq_factor,
            high_freq_factor,
            original_max_position_embeddings,
        } => {
            let old_context = original_max_position_embeddings as f64;
            let low_freq_wavelen = old_context / low_freq_factor;
            let high_freq_wavelen = old_context / high_freq_factor;
            let wavelen = inv_freq.reciprocal() * (2.0 * std::f64::consts::PI);
            let scaled = (&inv_freq / factor).where_self(&wavelen.gt(low_freq_wavelen), &inv_freq);
            let smooth = (wavelen.reciprocal() * old_context - low_freq_factor)
                / (high_freq_factor - low_freq_factor);
            let smoothed = (-&smooth + 1.0) * &scaled / factor + &smooth * &scaled;
            let medium = wavelen
                .lt(high_freq_wavelen)
                .logical_not()
                .logical_and(&wavelen.gt(low_freq_wavelen).logical_not());
            smoothed.where_self(&medium, &scaled)
        }
        RopeScaling::Yarn {
            factor,
            original_max_position_embeddings,
            beta_fast,
            beta_slow,
            truncate,
            ..
        } => {
            let base = config.rope.theta;
            // The dimension whose wavelength fits the original context `rotations` times.
            let dimension_of = |rotations: f64| {
                dim as f64
                    * (original_max_position_embeddings as f64
                        / (rotations * 2.0 * std::f64::consts::PI))
                        .ln()
                    / (2.0 * base.ln())
            };
            let (mut low, mut high) = (dimension_of(beta_fast), dimension_of(beta_slow));
            if truncate {
                (low, high) = (low.floor(), high.ceil());
            }
            let (low, mut high) = (low.max(0.0), high.min((dim - 1) as f64));
            if low == high {
                high += 0.001;
            }
            let ramp = ((Tensor::arange(dim / 2, (Kind::Float, Device::Cpu)) - low) / (high - low))
                .clamp(0.0, 1.0);
            // 1 where a frequency is kept (extrapolated), 0 where it is divided by `factor`.
            let kept = -ramp + 1.0;
            let interpolated = (pos_freqs * factor).reciprocal();
            interpolated * (-&kept + 1.0) + inv_freq * kept
        }
    }
}

fn rotate_half(x: &Tensor) -> Tensor {
    let half = x.size()[x.dim() - 1] / 2;
    let x1 = x.narrow(-1, 0, half);
    let x2 = x.narrow(-1, half, half);
    Tensor::cat(&[&(-x2), &x1], -1)
}

/// (batch, kv_heads, seq, head_dim) → (batch, kv_heads · repeats, seq, head_dim), each key/value
/// head repeated for the query heads of its group (`repeat_kv` in `modeling_llama.py`).
fn repeat_kv(x: &Tensor, repeats: i64) -> Tensor {
    let (b, kv_heads, s, d) = x.size4().expect("keys are (batch, heads, seq, head_dim)");
    x.unsqueeze(2)
        .expand([b, kv_heads, repeats, s, d], false)
        .reshape([b, kv_heads * repeats, s, d])
}

/// `LlamaAttention`: projections, RoPE, grouped-query scaled-dot-product attention; with
/// `qk_norm`, `Qwen3Attention`: each query and key head RMS-normalised before RoPE.
pub struct Attention {
    n_heads: i64,
    n_kv_heads: i64,
    head_dim: i64,
    qk_norm: Option<RmsNorm>,
}

impl Attention {
    pub fn forward(
        &self,
        p: &Params,
        x: &Tensor,
        (cos, sin): (&Tensor, &Tensor),
        mask: Option<&Tensor>,
    ) -> Tensor {
        let (b, s, _) = x.size3().expect("activations are (batch, seq, dim)");
        let heads = |t: Tensor, n: i64| t.view([b, s, n, self.head_dim]);
        let normed = |t: Tensor, norm: &str| match &self.qk_norm {
            Some(rms) => rms.forward(&p.pp(norm), &t),
            None => t,
        };
        let q = normed(heads(linear(&p.pp("q_proj"), x), self.n_heads), "q_norm");
        let k = normed(heads(linear(&p.pp("k_proj"), x), self.n_kv_heads), "k_norm");
        let v = heads(linear(&p.pp("v_proj"), x), self.n_kv_heads);
        let (q, k, v) = (q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2));
        let (cos, sin) = (cos.unsqueeze(1), sin.unsqueeze(1));
        let q = &q * &cos + rotate_half(&q) * &sin;
        let k = &k * &cos + rotate_half(&k) * &sin;
        let grouped = self.n_kv_heads < self.n_heads;
        // On CUDA only the flash kernel takes fewer key/value heads than query heads, and it
        // takes no mask: packed documents with grouped keys would fall to the math kernel,
        // which holds (batch, heads, seq, seq) scores. Repeating the key/value heads keeps
        // them on the memory-efficient kernel, as `transformers`' SDPA attention does.
        let (k, v, grouped) = if grouped && mask.is_some() && q.device().is_cuda() {
            let repeats = self.n_heads / self.n_kv_heads;
            (repeat_kv(&k, repeats), repeat_kv(&v, repeats), false)
        } else {
            (k, v, grouped)
        };
        let y = Tensor::scaled_dot_product_attention(
            &q,
            &k,
            &v,
            mask,
            0.0,
            mask.is_none(),
            None,
            grouped,
        );
        let y = y
            .transpose(1, 2)
            .reshape([b, s, self.n_heads * self.head_dim]);
        linear(&p.pp("o_proj"), &y)
    }
}

/// `LlamaMLP`: SwiGLU.
pub struct GatedMlp;

impl GatedMlp {
    pub fn forward(&self, p: &Params, x: &Tensor) -> Tensor {
        let gate = linear(&p.pp("gate_proj"), x).silu();
        linear(&p.pp("down_proj"), &(gate * linear(&p.pp("up_proj"), x)))
    }
}

/// `LlamaDecoderLayer`: pre-norm attention and MLP, each with a residual.
pub struct DecoderLayer {
    norm: RmsNorm,
    attention: Attention,
    mlp: GatedMlp,
}

impl DecoderLayer {
    pub fn forward(
        &self,
        p: &Params,
        h: &Tensor,
        rope: (&Tensor, &Tensor),
        mask: Option<&Tensor>,
    ) -> Tensor {
        let attn_in = self.norm.forward(&p.pp("input_layernorm"), h);
        let h = h + self
            .attention
            .forward(&p.pp("self_attn"), &attn_in, rope, mask);
        let mlp_in = self.norm.forward(&p.pp("post_attention_layernorm"), &h);
        &h + self.mlp.forward(&p.pp("mlp"), &mlp_in)
    }
}

/// `LlamaForCausalLM`, segment by segment: the embedding, each decoder layer, the head.
pub struct Llama {
    description: ModelDescription,
    layer: DecoderLayer,
    rotary: RotaryEmbedding,
    norm: RmsNorm,
    tie_embeddings: bool,
    padding_idx: i64,
}

impl Llama {
    pub fn new(config: &LlamaConfig, buffer_kind: Kind) -> Self {
        let norm = || RmsNorm {
            eps: config.norm_eps,
        };
        Llama {
            description: config.describe(),
            layer: DecoderLayer {
                norm: norm(),
                attention: Attention {
                    n_heads: config.n_heads as i64,
                    n_kv_heads: config.n_kv_heads as i64,
                    head_dim: config.head_dim as i64,
                    qk_norm: config.qk_norm().then(norm),
                },
                mlp: GatedMlp,
            },
            rotary: RotaryEmbedding::new(config, buffer_kind),
            norm: norm(),
            tie_embeddings: config.tie_embeddings,
            padding_idx: config.pad_token_id.map_or(-1, |p| p as i64),
        }
    }

    /// RoPE positions: the batch's `position_ids`, else 0..seq for every row.
    fn positions(batch: &Batch, seq_len: i64, device: Device) -> Tensor {
        match &batch.position_ids {
            Some(ids) => ids.to_device(device),
            None => Tensor::arange(seq_len, (Kind::Int64, device)).unsqueeze(0),
        }
    }

    /// With `document_ids`: token i attends to token j iff j ≤ i and both are in the same
    /// document (true = attend). Without: `None`, plain causal attention.
    fn document_mask(batch: &Batch, device: Device) -> Option<Tensor> {
        let docs = batch.document_ids.as_ref()?.to_device(device);
        let s = docs.size()[1];
        let same = docs.unsqueeze(2).eq_tensor(&docs.unsqueeze(1));
        let causal = Tensor::ones([s, s], (Kind::Bool, device)).tril(0);
        Some(same.logical_and(&causal).unsqueeze(1))
    }

    fn logits(&self, p: &Params, h: &Tensor) -> Tensor {
        let h = self.norm.forward(&p.pp("model.norm"), h);
        let head = if self.tie_embeddings {
            p.get(EMBED_TOKENS)
        } else {
            p.get(LM_HEAD)
        };
        h.linear::<Tensor>(head, None)
    }
}

impl Model for Llama {
    fn description(&self) -> &ModelDescription {
        &self.description
    }

    fn forward_segment(&self, index: usize, p: &Params, x: &Tensor, batch: &Batch) -> Tensor {
        let last = self.description.segments.len() - 1;
        match index {
            0 => Tensor::embedding(p.get(EMBED_TOKENS), x, self.padding_idx, false, false),
            i if i == last => token_loss(&self.logits(p, x), &batch.targets),
            i => {
                let (_, s, _) = x.size3().expect("activations are (batch, seq, dim)");
                let positions = Self::positions(batch, s, x.device());
                let (cos, sin) = self.rotary.cos_sin(&positions, x.kind());
                let mask = Self::document_mask(batch, x.device());
                let p = p.pp(&format!("model.layers.{}", i - 1));
                self.layer.forward(&p, x, (&cos, &sin), mask.as_ref())
            }
        }
    }

    fn output(&self, p: &Params, x: &Tensor, _batch: &Batch) -> Tensor {
        self.logits(p, x).to_kind(Kind::Float)
    }

    fn input_kind(&self) -> Kind {
        Kind::Int64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    /// Two rows of two documents each, as `Llama::document_mask` builds their mask.
    fn packed_mask(seq: i64, device: Device) -> Tensor {
        let split = [5, 9];
        let docs: Vec<i64> = split
            .iter()
            .enumerate()
            .flat_map(|(row, &at)| (0..seq).map(move |j| 2 * row as i64 + i64::from(j >= at)))
            .collect();
        let mut batch = Batch::new(
            Tensor::zeros([2, seq], (Kind::Int64, Device::Cpu)),
            Tensor::zeros([2, seq], (Kind::Int64, Device::Cpu)),
        );
        batch.document_ids = Some(Tensor::from_slice(&docs).view([2, seq]));
        Llama::document_mask(&batch, device).expect("a packed batch has a mask")
    }

    fn max_difference(a: &Tensor, b: &Tensor) -> f64 {
        let d = (a.to_device(Device::Cpu) - b.to_device(Device::Cpu))
            .abs()
            .max()
            .double_value(&[]);
        assert!(d.is_finite(), "not finite: {d}");
        d
    }

    #[test]
    fn repeated_key_value_heads_attend_as_grouped_query_attention() {
        tch::manual_seed(7);
        let (b, heads, kv_heads, s, d) = (2, 8, 2, 16, 4);
        let q = Tensor::randn([b, heads, s, d], (Kind::Float, Device::Cpu));
        let k = Tensor::randn([b, kv_heads, s, d], (Kind::Float, Device::Cpu));
        let v = Tensor::randn([b, kv_heads, s, d], (Kind::Float, Device::Cpu));
        let mask = packed_mask(s, Device::Cpu);
        let grouped =
            Tensor::scaled_dot_product_attention(&q, &k, &v, Some(&mask), 0.0, false, None, true);
        let repeats = heads / kv_heads;
        let repeated = Tensor::scaled_dot_product_attention(
            &q,
            &repeat_kv(&k, repeats),
            &repeat_kv(&v, repeats),
            Some(&mask),
            0.0,
            false,
            None,
            false,
        );
        assert!(max_difference(&grouped, &repeated) <= 1e-6);
        // Head h reads key/value head h / repeats: another order would differ.
        let wrong = k.repeat([1, repeats, 1, 1]);
        let misordered = Tensor::scaled_dot_product_attention(
            &q,
            &wrong,
            &v.repeat([1, repeats, 1, 1]),
            Some(&mask),
            0.0,
            false,
            None,
            false,
        );
        assert!(max_difference(&grouped, &misordered) > 1e-3);
    }

    /// On a GPU the masked grouped attention takes the repeated path: it must give what the
    /// CPU gives with grouped heads.
    #[test]
    fn masked_grouped_attention_on_the_gpu_equals_the_cpu() {
        if !tch::Cuda::is_available() {
            eprintln!("no CUDA device here: bench/gpu.sh runs this test on a GPU");
            return;
        }
        tch::manual_seed(11);
        let (dim, heads, kv_heads, s) = (32, 8, 2, 16);
        let head_dim = dim / heads;
        let attention = Attention {
            n_heads: heads,
            n_kv_heads: kv_heads,
            head_dim,
            qk_norm: None,
        };
        let weights = |device: Device| -> HashMap<String, Tensor> {
            tch::manual_seed(3);
            [
                ("q_proj.weight", heads * head_dim),
                ("k_proj.weight", kv_heads * head_dim),
                ("v_proj.weight", kv_heads * head_dim),
                ("o_proj.weight", dim),
            ]
            .into_iter()
            .map(|(name, rows)| {
                let w = Tensor::randn([rows, dim], (Kind::Float, Device::Cpu)) * 0.2;
                (name.to_string(), w.to_device(device))
            })
            .collect()
        };
        let x = Tensor::randn([2, s, dim], (Kind::Float, Device::Cpu));
        let positions = Tensor::arange(s, (Kind::Int64, Device::Cpu)).unsqueeze(0);
        let forward = |device: Device| {
            let params = weights(device);
            let freqs = positions
                .to_device(device)
                .unsqueeze(-1)
                .to_kind(Kind::Float)
                * 0.1;
            let angles = Tensor::cat(&[&freqs.repeat([1, 1, head_dim / 2]); 2], -1);
            let mask = packed_mask(s, device);
            attention.forward(
                &Params::new(&params),
                &x.to_device(device),
                (&angles.cos(), &angles.sin()),
                Some(&mask),
            )
        };
        let cuda = forward(Device::Cuda(0));
        let cpu = forward(Device::Cpu);
        assert!(max_difference(&cuda, &cpu) <= 1e-4);
    }
}
