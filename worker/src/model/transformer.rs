//! The transformer of PyTorch's FSDP2 example (`examples/distributed/FSDP2/model.py`):
//!
//! ```text
//! h = tok_embeddings(tokens) + pos_embeddings(positions)
//! for block in layers:
//!     h = h + attention(attention_norm(h))      # causal multi-head self-attention
//!     h = h + feed_forward(ffn_norm(h))         # Linear(d, 4d) → GELU → Linear(4d, d)
//! logits = output(norm(h))                      # no bias
//! loss = cross_entropy(logits, next tokens)
//! ```
//!
//! Parameter names are that module's paths, so checkpoints map 1:1 to PyTorch state dicts.

use super::{linear, linear_specs, Init, Model, ParamSpec, Params, SegmentSpec};
use tch::{Kind, Tensor};

#[derive(Debug, Clone)]
pub struct Transformer {
    pub vocab_size: i64,
    pub dim: i64,
    pub n_layers: i64,
    pub n_heads: i64,
    pub max_seq_len: i64,
}

const NORM_EPS: f64 = 1e-5;

impl Transformer {
    fn block_specs(&self, i: i64) -> Vec<ParamSpec> {
        let d = self.dim;
        let path = format!("layers.{i}");
        let mut specs = layer_norm_specs(&format!("{path}.attention_norm"), d);
        for w in ["wq", "wk", "wv", "wo"] {
            specs.extend(linear_specs(&format!("{path}.attention.{w}"), d, d, false));
        }
        specs.extend(layer_norm_specs(&format!("{path}.ffn_norm"), d));
        specs.extend(linear_specs(
            &format!("{path}.feed_forward.w1"),
            d,
            4 * d,
            true,
        ));
        specs.extend(linear_specs(
            &format!("{path}.feed_forward.w2"),
            4 * d,
            d,
            true,
        ));
        specs
    }

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

    fn head(&self, p: &Params, h: &Tensor, targets: &Tensor) -> Tensor {
        let logits = linear(&p.pp("output"), &layer_norm(&p.pp("norm"), h));
        // Loss in fp32 whatever the parameter dtype (bf16 logits lose the small differences
        // softmax depends on).
        logits
            .view([-1, self.vocab_size])
            .to_kind(Kind::Float)
            .cross_entropy_loss::<Tensor>(
                &targets.view([-1]),
                None,
                tch::Reduction::Mean,
                -100,
                0.0,
            )
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

fn layer_norm_specs(path: &str, dim: i64) -> Vec<ParamSpec> {
    vec![
        ParamSpec {
            name: format!("{path}.weight"),
            shape: vec![dim],
            init: Init::Ones,
        },
        ParamSpec {
            name: format!("{path}.bias"),
            shape: vec![dim],
            init: Init::Zeros,
        },
    ]
}

impl Model for Transformer {
    /// In the order PyTorch's `named_parameters()` lists them.
    fn params(&self) -> Vec<ParamSpec> {
        let d = self.dim;
        let mut specs = vec![
            ParamSpec {
                name: "tok_embeddings.weight".into(),
                shape: vec![self.vocab_size, d],
                init: Init::Normal(1.0),
            },
            ParamSpec {
                name: "pos_embeddings.weight".into(),
                shape: vec![self.max_seq_len, d],
                init: Init::Normal(1.0),
            },
        ];
        for i in 0..self.n_layers {
            specs.extend(self.block_specs(i));
        }
        specs.extend(layer_norm_specs("norm", d));
        specs.extend(linear_specs("output", d, self.vocab_size, false));
        specs
    }

    fn segments(&self) -> Vec<SegmentSpec> {
        let names = |specs: Vec<ParamSpec>| specs.into_iter().map(|s| s.name).collect();
        let mut segments = vec![SegmentSpec {
            name: "embeddings".into(),
            params: vec![
                "tok_embeddings.weight".into(),
                "pos_embeddings.weight".into(),
            ],
            is_block: false,
        }];
        for i in 0..self.n_layers {
            segments.push(SegmentSpec {
                name: format!("layers.{i}"),
                params: names(self.block_specs(i)),
                is_block: true,
            });
        }
        let mut head = names(layer_norm_specs("norm", self.dim));
        head.push("output.weight".into());
        segments.push(SegmentSpec {
            name: "head".into(),
            params: head,
            is_block: false,
        });
        segments
    }

    fn forward_segment(&self, index: usize, p: &Params, x: &Tensor, targets: &Tensor) -> Tensor {
        let last = self.n_layers as usize + 1;
        match index {
            0 => self.embed(p, x),
            i if i == last => self.head(p, x, targets),
            i => self.block(&p.pp(&format!("layers.{}", i - 1)), x),
        }
    }

    fn input_kind(&self) -> Kind {
        Kind::Int64
    }
}
