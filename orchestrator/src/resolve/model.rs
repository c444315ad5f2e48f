//! The model: architecture sizes checked, the sequence length agreed with the data, and
//! Hugging Face folders resolved on the login node into an explicit architecture plus the
//! folder its weights come from. Every problem with a folder (unsupported `model_type` or
//! rope type, a window the sequences exceed, missing, extra or mis-shaped tensors, a
//! truncated file) is found here, before any rank starts.

use super::{ResolveError, Section};
use crate::spec::{LlamaSpec, ModelSpec};
use shardrun_models::hf::{self, ConfigProblem, HfError};
use shardrun_protocol::config::{
    LlamaConfig, LlamaFamily, LlamaModel, ModelConfig, Rope, RopeScaling,
};
use std::path::{Path, PathBuf};

/// Whether a pretrained folder's weights must open. A run resuming from a checkpoint of its
/// own does not read them (the checkpoint holds every parameter), so weights deleted, moved
/// or damaged since it started are then a warning, not a reason to refuse the resume; the
/// folder's config.json is read either way.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Weights {
    Needed,
    ResumingPastThem,
}

/// The model and the sequence length the data will use.
pub fn resolve_model(
    s: &Section,
    weights: Weights,
    warnings: &mut Vec<String>,
) -> Result<(ModelConfig, u64), ResolveError> {
    let t = &s.spec().training;
    let data_seq = t.data.as_ref().and_then(|d| d.seq_len);
    match &t.model {
        ModelSpec::Mlp {
            input_dim,
            hidden_dim,
            output_dim,
        } => {
            let model = ModelConfig::Mlp {
                input_dim: *input_dim,
                hidden_dim: *hidden_dim,
                output_dim: *output_dim,
            };
            model.validate(1).map_err(|why| {
                s.err(
                    "training.model",
                    why,
                    "use positive `input_dim`, `hidden_dim`, `output_dim`",
                )
            })?;
            Ok((model, 1))
        }
        ModelSpec::Transformer {
            vocab_size,
            dim,
            n_layers,
            n_heads,
            max_seq_len,
        } => {
            let (vocab_size, dim, n_layers, n_heads) = (*vocab_size, *dim, *n_layers, *n_heads);
            if vocab_size == 0 || dim == 0 || n_layers == 0 || n_heads == 0 {
                return Err(s.err(
                    "training.model",
                    "a transformer dimension is 0",
                    "use positive `vocab_size`, `dim`, `n_layers`, `n_heads`",
                ));
            }
            head_dim(s, dim, n_heads, HeadDim::Derived)?;
            let (max_seq_len, seq_len) = match (*max_seq_len, data_seq) {
                (Some(m), Some(s)) => (m, s),
                (Some(m), None) => (m, m),
                (None, Some(s)) => (s, s),
                (None, None) => {
                    return Err(s.err(
                        "training.model.max_seq_len",
                        "the sequence length is not given",
                        "add `max_seq_len: 256` to the model (or `seq_len` to `training.data`)",
                    ));
                }
            };
            if seq_len == 0 || seq_len > max_seq_len {
                return Err(s.err(
                    "training.data.seq_len",
                    format!(
                        "seq_len {seq_len} is outside 1..={max_seq_len} (the model's max_seq_len)"
                    ),
                    format!("use seq_len ≤ {max_seq_len} or raise max_seq_len"),
                ));
            }
            Ok((
                ModelConfig::Transformer {
                    vocab_size,
                    dim,
                    n_layers,
                    n_heads,
                    max_seq_len,
                },
                seq_len,
            ))
        }
        ModelSpec::Llama(spec) => {
            let seq_len = llama_seq_len(s, data_seq, spec.max_position_embeddings)?;
            let architecture = llama_from_spec(s, spec, seq_len)?;
            architecture.validate(seq_len).map_err(|why| {
                let (key, why) = in_spec_words(&why);
                let fix = match key {
                    Some(key) if why.ends_with(" is 0") => format!("set `{key}` to 1 or more"),
                    Some(key) => format!("change `{key}` (docs/job-spec.md lists the Llama keys)"),
                    None => "change the model's keys (docs/job-spec.md lists them)".into(),
                };
                let field = key.map_or("training.model".into(), |k| format!("training.model.{k}"));
                s.err(&field, why, fix)
            })?;
            if seq_len > architecture.max_position_embeddings {
                warnings.push(format!(
                    "`training.model.max_position_embeddings` is {}, shorter than the {seq_len} \
                     tokens it trains on; an exported config.json would tell transformers the \
                     shorter context: raise it to at least {seq_len}, or leave it out",
                    architecture.max_position_embeddings
                ));
            }
            Ok((
                ModelConfig::Llama(LlamaModel {
                    architecture,
                    pretrained: None,
                }),
                seq_len,
            ))
        }
        ModelSpec::Hf { path } => {
            let dir = s.spec_relative(path);
            let folder = open_folder(s, "training.model.path", &dir, weights)?;
            let seq_len = llama_seq_len(s, data_seq, Some(folder.config.max_position_embeddings))?;
            check_sequences(s, &folder.config, seq_len, warnings)?;
            warnings.extend(folder.notes);
            Ok((
                ModelConfig::Llama(LlamaModel {
                    architecture: folder.config,
                    pretrained: Some(dir),
                }),
                seq_len,
            ))
        }
    }
}

/// `checkpoint.from` naming a Hugging Face folder (one with a `config.json`): the model
/// starts from its weights, which must be those of the architecture the spec describes.
/// Returns the folder when it is one.
pub fn resolve_pretrained_from(
    s: &Section,
    model: &mut ModelConfig,
    from: Option<&Path>,
    seq_len: u64,
    weights: Weights,
    warnings: &mut Vec<String>,
) -> Result<Option<PathBuf>, ResolveError> {
    let Some(from) = from else { return Ok(None) };
    let dir = s.spec_relative(from);
    if !hf::is_hf_folder(&dir) {
        return Ok(None);
    }
    let field = "training.checkpoint.from";
    let ModelConfig::Llama(llama) = model else {
        return Err(s.err(
            field,
            format!(
                "{} is a Hugging Face folder, but the model is not a Llama-family model",
                dir.display()
            ),
            "use `model: { kind: hf, path: <folder> }` to train the folder's model",
        ));
    };
    if let Some(pretrained) = &llama.pretrained {
        return Err(s.err(
            field,
            format!(
                "the model already starts from {}; a second Hugging Face folder would replace its weights",
                pretrained.display()
            ),
            "keep one: `model.path` or `checkpoint.from`",
        ));
    }
    let folder = open_folder(s, field, &dir, weights)?;
    let differences = architecture_differences(&folder.config, &llama.architecture);
    if !differences.is_empty() {
        // The notes say why the folder's model may differ from its config.json (an output
        // head stored apart from a tied embedding).
        let notes = folder
            .notes
            .iter()
            .map(|n| format!(" ({n})"))
            .collect::<String>();
        return Err(s.err(
            field,
            format!(
                "{}'s config.json describes another model than `training.model`: {}{notes}",
                dir.display(),
                differences.join(", ")
            ),
            format!(
                "use `model: {{ kind: hf, path: {} }}` to train the folder's own architecture",
                dir.display()
            ),
        ));
    }
    check_sequences(s, &folder.config, seq_len, warnings)?;
    warnings.extend(folder.notes);
    llama.pretrained = Some(dir.clone());
    Ok(Some(dir))
}

/// A folder's architecture and what to say about it (see [`hf::open_folder`]).
fn open_folder(
    s: &Section,
    field: &str,
    dir: &Path,
    weights: Weights,
) -> Result<Opened, ResolveError> {
    if !dir.exists() {
        return Err(s.err(
            field,
            format!("the model folder {} does not exist", dir.display()),
            format!(
                "check `{field}` (relative paths are relative to the job spec's folder); it names \
                 a Hugging Face model folder (config.json with model.safetensors or \
                 model.safetensors.index.json)"
            ),
        ));
    }
    if !dir.is_dir() {
        return Err(s.err(
            field,
            format!("{} is a file, not a model folder", dir.display()),
            format!(
                "point `{field}` at the folder that holds config.json and the weights{}",
                match dir.parent() {
                    Some(parent) if dir.file_name().is_some_and(|n| n == "config.json") =>
                        format!(" ({})", parent.display()),
                    _ => String::new(),
                }
            ),
        ));
    }
    let e = match hf::open_folder(dir) {
        Ok(folder) => {
            // Values the model cannot be built with are the folder's, whatever it trains on.
            folder.config.validate_architecture().map_err(|why| {
                s.err(
                    field,
                    format!("{}: {why}", dir.join(hf::CONFIG_FILE).display()),
                    format!(
                        "correct it in config.json, or point `{field}` at another Hugging Face \
                         model folder"
                    ),
                )
            })?;
            return Ok(Opened {
                config: folder.config,
                notes: folder.notes,
            });
        }
        Err(e) => e,
    };
    if weights == Weights::ResumingPastThem && !matches!(e, HfError::Config { .. }) {
        if let Ok(config) = hf::read_config(dir) {
            return Ok(Opened {
                config,
                notes: vec![format!(
                    "{e}: the run resumes from its own checkpoint, which holds every \
                     parameter, so these weights are not read; starting it over (--force) \
                     needs them again"
                )],
            });
        }
    }
    let fix = folder_fix(&e, field);
    Err(s.err(field, e.to_string(), fix))
}

/// What to do about a model folder that does not open as `field` names it.
fn folder_fix(e: &HfError, field: &str) -> String {
    match e {
        HfError::Config {
            key,
            path,
            problem: ConfigProblem::Missing,
            ..
        } => format!(
            "add `{key}` to {} as the model was made with (or use the model's own \
             config.json)",
            path.display()
        ),
        HfError::Config {
            key,
            path,
            problem: ConfigProblem::Invalid,
            ..
        } => format!("edit `{key}` in {} as said", path.display()),
        // Editing the value would change what the weights compute.
        HfError::Config {
            key,
            problem: ConfigProblem::Unsupported,
            ..
        } if key.ends_with("model_type") => format!(
            "point `{field}` at a folder of a model shardrun supports: {}",
            hf::SUPPORTED_TYPES
        ),
        // A model of a supported type with a setting shardrun does not train.
        HfError::Config {
            key,
            problem: ConfigProblem::Unsupported,
            ..
        } => format!(
            "shardrun does not train models with this `{key}` yet: point `{field}` at another \
             model's folder (what `training.model` supports is listed in docs/job-spec.md)"
        ),
        // Another user's folder, made with an owner-only umask.
        HfError::Io { path, source, .. }
            if source.kind() == std::io::ErrorKind::PermissionDenied =>
        {
            let whose = crate::rundir::access::owner_and_mode(path)
                .map(|(owner, mode)| format!(" (it is {owner}'s, mode {mode:o})"))
                .unwrap_or_default();
            format!(
                "ask the owner of {}{whose} to make it readable (`chmod -R a+rX` on the \
                 folder), or point `{field}` at a copy you can read",
                path.display()
            )
        }
        // Likely the folder above or beside the model's (the Hub cache's repository folder).
        HfError::Io { path, source, .. }
            if source.kind() == std::io::ErrorKind::NotFound
                && path.file_name() == Some(std::ffi::OsStr::new(hf::config::CONFIG_FILE)) =>
        {
            format!(
                "point `{field}` at the folder that holds config.json (a Hugging Face model \
                 folder: config.json with model.safetensors or model.safetensors.index.json; \
                 the Hub's cache keeps one under snapshots/<revision>/)"
            )
        }
        HfError::Tensor { .. } | HfError::Io { .. } | HfError::Folder { .. } => format!(
            "repair the folder as said, or point `{field}` at another Hugging Face model folder (config.json with model.safetensors or model.safetensors.index.json)"
        ),
    }
}

/// What [`open_folder`] read: the architecture, and notes for the warnings.
struct Opened {
    config: LlamaConfig,
    notes: Vec<String>,
}

fn check_sequences(
    s: &Section,
    config: &LlamaConfig,
    seq_len: u64,
    warnings: &mut Vec<String>,
) -> Result<(), ResolveError> {
    config.validate_sequences(seq_len).map_err(|why| {
        s.err(
            "training.data.seq_len",
            why,
            "train on shorter sequences, or on another model",
        )
    })?;
    if seq_len > config.max_position_embeddings {
        warnings.push(format!(
            "seq_len {seq_len} is longer than the model's max_position_embeddings ({}): positions past it were never trained",
            config.max_position_embeddings
        ));
    }
    // YaRN's factor should stretch the original context to max_position_embeddings; as
    // transformers does, say so when it does not and use the factor given. (An implied 1 is
    // a folder that left the original context out of its other keys.)
    if let RopeScaling::Yarn {
        factor,
        original_max_position_embeddings: original,
        ..
    } = config.rope.scaling
    {
        let implied = config.max_position_embeddings as f64 / original as f64;
        if implied != factor && implied != 1.0 {
            warnings.push(format!(
                "YaRN's factor {factor} is not max_position_embeddings / original_max_position_embeddings \
                 ({} / {original} = {implied}); the factor given is used, as transformers uses it",
                config.max_position_embeddings
            ));
        }
    }
    Ok(())
}

/// A Llama model trains on the sequence length the data says: no default, since a folder's
/// `max_position_embeddings` (up to 131072) is rarely what fits.
fn llama_seq_len(
    s: &Section,
    data_seq: Option<u64>,
    max_positions: Option<u64>,
) -> Result<u64, ResolveError> {
    match data_seq {
        Some(0) => Err(s.err(
            "training.data.seq_len",
            "seq_len is 0",
            "train on sequences of at least 1 token",
        )),
        Some(n) => Ok(n),
        None => {
            // A length the model knows: 2048, or its whole context where that is shorter.
            let suggested = max_positions.map_or(2048, |m| m.min(2048));
            let add = if s.spec().training.data.is_some() {
                format!("add `seq_len: {suggested}` (tokens per training sequence) to `data`")
            } else {
                format!(
                    "add your `data` with its `seq_len`, or `data: {{ kind: synthetic, seq_len: {suggested} }}`"
                )
            };
            let trained = max_positions
                .map(|m| format!("; the model was trained on up to {m} positions"))
                .unwrap_or_default();
            Err(s.err(
                "training.data",
                "a Llama-family model needs the sequence length to train on",
                format!("{add}{trained}"),
            ))
        }
    }
}

/// Where a model's per-head width comes from.
#[derive(Clone, Copy)]
enum HeadDim {
    /// Always `dim / n_heads` (the model has no `head_dim` key).
    Derived,
    /// The spec's `head_dim` when given, else `dim / n_heads`.
    Given(Option<u64>),
}

/// The width of each of `n_heads` attention heads; the heads must be at least one and, with
/// no `head_dim` given, divide `dim`.
fn head_dim(s: &Section, dim: u64, n_heads: u64, width: HeadDim) -> Result<u64, ResolveError> {
    if n_heads == 0 {
        return Err(s.err("training.model.n_heads", "0 heads", "use 1 or more"));
    }
    let (given, or_give) = match width {
        HeadDim::Derived => (None, ""),
        HeadDim::Given(given) => (given, ", or give `head_dim`"),
    };
    match given {
        Some(h) => Ok(h),
        None if dim.is_multiple_of(n_heads) => Ok(dim / n_heads),
        None => Err(s.err(
            "training.model.n_heads",
            format!("dim {dim} is not divisible by {n_heads} heads"),
            format!("use a number of heads that divides {dim}{or_give}"),
        )),
    }
}

fn llama_from_spec(s: &Section, m: &LlamaSpec, seq_len: u64) -> Result<LlamaConfig, ResolveError> {
    let family = m.model_type.unwrap_or(LlamaFamily::Llama);
    let (qkv_bias, o_proj_bias, mlp_bias) = match family {
        LlamaFamily::Llama => {
            let attention = m.attention_bias.unwrap_or(false);
            (attention, attention, m.mlp_bias.unwrap_or(false))
        }
        LlamaFamily::Qwen3 if m.mlp_bias.is_none() => {
            let attention = m.attention_bias.unwrap_or(false);
            (attention, attention, false)
        }
        other => {
            // The bias key the family fixes (Qwen3 takes `attention_bias`, not `mlp_bias`).
            let refused = match (m.attention_bias, m.mlp_bias) {
                (Some(_), _) if other != LlamaFamily::Qwen3 => {
                    Some("training.model.attention_bias")
                }
                (_, Some(_)) => Some("training.model.mlp_bias"),
                _ => None,
            };
            if let Some(field) = refused {
                return Err(s.err(
                    field,
                    format!(
                        "model_type {} fixes this bias (Mistral: none, Qwen2: q/k/v, Qwen3: \
                         none in the MLP)",
                        other.model_type()
                    ),
                    "remove the key, or use `model_type: llama`",
                ));
            }
            (other == LlamaFamily::Qwen2, false, false)
        }
    };
    let head_dim = head_dim(s, m.dim, m.n_heads, HeadDim::Given(m.head_dim))?;
    let max_position_embeddings = m.max_position_embeddings.unwrap_or(seq_len);
    let scaling = m.rope_scaling.unwrap_or(RopeScaling::Default);
    Ok(LlamaConfig {
        model_type: family,
        vocab_size: m.vocab_size,
        dim: m.dim,
        n_layers: m.n_layers,
        n_heads: m.n_heads,
        n_kv_heads: m.n_kv_heads.unwrap_or(m.n_heads),
        head_dim,
        ffn_dim: m.ffn_dim,
        norm_eps: m.norm_eps.unwrap_or(1e-6),
        rope: Rope {
            theta: m.rope_theta.unwrap_or(10_000.0),
            scaling,
        },
        max_position_embeddings,
        tie_embeddings: m.tie_embeddings.unwrap_or(false),
        qkv_bias,
        o_proj_bias,
        mlp_bias,
        initializer_range: m.initializer_range.unwrap_or(0.02),
        pad_token_id: m.pad_token_id,
        sliding_window: None,
    })
}

/// Keys on which two architectures differ (initialisation settings aside: loaded weights
/// make them moot).
fn architecture_differences(folder: &LlamaConfig, spec: &LlamaConfig) -> Vec<String> {
    let a = serde_json::to_value(folder).expect("configs serialize");
    let b = serde_json::to_value(spec).expect("configs serialize");
    let (Some(a), Some(b)) = (a.as_object(), b.as_object()) else {
        return Vec::new();
    };
    a.iter()
        .filter(|(key, _)| {
            !matches!(
                key.as_str(),
                "initializer_range" | "max_position_embeddings"
            )
        })
        .filter(|(key, value)| b.get(*key) != Some(value))
        .map(|(key, value)| {
            format!(
                "{key} {} (folder) vs {} (spec)",
                value,
                b.get(key).cloned().unwrap_or_default()
            )
        })
        .collect()
}

/// A Llama architecture's error, which names `config.json`'s keys, in the job spec's names,
/// with the spec key to change: the one the error is about, or the one that breaks the rule.
fn in_spec_words(why: &str) -> (Option<&'static str>, String) {
    let mut text = why.to_string();
    for (theirs, ours) in crate::spec::read::TRANSFORMERS_NAMES {
        text = text.replace(theirs, ours);
    }
    // Checked in this order: the heads rule is about the key-value heads it names last.
    const KEYS: [(&str, &str); 12] = [
        ("is not a multiple of n_kv_heads", "n_kv_heads"),
        ("vocab_size", "vocab_size"),
        ("n_layers", "n_layers"),
        ("n_kv_heads", "n_kv_heads"),
        ("n_heads", "n_heads"),
        ("head_dim", "head_dim"),
        ("ffn_dim", "ffn_dim"),
        ("dim", "dim"),
        ("pad_token_id", "pad_token_id"),
        ("norm_eps", "norm_eps"),
        ("rope_theta", "rope_theta"),
        ("rope scaling", "rope_scaling"),
    ];
    let key = if text.starts_with("biases") {
        Some("attention_bias")
    } else {
        KEYS.iter()
            .find(|(said, _)| text.contains(said))
            .map(|(_, key)| *key)
    };
    (key, text)
}

#[cfg(test)]
pub(super) mod tests {
    use crate::resolve::{resolve, Overrides, ResolveError};
    use crate::spec::parse;
    use shardrun_models::hf::config::config_json;
    use shardrun_models::hf::{save_folder, SaveOptions, StoredDtype};
    use shardrun_protocol::config::{LlamaFamily, ModelConfig, RopeScaling, WrapPolicy};
    use std::path::Path;

    fn job(
        model: &str,
        data: &str,
        extra: &str,
    ) -> Result<crate::resolve::ResolvedJob, ResolveError> {
        let yaml = format!(
            "name: t\ntraining:\n  model: {model}\n{data}  steps: 1\n  total_batch_size: 2\n  batch_size_per_device: 2\n{extra}"
        );
        resolve(
            &parse(&yaml, Path::new("/specs/job.yaml")).expect("parses"),
            &Overrides::default(),
        )
    }

    const LLAMA: &str = "{ kind: llama, vocab_size: 100, dim: 64, n_layers: 2, n_heads: 4, n_kv_heads: 2, ffn_dim: 128, rope_scaling: { rope_type: linear, factor: 2.0 } }";
    const DATA: &str = "  data: { kind: synthetic, seq_len: 16 }\n";

    /// A folder with `llama`'s architecture (zero weights), as transformers would save it.
    pub(in crate::resolve) fn folder(dir: &Path, model: &ModelConfig) {
        let ModelConfig::Llama(m) = model else {
            panic!("a Llama")
        };
        let d = m.architecture.describe();
        let tensors: Vec<(String, Vec<u64>)> = d
            .params
            .iter()
            .map(|p| (p.name.clone(), p.shape.iter().map(|&x| x as u64).collect()))
            .collect();
        save_folder(
            dir,
            &config_json(&m.architecture, "float32"),
            &tensors,
            |name, values| {
                let (_, shape) = tensors.iter().find(|(n, _)| n == name).unwrap();
                values.resize(shape.iter().product::<u64>() as usize, 0.0);
                Ok(())
            },
            &[],
            &SaveOptions {
                dtype: StoredDtype::Bf16,
                max_shard_bytes: 10_000,
            },
        )
        .unwrap();
    }

    #[test]
    fn llama_from_scratch_takes_transformers_defaults() {
        let j = job(LLAMA, DATA, "").unwrap();
        let ModelConfig::Llama(m) = &j.train.model else {
            panic!("{:?}", j.train.model)
        };
        let a = &m.architecture;
        assert_eq!(
            (
                a.model_type,
                a.head_dim,
                a.n_kv_heads,
                a.max_position_embeddings
            ),
            (LlamaFamily::Llama, 16, 2, 16)
        );
        assert_eq!(a.rope.scaling, RopeScaling::Linear { factor: 2.0 });
        assert_eq!(
            (a.norm_eps, a.rope.theta, a.tie_embeddings),
            (1e-6, 10_000.0, false)
        );
        assert_eq!(m.pretrained, None);
        assert_eq!(j.train.fsdp.wrap, WrapPolicy::Block);
        // embed + head 2·6400, per layer q/o 2·4096, k/v 2·2048, MLP 3·8192, norms 128; final norm.
        assert_eq!(
            j.memory.num_params,
            12800 + 2 * (8192 + 4096 + 24576 + 128) + 64
        );
    }

    #[test]
    fn llama_size_errors_point_at_the_spec_key_in_its_name() {
        for (change, field, why) in [
            (
                "n_kv_heads: 3,",
                "n_kv_heads",
                "n_heads 4 is not a multiple of n_kv_heads 3",
            ),
            ("n_layers: 0,", "n_layers", "n_layers is 0"),
            ("norm_eps: -1.0,", "norm_eps", "norm_eps -1 is not positive"),
        ] {
            let key = change.split(':').next().unwrap();
            let spec = LLAMA
                .replace(&format!(" {key}: 2,"), "")
                .replace("kind: llama,", &format!("kind: llama, {change}"));
            let ResolveError::Invalid(e) = job(&spec, DATA, "").unwrap_err();
            assert_eq!(
                (e.field.as_str(), e.why.as_str()),
                (format!("training.model.{field}").as_str(), why),
                "{e}"
            );
        }
    }

    #[test]
    fn llama_errors_name_the_key() {
        let ResolveError::Invalid(e) = job(LLAMA, "", "").unwrap_err();
        assert_eq!(e.field, "training.data");
        assert!(
            e.fix.starts_with("add your `data` with its `seq_len`"),
            "{e}"
        );
        let text = "  data: { kind: text, files: [a.txt], tokenizer: { kind: bytes } }\n";
        let ResolveError::Invalid(e) = job(LLAMA, text, "").unwrap_err();
        assert_eq!(e.field, "training.data");
        assert!(
            e.fix
                .starts_with("add `seq_len: 2048` (tokens per training sequence) to `data`"),
            "{e}"
        );
        // A model of a shorter context is offered its whole context, never more.
        let short = LLAMA.replace(
            "kind: llama,",
            "kind: llama, max_position_embeddings: 1024,",
        );
        let ResolveError::Invalid(e) = job(&short, text, "").unwrap_err();
        assert_eq!(
            e.fix,
            "add `seq_len: 1024` (tokens per training sequence) to `data`; the model was \
             trained on up to 1024 positions",
            "{e}"
        );
        let qwen = LLAMA.replace(
            "kind: llama,",
            "kind: llama, model_type: qwen2, mlp_bias: true,",
        );
        let ResolveError::Invalid(e) = job(&qwen, DATA, "").unwrap_err();
        assert_eq!(e.field, "training.model.mlp_bias");
        // Qwen3 takes `attention_bias` (all four projections) but no MLP bias.
        let qwen3 = LLAMA.replace(
            "kind: llama,",
            "kind: llama, model_type: qwen3, attention_bias: true,",
        );
        let ModelConfig::Llama(m) = job(&qwen3, DATA, "").unwrap().train.model else {
            panic!("a Llama model");
        };
        let a = &m.architecture;
        assert_eq!((a.qkv_bias, a.o_proj_bias, a.qk_norm()), (true, true, true));
        let ResolveError::Invalid(e) =
            job(&qwen3.replace("attention_bias", "mlp_bias"), DATA, "").unwrap_err();
        assert_eq!(e.field, "training.model.mlp_bias");
        let odd = LLAMA.replace("n_kv_heads: 2", "n_kv_heads: 3");
        let ResolveError::Invalid(e) = job(&odd, DATA, "").unwrap_err();
        assert_eq!(e.field, "training.model.n_kv_heads", "{e}");
        let no_heads = LLAMA.replace("n_heads: 4, n_kv_heads: 2", "n_heads: 0, head_dim: 16");
        let ResolveError::Invalid(e) = job(&no_heads, DATA, "").unwrap_err();
        assert_eq!(
            (e.field.as_str(), e.why.as_str(), e.fix.as_str()),
            ("training.model.n_heads", "0 heads", "use 1 or more")
        );
        let five = LLAMA.replace("n_heads: 4, n_kv_heads: 2", "n_heads: 5");
        let ResolveError::Invalid(e) = job(&five, DATA, "").unwrap_err();
        assert_eq!(
            (e.field.as_str(), e.why.as_str(), e.fix.as_str()),
            (
                "training.model.n_heads",
                "dim 64 is not divisible by 5 heads",
                "use a number of heads that divides 64, or give `head_dim`"
            )
        );
        // A `head_dim` of their own lets the heads leave `dim` undivided.
        let given = LLAMA.replace("n_heads: 4, n_kv_heads: 2", "n_heads: 5, head_dim: 16");
        let ModelConfig::Llama(m) = job(&given, DATA, "").unwrap().train.model else {
            panic!("a Llama")
        };
        assert_eq!((m.architecture.n_heads, m.architecture.head_dim), (5, 16));
        let ResolveError::Invalid(e) =
            job("{ kind: hf, path: /nonexistent/model }", DATA, "").unwrap_err();
        assert_eq!(e.field, "training.model.path");
        assert_eq!(e.why, "the model folder /nonexistent/model does not exist");
        assert!(e.fix.contains("relative to the job spec's folder"), "{e}");
        // A folder that is there names the file it lacks.
        let empty = tempfile::tempdir().unwrap();
        let ResolveError::Invalid(e) = job(
            &format!("{{ kind: hf, path: {} }}", empty.path().display()),
            DATA,
            "",
        )
        .unwrap_err();
        assert!(
            e.why
                .contains(&format!("{}/config.json", empty.path().display())),
            "{e}"
        );
    }

    /// What the file system answers another user reading a folder made with an owner-only
    /// umask: the fix names the owner and the mode, not a repair of the folder.
    #[test]
    fn weights_this_user_may_not_read_are_the_owners_to_open_up() {
        use std::os::unix::fs::PermissionsExt;
        let tmp = tempfile::tempdir().unwrap();
        let weights = tmp.path().join("model.safetensors");
        std::fs::write(&weights, b"").unwrap();
        std::fs::set_permissions(&weights, std::fs::Permissions::from_mode(0o600)).unwrap();
        let denied = shardrun_models::hf::HfError::Io {
            action: "open",
            path: weights.clone(),
            source: std::io::ErrorKind::PermissionDenied.into(),
        };
        assert_eq!(
            super::folder_fix(&denied, "training.model.path"),
            format!(
                "ask the owner of {} (it is {}'s, mode 600) to make it readable (`chmod -R \
                 a+rX` on the folder), or point `training.model.path` at a copy you can read",
                weights.display(),
                crate::rundir::access::this_user()
            )
        );
        let missing = shardrun_models::hf::HfError::Io {
            action: "open",
            path: weights,
            source: std::io::ErrorKind::NotFound.into(),
        };
        assert!(super::folder_fix(&missing, "training.model.path")
            .starts_with("repair the folder as said"));
        let no_config = shardrun_models::hf::HfError::Io {
            action: "read",
            path: tmp.path().join("config.json"),
            source: std::io::ErrorKind::NotFound.into(),
        };
        assert!(
            super::folder_fix(&no_config, "training.model.path").starts_with(
                "point `training.model.path` at the folder that holds config.json (a Hugging Face \
             model folder"
            )
        );
    }

    #[test]
    fn hf_folder_resolves_to_its_architecture_and_weights() {
        let tmp = tempfile::tempdir().unwrap();
        let scratch = job(LLAMA, DATA, "").unwrap();
        let dir = tmp.path().join("model");
        folder(&dir, &scratch.train.model);
        assert!(dir.join("model.safetensors.index.json").is_file());
        let j = job(
            &format!("{{ kind: hf, path: {} }}", dir.display()),
            DATA,
            "",
        )
        .unwrap();
        let (ModelConfig::Llama(a), ModelConfig::Llama(b)) = (&j.train.model, &scratch.train.model)
        else {
            panic!()
        };
        assert_eq!(a.architecture, b.architecture);
        assert_eq!(a.pretrained.as_deref(), Some(dir.as_path()));

        // The same folder as `checkpoint.from` of the same architecture: its weights start
        // the run; of another architecture: an error listing what differs.
        let from = format!("  checkpoint: {{ from: {} }}\n", dir.display());
        let j = job(LLAMA, DATA, &from).unwrap();
        let ModelConfig::Llama(m) = &j.train.model else {
            panic!()
        };
        assert_eq!(m.pretrained.as_deref(), Some(dir.as_path()));
        assert_eq!(j.train.checkpoint.from, None);
        let other = LLAMA.replace("ffn_dim: 128", "ffn_dim: 96");
        let ResolveError::Invalid(e) = job(&other, DATA, &from).unwrap_err();
        assert_eq!(e.field, "training.checkpoint.from");
        assert!(e.why.contains("ffn_dim 128 (folder) vs 96 (spec)"), "{e}");
    }

    #[test]
    fn a_folder_config_error_says_to_add_a_missing_key_edit_a_bad_value_or_pick_a_supported_model()
    {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("model");
        folder(&dir, &job(LLAMA, DATA, "").unwrap().train.model);
        let config = dir.join("config.json");
        let original: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&config).unwrap()).unwrap();
        let spec = format!("{{ kind: hf, path: {} }}", dir.display());
        let fix_with = |edit: &dyn Fn(&mut serde_json::Value)| {
            let mut edited = original.clone();
            edit(&mut edited);
            std::fs::write(&config, edited.to_string()).unwrap();
            let ResolveError::Invalid(e) = job(&spec, DATA, "").unwrap_err();
            e.fix
        };
        let missing = fix_with(&|c| {
            c.as_object_mut().unwrap().remove("num_attention_heads");
        });
        assert!(
            missing.starts_with("add `num_attention_heads` to ") && missing.contains("config.json"),
            "{missing}"
        );
        let invalid = fix_with(&|c| c["attention_dropout"] = 0.1.into());
        assert!(
            invalid.starts_with("edit `attention_dropout` in ") && invalid.ends_with("as said"),
            "{invalid}"
        );
        let unsupported = fix_with(&|c| c["hidden_act"] = "gelu".into());
        assert!(
            unsupported.starts_with("shardrun does not train models with this `hidden_act` yet: point `training.model.path` at another model's folder"),
            "{unsupported}"
        );
        let unsupported = fix_with(&|c| c["model_type"] = "gemma".into());
        assert!(
            unsupported.starts_with("point `training.model.path` at a folder of a model shardrun supports: llama, mistral, qwen2"),
            "{unsupported}"
        );
        // A value no model is built with is the folder's, not the data's.
        for (key, why) in [
            ("rms_norm_eps", "rms_norm_eps -1 is not positive"),
            ("rope_theta", "rope_theta -1 is not positive"),
        ] {
            let mut edited = original.clone();
            edited[key] = (-1.0).into();
            edited.as_object_mut().unwrap().remove("rope_parameters");
            std::fs::write(&config, edited.to_string()).unwrap();
            let ResolveError::Invalid(e) = job(&spec, DATA, "").unwrap_err();
            assert_eq!(e.field, "training.model.path", "{e}");
            assert_eq!(e.why, format!("{}: {why}", config.display()));
            assert!(e.fix.starts_with("correct it in config.json"), "{e}");
        }
    }

    /// A from-scratch `model` spec saved as a Hugging Face folder in `dir`: the `kind: hf`
    /// spec of that folder and the architecture read back from it.
    fn through_a_folder(model: &str, dir: &Path) -> (String, shardrun_models::LlamaConfig) {
        let scratch = job(model, DATA, "").unwrap();
        folder(dir, &scratch.train.model);
        let hf = format!("{{ kind: hf, path: {} }}", dir.display());
        let ModelConfig::Llama(m) = job(&hf, DATA, "").unwrap().train.model else {
            panic!("a Llama")
        };
        (hf, m.architecture)
    }

    #[test]
    fn yarn_from_a_spec_keeps_its_options_through_a_folder() {
        let tmp = tempfile::tempdir().unwrap();
        let yarn = LLAMA.replace(
            "rope_type: linear, factor: 2.0",
            "rope_type: yarn, factor: 4.0, original_max_position_embeddings: 4, beta_fast: 8",
        );
        let (_, read_back) = through_a_folder(&yarn, &tmp.path().join("model"));
        assert_eq!(
            read_back.rope.scaling,
            RopeScaling::Yarn {
                factor: 4.0,
                original_max_position_embeddings: 4,
                attention_factor: None,
                beta_fast: 8.0,
                beta_slow: 1.0,
                truncate: true,
            }
        );
    }

    #[test]
    fn a_yarn_factor_other_than_the_context_ratio_is_warned_of() {
        // The folder's context is 16 positions: factor 4 over 4 original ones matches it.
        let tmp = tempfile::tempdir().unwrap();
        let warnings_of = |factor: f64, original: u64, name: &str| {
            let yarn = LLAMA.replace(
                "rope_type: linear, factor: 2.0",
                &format!(
                    "rope_type: yarn, factor: {factor:?}, original_max_position_embeddings: {original}"
                ),
            );
            let (model, _) = through_a_folder(&yarn, &tmp.path().join(name));
            job(&model, DATA, "").unwrap().warnings
        };
        let yarn_warnings = |warnings: Vec<String>| -> Vec<String> {
            warnings
                .into_iter()
                .filter(|w| w.starts_with("YaRN"))
                .collect()
        };
        assert_eq!(
            yarn_warnings(warnings_of(4.0, 4, "matching")),
            Vec::<String>::new()
        );
        assert_eq!(
            yarn_warnings(warnings_of(2.0, 4, "mismatched")),
            ["YaRN's factor 2 is not max_position_embeddings / original_max_position_embeddings \
              (16 / 4 = 4); the factor given is used, as transformers uses it"]
        );
        assert_eq!(
            yarn_warnings(warnings_of(2.0, 16, "implied_one")),
            Vec::<String>::new()
        );
    }

    #[test]
    fn dynamic_rope_trains_up_to_max_position_embeddings() {
        let tmp = tempfile::tempdir().unwrap();
        let dynamic = LLAMA.replace("rope_type: linear", "rope_type: dynamic");
        let (model, read_back) = through_a_folder(&dynamic, &tmp.path().join("model"));
        assert_eq!(
            (read_back.rope.scaling, read_back.max_position_embeddings),
            (RopeScaling::Dynamic { factor: 2.0 }, 16)
        );
        let longer = "  data: { kind: synthetic, seq_len: 17 }\n";
        let ResolveError::Invalid(e) = job(&model, longer, "").unwrap_err();
        assert_eq!(e.field, "training.data.seq_len");
        assert!(
            e.why.contains("rope_type dynamic") && e.why.contains("seq_len <= 16"),
            "{e}"
        );
    }

    #[test]
    fn weights_gone_are_a_warning_only_for_a_run_resuming_its_own_checkpoint() {
        let tmp = tempfile::tempdir().unwrap();
        let scratch = job(LLAMA, DATA, "").unwrap();
        let dir = tmp.path().join("model");
        folder(&dir, &scratch.train.model);
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "safetensors") {
                std::fs::remove_file(path).unwrap();
            }
        }
        let resolve_with = |resumes_from_checkpoint: bool, extra: &str| {
            let yaml = format!(
                "name: t\ntraining:\n  model: {{ kind: hf, path: {} }}\n{DATA}  steps: 1\n  total_batch_size: 2\n  batch_size_per_device: 2\n{extra}",
                dir.display()
            );
            let overrides = Overrides {
                continues_run: resumes_from_checkpoint,
                resumes_from_checkpoint,
                ..Overrides::default()
            };
            resolve(
                &parse(&yaml, Path::new("/specs/job.yaml")).unwrap(),
                &overrides,
            )
        };
        let ResolveError::Invalid(e) = resolve_with(false, "").unwrap_err();
        assert_eq!(e.field, "training.model.path");
        assert!(e.why.contains("model-00001-of-"), "{e}");

        // Resuming: the architecture from config.json, the missing file a warning.
        let j = resolve_with(true, "").unwrap();
        let (ModelConfig::Llama(a), ModelConfig::Llama(b)) = (&j.train.model, &scratch.train.model)
        else {
            panic!()
        };
        assert_eq!(a.architecture, b.architecture);
        assert_eq!(a.pretrained.as_deref(), Some(dir.as_path()));
        assert!(
            j.warnings
                .iter()
                .any(|w| w.contains("model-00001-of-")
                    && w.contains("resumes from its own checkpoint")),
            "{:?}",
            j.warnings
        );

        // A run set not to resume starts from the weights: they must be there.
        let ResolveError::Invalid(e) =
            resolve_with(true, "  checkpoint: { resume: false }\n").unwrap_err();
        assert_eq!(e.field, "training.model.path");

        // The config is read either way: a broken one is an error even when resuming.
        std::fs::write(dir.join("config.json"), "{}").unwrap();
        assert!(resolve_with(true, "").is_err());
    }

    #[test]
    fn checkpoint_from_is_checked_at_plan_time() {
        let tmp = tempfile::tempdir().unwrap();
        let missing = tmp.path().join("missing");
        let from = |dir: &Path| format!("  checkpoint: {{ from: {} }}\n", dir.display());
        let ResolveError::Invalid(e) = job(LLAMA, DATA, &from(&missing)).unwrap_err();
        assert_eq!(e.field, "training.checkpoint.from");
        assert!(e.why.contains("does not exist"), "{e}");

        // A folder with a config.json is a Hugging Face folder whatever its weights: pickle
        // weights or none get their own message, not a checkpoint's.
        let scratch = job(LLAMA, DATA, "").unwrap();
        let ModelConfig::Llama(m) = &scratch.train.model else {
            panic!()
        };
        let config = config_json(&m.architecture, "float32").to_string();
        let pickle = tmp.path().join("pickle");
        std::fs::create_dir(&pickle).unwrap();
        std::fs::write(pickle.join("config.json"), &config).unwrap();
        std::fs::write(pickle.join("pytorch_model.bin"), b"pickle").unwrap();
        let ResolveError::Invalid(e) = job(LLAMA, DATA, &from(&pickle)).unwrap_err();
        assert_eq!(e.field, "training.checkpoint.from");
        assert!(
            e.why.contains("pytorch_model.bin")
                && e.why.contains("save_pretrained")
                && e.why
                    .contains("t.AutoTokenizer.from_pretrained(a).save_pretrained(b)"),
            "{e}"
        );
        std::fs::remove_file(pickle.join("pytorch_model.bin")).unwrap();
        let ResolveError::Invalid(e) = job(LLAMA, DATA, &from(&pickle)).unwrap_err();
        assert!(e.why.contains("has no model.safetensors"), "{e}");

        // A relative `from` is relative to the spec file, and made absolute for the ranks.
        let checkpoints = tmp.path().join("pretrain");
        std::fs::create_dir(&checkpoints).unwrap();
        let yaml = format!(
            "name: t\ntraining:\n  model: {LLAMA}\n{DATA}  steps: 1\n  total_batch_size: 2\n  batch_size_per_device: 2\n  checkpoint: {{ from: pretrain }}\n"
        );
        let j = resolve(
            &parse(&yaml, &tmp.path().join("job.yaml")).unwrap(),
            &Overrides::default(),
        )
        .unwrap();
        assert_eq!(j.train.checkpoint.from, Some(checkpoints));
    }
}
