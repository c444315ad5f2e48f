//! What the memory plan needs to know of an architecture, without libtorch: its parameters
//! (names and shapes, in the order the worker's model declares them), its segments, and the
//! activation memory each segment holds while training. Every model kind fills one
//! [`Footprint`] in [`ModelConfig::footprint`]; the worker's tests check that the parameters
//! and segments are exactly its model's, so the plan's units are the engine's.
//!
//! Activation figures are bytes per token (per sample for a model without sequences), read
//! off the model's forward code: which tensors autograd saves for backward, which exist only
//! while a segment runs. The memory plan multiplies them by the tokens a rank processes per
//! micro-step.
//!
//! A new architecture adds its arm to [`ModelConfig::footprint`], its config to the worker's
//! test that compares footprints with the models, and a job to `tests/tests/memory_plan.rs`,
//! which checks the plan built from these figures against the peak of a real run.

use crate::config::{DType, ModelConfig};
use crate::units::SegmentSpec;

/// An architecture's parameters, segments and activation memory.
#[derive(Debug, Clone, PartialEq)]
pub struct Footprint {
    /// `(name, shape)` of every parameter, in model order.
    pub params: Vec<(String, Vec<u64>)>,
    pub segments: Vec<SegmentFootprint>,
    /// Bytes per token of one micro-batch's inputs and targets.
    pub batch: u64,
}

/// Activation bytes per token of one segment, in the compute dtype the footprint was made for.
#[derive(Debug, Clone, PartialEq)]
pub struct SegmentFootprint {
    pub spec: SegmentSpec,
    /// What autograd keeps for this segment's backward, besides its input and its output.
    pub saved: u64,
    /// The segment's output: the next segment's input, and all that a block keeps under
    /// activation checkpointing.
    pub output: u64,
    /// The most alive on top of `saved` and `output` while the segment's forward or backward
    /// runs: temporaries, and the gradients of its activations.
    pub transient: u64,
}

impl Footprint {
    /// `(name, elements)` of every parameter, what unit planning reads.
    pub fn param_sizes(&self) -> Vec<(String, u64)> {
        self.params
            .iter()
            .map(|(name, shape)| (name.clone(), shape.iter().product()))
            .collect()
    }

    pub fn num_params(&self) -> u64 {
        self.params
            .iter()
            .map(|(_, shape)| shape.iter().product::<u64>())
            .sum()
    }

    pub fn segment_specs(&self) -> Vec<SegmentSpec> {
        self.segments.iter().map(|s| s.spec.clone()).collect()
    }
}

impl ModelConfig {
    /// This model's footprint when it computes in `compute` (the parameter dtype).
    pub fn footprint(&self, compute: DType) -> Footprint {
        match *self {
            ModelConfig::Transformer {
                vocab_size,
                dim,
                n_layers,
                n_heads,
                max_seq_len,
            } => transformer(vocab_size, dim, n_layers, n_heads, max_seq_len, compute),
            ModelConfig::Mlp {
                input_dim,
                hidden_dim,
                output_dim,
            } => mlp(input_dim, hidden_dim, output_dim, compute),
        }
    }
}

type Params = Vec<(String, Vec<u64>)>;

fn linear(path: &str, in_dim: u64, out_dim: u64, bias: bool) -> Params {
    let mut params = vec![(format!("{path}.weight"), vec![out_dim, in_dim])];
    if bias {
        params.push((format!("{path}.bias"), vec![out_dim]));
    }
    params
}

fn layer_norm(path: &str, dim: u64) -> Params {
    vec![
        (format!("{path}.weight"), vec![dim]),
        (format!("{path}.bias"), vec![dim]),
    ]
}

fn names(params: &Params) -> Vec<String> {
    params.iter().map(|(name, _)| name.clone()).collect()
}

/// fp32 bytes: LayerNorm statistics, attention's log-sum-exp, the loss's log-probabilities.
const F32: u64 = 4;

/// PyTorch's FSDP2-example transformer (the worker's `model::transformer`).
fn transformer(
    vocab: u64,
    d: u64,
    n_layers: u64,
    n_heads: u64,
    max_seq_len: u64,
    compute: DType,
) -> Footprint {
    let c = compute.size_bytes();
    let block = |i: u64| {
        let path = format!("layers.{i}");
        let mut p = layer_norm(&format!("{path}.attention_norm"), d);
        for w in ["wq", "wk", "wv", "wo"] {
            p.extend(linear(&format!("{path}.attention.{w}"), d, d, false));
        }
        p.extend(layer_norm(&format!("{path}.ffn_norm"), d));
        p.extend(linear(&format!("{path}.feed_forward.w1"), d, 4 * d, true));
        p.extend(linear(&format!("{path}.feed_forward.w2"), 4 * d, d, true));
        p
    };
    let embeddings: Params = vec![
        ("tok_embeddings.weight".into(), vec![vocab, d]),
        ("pos_embeddings.weight".into(), vec![max_seq_len, d]),
    ];
    let mut head = layer_norm("norm", d);
    head.extend(linear("output", d, vocab, false));

    let mut params = embeddings.clone();
    let mut segments = vec![SegmentFootprint {
        spec: SegmentSpec {
            name: "embeddings".into(),
            params: names(&embeddings),
            is_block: false,
        },
        // The lookups save only the token ids (the batch); the token embedding exists
        // before the position embedding is added.
        saved: 0,
        output: d * c,
        transient: d * c,
    }];
    for i in 0..n_layers {
        let p = block(i);
        segments.push(SegmentFootprint {
            spec: SegmentSpec {
                name: format!("layers.{i}"),
                params: names(&p),
                is_block: true,
            },
            // Saved for backward, per token: attention_norm's output (read by wq, wk, wv),
            // q, k and v, attention's output and its contiguous copy (read by wo), the
            // residual sum (read by ffn_norm), ffn_norm's output (read by w1), w1's output
            // (read by GELU) and GELU's output (read by w2): 16·dim; in fp32 the two
            // LayerNorms' mean and rstd and attention's log-sum-exp per head.
            saved: 16 * d * c + (4 + n_heads) * F32,
            output: d * c,
            // Backward of the MLP: the upstream gradient and the gradients of GELU's input
            // and output (4·dim each), less w1's output once GELU's backward released it.
            transient: 5 * d * c,
        });
        params.extend(p);
    }
    params.extend(head.clone());
    // Loss in fp32: the logits (vocab per token) are cast up when the compute dtype is
    // narrower, then log-softmax keeps its fp32 output for backward.
    let upcast = if c < F32 { F32 } else { 0 };
    segments.push(SegmentFootprint {
        spec: SegmentSpec {
            name: "head".into(),
            params: names(&head),
            is_block: false,
        },
        // The final norm's output (read by the output projection) and statistics, the
        // log-probabilities.
        saved: d * c + 2 * F32 + vocab * F32,
        output: 0,
        // Backward: the gradient of the log-probabilities and of the logits (fp32), the
        // logits' gradient cast back to the compute dtype, the gradient of the norm's output.
        transient: 2 * vocab * F32 + vocab * if upcast > 0 { c } else { 0 } + d * c,
    });
    Footprint {
        params,
        segments,
        // int64 token ids and targets.
        batch: 16,
    }
}

/// The MLP of PyTorch's FSDP tutorial (the worker's `model::mlp`), per sample.
fn mlp(input: u64, hidden: u64, output: u64, compute: DType) -> Footprint {
    let c = compute.size_bytes();
    let layer1 = linear("layer1", input, hidden, true);
    let layer2 = linear("layer2", hidden, output, true);
    let mut params = layer1.clone();
    params.extend(layer2.clone());
    Footprint {
        params,
        segments: vec![
            SegmentFootprint {
                spec: SegmentSpec {
                    name: "layer1".into(),
                    params: names(&layer1),
                    is_block: false,
                },
                // ReLU keeps its output, which is the segment's output; the linear layer
                // keeps its input, the batch.
                saved: 0,
                output: hidden * c,
                // The linear output before ReLU; in backward the two hidden gradients.
                transient: 2 * hidden * c,
            },
            SegmentFootprint {
                spec: SegmentSpec {
                    name: "layer2".into(),
                    params: names(&layer2),
                    is_block: false,
                },
                // The MSE loss keeps its (fp32) input.
                saved: output * F32,
                output: 0,
                transient: 2 * output * F32 + hidden * c,
            },
        ],
        // fp32 input vector and target vector (and the input cast to the compute dtype).
        batch: (input + output) * F32 + if c < F32 { input * c } else { 0 },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parameter_count_agrees_with_the_config() {
        for model in [
            ModelConfig::Transformer {
                vocab_size: 8192,
                dim: 256,
                n_layers: 8,
                n_heads: 8,
                max_seq_len: 256,
            },
            ModelConfig::Mlp {
                input_dim: 13,
                hidden_dim: 29,
                output_dim: 7,
            },
        ] {
            let f = model.footprint(DType::F32);
            assert_eq!(f.num_params(), model.num_params(), "{model:?}");
            let mut read: Vec<&String> = f.segments.iter().flat_map(|s| &s.spec.params).collect();
            read.sort();
            read.dedup();
            assert_eq!(read.len(), f.params.len(), "every parameter is read once");
        }
    }

    #[test]
    fn activations_scale_with_the_compute_dtype() {
        let model = ModelConfig::Transformer {
            vocab_size: 1000,
            dim: 64,
            n_layers: 2,
            n_heads: 4,
            max_seq_len: 16,
        };
        let (f32, bf16) = (model.footprint(DType::F32), model.footprint(DType::Bf16));
        let block = |f: &Footprint| f.segments[1].saved;
        assert_eq!(block(&f32), 16 * 64 * 4 + 8 * 4);
        assert_eq!(block(&bf16), 16 * 64 * 2 + 8 * 4);
        // The loss's log-probabilities stay fp32 whatever the compute dtype.
        assert_eq!(
            f32.segments[3].saved - 64 * 4,
            bf16.segments[3].saved - 64 * 2
        );
    }
}
