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

use crate::footprint::{Activations, F32};
use crate::param::{Builder, Init, ModelDescription, ParamSpec, SegmentSpec};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TransformerSizes {
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

impl TransformerSizes {
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
        // The output layer, a linear map to the vocabulary without bias: its weight is what
        // the loss multiplies the last hidden states by.
        let output = linear(&root, "output", self.dim, self.vocab_size, false);
        let output_weight = output[0].name.clone();
        head.extend(output);
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
            output_weight: Some(output_weight),
            attention_flops_per_token_per_position: 12 * (self.n_layers * self.dim) as u64,
        }
    }

    /// Activation bytes per token of each segment when computing in `c`-byte floats, and the
    /// batch's bytes per token (for the memory plan, [`crate::footprint`]).
    pub fn activations(&self, c: u64) -> (Vec<Activations>, u64) {
        let (d, vocab) = (self.dim as u64, self.vocab_size as u64);
        let mut segments = vec![Activations {
            // The lookups save only the token ids (the batch); the token embedding exists
            // before the position embedding is added.
            saved: 0,
            output: d * c,
            transient: d * c,
            chunked: 0,
        }];
        for _ in 0..self.n_layers {
            segments.push(Activations {
                // Saved for backward, per token: attention_norm's output (read by wq, wk,
                // wv), q, k and v, attention's output and its contiguous copy (read by wo),
                // the residual sum (read by ffn_norm), ffn_norm's output (read by w1), w1's
                // output (read by GELU) and GELU's output (read by w2): 16·dim; in fp32 the
                // two LayerNorms' mean and rstd and attention's log-sum-exp per head.
                saved: 16 * d * c + (4 + self.n_heads as u64) * F32,
                output: d * c,
                // Backward of the MLP: the upstream gradient and the gradients of GELU's
                // input and output (4·dim each), less w1's output once GELU's backward
                // released it.
                transient: 5 * d * c,
                chunked: 0,
            });
        }
        segments.push(Activations {
            // The final norm's output (read by the output projection) and statistics.
            saved: d * c + 2 * F32,
            output: 0,
            // The gradient of the norm's output, in chunks and then joined.
            transient: 2 * d * c,
            // The loss, a chunk at a time: the logits in the compute dtype and cast up to
            // fp32, which become their gradient in place, cast back down.
            chunked: vocab * F32 + if c < F32 { vocab * c } else { 0 },
        });
        // int64 token ids and targets.
        (segments, 16)
    }
}
