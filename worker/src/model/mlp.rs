//! The MLP of PyTorch's FSDP tutorial: `layer2(relu(layer1(x)))`, trained with MSE against random targets.

use super::{linear, linear_specs, Model, ParamSpec, Params, SegmentSpec};
use tch::{Kind, Tensor};

#[derive(Debug, Clone)]
pub struct Mlp {
    pub input_dim: i64,
    pub hidden_dim: i64,
    pub output_dim: i64,
}

impl Model for Mlp {
    fn params(&self) -> Vec<ParamSpec> {
        let mut specs = linear_specs("layer1", self.input_dim, self.hidden_dim, true);
        specs.extend(linear_specs(
            "layer2",
            self.hidden_dim,
            self.output_dim,
            true,
        ));
        specs
    }

    fn segments(&self) -> Vec<SegmentSpec> {
        let segment = |name: &str| SegmentSpec {
            name: name.into(),
            params: vec![format!("{name}.weight"), format!("{name}.bias")],
            is_block: false,
        };
        vec![segment("layer1"), segment("layer2")]
    }

    fn forward_segment(&self, index: usize, p: &Params, x: &Tensor, targets: &Tensor) -> Tensor {
        match index {
            0 => linear(&p.pp("layer1"), x).relu(),
            _ => linear(&p.pp("layer2"), x)
                .to_kind(Kind::Float)
                .mse_loss(targets, tch::Reduction::Mean),
        }
    }

    fn input_kind(&self) -> Kind {
        Kind::Float
    }
}
