//! Training data: the `training.data` section checked key by key against its `kind`, paths
//! made absolute (relative to the spec file), every default applied. Pure: files are read
//! when the data is prepared (`shardrun prepare`, or the job's controller before launch).

use super::{defaults, ResolveError, Section};
use crate::spec::{DataKind, DataSpec, TextSplitKind, TokenizerKind};
use shardrun_protocol::config::{
    DataConfig, DataSource, DatasetConfig, HeldOut, JsonlText, ModelConfig, OnBadRecord, Packing,
    TextSplit, TokenDtype, TokenizerConfig, ValidationConfig,
};
use std::path::{Path, PathBuf};

/// `model_folder`: the model's Hugging Face folder, where the tokenizer is taken from when
/// `data.tokenizer.path` is not given.
pub fn resolve_data(
    s: &Section,
    model: &ModelConfig,
    seq_len: u64,
    model_folder: Option<&Path>,
) -> Result<DataConfig, ResolveError> {
    let Some(spec) = &s.spec().training.data else {
        return Ok(DataConfig::Synthetic { seq_len });
    };
    check_keys(s, spec)?;
    if spec.kind == DataKind::Synthetic {
        return Ok(DataConfig::Synthetic { seq_len });
    }
    if let ModelConfig::Mlp { .. } = model {
        return Err(s.err(
            "training.data.kind",
            format!(
                "`{}` data is token sequences; the MLP trains on synthetic vectors",
                kind_name(spec.kind)
            ),
            "use `kind: synthetic` with the MLP, or a transformer model",
        ));
    }
    let files = match &spec.files {
        Some(files) if !files.is_empty() => files.iter().map(|f| s.spec_relative(f)).collect(),
        _ => {
            return Err(s.err(
                "training.data.files",
                format!("`{}` data needs files", kind_name(spec.kind)),
                "add `files: [data/*.txt]` (paths or glob patterns, relative to the spec file)",
            ))
        }
    };
    let source = source(s, spec, files)?;
    let tokenizer = tokenizer(s, spec, model_folder)?;
    let document_mask = spec.document_mask.unwrap_or(false);
    if document_mask && !model.supports_document_mask() {
        return Err(s.err(
            "training.data.document_mask",
            "this model has learned absolute positions and a plain causal mask: it cannot keep \
             attention within documents",
            "remove `document_mask` (documents are still separated by the end-of-document token), \
             or use a model that takes document ids",
        ));
    }
    let validation = validation(s, spec)?;
    let cache_dir = match &spec.cache_dir {
        Some(dir) => s.spec_relative(dir),
        None => {
            let root = s
                .spec()
                .run_root
                .clone()
                .unwrap_or_else(|| PathBuf::from(defaults::RUN_ROOT));
            std::path::absolute(&root)
                .unwrap_or(root)
                .join(defaults::DATA_CACHE_DIR)
        }
    };
    Ok(DataConfig::Dataset(Box::new(DatasetConfig {
        source,
        seq_len,
        tokenizer,
        packing: spec.packing.unwrap_or(Packing::Stream),
        document_mask,
        shuffle: spec.shuffle.unwrap_or(true),
        validation,
        cache_dir,
        on_bad_record: spec.on_bad_record.unwrap_or(OnBadRecord::Stop),
    })))
}

fn kind_name(kind: DataKind) -> &'static str {
    match kind {
        DataKind::Synthetic => "synthetic",
        DataKind::Text => "text",
        DataKind::Jsonl => "jsonl",
        DataKind::Chat => "chat",
        DataKind::Tokens => "tokens",
    }
}

/// Every key written must apply to the kind.
fn check_keys(s: &Section, spec: &DataSpec) -> Result<(), ResolveError> {
    use DataKind::*;
    let documents = [Text, Jsonl, Chat, Tokens];
    let text = [Text, Jsonl, Chat];
    let keys: [(&str, bool, &[DataKind]); 16] = [
        ("files", spec.files.is_some(), &documents),
        ("split", spec.split.is_some(), &[Text]),
        ("separator", spec.separator.is_some(), &[Text]),
        ("field", spec.field.is_some(), &[Jsonl]),
        ("prompt_field", spec.prompt_field.is_some(), &[Jsonl]),
        (
            "completion_field",
            spec.completion_field.is_some(),
            &[Jsonl],
        ),
        ("messages_field", spec.messages_field.is_some(), &[Chat]),
        ("chat_template", spec.chat_template.is_some(), &[Chat]),
        ("dtype", spec.dtype.is_some(), &[Tokens]),
        ("tokenizer", spec.tokenizer.is_some(), &text),
        ("packing", spec.packing.is_some(), &documents),
        ("document_mask", spec.document_mask.is_some(), &documents),
        ("shuffle", spec.shuffle.is_some(), &documents),
        ("validation", spec.validation.is_some(), &documents),
        ("cache_dir", spec.cache_dir.is_some(), &documents),
        ("on_bad_record", spec.on_bad_record.is_some(), &documents),
    ];
    for (key, written, kinds) in keys {
        if written && !kinds.contains(&spec.kind) {
            let names: Vec<&str> = kinds.iter().map(|k| kind_name(*k)).collect();
            return Err(s.err(
                &format!("training.data.{key}"),
                format!(
                    "`{key}` does not apply to `{}` data (it applies to {})",
                    kind_name(spec.kind),
                    names.join(", ")
                ),
                format!("remove `{key}`, or change `kind`"),
            ));
        }
    }
    Ok(())
}

fn source(s: &Section, spec: &DataSpec, files: Vec<PathBuf>) -> Result<DataSource, ResolveError> {
    Ok(match spec.kind {
        DataKind::Text => {
            let split = match (spec.split, &spec.separator) {
                (None | Some(TextSplitKind::Separator), Some(separator)) => {
                    if separator.is_empty() {
                        return Err(s.err(
                            "training.data.separator",
                            "the separator is empty",
                            "write the string between documents, e.g. `separator: \"<|endoftext|>\"`",
                        ));
                    }
                    TextSplit::Separator {
                        separator: separator.clone(),
                    }
                }
                (Some(TextSplitKind::Separator), None) => {
                    return Err(s.err(
                        "training.data.split",
                        "`split: separator` needs the separator",
                        "add `separator: \"\\n\\n\"` (the string between documents)",
                    ))
                }
                (Some(split), Some(_)) => {
                    return Err(s.err(
                        "training.data.separator",
                        format!("`separator` is only used with `split: separator`, not {split:?}")
                            .to_lowercase(),
                        "remove `separator`, or set `split: separator`",
                    ))
                }
                (None | Some(TextSplitKind::File), None) => TextSplit::File,
                (Some(TextSplitKind::Line), None) => TextSplit::Line,
            };
            DataSource::Text { files, split }
        }
        DataKind::Jsonl => {
            let text = match (&spec.field, &spec.prompt_field, &spec.completion_field) {
                (None, Some(prompt), Some(completion)) => JsonlText::PromptCompletion {
                    prompt: prompt.clone(),
                    completion: completion.clone(),
                },
                (Some(_), Some(_), _) | (Some(_), _, Some(_)) => return Err(s.err(
                    "training.data.field",
                    "`field` (train on all of one field) and `prompt_field`/`completion_field` \
                         (train on the completion) exclude each other",
                    "keep one of them",
                )),
                (None, Some(_), None) | (None, None, Some(_)) => {
                    return Err(s.err(
                        "training.data.prompt_field",
                        "prompt/completion records need both fields",
                        "give both `prompt_field` and `completion_field`",
                    ))
                }
                (field, None, None) => JsonlText::Field {
                    field: field.clone().unwrap_or_else(|| "text".into()),
                },
            };
            DataSource::Jsonl { files, text }
        }
        DataKind::Chat => DataSource::Chat {
            files,
            messages_field: spec
                .messages_field
                .clone()
                .unwrap_or_else(|| "messages".into()),
            chat_template: spec.chat_template.as_deref().map(|p| s.spec_relative(p)),
        },
        DataKind::Tokens => DataSource::Tokens {
            files,
            dtype: spec.dtype.unwrap_or(TokenDtype::U16),
        },
        DataKind::Synthetic => unreachable!("synthetic data has no source"),
    })
}

fn tokenizer(
    s: &Section,
    spec: &DataSpec,
    model_folder: Option<&Path>,
) -> Result<TokenizerConfig, ResolveError> {
    if spec.kind == DataKind::Tokens {
        return Ok(TokenizerConfig::PreTokenized);
    }
    let t = spec.tokenizer.as_ref();
    match t.and_then(|t| t.kind).unwrap_or(TokenizerKind::Hf) {
        TokenizerKind::Bytes => {
            if t.is_some_and(|t| t.path.is_some() || t.eos_token.is_some() || t.bos_token.is_some())
            {
                return Err(s.err(
                    "training.data.tokenizer",
                    "the byte tokenizer has no folder and fixed special tokens (end of document = 256)",
                    "remove `path`, `eos_token` and `bos_token`, or use `kind: hf`",
                ));
            }
            Ok(TokenizerConfig::Bytes)
        }
        TokenizerKind::Hf => {
            let path =
                match (t.and_then(|t| t.path.as_deref()), model_folder) {
                    (Some(path), _) => s.spec_relative(path),
                    (None, Some(folder)) => folder.to_path_buf(),
                    (None, None) => return Err(s.err(
                        "training.data.tokenizer",
                        "text data needs a tokenizer and the model has no folder to take it from",
                        "add `tokenizer: { path: <folder with tokenizer.json> }` (a Hugging Face \
                         model or tokenizer folder), or `tokenizer: { kind: bytes }`",
                    )),
                };
            Ok(TokenizerConfig::HuggingFace {
                path,
                bos_token: t.and_then(|t| t.bos_token.clone()),
                eos_token: t.and_then(|t| t.eos_token.clone()),
            })
        }
    }
}

fn validation(s: &Section, spec: &DataSpec) -> Result<Option<ValidationConfig>, ResolveError> {
    let Some(v) = &spec.validation else {
        return Ok(None);
    };
    let held_out = match (v.fraction, &v.files) {
        (Some(fraction), None) => {
            if !(fraction > 0.0 && fraction < 1.0) {
                return Err(s.err(
                    "training.data.validation.fraction",
                    format!("fraction {fraction} is not between 0 and 1"),
                    "hold out a fraction like 0.01 (1% of the documents)",
                ));
            }
            HeldOut::Fraction { fraction }
        }
        (None, Some(files)) if !files.is_empty() => HeldOut::Files {
            files: files.iter().map(|f| s.spec_relative(f)).collect(),
        },
        (Some(_), Some(_)) => {
            return Err(s.err(
                "training.data.validation",
                "`fraction` and `files` exclude each other",
                "hold out a fraction of the training documents, or evaluate on separate files",
            ))
        }
        _ => {
            return Err(s.err(
                "training.data.validation",
                "the validation data is not given",
                "add `fraction: 0.01` (held-out documents) or `files: [val.jsonl]`",
            ))
        }
    };
    if v.every_steps == Some(0) {
        return Err(s.err(
            "training.data.validation.every_steps",
            "`every_steps` is 0",
            "evaluate every N ≥ 1 steps, or leave it out to evaluate after the last step only",
        ));
    }
    Ok(Some(ValidationConfig {
        held_out,
        every_steps: v.every_steps,
        max_batches: v.max_batches.filter(|&n| n > 0),
    }))
}

#[cfg(test)]
mod tests {
    use crate::resolve::{resolve, Overrides, ResolveError};
    use crate::spec::parse;
    use shardrun_protocol::config::*;
    use std::path::Path;

    fn data(yaml: &str) -> Result<DataConfig, ResolveError> {
        let spec = format!(
            "name: t\nrun_root: /tmp/runs\ntraining:\n  model: {{ kind: transformer, vocab_size: 300, dim: 8, n_layers: 1, n_heads: 2, max_seq_len: 16 }}\n  data:\n{yaml}  steps: 2\n  total_batch_size: 2\n  batch_size_per_device: 2\n"
        );
        let loaded = parse(&spec, Path::new("/jobs/job.yaml")).map_err(ResolveError::from)?;
        resolve(&loaded, &Overrides::default()).map(|j| j.train.data)
    }

    fn err(yaml: &str) -> crate::spec::SpecError {
        let ResolveError::Invalid(e) = data(yaml).unwrap_err();
        e
    }

    #[test]
    fn every_default_is_explicit() {
        let DataConfig::Dataset(d) = data(
            "    kind: jsonl\n    files: [d/*.jsonl]\n    tokenizer: { path: tok }\n    validation: { fraction: 0.1, every_steps: 5 }\n",
        )
        .unwrap() else {
            panic!("dataset expected")
        };
        assert_eq!(
            d.source,
            DataSource::Jsonl {
                files: vec!["/jobs/d/*.jsonl".into()],
                text: JsonlText::Field {
                    field: "text".into()
                }
            }
        );
        assert_eq!(
            d.tokenizer,
            TokenizerConfig::HuggingFace {
                path: "/jobs/tok".into(),
                bos_token: None,
                eos_token: None
            }
        );
        assert_eq!(d.seq_len, 16);
        assert_eq!(
            (d.packing, d.shuffle, d.document_mask),
            (Packing::Stream, true, false)
        );
        assert_eq!(d.cache_dir, Path::new("/tmp/runs/data-cache"));
        assert_eq!(d.on_bad_record, OnBadRecord::Stop);
        assert_eq!(
            d.validation.unwrap().held_out,
            HeldOut::Fraction { fraction: 0.1 }
        );
    }

    #[test]
    fn keys_that_do_not_apply_are_located_errors() {
        let e = err(
            "    kind: text\n    files: [a.txt]\n    tokenizer: { kind: bytes }\n    field: body\n",
        );
        assert_eq!(e.field, "training.data.field");
        assert_eq!(e.line, Some(9));
        assert!(
            e.why
                .contains("`field` does not apply to `text` data (it applies to jsonl)"),
            "{e}"
        );

        let e = err("    kind: jsonl\n    files: [a.jsonl]\n    tokenizer: { kind: bytes }\n    prompt_field: q\n");
        assert!(
            e.fix.contains("both `prompt_field` and `completion_field`"),
            "{e}"
        );

        let e = err("    kind: text\n    files: [a.txt]\n");
        assert_eq!(e.field, "training.data.tokenizer");
        assert!(e.fix.contains("tokenizer: { path:"), "{e}");

        let e = err("    kind: tokens\n    files: [a.bin]\n    document_mask: true\n");
        assert_eq!(e.field, "training.data.document_mask");

        let e = err("    kind: chat\n    tokenizer: { path: t }\n");
        assert_eq!(e.field, "training.data.files");

        let e = err("    kind: text\n    files: [a.txt]\n    tokenizer: { kind: bytes }\n    validation: { fraction: 1.5 }\n");
        assert_eq!(e.field, "training.data.validation.fraction");
    }

    #[test]
    fn text_split_and_tokens() {
        let DataConfig::Dataset(d) = data(
            "    kind: text\n    files: [a.txt]\n    separator: \"<|endoftext|>\"\n    tokenizer: { kind: bytes }\n",
        )
        .unwrap() else {
            panic!()
        };
        assert_eq!(
            d.source,
            DataSource::Text {
                files: vec!["/jobs/a.txt".into()],
                split: TextSplit::Separator {
                    separator: "<|endoftext|>".into()
                }
            }
        );
        assert_eq!(d.tokenizer, TokenizerConfig::Bytes);
        let DataConfig::Dataset(d) =
            data("    kind: tokens\n    files: [/data/train.bin]\n").unwrap()
        else {
            panic!()
        };
        assert_eq!(d.tokenizer, TokenizerConfig::PreTokenized);
        assert!(matches!(
            d.source,
            DataSource::Tokens {
                dtype: TokenDtype::U16,
                ..
            }
        ));
    }
}
