//! Hugging Face model folders, as `transformers`' `save_pretrained` writes them and
//! `from_pretrained` reads them:
//!
//! ```text
//! <folder>/
//!   config.json                          architecture (transformers 4.x or 5.x dialect)
//!   model.safetensors                    all weights, or, past a size limit:
//!   model.safetensors.index.json         {"weight_map": {tensor: file}}
//!   model-00001-of-00003.safetensors ...
//!   tokenizer.json, tokenizer_config.json, generation_config.json, ...
//!   chat_template.jinja, additional_chat_templates/tool_use.jinja, ...
//! ```
//!
//! * [`config`]: `config.json` → [`crate::LlamaConfig`] (and back, for exports);
//! * [`weights`]: the safetensors files checked against the architecture's parameters and
//!   read by element range, one mapped byte range at a time;
//! * [`save`]: writing a folder back, split into shards with an index past a size limit.

pub mod config;
pub mod save;
pub mod weights;

pub use config::{read_config, CONFIG_FILE, SUPPORTED_TYPES};
pub use save::{
    is_tokenizer_file, save_folder, tokenizer_and_generation_files, FileContents, FolderFile,
    SaveOptions, SavedFolder, ADDITIONAL_CHAT_TEMPLATES,
};
pub use weights::{HfWeights, StoredDtype};

use crate::llama::{EMBED_TOKENS, LM_HEAD};
use std::path::{Path, PathBuf};

pub const SINGLE_FILE: &str = "model.safetensors";
pub const INDEX_FILE: &str = "model.safetensors.index.json";

/// Why a folder cannot be used; every message names the file (and the key or tensor) and says
/// what to do.
#[derive(Debug, thiserror::Error)]
pub enum HfError {
    #[error("cannot {action} {path}: {source}")]
    Io {
        action: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: `{key}`: {why}")]
    Config {
        path: PathBuf,
        key: String,
        why: String,
        problem: ConfigProblem,
    },
    #[error("{file}: tensor `{tensor}`: {why}")]
    Tensor {
        file: PathBuf,
        tensor: String,
        why: String,
    },
    #[error("{path}: {why}")]
    Folder { path: PathBuf, why: String },
}

/// What is wrong with a key of a folder's config.json, which decides the fix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConfigProblem {
    /// A key the architecture needs is not there: add it as the model was made with.
    Missing,
    /// A value of the wrong type or out of range, or one to change as the error says.
    Invalid,
    /// A feature this architecture does not implement: editing the value would change what
    /// the weights compute, so the folder is not one shardrun can train.
    Unsupported,
}

impl HfError {
    pub(crate) fn io(action: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> HfError {
        let path = path.to_path_buf();
        move |source| HfError::Io {
            action,
            path,
            source,
        }
    }

    pub(crate) fn config(
        path: &Path,
        key: &str,
        problem: ConfigProblem,
        why: impl Into<String>,
    ) -> HfError {
        HfError::Config {
            path: path.to_path_buf(),
            key: key.to_string(),
            why: why.into(),
            problem,
        }
    }

    pub(crate) fn tensor(file: &Path, tensor: &str, why: impl Into<String>) -> HfError {
        HfError::Tensor {
            file: file.to_path_buf(),
            tensor: tensor.to_string(),
            why: why.into(),
        }
    }

    pub(crate) fn folder(path: &Path, why: impl Into<String>) -> HfError {
        HfError::Folder {
            path: path.to_path_buf(),
            why: why.into(),
        }
    }
}

/// Whether `dir` is meant as a Hugging Face model folder: it has a `config.json`, which
/// shardrun checkpoints never have. Its weights are not looked at, so a folder with pickle
/// weights or none gets [`open_folder`]'s message rather than passing for a checkpoint.
pub fn is_hf_folder(dir: &Path) -> bool {
    dir.join(CONFIG_FILE).is_file()
}

/// A folder's architecture and weights, checked against each other.
#[derive(Debug)]
pub struct HfFolder {
    pub dir: PathBuf,
    pub config: crate::LlamaConfig,
    pub weights: HfWeights,
    /// Things accepted but worth saying (tensors ignored, and why).
    pub notes: Vec<String>,
}

/// Opens `dir`: parses `config.json`, reads every weight file's header, and checks that the
/// tensors are exactly the parameters the config describes, with the same shapes.
///
/// A tied config whose file also stores an output head that differs from the embedding
/// gives the untied model: `from_pretrained` keeps both tensors and does not tie them. That
/// takes reading both tensors once; every other check reads headers only.
pub fn open_folder(dir: &Path) -> Result<HfFolder, HfError> {
    let mut config = read_config(dir)?;
    let mut weights = HfWeights::open(dir)?;
    let mut notes = Vec::new();
    if config.tie_embeddings
        && weights.get(EMBED_TOKENS).is_some()
        && weights.get(LM_HEAD).is_some()
        && !weights.same_values(EMBED_TOKENS, LM_HEAD)?
    {
        config.tie_embeddings = false;
        notes.push(format!(
            "{LM_HEAD} differs from {EMBED_TOKENS} though {} says tie_word_embeddings: true: loaded untied with both, as transformers does; set tie_word_embeddings: false there to say so",
            dir.join(CONFIG_FILE).display()
        ));
    }
    notes.extend(weights.check(&config.describe(), dir)?);
    Ok(HfFolder {
        dir: dir.to_path_buf(),
        config,
        weights,
        notes,
    })
}
