//! The models' forward code, one file per architecture. What a model *is* (parameters,
//! shapes, initialisation, segments) is described in the `shardrun-models` crate, shared with
//! the orchestrator; nothing here knows about sharding (that lives in [`crate::fsdp`], like
//! torchtitan's `parallelize.py`).
//!
//! A model is cut into *segments*, the pieces of forward whose boundaries carry one
//! activation tensor (embeddings, each block, the head with its loss). FSDP units gather
//! parameters and run backward segment by segment, so each segment's forward is a function
//! of (its parameters, one input tensor, the batch).

pub mod llama;
pub mod loss;
pub mod mlp;
pub mod transformer;

use crate::data::Batch;
use shardrun_models::hf::HfError;
use shardrun_models::source::ParamSource;
use shardrun_protocol::config::ModelConfig;
use std::collections::{HashMap, HashSet};
use tch::{Kind, Tensor};

pub use shardrun_models::{Init, ModelDescription, ParamKind, ParamSpec, SegmentSpec};

/// Parameters by name, with candle-style prefixes (`p.pp("layers.0").get("ffn_norm.weight")`).
#[derive(Clone)]
pub struct Params<'a> {
    map: &'a HashMap<String, Tensor>,
    /// The names the running segment declares, when it runs under FSDP.
    declared: Option<&'a HashSet<String>>,
    prefix: String,
}

impl<'a> Params<'a> {
    /// Every parameter of `map`, whole (single-process training).
    pub fn new(map: &'a HashMap<String, Tensor>) -> Self {
        Params {
            map,
            declared: None,
            prefix: String::new(),
        }
    }

    /// The parameters of one FSDP segment: those of `map` named in `declared`; reading
    /// another is a bug in the model's description, stopped by name. Its unit may hold
    /// memory all the same (gathered ahead for a later segment, its all-gather not waited
    /// for, or kept from an earlier step): read, it would give wrong values on a GPU.
    pub fn of_segment(map: &'a HashMap<String, Tensor>, declared: &'a HashSet<String>) -> Self {
        Params {
            map,
            declared: Some(declared),
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
        // A missing name is a bug in the model's own description, not an input error.
        let tensor = self
            .map
            .get(&path)
            .unwrap_or_else(|| panic!("model reads parameter {path} it did not declare"));
        self.resident(&path, tensor)
    }

    /// `name` when the model has it (optional biases).
    pub fn maybe(&self, name: &str) -> Option<&'a Tensor> {
        let path = self.path(name);
        self.map
            .get(&path)
            .map(|tensor| self.resident(&path, tensor))
    }

    pub fn pp(&self, prefix: &str) -> Params<'a> {
        Params {
            map: self.map,
            declared: self.declared,
            prefix: self.path(prefix),
        }
    }

    /// `tensor`, after checking the running segment may read it and its memory is there.
    /// Read otherwise, its memory may be freed (a crash on the CPU; on a GPU, memory the
    /// caching allocator handed on, read as silently wrong values) or still being gathered.
    fn resident(&self, path: &str, tensor: &'a Tensor) -> &'a Tensor {
        let undeclared = self.declared.is_some_and(|d| !d.contains(path));
        if undeclared || (crate::shim::storage_nbytes(tensor) == 0 && tensor.numel() > 0) {
            panic!(
                "model reads parameter {path} outside its segment: its FSDP unit is not \
                 gathered for it (the segment's description must name it)"
            );
        }
        tensor
    }
}

/// A language model's output layer, what [`loss`] computes the loss from.
pub struct OutputLayer<'a> {
    /// The last segment's input through everything before the output projection (the final
    /// norm), with its graph.
    pub hidden: Tensor,
    /// The output projection's weight, `(vocab, dim)`: the token embedding when tied
    /// ([`ModelDescription::output_weight`]).
    pub weight: &'a Tensor,
}

/// A model: its description and the forward of each segment.
pub trait Model: Send + Sync {
    fn description(&self) -> &ModelDescription;

    fn params(&self) -> Vec<ParamSpec> {
        self.description().params.clone()
    }

    fn segments(&self) -> Vec<SegmentSpec> {
        self.description().segments.clone()
    }

    /// Forward of segment `index`. The first segment reads the batch's `inputs` as `x`; the
    /// last returns the scalar loss against the batch's targets.
    fn forward_segment(&self, index: usize, p: &Params, x: &Tensor, batch: &Batch) -> Tensor;

    /// A language model's last segment up to its output projection, whose logits'
    /// cross-entropy is the loss: the engine computes both a chunk of tokens at a time
    /// ([`loss`]). `None` for a model whose loss is something else (the MLP's MSE); its last
    /// segment then runs whole, through [`Model::forward_segment`].
    fn output_layer<'a>(&self, _p: &Params<'a>, _x: &Tensor) -> Option<OutputLayer<'a>> {
        None
    }

    /// What the last segment computes before its loss (a language model's logits, in
    /// fp32), from that segment's input.
    fn output(&self, p: &Params, x: &Tensor, batch: &Batch) -> Tensor;

    /// dtype of the model inputs the data pipeline must produce (token ids or features).
    fn input_kind(&self) -> Kind;
}

/// The forward code of `config`'s architecture. `buffer_kind`: what the model's buffers
/// (the Llama model's rotary frequencies) are held in (`mixed_precision.buffer_dtype`).
pub fn build(config: &ModelConfig, buffer_kind: Kind) -> Box<dyn Model> {
    let description = config.describe();
    match config {
        ModelConfig::Transformer {
            vocab_size,
            n_heads,
            ..
        } => Box::new(transformer::Transformer {
            description,
            vocab_size: *vocab_size as i64,
            n_heads: *n_heads as i64,
        }),
        ModelConfig::Mlp { .. } => Box::new(mlp::Mlp { description }),
        ModelConfig::Llama(m) => Box::new(llama::Llama::new(&m.architecture, buffer_kind)),
    }
}

/// Forward of the whole model: every segment in order (single-process reference training).
pub fn forward(model: &dyn Model, p: &Params, batch: &Batch) -> Tensor {
    let n = model.segments().len();
    let mut x = batch.inputs.shallow_clone();
    for i in 0..n {
        x = model.forward_segment(i, p, &x, batch);
    }
    x
}

/// The model's output before the loss (logits) for the whole batch.
pub fn output(model: &dyn Model, p: &Params, batch: &Batch) -> Tensor {
    let n = model.segments().len();
    let mut x = batch.inputs.shallow_clone();
    for i in 0..n - 1 {
        x = model.forward_segment(i, p, &x, batch);
    }
    model.output(p, &x, batch)
}

/// Every parameter of `model`, whole, from `source` (single-process use: the reference
/// trainer, tests), as leaves that require grad.
pub fn full_parameters(
    model: &dyn Model,
    source: &ParamSource,
    device: tch::Device,
) -> Result<HashMap<String, Tensor>, HfError> {
    let mut params = HashMap::new();
    for spec in &model.description().params {
        let mut values = vec![0.0f32; spec.numel() as usize];
        source.fill(spec, 0..spec.numel() as u64, &mut values)?;
        let value = Tensor::from_slice(&values)
            .view(spec.shape.as_slice())
            .to_device(device);
        params.insert(spec.name.clone(), value.set_requires_grad(true));
    }
    Ok(params)
}

/// `x @ weight.T + bias` with the module's parameters (the bias when it has one).
pub(crate) fn linear(p: &Params, x: &Tensor) -> Tensor {
    x.linear(p.get("weight"), p.maybe("bias"))
}

/// Mean cross-entropy over the targets that are not -100 (`transformers`' labels), in fp32
/// whatever the compute dtype; 0 (and no gradient) when every target is -100.
pub(crate) fn token_loss(logits: &Tensor, targets: &Tensor) -> Tensor {
    let vocab = logits.size()[logits.dim() - 1];
    let targets = targets.reshape([-1]);
    let sum = logits
        .reshape([-1, vocab])
        .to_kind(Kind::Float)
        .cross_entropy_loss::<Tensor>(&targets, None, tch::Reduction::Sum, -100, 0.0);
    let counted = targets.ne(-100).sum(Kind::Float).clamp_min(1.0);
    sum / counted
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one_param(name: &str) -> HashMap<String, Tensor> {
        HashMap::from([(
            name.to_string(),
            Tensor::ones([4, 4], (Kind::Float, tch::Device::Cpu)),
        )])
    }

    #[test]
    fn a_gathered_parameter_is_read() {
        let map = one_param("layers.0.attn.weight");
        let p = Params::new(&map).pp("layers.0");
        assert_eq!(p.get("attn.weight").size(), [4, 4]);
        assert!(p.maybe("attn.bias").is_none());
    }

    #[test]
    #[should_panic(expected = "model reads parameter layers.0.attn.weight outside its segment")]
    fn reading_a_released_unit_stops_with_its_name() {
        let map = one_param("layers.0.attn.weight");
        crate::shim::release_storage(&map["layers.0.attn.weight"]).unwrap();
        Params::new(&map).pp("layers.0.attn").get("weight");
    }

    #[test]
    #[should_panic(expected = "outside its segment")]
    fn an_optional_parameter_of_a_released_unit_stops_too() {
        let map = one_param("head.bias");
        crate::shim::release_storage(&map["head.bias"]).unwrap();
        Params::new(&map).pp("head").maybe("bias");
    }

    /// Memory there (a unit gathered ahead for a later segment) is no licence to read it.
    #[test]
    #[should_panic(expected = "model reads parameter head.bias outside its segment")]
    fn a_resident_parameter_another_segment_declares_stops_with_its_name() {
        let map = one_param("head.bias");
        let declared = HashSet::from(["layers.0.attn.weight".to_string()]);
        Params::of_segment(&map, &declared).pp("head").maybe("bias");
    }

    #[test]
    fn a_segment_reads_what_it_declares() {
        let map = one_param("head.bias");
        let declared = HashSet::from(["head.bias".to_string()]);
        let p = Params::of_segment(&map, &declared).pp("head");
        assert_eq!(p.get("bias").size(), [4, 4]);
        assert!(p.maybe("weight").is_none());
    }
}
