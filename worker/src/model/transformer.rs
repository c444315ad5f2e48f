//! Forward of the transformer of PyTorch's FSDP2 example (described in
//! `shardrun_models::transformer`):
//!
//! ```text
//! h = tok_embeddings(tokens) + pos_embeddings(positions)
//! for block in layers:
//!     h = h + attention(attention_norm(h))      # causal multi-head self-attention
//!     h = h + feed_forward(ffn_norm(h))         # Linear(d, 4d) → GELU → Linear(4d, d)
//! logits = output(norm(h))                      # no bias
//! loss = cross_entropy(logits, next tokens)
//! ```

use super::{linear, token_loss, Model, ModelDescription, OutputLayer, Params};
use crate::data::Batch;
use tch::{Kind, Tensor};

#[derive(Debug, Clone)]
pub struct Transformer {
    pub description: ModelDescription,
    pub vocab_size: i64,
    pub n_heads: i64,
}

const NORM_EPS: f64 = 1e-5;

impl Transformer {
    fn embed(&self, p: &Params, tokens: &Tensor) -> Tensor {
        let seq_len = tokens.size()[1];
        let positions = Tensor::arange(seq_len, (Kind::Int64, tokens.device()));
        let tok = Tensor::embedding(p.get("tok_embeddings.weight"), tokens, -1, false, false);
        let pos = Tensor::embedding(p.get("pos_embeddings.weight"), &positions, -1, false, false);
        tok + pos
    }

    fn block(&self, p: &Params, h: &Tensor) -> Tensor {
        let h = h + self.attention(&p.pp("attention"), &layer_norm(&p.pp("attention_norm"), h));
        let ffn = feed_forward(&p.pp("feed_forward"), &layer_norm(&p.pp("ffn_norm"), &h));
        h + ffn
    }

    fn attention(&self, p: &Params, x: &Tensor) -> Tensor {
        let (b, s, d) = x.size3().expect("activations are (batch, seq, dim)");
        let head_dim = d / self.n_heads;
        let heads = |t: Tensor| t.view([b, s, self.n_heads, head_dim]).transpose(1, 2);
        let q = heads(linear(&p.pp("wq"), x));
        let k = heads(linear(&p.pp("wk"), x));
        let v = heads(linear(&p.pp("wv"), x));
        let y = Tensor::scaled_dot_product_attention(
            &q,
            &k,
            &v,
            None::<Tensor>,
            0.0,
            true,
            None,
            false,
        );
        linear(&p.pp("wo"), &y.transpose(1, 2).contiguous().view([b, s, d]))
    }

    fn logits(&self, p: &Params, h: &Tensor) -> Tensor {
        let head = self.output_layer(p, h).expect("a language model");
        head.hidden.linear::<Tensor>(head.weight, None)
    }
}

fn feed_forward(p: &Params, x: &Tensor) -> Tensor {
    linear(&p.pp("w2"), &linear(&p.pp("w1"), x).gelu("none"))
}

fn layer_norm(p: &Params, x: &Tensor) -> Tensor {
    let d = x.size()[x.dim() - 1];
    x.layer_norm(
        [d],
        Some(p.get("weight")),
        Some(p.get("bias")),
        NORM_EPS,
        false,
    )
}

impl Model for Transformer {
    fn description(&self) -> &ModelDescription {
        &self.description
    }

    fn forward_segment(&self, index: usize, p: &Params, x: &Tensor, batch: &Batch) -> Tensor {
        let last = self.description.segments.len() - 1;
        match index {
            0 => self.embed(p, x),
            i if i == last => token_loss(&self.logits(p, x), &batch.targets),
            i => self.block(&p.pp(&format!("layers.{}", i - 1)), x),
        }
    }

    fn output_layer<'a>(&self, p: &Params<'a>, x: &Tensor) -> Option<OutputLayer<'a>> {
        // The output projection has no bias.
        Some(OutputLayer {
            hidden: layer_norm(&p.pp("norm"), x),
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
