//! The transformer of PyTorch's FSDP2 example (`examples/distributed/FSDP2/model.py`), with
//! causal attention:
//!
//! ```text
//! h = tok_embeddings(tokens) + pos_embeddings(positions)
//! for block in layers:
//!     h = h + attention(attention_norm(h))      # multi-head self-attention, no biases
//!     h = h + feed_forward(ffn_norm(h))         # Linear(d, 4d) → GELU → Linear(4d, d)
//! logits = output(norm(h))                      # no bias
//! ```
//!
//! Parameter names are that module's paths, so checkpoints map 1:1 to its state dict;
//! initialisation is PyTorch's module defaults.

use crate::param::{Builder, Init, ModelDescription, ParamSpec, SegmentSpec};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transformer {
    pub vocab_size: i64,
    pub dim: i64,
    pub n_layers: i64,
    pub n_heads: i64,
    pub max_seq_len: i64,
}

/// `nn.Linear`'s default init: U(±1/√fan_in) for weight and bias.
fn linear(b: &Builder, name: &str, in_dim: i64, out_dim: i64, bias: bool) -> Vec<ParamSpec> {
    let bound = Init::Uniform(1.0 / (in_dim as f64).sqrt());
    b.linear(name, in_dim, out_dim, bias, bound, bound)
}

impl Transformer {
    fn block(&self, b: &Builder) -> Vec<ParamSpec> {
        let d = self.dim;
        let mut specs = b.norm("attention_norm", d, true);
        for w in ["wq", "wk", "wv", "wo"] {
            specs.extend(linear(&b.pp("attention"), w, d, d, false));
        }
        specs.extend(b.norm("ffn_norm", d, true));
        specs.extend(linear(&b.pp("feed_forward"), "w1", d, 4 * d, true));
        specs.extend(linear(&b.pp("feed_forward"), "w2", 4 * d, d, true));
        specs
    }

    pub fn describe(&self) -> ModelDescription {
        let root = Builder::root();
        let names = |specs: &[ParamSpec]| specs.iter().map(|s| s.name.clone()).collect();
        let embeddings = vec![
            root.embedding(
                "tok_embeddings",
                self.vocab_size,
                self.dim,
                Init::normal(1.0),
            ),
            root.embedding(
                "pos_embeddings",
                self.max_seq_len,
                self.dim,
                Init::normal(1.0),
            ),
        ];
        let mut segments = vec![SegmentSpec {
            name: "embeddings".into(),
            params: names(&embeddings),
            is_block: false,
        }];
        let mut params = embeddings;
        for i in 0..self.n_layers {
            let name = format!("layers.{i}");
            let block = self.block(&root.pp(&name));
            segments.push(SegmentSpec {
                name,
                params: names(&block),
                is_block: true,
            });
            params.extend(block);
        }
        let mut head = root.norm("norm", self.dim, true);
        head.extend(linear(&root, "output", self.dim, self.vocab_size, false));
        segments.push(SegmentSpec {
            name: "head".into(),
            params: names(&head),
            is_block: false,
        });
        params.extend(head);
        ModelDescription {
            params,
            segments,
            tied: Vec::new(),
            attention_flops_per_token_per_position: 12 * (self.n_layers * self.dim) as u64,
        }
    }
}
