//! What the memory plan needs to know of an architecture, without libtorch: its parameters
//! and segments (the architecture's own description, so the plan's units are the engine's)
//! and the activation memory each segment holds while training, which each architecture
//! module states next to its parameters, read off its forward code: which tensors autograd
//! saves for backward, which exist only while a segment runs.
//!
//! Activation figures are bytes per token (per sample for a model without sequences); the
//! memory plan multiplies them by the tokens a rank processes per micro-step.
//! `tests/tests/memory_plan.rs` checks the plan built from them against the peak of real runs.

use crate::param::SegmentSpec;
use crate::ModelConfig;

/// An architecture's parameters, segments and activation memory.
#[derive(Debug, Clone, PartialEq)]
pub struct Footprint {
    /// `(name, shape)` of every parameter, in model order.
    pub params: Vec<(String, Vec<u64>)>,
    pub segments: Vec<SegmentFootprint>,
    /// Bytes per token of one micro-batch's inputs and targets.
    pub batch: u64,
    /// The output layer's weight, whose gradient the loss computes a chunk of tokens at a
    /// time in the last segment's forward ([`crate::ModelDescription::output_weight`]).
    pub output_weight: Option<String>,
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
    /// Bytes per token on top of those that exist for one chunk of the loss's tokens at a
    /// time, not the micro-batch's (a language model's logits and their gradient).
    pub chunked: u64,
}

/// One segment's activation bytes per token, as an architecture states them (in segment
/// order, with the batch's bytes per token).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Activations {
    pub saved: u64,
    pub output: u64,
    pub transient: u64,
    /// Per token of one chunk of the loss ([`SegmentFootprint::chunked`]).
    pub chunked: u64,
}

/// fp32 bytes: norm statistics, attention's log-sum-exp, the loss's log-probabilities.
pub const F32: u64 = 4;

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
    /// This model's footprint when it computes in a dtype of `compute_bytes` bytes (the
    /// parameter dtype).
    pub fn footprint(&self, compute_bytes: u64) -> Footprint {
        let description = self.describe();
        let (activations, batch) = match *self {
            ModelConfig::Transformer {
                vocab_size,
                dim,
                n_layers,
                n_heads,
                max_seq_len,
            } => crate::transformer::TransformerSizes {
                vocab_size: vocab_size as i64,
                dim: dim as i64,
                n_layers: n_layers as i64,
                n_heads: n_heads as i64,
                max_seq_len: max_seq_len as i64,
            }
            .activations(compute_bytes),
            ModelConfig::Mlp {
                input_dim,
                hidden_dim,
                output_dim,
            } => crate::mlp::MlpSizes {
                input_dim: input_dim as i64,
                hidden_dim: hidden_dim as i64,
                output_dim: output_dim as i64,
            }
            .activations(compute_bytes),
            ModelConfig::Llama(ref m) => m.architecture.activations(compute_bytes),
        };
        assert_eq!(
            activations.len(),
            description.segments.len(),
            "one activation figure per segment"
        );
        Footprint {
            params: description
                .params
                .iter()
                .map(|p| (p.name.clone(), p.shape.iter().map(|&d| d as u64).collect()))
                .collect(),
            segments: description
                .segments
                .into_iter()
                .zip(activations)
                .map(|(spec, a)| SegmentFootprint {
                    spec,
                    saved: a.saved,
                    output: a.output,
                    transient: a.transient,
                    chunked: a.chunked,
                })
                .collect(),
            batch,
            output_weight: description.output_weight,
        }
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
            model.describe().validate().unwrap();
            let f = model.footprint(F32);
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
        let (f32, bf16) = (model.footprint(4), model.footprint(2));
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
