//! Where a model's initial parameter values come from: the from-scratch generator, a
//! Hugging Face folder, or a checkpoint loaded once the model is built. Each fills any element
//! range of any parameter on its own, which is what lets each rank build exactly its own
//! shards and nothing else.

use crate::hf::{HfError, HfWeights};
use crate::param::ParamSpec;
use crate::ModelConfig;
use std::ops::Range;
use std::path::{Path, PathBuf};

pub enum ParamSource {
    /// Each parameter's [`crate::Init`], from the counter-based generator keyed by `seed`.
    Init { seed: u64 },
    /// The weights of a Hugging Face folder, checked against the model's parameters.
    Pretrained { dir: PathBuf, weights: HfWeights },
    /// Every parameter is about to be overwritten by checkpoint `dir` (a resume, or weights
    /// of `checkpoint.from`): zeros until then. The model's own source is not read, so a
    /// resume neither waits for a pretrained folder's weights nor needs them to still exist.
    Checkpoint { dir: PathBuf },
}

impl ParamSource {
    /// The source `model` starts from: its pretrained folder when it has one, else `seed`.
    pub fn for_model(model: &ModelConfig, seed: u64) -> Result<ParamSource, HfError> {
        match model {
            ModelConfig::Llama(m) => match &m.pretrained {
                Some(dir) => ParamSource::pretrained(dir, model),
                None => Ok(ParamSource::Init { seed }),
            },
            _ => Ok(ParamSource::Init { seed }),
        }
    }

    /// The weights of folder `dir` (headers read, tensors checked against `model`).
    pub fn pretrained(dir: &Path, model: &ModelConfig) -> Result<ParamSource, HfError> {
        let mut weights = HfWeights::open(dir)?;
        weights.check(&model.describe(), dir)?;
        Ok(ParamSource::Pretrained {
            dir: dir.to_path_buf(),
            weights,
        })
    }

    /// Elements `range` of the flattened value of `spec`, as f32, into `out`.
    pub fn fill(
        &self,
        spec: &ParamSpec,
        range: Range<u64>,
        out: &mut [f32],
    ) -> Result<(), HfError> {
        match self {
            ParamSource::Init { seed } => {
                crate::init::fill(spec, *seed, range, out);
                Ok(())
            }
            ParamSource::Pretrained { weights, .. } => weights.read(&spec.name, range, out),
            ParamSource::Checkpoint { .. } => {
                out.fill(0.0);
                Ok(())
            }
        }
    }

    /// For log lines: "initialised from seed 7", or the folder.
    pub fn describe(&self) -> String {
        match self {
            ParamSource::Init { seed } => format!("initialised from seed {seed}"),
            ParamSource::Pretrained { dir, .. } => format!("loaded from {}", dir.display()),
            ParamSource::Checkpoint { dir } => {
                format!("made ready for checkpoint {}", dir.display())
            }
        }
    }
}
