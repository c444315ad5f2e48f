//! The MLP of PyTorch's FSDP tutorial: `layer2(relu(layer1(x)))`, trained with MSE against
//! random targets. Each layer is a segment of its own.

use crate::param::{Builder, Init, ModelDescription, SegmentSpec};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mlp {
    pub input_dim: i64,
    pub hidden_dim: i64,
    pub output_dim: i64,
}

impl Mlp {
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
            attention_flops_per_token_per_position: 0,
        }
    }
}
