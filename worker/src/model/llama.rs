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
//! document; `position_ids` give each token's RoPE position. On a GPU in fp16/bf16 flash
//! attention's variable-length kernel does it from the documents' bounds, computing no pair
//! of tokens from different documents; elsewhere SDPA takes a block-diagonal causal mask.

use super::{linear, token_loss, Model, ModelDescription, OutputLayer, Params};
use crate::data::{Batch, DocumentBounds};
use crate::shim;
use shardrun_models::llama::{flash_varlen_takes, mask_row_values, EMBED_TOKENS};
use shardrun_models::{LlamaConfig, RopeScaling};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Mutex, OnceLock, PoisonError};
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

/// Which earlier tokens each token attends to.
#[derive(Clone, Copy)]
pub enum Attend<'a> {
    /// Every earlier token of its row.
    Causal,
    /// The earlier tokens of its own document: `ids` (batch, seq) name each token's
    /// document; `bounds`, where the batch has them, are the same documents laid end to end;
    /// `mask` keeps the dense mask made from `ids` for every layer that needs it.
    Documents {
        ids: &'a Tensor,
        bounds: Option<&'a DocumentBounds>,
        mask: &'a OnceLock<Tensor>,
    },
}

/// How packed documents attended so far in this process: [`FLASH_VARLEN`] once flash
/// attention's variable-length kernel ran, [`FLASH_VARLEN_REFUSED`] (for the rest of the run:
/// they take the dense mask) once it refused an input.
static DOCUMENT_ATTENTION: AtomicU8 = AtomicU8::new(0);
const FLASH_VARLEN: u8 = 1;
const FLASH_VARLEN_REFUSED: u8 = 2;

/// A line for the run's log saying which kernel packed documents attended through, once
/// one did on a GPU.
pub fn document_attention_note() -> Option<&'static str> {
    match DOCUMENT_ATTENTION.load(Ordering::Relaxed) {
        FLASH_VARLEN => Some(
            "packed documents attend within themselves through flash attention's \
             variable-length kernel",
        ),
        FLASH_VARLEN_REFUSED => Some(
            "packed documents attend through a dense mask: flash attention's variable-length \
             kernel refused them (its reason is above)",
        ),
        _ => None,
    }
}

/// Flash attention's variable-length kernel: (q, k, v) as (tokens, heads, head_dim), the
/// documents' offsets and the longest one (see [`shim::flash_varlen`]).
type VarlenKernel<'a> =
    &'a dyn Fn(&Tensor, &Tensor, &Tensor, &Tensor, i64) -> Result<Tensor, shim::VarlenError>;

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
        attend: Attend,
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
        let y = match attend {
            Attend::Causal => self.scaled_dot_product(&q, &k, &v, None),
            Attend::Documents { ids, bounds, mask } => {
                let flash = bounds.filter(|_| self.flash_varlen_fits(&q));
                match flash.and_then(|b| self.within_documents(&q, &k, &v, b, &shim::flash_varlen))
                {
                    Some(y) => y,
                    None => {
                        let mask = mask.get_or_init(|| document_mask(ids, q.kind()));
                        self.scaled_dot_product(&q, &k, &v, Some(mask))
                    }
                }
            }
        };
        let y = y
            .transpose(1, 2)
            .reshape([b, s, self.n_heads * self.head_dim]);
        linear(&p.pp("o_proj"), &y)
    }

    /// SDPA on (batch, heads, seq, head_dim), causal or by `mask` (boolean, true = attend;
    /// or added to the scores).
    fn scaled_dot_product(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        mask: Option<&Tensor>,
    ) -> Tensor {
        let (k, v, grouped) = self.keys_for_sdpa(q, k, v, mask.is_some());
        let _cudnn_off = sdpa_kernel_guard(q, mask.is_some());
        Tensor::scaled_dot_product_attention(q, &k, &v, mask, 0.0, mask.is_none(), None, grouped)
    }

    /// The keys and values SDPA gets, and whether they are grouped (fewer heads than the
    /// queries). On CUDA the memory-efficient kernel takes no grouped heads, and flash and
    /// cuDNN, which do, take no fp32 (flash no mask either): grouped keys there would fall to
    /// the math kernel, which holds (batch, heads, seq, seq) scores. Repeated key/value heads
    /// keep them on the memory-efficient kernel, as `transformers`' SDPA attention repeats
    /// them whenever there is a mask.
    fn keys_for_sdpa(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        masked: bool,
    ) -> (Tensor, Tensor, bool) {
        let grouped = self.n_kv_heads < self.n_heads;
        if grouped && q.device().is_cuda() && (masked || q.kind() == Kind::Float) {
            let repeats = self.n_heads / self.n_kv_heads;
            (repeat_kv(k, repeats), repeat_kv(v, repeats), false)
        } else {
            (k.shallow_clone(), v.shallow_clone(), grouped)
        }
    }

    /// Whether flash attention's variable-length kernel takes these queries: on CUDA, in
    /// fp16 or bf16, heads of at most 256 in multiples of 8, and it has not refused the run's
    /// documents before.
    fn flash_varlen_fits(&self, q: &Tensor) -> bool {
        flash_varlen_takes(
            q.device().is_cuda(),
            matches!(q.kind(), Kind::BFloat16 | Kind::Half),
            self.head_dim as u64,
        ) && DOCUMENT_ATTENTION.load(Ordering::Relaxed) != FLASH_VARLEN_REFUSED
    }

    /// Causal attention within each document by `kernel` on the rows laid end to end, for
    /// (batch, heads, seq, head_dim) as SDPA takes them; `None` when the kernel refused the
    /// inputs (said once, the run then keeps the dense mask). Any other failure (out of
    /// device memory, a CUDA error) ends the rank, as a failing libtorch call does.
    fn within_documents(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        bounds: &DocumentBounds,
        kernel: VarlenKernel,
    ) -> Option<Tensor> {
        let (b, _, s, _) = q
            .size4()
            .expect("queries are (batch, heads, seq, head_dim)");
        // (tokens, heads, head_dim): RoPE left them laid out so, this copies nothing.
        let tokens = |t: &Tensor| {
            let heads = t.size()[1];
            t.transpose(1, 2).reshape([b * s, heads, self.head_dim])
        };
        match kernel(
            &tokens(q),
            &tokens(k),
            &tokens(v),
            &bounds.offsets,
            bounds.longest,
        ) {
            Ok(y) => {
                DOCUMENT_ATTENTION.store(FLASH_VARLEN, Ordering::Relaxed);
                Some(y.view([b, s, self.n_heads, self.head_dim]).transpose(1, 2))
            }
            Err(shim::VarlenError::Refused(e)) => {
                if DOCUMENT_ATTENTION.swap(FLASH_VARLEN_REFUSED, Ordering::Relaxed)
                    != FLASH_VARLEN_REFUSED
                {
                    eprintln!(
                        "warning: flash attention's variable-length kernel refused the packed \
                         documents ({e}); they attend through a dense mask instead, slower"
                    );
                }
                None
            }
            Err(shim::VarlenError::Failed(e)) => {
                panic!("flash attention's variable-length kernel failed: {e}")
            }
        }
    }
}

/// What keeps SDPA off a kernel for this call: cuDNN's (its first choice on Hopper) returns
/// NaN query gradients with a mask when seq % 128 == 64 and a row's scores are all very
/// negative (PyTorch 2.11, pytorch/pytorch#196678), so a masked call on CUDA takes the
/// memory-efficient kernel.
fn sdpa_kernel_guard(q: &Tensor, masked: bool) -> Option<shim::WithoutCudnnAttention> {
    (q.device().is_cuda() && masked).then(shim::WithoutCudnnAttention::enter)
}

/// Token i attends to token j iff j ≤ i and `ids` (batch, seq) puts both in the same
/// document: a (batch, 1, seq, seq) mask added to the scores, 0 to attend and -inf not to,
/// in the queries' dtype `kind`. SDPA turns a boolean mask into just this in every call,
/// and each layer's copy would stay alive for its backward: made once, the layers share it.
/// Its rows are laid out [`shardrun_models::llama::MASK_ROW_ALIGNMENT`] values apart, as CUDA's memory-efficient
/// kernel wants them (it would copy the mask in every call).
fn document_mask(ids: &Tensor, kind: Kind) -> Tensor {
    let (b, s) = ids.size2().expect("document ids are (batch, seq)");
    let mut apart = ids.unsqueeze(2).eq_tensor(&ids.unsqueeze(1));
    let causal = Tensor::ones([s, s], (Kind::Bool, ids.device())).tril(0);
    let _ = apart.logical_and_(&causal).logical_not_();
    let row = mask_row_values(s as u64) as i64;
    let mut mask = Tensor::zeros([b, 1, s, row], (kind, ids.device())).narrow(3, 0, s);
    let _ = mask.masked_fill_(&apart.unsqueeze(1), f64::NEG_INFINITY);
    mask
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
        attend: Attend,
    ) -> Tensor {
        let attn_in = self.norm.forward(&p.pp("input_layernorm"), h);
        let h = h + self
            .attention
            .forward(&p.pp("self_attn"), &attn_in, rope, attend);
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

    /// What the batch's tokens attend to: the earlier tokens of their own document when the
    /// batch has `document_ids` (`ids_on_device`: those, on the compute device).
    fn attend<'a>(batch: &'a Batch, ids_on_device: &'a Option<Tensor>) -> Attend<'a> {
        match ids_on_device {
            Some(ids) => Attend::Documents {
                ids,
                bounds: batch.document_bounds.as_ref(),
                mask: &batch.attention_mask,
            },
            None => Attend::Causal,
        }
    }

    fn logits(&self, p: &Params, h: &Tensor) -> Tensor {
        let head = self.output_layer(p, h).expect("a language model");
        head.hidden.linear::<Tensor>(head.weight, None)
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
                let ids = batch.document_ids.as_ref().map(|d| d.to_device(x.device()));
                let p = p.pp(&format!("model.layers.{}", i - 1));
                self.layer
                    .forward(&p, x, (&cos, &sin), Self::attend(batch, &ids))
            }
        }
    }

    fn output_layer<'a>(&self, p: &Params<'a>, x: &Tensor) -> Option<OutputLayer<'a>> {
        Some(OutputLayer {
            hidden: self.norm.forward(&p.pp("model.norm"), x),
            weight: p.get(self.description.output_weight.as_deref()?),
        })
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

    /// Document ids of two rows of 16 tokens, numbered from 0 in each row as packing writes
    /// them: one document filling the first row, then documents of 9 and 4 tokens and 3 of
    /// padding (an id of its own). Both rows start with document 0.
    fn packed_ids() -> Vec<i64> {
        let row = |lengths: &[usize]| -> Vec<i64> {
            let mut ids = Vec::new();
            for (d, &n) in lengths.iter().enumerate() {
                ids.extend(std::iter::repeat_n(d as i64, n));
            }
            ids
        };
        [row(&[16]), row(&[9, 4, 3])].concat()
    }

    const SEQ: i64 = 16;

    fn ids_tensor(device: Device) -> Tensor {
        Tensor::from_slice(&packed_ids())
            .view([2, SEQ])
            .to_device(device)
    }

    fn max_difference(a: &Tensor, b: &Tensor) -> f64 {
        let d = (a.to_device(Device::Cpu).to_kind(Kind::Double)
            - b.to_device(Device::Cpu).to_kind(Kind::Double))
        .abs()
        .max()
        .double_value(&[]);
        assert!(d.is_finite(), "not finite: {d}");
        d
    }

    /// What flash attention's variable-length kernel computes, on the CPU: each document
    /// (rows laid end to end) causal with itself, grouped key/value heads as SDPA takes them.
    fn each_document_alone(
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        offsets: &Tensor,
        _longest: i64,
    ) -> Result<Tensor, shim::VarlenError> {
        let offsets = Vec::<i32>::try_from(offsets).expect("int32 offsets");
        let pieces: Vec<Tensor> = offsets
            .windows(2)
            .map(|w| {
                let (start, n) = (i64::from(w[0]), i64::from(w[1] - w[0]));
                // (n, heads, d) -> (1, heads, n, d) and back.
                let part = |t: &Tensor| t.narrow(0, start, n).transpose(0, 1).unsqueeze(0);
                Tensor::scaled_dot_product_attention(
                    &part(q),
                    &part(k),
                    &part(v),
                    None::<Tensor>,
                    0.0,
                    true,
                    None,
                    true,
                )
                .squeeze_dim(0)
                .transpose(0, 1)
            })
            .collect();
        Ok(Tensor::cat(&pieces, 0))
    }

    /// The variable-length path (the layout around the kernel, and the documents' bounds)
    /// attends as SDPA with the block-diagonal mask does.
    #[test]
    fn documents_by_their_bounds_attend_as_by_the_mask() {
        tch::manual_seed(5);
        let attention = Attention {
            n_heads: 4,
            n_kv_heads: 2,
            head_dim: 8,
            qk_norm: None,
        };
        // Laid out as RoPE leaves them: (batch, seq, heads, d) in memory.
        let qkv = |heads: i64| {
            Tensor::randn([2, SEQ, heads, 8], (Kind::Float, Device::Cpu)).transpose(1, 2)
        };
        let (q, k, v) = (qkv(4), qkv(2), qkv(2));
        let masked = attention.scaled_dot_product(
            &q,
            &k,
            &v,
            Some(&document_mask(&ids_tensor(Device::Cpu), Kind::Float)),
        );
        let bounds = DocumentBounds::from_ids(&packed_ids(), SEQ as usize);
        let bounded = attention
            .within_documents(&q, &k, &v, &bounds, &each_document_alone)
            .expect("the kernel took them");
        assert_eq!(bounded.size(), masked.size());
        assert!(max_difference(&masked, &bounded) <= 1e-6);
        // Without the bounds' row break, document 0 of the second row would see the first
        // row's document 0.
        let merged = DocumentBounds {
            offsets: Tensor::from_slice(&[0i32, 25, 29, 32]),
            longest: 25,
        };
        let wrong = attention
            .within_documents(&q, &k, &v, &merged, &each_document_alone)
            .unwrap();
        assert!(max_difference(&masked, &wrong) > 1e-3);
    }

    /// The additive mask made once is what SDPA makes of the boolean one in every call:
    /// outputs and gradients bit for bit, in fp32 and bf16, with rows laid out wider than
    /// the sequence where it is not a multiple of the alignment.
    #[test]
    fn the_shared_additive_mask_attends_as_the_boolean_one() {
        tch::manual_seed(11);
        for s in [SEQ, SEQ - 3] {
            the_additive_mask_attends_as_the_boolean_one_over(s);
        }
    }

    fn the_additive_mask_attends_as_the_boolean_one_over(s: i64) {
        let ids = ids_tensor(Device::Cpu).narrow(1, 0, s);
        let mask = document_mask(&ids, Kind::Float);
        assert_eq!(mask.size(), [2, 1, s, s]);
        assert_eq!(
            mask.stride()[2] as u64 % shardrun_models::llama::MASK_ROW_ALIGNMENT,
            0,
            "{:?}",
            mask.stride()
        );
        let boolean = ids
            .unsqueeze(2)
            .eq_tensor(&ids.unsqueeze(1))
            .logical_and(&Tensor::ones([s, s], (Kind::Bool, Device::Cpu)).tril(0))
            .unsqueeze(1);
        for kind in [Kind::Float, Kind::BFloat16] {
            let qkv = || {
                Tensor::randn([2, 4, s, 8], (Kind::Float, Device::Cpu))
                    .to_kind(kind)
                    .set_requires_grad(true)
            };
            let (q, k, v) = (qkv(), qkv(), qkv());
            let attend = |mask: &Tensor| {
                let y = Tensor::scaled_dot_product_attention(
                    &q,
                    &k,
                    &v,
                    Some(mask),
                    0.0,
                    false,
                    None,
                    false,
                );
                let grads = Tensor::run_backward(
                    &[y.to_kind(Kind::Float).sum(Kind::Float)],
                    &[&q, &k, &v],
                    false,
                    false,
                );
                (y, grads)
            };
            let (by_bool, bool_grads) = attend(&boolean);
            let (by_sum, sum_grads) = attend(&document_mask(&ids, kind));
            assert_eq!(max_difference(&by_bool, &by_sum), 0.0, "{kind:?}");
            for (a, b) in bool_grads.iter().zip(&sum_grads) {
                assert_eq!(max_difference(a, b), 0.0, "{kind:?}");
            }
        }
    }

    /// A batch's layers share one mask: the first that needs it makes it.
    #[test]
    fn the_layers_of_a_batch_share_its_mask() {
        let batch = Batch::from_host(&shardrun_data::HostBatch {
            rows: 2,
            seq_len: SEQ as usize,
            inputs: vec![1; 2 * SEQ as usize],
            targets: vec![1; 2 * SEQ as usize],
            position_ids: Some((0..2 * SEQ).map(|i| i % SEQ).collect()),
            document_ids: Some(packed_ids()),
            loss_tokens: 2 * SEQ as u64,
        });
        let layer = Layer::new(Device::Cpu, Kind::Float);
        let ids = batch.document_ids.as_ref().unwrap();
        let attend = || Attend::Documents {
            ids,
            bounds: None,
            mask: &batch.attention_mask,
        };
        let (first, _) = layer.run(attend());
        let made = batch.attention_mask.get().expect("made by the first layer");
        let storage = made.data_ptr();
        let (second, _) = layer.run(attend());
        assert_eq!(batch.attention_mask.get().unwrap().data_ptr(), storage);
        assert_eq!(max_difference(&first, &second), 0.0);
        assert_eq!(made.size(), [2, 1, SEQ, SEQ]);
    }

    #[test]
    fn repeated_key_value_heads_attend_as_grouped_query_attention() {
        tch::manual_seed(7);
        let (b, heads, kv_heads, d) = (2, 8, 2, 4);
        let q = Tensor::randn([b, heads, SEQ, d], (Kind::Float, Device::Cpu));
        let k = Tensor::randn([b, kv_heads, SEQ, d], (Kind::Float, Device::Cpu));
        let v = Tensor::randn([b, kv_heads, SEQ, d], (Kind::Float, Device::Cpu));
        let mask = document_mask(&ids_tensor(Device::Cpu), Kind::Float);
        let sdpa = |k: &Tensor, v: &Tensor, grouped: bool| {
            Tensor::scaled_dot_product_attention(&q, k, v, Some(&mask), 0.0, false, None, grouped)
        };
        let grouped = sdpa(&k, &v, true);
        let repeats = heads / kv_heads;
        let repeated = sdpa(&repeat_kv(&k, repeats), &repeat_kv(&v, repeats), false);
        assert!(max_difference(&grouped, &repeated) <= 1e-6);
        // Head h reads key/value head h / repeats: another order would differ.
        let misordered = sdpa(
            &k.repeat([1, repeats, 1, 1]),
            &v.repeat([1, repeats, 1, 1]),
            false,
        );
        assert!(max_difference(&grouped, &misordered) > 1e-3);
    }

    /// An attention layer with grouped key/value heads and random weights on `device`.
    struct Layer {
        attention: Attention,
        params: HashMap<String, Tensor>,
        x: Tensor,
    }

    const DIM: i64 = 64;

    impl Layer {
        fn new(device: Device, kind: Kind) -> Layer {
            let (heads, kv_heads) = (4, 2);
            let head_dim = DIM / heads;
            tch::manual_seed(3);
            let params = [
                ("q_proj.weight", heads * head_dim),
                ("k_proj.weight", kv_heads * head_dim),
                ("v_proj.weight", kv_heads * head_dim),
                ("o_proj.weight", DIM),
            ]
            .into_iter()
            .map(|(name, rows)| {
                let w = Tensor::randn([rows, DIM], (Kind::Float, Device::Cpu)) * 0.2;
                let w = w.to_kind(kind).to_device(device).set_requires_grad(true);
                (name.to_string(), w)
            })
            .collect();
            let x = Tensor::randn([2, SEQ, DIM], (Kind::Float, Device::Cpu))
                .to_kind(kind)
                .to_device(device)
                .set_requires_grad(true);
            Layer {
                attention: Attention {
                    n_heads: heads,
                    n_kv_heads: kv_heads,
                    head_dim,
                    qk_norm: None,
                },
                params,
                x,
            }
        }

        /// The output and the gradients of its sum with respect to the input and every weight.
        fn run(&self, attend: Attend) -> (Tensor, Vec<Tensor>) {
            let device = self.x.device();
            let head_dim = self.attention.head_dim;
            let positions = Tensor::arange(SEQ, (Kind::Int64, device)).unsqueeze(0);
            let freqs = positions.unsqueeze(-1).to_kind(Kind::Float) * 0.1;
            let angles = Tensor::cat(&[&freqs.repeat([1, 1, head_dim / 2]); 2], -1);
            let kind = self.x.kind();
            let (cos, sin) = (angles.cos().to_kind(kind), angles.sin().to_kind(kind));
            let y =
                self.attention
                    .forward(&Params::new(&self.params), &self.x, (&cos, &sin), attend);
            let mut inputs = vec![&self.x];
            let mut names: Vec<_> = self.params.keys().collect();
            names.sort();
            inputs.extend(names.into_iter().map(|n| &self.params[n]));
            let grads = Tensor::run_backward(
                &[y.to_kind(Kind::Float).sum(Kind::Float)],
                &inputs,
                false,
                false,
            );
            (y, grads)
        }
    }

    /// The GPU tests are ignored by `cargo test` (no machine of CI has a GPU) and run by
    /// bench/gpu.sh with `--include-ignored`: there, no CUDA device is a failure, not a pass.
    fn require_cuda() {
        assert!(
            tch::Cuda::is_available(),
            "no CUDA device: this test needs one (bench/gpu.sh runs it on a GPU)"
        );
    }

    /// On a GPU masked grouped attention repeats the key/value heads: it must give what
    /// the CPU gives with grouped heads.
    #[test]
    #[ignore = "needs a CUDA device: bench/gpu.sh runs it"]
    fn masked_grouped_attention_on_the_gpu_equals_the_cpu() {
        require_cuda();
        let run = |device: Device| {
            let ids = ids_tensor(device);
            Layer::new(device, Kind::Float).run(Attend::Documents {
                ids: &ids,
                bounds: None,
                mask: &OnceLock::new(),
            })
        };
        let (cuda, cuda_grads) = run(Device::Cuda(0));
        let (cpu, cpu_grads) = run(Device::Cpu);
        assert!(max_difference(&cuda, &cpu) <= 1e-4);
        for (a, b) in cuda_grads.iter().zip(&cpu_grads) {
            assert!(max_difference(a, b) <= 1e-3);
        }
    }

    /// On a GPU grouped key/value heads never leave SDPA with only its math kernel (which
    /// holds every head's seq × seq scores): fp32 or bf16, causal or masked.
    #[test]
    #[ignore = "needs a CUDA device: bench/gpu.sh runs it"]
    fn grouped_attention_on_the_gpu_takes_a_fused_kernel() {
        require_cuda();
        // `sdp::SDPBackend`'s values.
        const MATH: i64 = 0;
        const CUDNN: i64 = 3;
        let device = Device::Cuda(0);
        let attention = Attention {
            n_heads: 8,
            n_kv_heads: 2,
            head_dim: 64,
            qk_norm: None,
        };
        for kind in [Kind::Float, Kind::BFloat16] {
            let mask = document_mask(&ids_tensor(device), kind);
            let qkv = |heads| Tensor::randn([2, heads, SEQ, 64], (kind, device));
            let (q, k, v) = (qkv(8), qkv(2), qkv(2));
            for mask in [None, Some(&mask)] {
                let (k, v, grouped) = attention.keys_for_sdpa(&q, &k, &v, mask.is_some());
                let _cudnn_off = sdpa_kernel_guard(&q, mask.is_some());
                let choice = Tensor::internal_fused_sdp_choice(
                    &q,
                    &k,
                    &v,
                    mask,
                    0.0,
                    mask.is_none(),
                    None,
                    grouped,
                );
                assert_ne!(choice, MATH, "{kind:?}, mask: {}", mask.is_some());
                if mask.is_some() {
                    assert_ne!(choice, CUDNN, "{kind:?}: a masked call took cuDNN");
                }
            }
        }
    }

    /// Scores all far below zero with a mask and seq % 128 == 64: cuDNN's backward gives NaN
    /// query gradients there (PyTorch 2.11 on Hopper), so masked attention must not use it.
    #[test]
    #[ignore = "needs a CUDA device: bench/gpu.sh runs it"]
    fn masked_attention_on_the_gpu_has_finite_gradients_where_cudnn_has_not() {
        require_cuda();
        let device = Device::Cuda(0);
        let (l, d) = (704, 64);
        tch::manual_seed(0);
        let randn = |scale: f64| {
            (Tensor::randn([1, 1, l, d], (Kind::Float, device)) * scale).to_kind(Kind::BFloat16)
        };
        let (q, k, v) = (randn(0.1), randn(0.1), randn(1.0));
        let _ = q.narrow(3, 0, 1).fill_(1.0);
        let _ = k.narrow(3, 0, 1).fill_(-120.0 * (d as f64).sqrt());
        let (q, k, v) = (
            q.set_requires_grad(true),
            k.set_requires_grad(true),
            v.set_requires_grad(true),
        );
        let attention = Attention {
            n_heads: 1,
            n_kv_heads: 1,
            head_dim: d,
            qk_norm: None,
        };
        let mask = Tensor::ones([l, l], (Kind::Bool, device))
            .tril(0)
            .view([1, 1, l, l]);
        let y = attention.scaled_dot_product(&q, &k, &v, Some(&mask));
        let upstream = Tensor::randn_like(&y);
        let grads = Tensor::run_backward(
            &[(y * upstream).sum(Kind::Float)],
            &[&q, &k, &v],
            false,
            false,
        );
        for (name, g) in ["query", "key", "value"].iter().zip(&grads) {
            let bad = g.isfinite().logical_not().sum(Kind::Int64).int64_value(&[]);
            assert_eq!(bad, 0, "{bad} non-finite {name} gradients");
        }
    }

    /// On a GPU in fp16, packed documents with their bounds take flash attention's
    /// variable-length kernel: its output and gradients must be the dense mask's.
    #[test]
    #[ignore = "needs a CUDA device: bench/gpu.sh runs it"]
    fn packed_documents_by_flash_varlen_equal_the_dense_mask_on_the_gpu() {
        require_cuda();
        let device = Device::Cuda(0);
        let layer = Layer::new(device, Kind::Half);
        let ids = ids_tensor(device);
        let host = DocumentBounds::from_ids(&packed_ids(), SEQ as usize);
        let bounds = host.map(|t| t.to_device(device));
        // The kernel itself takes these shapes (else the comparison below would be of the
        // dense mask with itself).
        let tokens = |heads| Tensor::randn([2 * SEQ, heads, 16], (Kind::Half, device));
        if let Err(e) = shim::flash_varlen(&tokens(4), &tokens(2), &tokens(2), &bounds.offsets, 16)
        {
            panic!("flash attention's variable-length kernel refused the documents: {e}");
        }
        let (flash, flash_grads) = layer.run(Attend::Documents {
            ids: &ids,
            bounds: Some(&bounds),
            mask: &OnceLock::new(),
        });
        let (dense, dense_grads) = layer.run(Attend::Documents {
            ids: &ids,
            bounds: None,
            mask: &OnceLock::new(),
        });
        let scale = max_difference(&dense, &dense.zeros_like());
        assert!(scale > 0.1, "outputs too small to compare: {scale}");
        assert!(max_difference(&flash, &dense) <= 1e-2 * scale);
        for (a, b) in flash_grads.iter().zip(&dense_grads) {
            let scale = max_difference(b, &b.zeros_like());
            assert!(max_difference(a, b) <= 2e-2 * scale.max(1e-3));
        }
    }
}
