//! Forward of the MLP of PyTorch's FSDP tutorial (described in `shardrun_models::mlp`):
//! `layer2(relu(layer1(x)))`, trained with MSE against random targets.

use super::{linear, Model, ModelDescription, Params};
use crate::data::Batch;
use tch::{Kind, Tensor};

#[derive(Debug, Clone)]
pub struct Mlp {
    pub description: ModelDescription,
}

impl Model for Mlp {
    fn description(&self) -> &ModelDescription {
        &self.description
    }

    fn forward_segment(&self, index: usize, p: &Params, x: &Tensor, batch: &Batch) -> Tensor {
        match index {
            0 => linear(&p.pp("layer1"), x).relu(),
            _ => self
                .output(p, x, batch)
                .mse_loss(&batch.targets, tch::Reduction::Mean),
        }
    }

    fn output(&self, p: &Params, x: &Tensor, _batch: &Batch) -> Tensor {
        linear(&p.pp("layer2"), x).to_kind(Kind::Float)
    }

    fn input_kind(&self) -> Kind {
        Kind::Float
    }
}
