//! The models: plain descriptions of parameters plus forward code, with no knowledge of
//! sharding (that lives in [`crate::fsdp`], like torchtitan's `parallelize.py`).
//!
//! A model is cut into *segments*, the pieces of forward whose boundaries carry one
//! activation tensor (embeddings, each transformer block, the head with its loss). FSDP units
//! gather parameters and run backward segment by segment, so each segment's forward is a
//! function of (its parameters, one input tensor).

pub mod mlp;
pub mod transformer;

use shardrun_protocol::config::ModelConfig;
pub use shardrun_protocol::units::SegmentSpec;
use std::collections::HashMap;
use tch::{Kind, Tensor};

/// How a parameter is initialised: PyTorch's module defaults.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Init {
    /// `U(-bound, bound)`: nn.Linear's kaiming_uniform(a=√5) weight and its bias, both
    /// with bound 1/√fan_in.
    Uniform(f64),
    /// `N(0, std²)`: nn.Embedding.
    Normal(f64),
    /// nn.LayerNorm's weight.
    Ones,
    /// nn.LayerNorm's bias.
    Zeros,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ParamSpec {
    /// PyTorch module path, e.g. `layers.0.attention.wq.weight`.
    pub name: String,
    pub shape: Vec<i64>,
    pub init: Init,
}

impl ParamSpec {
    pub fn numel(&self) -> i64 {
        self.shape.iter().product()
    }

    /// The module this parameter belongs to (`layers.0.attention.wq`).
    pub fn module_path(&self) -> &str {
        self.name.rsplit_once('.').map_or("", |(module, _)| module)
    }

    /// This parameter's initial value. Each parameter draws from its own stream seeded by
    /// (seed, name), so the weights do not depend on world size, sharding, init order or
    /// threads (torch's global generator would be shared state).
    pub fn initial_value(&self, seed: u64) -> Tensor {
        let n = self.numel() as usize;
        let mut rng = ParamRng(param_seed(seed, &self.name));
        let values: Vec<f32> = match self.init {
            Init::Uniform(bound) => (0..n)
                .map(|_| ((2.0 * rng.unit() - 1.0) * bound) as f32)
                .collect(),
            Init::Normal(std) => (0..n).map(|_| (rng.normal() * std) as f32).collect(),
            Init::Ones => vec![1.0; n],
            Init::Zeros => vec![0.0; n],
        };
        Tensor::from_slice(&values).view(self.shape.as_slice())
    }
}

fn param_seed(seed: u64, name: &str) -> u64 {
    // FNV-1a over the name, mixed with the seed.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in name.bytes() {
        h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    crate::data::splitmix64(seed ^ h)
}

/// A splitmix64 stream: uniform doubles in [0, 1) and Box-Muller normals.
struct ParamRng(u64);

impl ParamRng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        crate::data::splitmix64(self.0)
    }

    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }

    fn normal(&mut self) -> f64 {
        let u1 = 1.0 - self.unit(); // (0, 1]: ln stays finite
        let u2 = self.unit();
        (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
    }
}

/// Parameters by name, with candle-style prefixes (`p.pp("layers.0").get("ffn_norm.weight")`).
#[derive(Clone)]
pub struct Params<'a> {
    map: &'a HashMap<String, Tensor>,
    prefix: String,
}

impl<'a> Params<'a> {
    pub fn new(map: &'a HashMap<String, Tensor>) -> Self {
        Params {
            map,
            prefix: String::new(),
        }
    }

    /// The full name of `name` under this prefix.
    fn path(&self, name: &str) -> String {
        if self.prefix.is_empty() {
            name.to_string()
        } else {
            format!("{}.{name}", self.prefix)
        }
    }

    pub fn get(&self, name: &str) -> &'a Tensor {
        let path = self.path(name);
        // A missing name is a bug in the model's own ParamSpec list, not an input error.
        self.map
            .get(&path)
            .unwrap_or_else(|| panic!("model reads parameter {path} it did not declare"))
    }

    pub fn pp(&self, prefix: &str) -> Params<'a> {
        Params {
            map: self.map,
            prefix: self.path(prefix),
        }
    }
}

/// A model: parameters, segments and the forward of each segment.
pub trait Model: Send + Sync {
    fn params(&self) -> Vec<ParamSpec>;
    fn segments(&self) -> Vec<SegmentSpec>;
    /// Forward of segment `index`. The first segment reads the batch `inputs` as `x`; the last
    /// returns the scalar loss against `targets`.
    fn forward_segment(&self, index: usize, p: &Params, x: &Tensor, targets: &Tensor) -> Tensor;
    /// dtype of the model inputs the data pipeline must produce (token ids or features).
    fn input_kind(&self) -> Kind;
}

/// Checks what the model code would otherwise only find out deep inside libtorch: head
/// sizes that do not divide, sequences longer than the position table, empty layers.
pub fn check(config: &ModelConfig, seq_len: u64) -> Result<(), String> {
    match *config {
        ModelConfig::Transformer {
            vocab_size,
            dim,
            n_heads,
            max_seq_len,
            ..
        } => {
            if vocab_size == 0 || dim == 0 || n_heads == 0 || max_seq_len == 0 {
                return Err(
                    "model: vocab_size, dim, n_heads and max_seq_len must be positive".into(),
                );
            }
            if dim % n_heads != 0 {
                return Err(format!(
                    "model: dim {dim} is not divisible by n_heads {n_heads}"
                ));
            }
            if seq_len > max_seq_len {
                return Err(format!(
                    "data.seq_len {seq_len} exceeds the model's max_seq_len {max_seq_len} (the position table)"
                ));
            }
        }
        ModelConfig::Mlp {
            input_dim,
            hidden_dim,
            output_dim,
        } => {
            if input_dim == 0 || hidden_dim == 0 || output_dim == 0 {
                return Err("model: the MLP's dimensions must be positive".into());
            }
        }
    }
    Ok(())
}

/// The model a config describes (see [`check`]).
pub fn build(config: &ModelConfig) -> Box<dyn Model> {
    match *config {
        ModelConfig::Transformer {
            vocab_size,
            dim,
            n_layers,
            n_heads,
            max_seq_len,
        } => Box::new(transformer::Transformer {
            vocab_size: vocab_size as i64,
            dim: dim as i64,
            n_layers: n_layers as i64,
            n_heads: n_heads as i64,
            max_seq_len: max_seq_len as i64,
        }),
        ModelConfig::Mlp {
            input_dim,
            hidden_dim,
            output_dim,
        } => Box::new(mlp::Mlp {
            input_dim: input_dim as i64,
            hidden_dim: hidden_dim as i64,
            output_dim: output_dim as i64,
        }),
    }
}

/// Forward of the whole model: every segment in order (single-process reference training).
pub fn forward(model: &dyn Model, p: &Params, inputs: &Tensor, targets: &Tensor) -> Tensor {
    let n = model.segments().len();
    let mut x = inputs.shallow_clone();
    for i in 0..n {
        x = model.forward_segment(i, p, &x, targets);
    }
    x
}

/// nn.Linear's parameter specs (`weight` of shape (out, in), optional `bias`).
pub(crate) fn linear_specs(path: &str, in_dim: i64, out_dim: i64, bias: bool) -> Vec<ParamSpec> {
    let bound = 1.0 / (in_dim as f64).sqrt();
    let mut specs = vec![ParamSpec {
        name: format!("{path}.weight"),
        shape: vec![out_dim, in_dim],
        init: Init::Uniform(bound),
    }];
    if bias {
        specs.push(ParamSpec {
            name: format!("{path}.bias"),
            shape: vec![out_dim],
            init: Init::Uniform(bound),
        });
    }
    specs
}

/// `x @ weight.T + bias` with the module's parameters.
pub(crate) fn linear(p: &Params, x: &Tensor) -> Tensor {
    let bias = p.map.get(&p.path("bias"));
    x.linear(p.get("weight"), bias)
}

#[cfg(test)]
mod tests {
    use super::*;
    use shardrun_protocol::config::DType;

    /// The plan sizes units and activations from the footprint: its parameters and segments
    /// must be the model's own, in the same order.
    #[test]
    fn every_models_footprint_lists_its_parameters_and_segments() {
        for config in [
            ModelConfig::Transformer {
                vocab_size: 37,
                dim: 12,
                n_layers: 3,
                n_heads: 2,
                max_seq_len: 9,
            },
            ModelConfig::Mlp {
                input_dim: 5,
                hidden_dim: 7,
                output_dim: 3,
            },
        ] {
            let model = build(&config);
            let footprint = config.footprint(DType::F32);
            let params: Vec<(String, Vec<u64>)> = model
                .params()
                .into_iter()
                .map(|p| (p.name, p.shape.iter().map(|&n| n as u64).collect()))
                .collect();
            assert_eq!(footprint.params, params, "{config:?}");
            assert_eq!(footprint.segment_specs(), model.segments(), "{config:?}");
        }
    }
}
