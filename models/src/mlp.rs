//! The MLP of PyTorch's FSDP tutorial: `layer2(relu(layer1(x)))`, trained with MSE against
//! random targets. Each layer is a segment of its own.

use crate::footprint::{Activations, F32};
use crate::param::{Builder, Init, ModelDescription, SegmentSpec};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MlpSizes {
    pub input_dim: i64,
    pub hidden_dim: i64,
    pub output_dim: i64,
}

impl MlpSizes {
    pub fn describe(&self) -> ModelDescription {
        let root = Builder::root();
        let mut params = Vec::new();
        let mut segments = Vec::new();
        for (name, i, o) in [
            ("layer1", self.input_dim, self.hidden_dim),
            ("layer2", self.hidden_dim, self.output_dim),
        ] {
            let bound = Init::Uniform(1.0 / (i as f64).sqrt());
            let layer = root.linear(name, i, o, true, bound, bound);
            segments.push(SegmentSpec {
                name: name.into(),
                params: layer.iter().map(|p| p.name.clone()).collect(),
                is_block: false,
            });
            params.extend(layer);
        }
        ModelDescription {
            params,
            segments,
            tied: Vec::new(),
            output_weight: None,
            attention_flops_per_token_per_position: 0,
        }
    }

    /// Activation bytes per sample of each layer when computing in `c`-byte floats, and the
    /// batch's bytes per sample (for the memory plan, [`crate::footprint`]).
    pub fn activations(&self, c: u64) -> (Vec<Activations>, u64) {
        let (input, hidden, output) = (
            self.input_dim as u64,
            self.hidden_dim as u64,
            self.output_dim as u64,
        );
        let layers = vec![
            Activations {
                // ReLU keeps its output, which is the segment's output; the linear layer
                // keeps its input, the batch.
                saved: 0,
                output: hidden * c,
                // The linear output before ReLU; in backward the two hidden gradients.
                transient: 2 * hidden * c,
                chunked: 0,
            },
            Activations {
                // The MSE loss keeps its (fp32) input.
                saved: output * F32,
                output: 0,
                transient: 2 * output * F32 + hidden * c,
                chunked: 0,
            },
        ];
        // fp32 input vector and target vector (and the input cast to the compute dtype).
        let batch = (input + output) * F32 + if c < F32 { input * c } else { 0 };
        (layers, batch)
    }
}
