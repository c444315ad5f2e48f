//! Training data: the `training.data` section checked key by key against its `kind`, paths
//! made absolute (relative to the spec file), every default applied, and what the paths name
//! looked at on disk: every `files` pattern matches a file, the tokenizer folder holds a
//! `tokenizer.json`, chat data has a template (the `chat_template` file exists, or the
//! tokenizer folder has one), the tokenizer loads with the special tokens the spec names.
//! So a wrong path or token fails in `plan`, not after the queue wait. No data is read or
//! tokenized here: that happens when the data is prepared (`shardrun prepare`, or the job's
//! controller before launch).

use super::{defaults, ResolveError, Section};
use crate::spec::{DataKind, DataSpec, TextSplitKind, TokenizerKind};
use shardrun_data::chat::{ChatTemplate, RENDER_ARGUMENTS};
use shardrun_data::DataError;
use shardrun_protocol::config::{
    DataConfig, DataSource, DatasetConfig, HeldOut, JsonlText, ModelConfig, OnBadRecord, Packing,
    TextSplit, TokenDtype, TokenizerConfig, ValidationConfig,
};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

/// `model_folder`: the model's Hugging Face folder, where the tokenizer is taken from when
/// `data.tokenizer.path` is not given. `on_disk` keeps what each path was found to hold.
pub fn resolve_data(
    s: &Section,
    model: &ModelConfig,
    seq_len: u64,
    model_folder: Option<&Path>,
    on_disk: &mut OnDisk,
    warnings: &mut Vec<String>,
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
    let packing = spec.packing.unwrap_or(Packing::Stream);
    let truncate = spec.truncate.unwrap_or(false);
    if truncate && packing == Packing::Stream {
        let stream = if spec.packing.is_some() {
            "with `packing: stream`"
        } else {
            "`packing` is `stream` unless set (pre-training text):"
        };
        // Blamed on what was given last: a `--set` of the packing over a file that truncates.
        let (packing_set, truncate_set) = (
            s.overridden("training.data.packing"),
            s.overridden("training.data.truncate"),
        );
        if packing_set && !truncate_set {
            return Err(s.err(
                "training.data.packing",
                "with `packing: stream` a document longer than `seq_len` continues into the \
                 next sequence, so the spec's `truncate: true` has nothing to cut",
                "keep `packing: whole_documents` for fine-tuning examples, or also give \
                 `--set training.data.truncate=false`",
            ));
        }
        return Err(s.err(
            "training.data.truncate",
            format!(
                "{stream} a document longer than `seq_len` continues into the next sequence, \
                 so nothing is cut"
            ),
            "add `packing: whole_documents` (fine-tuning examples, as TRL packs them: each \
             whole in a sequence, the longer ones truncated), or remove `truncate`",
        ));
    }
    // Fine-tuning examples streamed by default: said, since every SFT trainer (TRL,
    // torchtune, axolotl) keeps an example whole unless told to pack.
    let examples = match &source {
        DataSource::Chat { .. } => Some("conversations"),
        DataSource::Jsonl {
            text: JsonlText::PromptCompletion { .. },
            ..
        } => Some("prompt/completion records"),
        _ => None,
    };
    if let (Some(examples), None) = (examples, spec.packing) {
        warnings.push(format!(
            "`training.data.packing` is `stream` unless set (pre-training text): the {examples} \
             are packed back to back, cut every `seq_len` and attend to those before them; add \
             `packing: whole_documents` and `truncate: true` to train each one whole and on its \
             own, as TRL's SFT does, or `packing: stream` to keep this and not be told"
        ));
    }
    // Whole documents are fine-tuning examples: each sees only itself, at positions from 0,
    // as in TRL's packing and torchtune's packed datasets. A stream is pre-training text, cut
    // wherever `seq_len` falls, as torchtitan trains it: causal across the cut documents.
    let document_mask = spec
        .document_mask
        .unwrap_or(packing == Packing::WholeDocuments && model.supports_document_mask());
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
    check_on_disk(s, spec, &source, &tokenizer, validation.as_ref(), on_disk)?;
    let from_folder = model_folder.is_some();
    check_tokenizer(s, spec, model, from_folder, &tokenizer, on_disk, warnings)?;
    let cache_dir = match &spec.cache_dir {
        Some(dir) => s.spec_relative(dir),
        None => {
            let root = super::run_root(s.spec());
            std::path::absolute(&root)
                .unwrap_or(root)
                .join(defaults::DATA_CACHE_DIR)
        }
    };
    Ok(DataConfig::Dataset(Box::new(DatasetConfig {
        source,
        seq_len,
        tokenizer,
        packing,
        truncate,
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
    let keys: [(&str, bool, &[DataKind]); 18] = [
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
        (
            "chat_template_kwargs",
            spec.chat_template_kwargs.is_some(),
            &[Chat],
        ),
        ("dtype", spec.dtype.is_some(), &[Tokens]),
        ("tokenizer", spec.tokenizer.is_some(), &text),
        ("packing", spec.packing.is_some(), &documents),
        ("truncate", spec.truncate.is_some(), &documents),
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
        DataKind::Chat => {
            let chat_template_kwargs = spec.chat_template_kwargs.clone().unwrap_or_default();
            if let Some(name) = chat_template_kwargs
                .keys()
                .find(|name| RENDER_ARGUMENTS.contains(&name.as_str()))
            {
                return Err(s.err(
                    &format!("training.data.chat_template_kwargs.{name}"),
                    format!("`{name}` is set by shardrun for every record"),
                    format!(
                        "remove `{name}`: the template sees {} from each record",
                        RENDER_ARGUMENTS.join(", ")
                    ),
                ));
            }
            DataSource::Chat {
                files,
                messages_field: spec
                    .messages_field
                    .clone()
                    .unwrap_or_else(|| "messages".into()),
                chat_template: spec.chat_template.as_deref().map(|p| s.spec_relative(p)),
                chat_template_kwargs,
            }
        }
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

/// What the data's paths hold on disk, looked at once per path: a sweep's points name the
/// same files, and a pattern like `/usr/lib/**/*.py` walks folders until it finds one.
#[derive(Default)]
pub struct OnDisk {
    found: HashMap<(Lookup, PathBuf), Option<Problem>>,
    /// What each tokenizer can produce, or why it did not load.
    tokenizers: Vec<(TokenizerConfig, Result<TokenizerIds, LoadFailure>)>,
}

/// The ids a tokenizer can give, against which a model's vocabulary is checked.
#[derive(Clone)]
struct TokenizerIds {
    vocab_size: u64,
    /// The end-of-document token, which every document ends with.
    eos: (u32, String),
}

/// Why a tokenizer did not load, as the data reader would stop on it.
#[derive(Clone)]
enum LoadFailure {
    /// The spec names a special token (`key`: `eos_token` or `bos_token`) it does not have.
    SpecToken {
        key: String,
        why: String,
    },
    Other(String),
}

#[derive(Clone, Copy, PartialEq, Eq, Hash)]
enum Lookup {
    Files,
    Tokenizer,
    ChatTemplate,
    /// A tokenizer folder's own chat templates.
    FolderChatTemplates,
}

/// Why a path will not do, and what to write instead (without the field, added where it is
/// reported).
#[derive(Clone)]
struct Problem {
    why: String,
    fix: String,
}

impl OnDisk {
    fn problem(&mut self, lookup: Lookup, path: &Path) -> Option<Problem> {
        self.found
            .entry((lookup, path.to_path_buf()))
            .or_insert_with(|| match lookup {
                Lookup::Files => files_problem(path),
                Lookup::Tokenizer => tokenizer_problem(path),
                Lookup::ChatTemplate => chat_template_problem(path),
                Lookup::FolderChatTemplates => folder_chat_template_problem(path),
            })
            .clone()
    }
}

impl OnDisk {
    fn tokenizer_ids(&mut self, tokenizer: &TokenizerConfig) -> Result<TokenizerIds, LoadFailure> {
        if let Some((_, ids)) = self.tokenizers.iter().find(|(t, _)| t == tokenizer) {
            return ids.clone();
        }
        let ids = match shardrun_data::tokenizer::TextTokenizer::load(tokenizer) {
            Ok(loaded) => Ok(TokenizerIds {
                vocab_size: loaded.vocab_size,
                eos: (loaded.eos.id, loaded.eos.text),
            }),
            Err(DataError::UnknownSpecToken {
                path,
                key,
                token,
                special,
            }) => Err(LoadFailure::SpecToken {
                why: format!(
                    "the tokenizer {} has no token `{token}`{special}",
                    path.display()
                ),
                key,
            }),
            Err(e) => Err(LoadFailure::Other(e.to_string())),
        };
        self.tokenizers.push((tokenizer.clone(), ids.clone()));
        ids
    }
}

/// The tokenizer must load, with the special tokens the spec names, and its ids must fit the
/// model's embedding. The end-of-document token ends every document: past the vocabulary, it
/// fails the job at its first step, so it is refused here, before the job waits in a queue.
/// Other ids past it (an added pad token, say) fail the job only if the data holds them: a
/// warning.
fn check_tokenizer(
    s: &Section,
    spec: &DataSpec,
    model: &ModelConfig,
    from_folder: bool,
    tokenizer: &TokenizerConfig,
    on_disk: &mut OnDisk,
    warnings: &mut Vec<String>,
) -> Result<(), ResolveError> {
    let resize = if from_folder {
        "give the model rows for them with transformers \
         (`model.resize_token_embeddings(len(tokenizer))`, then `save_pretrained`)"
    } else {
        "raise the model's `vocab_size`"
    };
    let path = match tokenizer {
        TokenizerConfig::HuggingFace { path, .. } => path,
        // Every document ends with id 256: known without reading any data.
        TokenizerConfig::Bytes => {
            // Its end-of-document id is its largest.
            let eos = u64::from(shardrun_data::tokenizer::BYTES_EOS);
            return match model.vocab_size().filter(|&vocab| vocab <= eos) {
                Some(vocab) => Err(s.err(
                    TOKENIZER_FROM_MODEL,
                    format!(
                        "the byte tokenizer's ids run to {eos}, its end-of-document token, \
                         past the model's vocabulary of {vocab}"
                    ),
                    format!("{resize} (at least {})", eos + 1),
                )),
                None => Ok(()),
            };
        }
        TokenizerConfig::PreTokenized => return Ok(()),
    };
    let field = tokenizer_field(spec);
    let ids =
        match on_disk.tokenizer_ids(tokenizer) {
            Ok(ids) => ids,
            Err(LoadFailure::SpecToken { key, why }) => {
                return Err(s.err(
                    &format!("training.data.tokenizer.{key}"),
                    why,
                    format!(
                    "name one of its tokens, or remove `{key}` to take the one its folder names"
                ),
                ))
            }
            Err(LoadFailure::Other(why)) => return Err(s.err(
                field,
                why,
                "correct the file it names as said, or point `training.data.tokenizer.path` at \
                 another tokenizer folder",
            )),
        };
    let Some(vocab) = model.vocab_size().filter(|&vocab| ids.vocab_size > vocab) else {
        return Ok(());
    };
    let sizes = format!(
        "the tokenizer {} has {} ids, the model's vocabulary {}",
        path.display(),
        ids.vocab_size,
        vocab
    );
    let (eos_id, eos_text) = &ids.eos;
    if u64::from(*eos_id) >= vocab {
        return Err(s.err(
            field,
            format!("{sizes}, and its end-of-document token {eos_text:?} (id {eos_id}) is past it"),
            format!("use the tokenizer the model was trained with, or {resize}"),
        ));
    }
    warnings.push(format!(
        "`{field}`: {sizes}: a document holding ids {vocab} or above fails the job; use the \
         tokenizer the model was trained with, or {resize}"
    ));
    Ok(())
}

/// The field a tokenizer error points at: the path the spec gives, or (the model folder's
/// tokenizer) the `tokenizer` setting, where a path would be added.
fn tokenizer_field(spec: &DataSpec) -> &'static str {
    if spec.tokenizer.as_ref().is_some_and(|t| t.path.is_some()) {
        "training.data.tokenizer.path"
    } else {
        TOKENIZER_FROM_MODEL
    }
}

const TOKENIZER_FROM_MODEL: &str = "training.data.tokenizer";

/// Every path of the resolved data, as the worker will read it; an error names the spec
/// field (the list entry for a pattern).
fn check_on_disk(
    s: &Section,
    spec: &DataSpec,
    source: &DataSource,
    tokenizer: &TokenizerConfig,
    validation: Option<&ValidationConfig>,
    on_disk: &mut OnDisk,
) -> Result<(), ResolveError> {
    let at = |field: String, p: Problem| s.err(&field, p.why, p.fix);
    for (i, pattern) in source.files().iter().enumerate() {
        if let Some(p) = on_disk.problem(Lookup::Files, pattern) {
            return Err(at(format!("training.data.files[{i}]"), p));
        }
    }
    if let Some(HeldOut::Files { files }) = validation.map(|v| &v.held_out) {
        for (i, pattern) in files.iter().enumerate() {
            if let Some(p) = on_disk.problem(Lookup::Files, pattern) {
                return Err(at(format!("training.data.validation.files[{i}]"), p));
            }
        }
    }
    if let TokenizerConfig::HuggingFace { path, .. } = tokenizer {
        if let Some(mut p) = on_disk.problem(Lookup::Tokenizer, path) {
            let field = tokenizer_field(spec);
            if field == TOKENIZER_FROM_MODEL {
                // The folder is the model's: the way out is naming another.
                p.why = format!(
                    "{} data takes its tokenizer from the model's folder: {}",
                    kind_name(spec.kind),
                    p.why
                );
                p.fix = format!(
                    "{}; or add `tokenizer: {{ path: <folder with tokenizer.json> }}` to `data`",
                    p.fix
                );
            }
            return Err(at(field.into(), p));
        }
    }
    if let DataSource::Chat { chat_template, .. } = source {
        match (chat_template, tokenizer) {
            (Some(path), _) => {
                if let Some(p) = on_disk.problem(Lookup::ChatTemplate, path) {
                    return Err(at("training.data.chat_template".into(), p));
                }
            }
            (None, TokenizerConfig::HuggingFace { path, .. }) => {
                let folder = shardrun_data::tokenizer::tokenizer_folder(path);
                if let Some(p) = on_disk.problem(Lookup::FolderChatTemplates, &folder) {
                    return Err(at("training.data".into(), p));
                }
            }
            (None, _) => {
                return Err(s.err(
                    "training.data",
                    "chat data is rendered with a chat template, and the byte tokenizer has no \
                     folder to take one from",
                    "name a Jinja file in `chat_template` (relative paths are relative to the \
                     job spec's folder), or use a Hugging Face tokenizer folder that has a \
                     template",
                ))
            }
        }
    }
    Ok(())
}

/// Why `pattern` names no file, as the data reader would find it.
fn files_problem(pattern: &Path) -> Option<Problem> {
    let shown = pattern.display();
    let relative = "relative paths are relative to the job spec's folder";
    let error = shardrun_data::files::check(pattern).err()?;
    Some(match error {
        DataError::NoFiles { .. } => {
            // Say where the path stops existing, or which file was likely meant.
            let literal: PathBuf = pattern
                .components()
                .take_while(|c| !shardrun_data::files::is_glob(&c.as_os_str().to_string_lossy()))
                .collect();
            let is_literal = literal == pattern;
            let folder = if is_literal {
                literal.parent().map(Path::to_path_buf).unwrap_or_default()
            } else {
                literal
            };
            let fix = if !folder.is_dir() {
                format!("check the path: {} does not exist ({relative})", folder.display())
            } else if let Some(near) = is_literal
                .then(|| nearest_file(&folder, pattern.file_name()?.to_str()?))
                .flatten()
            {
                format!("did you mean {}?", folder.join(near).display())
            } else {
                format!("check the path ({relative})")
            };
            Problem {
                why: format!("no file matches {shown}"),
                fix,
            }
        }
        DataError::Folder { path } => Problem {
            why: format!("{shown} is a folder"),
            fix: match most_common_extension(&path) {
                Some(ext) => format!("name the files in it with a pattern: `{shown}/*.{ext}`, or `{shown}/**/*.{ext}` at any depth"),
                None => format!("name the files in it with a pattern: `{shown}/**/*` for every file at any depth"),
            },
        },
        DataError::Pattern { why, .. } => Problem {
            why: format!("{shown} is not a valid file pattern: {why}"),
            fix: "write a path, or a pattern with `*`, `?`, `[abc]` and `**` (any depth)".into(),
        },
        other => Problem {
            why: other.to_string(),
            fix: "check the path and its permissions".into(),
        },
    })
}

/// The extension most of the files directly in `folder` have, for a pattern that names
/// them (the first in order among equally common ones).
fn most_common_extension(folder: &Path) -> Option<String> {
    let mut counts = std::collections::BTreeMap::<String, usize>::new();
    for entry in std::fs::read_dir(folder).ok()?.flatten() {
        let path = entry.path();
        if path.is_file() {
            if let Some(ext) = path.extension().and_then(|e| e.to_str()) {
                *counts.entry(ext.to_string()).or_default() += 1;
            }
        }
    }
    let most = *counts.values().max()?;
    counts
        .into_iter()
        .find(|&(_, n)| n == most)
        .map(|(ext, _)| ext)
}

/// The name in `folder` closest to `name`, if it is close enough to be a typo.
fn nearest_file(folder: &Path, name: &str) -> Option<String> {
    let names: Vec<String> = std::fs::read_dir(folder)
        .ok()?
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .collect();
    let candidates: Vec<&str> = names.iter().map(String::as_str).collect();
    crate::spec::did_you_mean(name, &candidates).map(str::to_string)
}

/// Why `path` is not a tokenizer the data reader loads: it reads `tokenizer.json` (the
/// folder's, or the file named), never a SentencePiece model.
fn tokenizer_problem(path: &Path) -> Option<Problem> {
    let sentencepiece = |folder: &Path| Problem {
        why: format!(
            "{} holds a SentencePiece `tokenizer.model` but no `tokenizer.json`, which is what \
             shardrun reads",
            folder.display()
        ),
        fix: format!(
            "write the folder's tokenizer.json once, with transformers (which reads a \
             SentencePiece model with two more packages: `pip install transformers \
             sentencepiece protobuf`): `python -c \"from transformers import AutoTokenizer; \
             AutoTokenizer.from_pretrained('{0}').save_pretrained('{0}')\"`",
            folder.display()
        ),
    };
    let folder = if path.is_dir() {
        path
    } else if path.is_file() {
        // The file itself: anything but a SentencePiece model is left to the reader.
        return match path.extension().is_some_and(|e| e == "model") {
            true => Some(sentencepiece(path.parent().unwrap_or(Path::new(".")))),
            false => None,
        };
    } else {
        match path.parent().filter(|_| path.ends_with("tokenizer.json")) {
            Some(folder) if folder.is_dir() => folder,
            _ => {
                return Some(Problem {
                    why: format!("the tokenizer {} does not exist", path.display()),
                    fix: "name the folder that holds `tokenizer.json` (a Hugging Face model or \
                          tokenizer folder; relative paths are relative to the job spec's \
                          folder), or use `tokenizer: { kind: bytes }`"
                        .into(),
                })
            }
        }
    };
    if folder.join("tokenizer.json").is_file() {
        return None;
    }
    if folder.join("tokenizer.model").is_file() {
        return Some(sentencepiece(folder));
    }
    Some(Problem {
        why: format!("{} holds no `tokenizer.json`", folder.display()),
        fix: "name the folder where `transformers` saved the model's tokenizer \
              (`save_pretrained` writes tokenizer.json), or the tokenizer.json file itself"
            .into(),
    })
}

fn chat_template_problem(path: &Path) -> Option<Problem> {
    let why = if path.is_file() {
        // A template that does not compile would fail the job on its first record.
        let compiled = std::fs::read_to_string(path)
            .map_err(|e| DataError::ChatTemplate {
                path: path.to_path_buf(),
                why: format!("cannot be read: {e}"),
            })
            .and_then(|source| {
                ChatTemplate::from_source(path.to_path_buf(), source, &BTreeMap::new())
            });
        return compiled.err().map(|e| Problem {
            why: e.to_string(),
            fix: "fix the template (`transformers` would refuse it too), or remove \
                  `chat_template` to use the tokenizer folder's"
                .into(),
        });
    } else if path.is_dir() {
        format!("the chat template {} is a folder", path.display())
    } else {
        format!("the chat template {} does not exist", path.display())
    };
    Some(Problem {
        why,
        fix: "name a Jinja file (relative paths are relative to the job spec's folder), or \
              remove `chat_template` to use the tokenizer folder's template"
            .into(),
    })
}

/// Why chat data cannot take its template from the tokenizer folder `folder`, as the data
/// reader looks for one.
fn folder_chat_template_problem(folder: &Path) -> Option<Problem> {
    let error = shardrun_data::chat::templates_in_folder(folder)
        .and_then(|templates| ChatTemplate::from_templates(templates, &BTreeMap::new()))
        .err()?;
    Some(match error {
        DataError::NoChatTemplate { .. } => Problem {
            why: format!(
                "chat data is rendered with a chat template, and the tokenizer folder {} has \
                 none (no chat_template.jinja, no additional_chat_templates/, no \
                 `chat_template` in tokenizer_config.json)",
                folder.display()
            ),
            fix: "add `chat_template: <file.jinja>` to `data` (a Jinja template as \
                  `transformers` uses; relative paths are relative to the job spec's folder), \
                  or use a tokenizer folder saved with its template (`save_pretrained` writes \
                  chat_template.jinja)"
                .into(),
        },
        other => Problem {
            why: other.to_string(),
            fix: "fix the tokenizer folder's template files, or name a Jinja file in \
                  `chat_template` to use instead"
                .into(),
        },
    })
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
    if v.max_batches == Some(0) {
        return Err(s.err(
            "training.data.validation.max_batches",
            "`max_batches` is 0",
            "evaluate on N ≥ 1 batches, leave it out to evaluate on all of the validation data, \
             or remove `validation` to train without evaluating",
        ));
    }
    Ok(Some(ValidationConfig {
        held_out,
        every_steps: v.every_steps,
        max_batches: v.max_batches,
    }))
}

#[cfg(test)]
mod tests {
    use crate::resolve::{resolve, Overrides, ResolveError, ResolvedJob};
    use crate::spec::parse;
    use shardrun_protocol::config::*;
    use std::path::Path;

    /// A folder with the files the specs below name: `d/x.jsonl`, `a.txt`, `a.jsonl`,
    /// `train.bin`, `tok/tokenizer.json` and `chat.jinja`.
    fn jobs() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("d")).unwrap();
        std::fs::create_dir_all(dir.path().join("tok")).unwrap();
        for file in ["d/x.jsonl", "a.txt", "a.jsonl", "train.bin", "chat.jinja"] {
            std::fs::write(dir.path().join(file), "{}").unwrap();
        }
        bytes_tokenizer(&dir.path().join("tok"), "<eos>");
        dir
    }

    /// The byte tokenizer (257 ids: the bytes and `<eos>`) saved as a Hugging Face folder
    /// whose end of document is `eos`.
    fn bytes_tokenizer(folder: &Path, eos: &str) {
        std::fs::create_dir_all(folder).unwrap();
        let json = shardrun_data::tokenizer_files::bytes_tokenizer_json().unwrap();
        std::fs::write(folder.join("tokenizer.json"), json).unwrap();
        let config = serde_json::json!({ "eos_token": eos }).to_string();
        std::fs::write(folder.join("tokenizer_config.json"), config).unwrap();
    }

    fn data_in(dir: &Path, yaml: &str) -> Result<DataConfig, ResolveError> {
        let spec = format!(
            "name: t\nrun_root: /tmp/runs\ntraining:\n  model: {{ kind: transformer, vocab_size: 300, dim: 8, n_layers: 1, n_heads: 2, max_seq_len: 16 }}\n  data:\n{yaml}  steps: 2\n  total_batch_size: 2\n  batch_size_per_device: 2\n"
        );
        let loaded = parse(&spec, &dir.join("job.yaml")).map_err(ResolveError::from)?;
        resolve(&loaded, &Overrides::default()).map(|j| j.train.data)
    }

    fn data(yaml: &str) -> Result<DataConfig, ResolveError> {
        data_in(jobs().path(), yaml)
    }

    fn err(yaml: &str) -> crate::spec::SpecError {
        let ResolveError::Invalid(e) = data(yaml).unwrap_err();
        e
    }

    #[test]
    fn every_default_is_explicit() {
        let dir = jobs();
        let DataConfig::Dataset(d) = data_in(
            dir.path(),
            "    kind: jsonl\n    files: [d/*.jsonl]\n    tokenizer: { path: tok }\n    validation: { fraction: 0.1, every_steps: 5 }\n",
        )
        .unwrap() else {
            panic!("dataset expected")
        };
        assert_eq!(
            d.source,
            DataSource::Jsonl {
                files: vec![dir.path().join("d/*.jsonl")],
                text: JsonlText::Field {
                    field: "text".into()
                }
            }
        );
        assert_eq!(
            d.tokenizer,
            TokenizerConfig::HuggingFace {
                path: dir.path().join("tok"),
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
    fn whole_documents_keep_to_themselves_where_the_model_can() {
        let mask = |model: &str, data: &str| {
            let spec = format!(
                "name: t\nrun_root: /tmp/runs\ntraining:\n  model: {model}\n  data: {{ kind: text, files: [a.txt], tokenizer: {{ kind: bytes }}, seq_len: 8{data} }}\n  steps: 2\n  total_batch_size: 2\n  batch_size_per_device: 2\n"
            );
            let dir = jobs();
            let loaded = parse(&spec, &dir.path().join("job.yaml")).unwrap();
            let job = resolve(&loaded, &Overrides::default()).unwrap();
            let DataConfig::Dataset(d) = &job.train.data else {
                panic!("dataset expected")
            };
            // The plan says it.
            let alone = "each attending only to itself (document_mask)";
            assert_eq!(
                job.summary().contains(alone),
                d.document_mask,
                "{}",
                job.summary()
            );
            d.document_mask
        };
        let llama =
            "{ kind: llama, vocab_size: 300, dim: 16, n_layers: 1, n_heads: 2, ffn_dim: 32 }";
        let transformer =
            "{ kind: transformer, vocab_size: 300, dim: 8, n_layers: 1, n_heads: 2, max_seq_len: 16 }";
        assert!(mask(llama, ", packing: whole_documents"));
        assert!(!mask(
            llama,
            ", packing: whole_documents, document_mask: false"
        ));
        assert!(!mask(llama, ""), "a stream crosses documents");
        assert!(mask(llama, ", document_mask: true"));
        assert!(
            !mask(transformer, ", packing: whole_documents"),
            "absolute positions cannot restart"
        );
    }

    /// The dense mask of packed documents is in the plan where the worker makes one (once
    /// a micro-batch, in the parameter dtype), and the plan says how documents attend.
    #[test]
    fn the_plan_counts_the_dense_document_mask_where_there_is_one() {
        let plan = |resources: &str, dtype: &str, mask: bool| {
            let spec = format!(
                "name: t\nrun_root: /tmp/runs\nresources: {{ {resources} }}\ntraining:\n  model: {{ kind: llama, vocab_size: 300, dim: 64, n_layers: 2, n_heads: 2, ffn_dim: 128 }}\n  data: {{ kind: text, files: [a.txt], tokenizer: {{ kind: bytes }}, seq_len: 1024, packing: whole_documents, document_mask: {mask} }}\n  steps: 2\n  total_batch_size: 6\n  batch_size_per_device: 3\n  fsdp: {{ mixed_precision: {{ param_dtype: {dtype} }} }}\n"
            );
            let dir = jobs();
            let loaded = parse(&spec, &dir.path().join("job.yaml")).unwrap();
            let job = resolve(&loaded, &Overrides::default()).unwrap();
            (job.memory.chosen.at_peak.activations, job.summary())
        };
        let mask_bytes = |dtype_bytes: u64| 3 * 1024 * 1024 * dtype_bytes;
        // Rows padded to a multiple of 8 values, as the worker lays the mask out.
        assert_eq!(
            shardrun_models::llama::dense_mask_values(3, 1021),
            3 * 1021 * 1024
        );
        for (resources, dtype, bytes, dense) in [
            ("tasks_per_node: 2", "f32", 4, true),
            ("tasks_per_node: 2", "bf16", 2, true),
            ("gpus_per_node: 2", "f32", 4, true),
            ("gpus_per_node: 2", "bf16", 2, false),
        ] {
            let (with, summary) = plan(resources, dtype, true);
            let (without, _) = plan(resources, dtype, false);
            let held = if dense { mask_bytes(bytes) } else { 0 };
            assert_eq!(with - without, held, "{resources}, {dtype}");
            let said = if dense {
                format!(
                    "through a dense mask ({} MiB a micro-batch)",
                    mask_bytes(bytes) >> 20
                )
            } else {
                format!(
                    "through flash attention's variable-length kernel (GPUs of compute \
                     capability 8.0 or more; older ones take a dense mask of {} MiB a \
                     micro-batch)",
                    mask_bytes(bytes) >> 20
                )
            };
            assert!(summary.contains(&said), "{resources}, {dtype}: {summary}");
        }
    }

    #[test]
    fn truncation_is_for_whole_documents_and_the_plan_says_it() {
        let e = err("    kind: text\n    files: [a.txt]\n    tokenizer: { kind: bytes }\n    truncate: true\n");
        assert_eq!(e.field, "training.data.truncate");
        assert_eq!(e.line, Some(9));
        assert!(
            e.why.starts_with("`packing` is `stream` unless set")
                && e.why.contains("continues into the next sequence"),
            "{e}"
        );
        assert!(e.fix.starts_with("add `packing: whole_documents`"), "{e}");
        let e = err("    kind: text\n    files: [a.txt]\n    tokenizer: { kind: bytes }\n    packing: stream\n    truncate: true\n");
        assert!(
            e.why.starts_with("with `packing: stream` a document"),
            "{e}"
        );
        // A `--set` of the packing over a file that truncates is blamed on the flag.
        let dir = jobs();
        let file = "name: t\nrun_root: /tmp/runs\ntraining:\n  model: { kind: transformer, vocab_size: 300, dim: 8, n_layers: 1, n_heads: 2, max_seq_len: 16 }\n  data: { kind: text, files: [a.txt], tokenizer: { kind: bytes }, packing: whole_documents, truncate: true }\n  steps: 2\n  total_batch_size: 2\n  batch_size_per_device: 2\n";
        let set = crate::spec::overrides::parse("training.data.packing=stream").unwrap();
        let loaded = crate::spec::overrides::apply(
            parse(file, &dir.path().join("job.yaml")).unwrap(),
            &[set],
        )
        .unwrap();
        let ResolveError::Invalid(e) = resolve(&loaded, &Overrides::default()).unwrap_err();
        assert_eq!(e.field, "training.data.packing");
        assert!(
            e.to_string().contains("--set training.data.packing=stream")
                && e.fix.contains("--set training.data.truncate=false"),
            "{e}"
        );

        let spec = "name: t\nrun_root: /tmp/runs\ntraining:\n  model: { kind: llama, vocab_size: 300, dim: 16, n_layers: 1, n_heads: 2, ffn_dim: 32 }\n  data: { kind: text, files: [a.txt], tokenizer: { kind: bytes }, seq_len: 8, packing: whole_documents, truncate: true }\n  steps: 2\n  total_batch_size: 2\n  batch_size_per_device: 2\n";
        let dir = jobs();
        let job = resolve(
            &parse(spec, &dir.path().join("job.yaml")).unwrap(),
            &Overrides::default(),
        )
        .unwrap();
        let DataConfig::Dataset(d) = &job.train.data else {
            panic!("dataset expected")
        };
        assert!(d.truncate);
        assert!(
            job.summary().contains("longer ones truncated to seq_len"),
            "{}",
            job.summary()
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

        // 0 batches would be read as "all of them": refused, with the ways to say either.
        let e = err("    kind: text\n    files: [a.txt]\n    tokenizer: { kind: bytes }\n    validation: { fraction: 0.1, max_batches: 0 }\n");
        assert_eq!(e.field, "training.data.validation.max_batches");
        assert!(e.fix.contains("remove `validation`"), "{e}");
    }

    #[test]
    fn text_split_and_tokens() {
        let dir = jobs();
        let DataConfig::Dataset(d) = data_in(
            dir.path(),
            "    kind: text\n    files: [a.txt]\n    separator: \"<|endoftext|>\"\n    tokenizer: { kind: bytes }\n",
        )
        .unwrap() else {
            panic!()
        };
        assert_eq!(
            d.source,
            DataSource::Text {
                files: vec![dir.path().join("a.txt")],
                split: TextSplit::Separator {
                    separator: "<|endoftext|>".into()
                }
            }
        );
        assert_eq!(d.tokenizer, TokenizerConfig::Bytes);
        let train = dir.path().join("train.bin");
        let DataConfig::Dataset(d) = data_in(
            dir.path(),
            &format!("    kind: tokens\n    files: [{}]\n", train.display()),
        )
        .unwrap() else {
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

    #[test]
    fn files_that_match_nothing_are_errors_at_their_entry() {
        let dir = jobs();
        let e = |yaml: &str| {
            let ResolveError::Invalid(e) = data_in(dir.path(), yaml).unwrap_err();
            e
        };
        let bytes = "    tokenizer: { kind: bytes }\n";
        let err = e(&format!(
            "    kind: jsonl\n    files: [d/*.jsonl, nope.jsonl]\n{bytes}"
        ));
        assert_eq!(err.field, "training.data.files[1]");
        assert_eq!((err.line, err.column), (Some(7), Some(24)));
        assert_eq!(
            err.why,
            format!(
                "no file matches {}",
                dir.path().join("nope.jsonl").display()
            )
        );
        assert!(
            err.fix.contains("relative to the job spec's folder"),
            "{err}"
        );
        // A typo of a file that is there, a folder that is not, a folder for a file.
        let err = e(&format!("    kind: jsonl\n    files: [d/x.jsnl]\n{bytes}"));
        assert_eq!(
            err.fix,
            format!("did you mean {}?", dir.path().join("d/x.jsonl").display())
        );
        let err = e(&format!("    kind: jsonl\n    files: [d/*.jsnl]\n{bytes}"));
        assert!(err.fix.starts_with("check the path ("), "{err}");
        let err = e(&format!(
            "    kind: jsonl\n    files: [dd/**/*.jsonl]\n{bytes}"
        ));
        assert!(
            err.fix.contains(&format!(
                "{} does not exist",
                dir.path().join("dd").display()
            )),
            "{err}"
        );
        let err = e(&format!("    kind: jsonl\n    files: [d]\n{bytes}"));
        assert!(err.why.ends_with("/d is a folder"), "{err}");
        // The pattern offered names the files the folder holds.
        let d = dir.path().join("d");
        assert!(
            err.fix.contains(&format!("`{}/*.jsonl`", d.display())),
            "{err}"
        );
        std::fs::create_dir(dir.path().join("py")).unwrap();
        for name in ["a.py", "b.py", "notes.txt"] {
            std::fs::write(dir.path().join("py").join(name), "x = 1\n").unwrap();
        }
        let err = e(&format!("    kind: text\n    files: [py]\n{bytes}"));
        let py = dir.path().join("py");
        assert!(
            err.fix.contains(&format!("`{}/*.py`", py.display())),
            "{err}"
        );
        // Validation files are checked the same way.
        let err = e(&format!(
            "    kind: jsonl\n    files: [a.jsonl]\n{bytes}    validation: {{ files: [a.jsonl, val.jsonl] }}\n"
        ));
        assert_eq!(err.field, "training.data.validation.files[1]");
        assert_eq!(err.line, Some(9));
    }

    #[test]
    fn a_tokenizer_without_tokenizer_json_is_an_error_with_the_way_to_get_one() {
        let dir = jobs();
        let e = |yaml: &str| {
            let ResolveError::Invalid(e) = data_in(dir.path(), yaml).unwrap_err();
            e
        };
        let err = e("    kind: text\n    files: [a.txt]\n    tokenizer: { path: toks }\n");
        assert_eq!(err.field, "training.data.tokenizer.path");
        assert!(err.why.contains("does not exist"), "{err}");
        std::fs::create_dir(dir.path().join("sp")).unwrap();
        let err = e("    kind: text\n    files: [a.txt]\n    tokenizer: { path: sp }\n");
        assert!(err.why.ends_with("sp holds no `tokenizer.json`"), "{err}");
        std::fs::write(dir.path().join("sp/tokenizer.model"), "").unwrap();
        let err = e("    kind: text\n    files: [a.txt]\n    tokenizer: { path: sp }\n");
        assert!(err.why.contains("SentencePiece `tokenizer.model`"), "{err}");
        assert!(
            err.fix.contains(&format!(
                "AutoTokenizer.from_pretrained('{0}').save_pretrained('{0}')",
                dir.path().join("sp").display()
            )) && err
                .fix
                .contains("pip install transformers sentencepiece protobuf"),
            "{err}"
        );
        // The file itself is fine; a chat template must be a file that is there.
        data_in(
            dir.path(),
            "    kind: text\n    files: [a.txt]\n    tokenizer: { path: tok/tokenizer.json }\n",
        )
        .unwrap();
        data_in(
            dir.path(),
            "    kind: chat\n    files: [a.jsonl]\n    tokenizer: { path: tok }\n    chat_template: chat.jinja\n",
        )
        .unwrap();
        let err = e("    kind: chat\n    files: [a.jsonl]\n    tokenizer: { path: tok }\n    chat_template: chat.jnja\n");
        assert_eq!(err.field, "training.data.chat_template");
        assert!(err.why.contains("does not exist"), "{err}");
    }

    #[test]
    fn chat_data_without_a_template_is_an_error_with_the_ways_to_give_one() {
        let chat = "    kind: chat\n    files: [a.jsonl]\n    tokenizer: { path: tok }\n";
        let dir = jobs();
        let ResolveError::Invalid(err) = data_in(dir.path(), chat).unwrap_err();
        assert_eq!((err.field.as_str(), err.line), ("training.data", Some(5)));
        assert!(
            err.why.starts_with(&format!(
                "chat data is rendered with a chat template, and the tokenizer folder {} has none",
                dir.path().join("tok").display()
            )),
            "{err}"
        );
        assert!(
            err.fix.contains("add `chat_template: <file.jinja>`"),
            "{err}"
        );
        let bytes = "    kind: chat\n    files: [a.jsonl]\n    tokenizer: { kind: bytes }\n";
        let ResolveError::Invalid(err) = data_in(dir.path(), bytes).unwrap_err();
        assert!(
            err.why.contains("the byte tokenizer has no folder"),
            "{err}"
        );
        data_in(
            dir.path(),
            &format!("{bytes}    chat_template: chat.jinja\n"),
        )
        .unwrap();

        // Wherever the data reader finds a template in the folder, it is found.
        for (file, text) in [
            ("chat_template.jinja", "{{ messages }}"),
            ("additional_chat_templates/tool_use.jinja", "{{ tools }}"),
            (
                "tokenizer_config.json",
                r#"{"chat_template": "{{ messages }}", "eos_token": "<eos>"}"#,
            ),
        ] {
            let dir = jobs();
            let path = dir.path().join("tok").join(file);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, text).unwrap();
            data_in(dir.path(), chat).unwrap_or_else(|e| panic!("{file}: {e}"));
        }
        // A template that does not compile is refused here, not by the job's first record.
        let dir = jobs();
        std::fs::write(
            dir.path().join("tok/chat_template.jinja"),
            "{% for m in messages %}",
        )
        .unwrap();
        let ResolveError::Invalid(err) = data_in(dir.path(), chat).unwrap_err();
        assert!(
            err.why
                .contains("chat_template.jinja: not a valid Jinja template: syntax error"),
            "{err}"
        );
        std::fs::write(dir.path().join("own.jinja"), "{{ messages }").unwrap();
        let ResolveError::Invalid(err) = data_in(
            dir.path(),
            &format!("{bytes}    chat_template: own.jinja\n"),
        )
        .unwrap_err();
        assert!(
            err.why
                .contains("own.jinja: not a valid Jinja template: syntax error")
                && err.fix.starts_with("fix the template"),
            "{err}"
        );
        // A folder whose templates cannot be read is named with what is wrong.
        let dir = jobs();
        std::fs::write(dir.path().join("tok/tokenizer_config.json"), "{").unwrap();
        let ResolveError::Invalid(err) = data_in(dir.path(), chat).unwrap_err();
        assert!(
            err.why.contains("tokenizer_config.json: not valid JSON"),
            "{err}"
        );
    }

    #[test]
    fn chat_template_kwargs_reach_the_source_and_leave_the_record_arguments_alone() {
        let dir = jobs();
        std::fs::write(dir.path().join("tok/chat_template.jinja"), "{{ messages }}").unwrap();
        let chat = "    kind: chat\n    files: [a.jsonl]\n    tokenizer: { path: tok }\n";
        let with = |kwargs: &str| {
            data_in(
                dir.path(),
                &format!("{chat}    chat_template_kwargs: {kwargs}\n"),
            )
        };
        let DataConfig::Dataset(d) =
            with("{ date_string: 26 Jul 2024, enable_thinking: false }").unwrap()
        else {
            panic!("dataset expected")
        };
        let DataSource::Chat {
            chat_template_kwargs,
            ..
        } = d.source
        else {
            panic!("chat expected")
        };
        assert_eq!(
            serde_json::to_value(&chat_template_kwargs).unwrap(),
            serde_json::json!({"date_string": "26 Jul 2024", "enable_thinking": false})
        );
        let ResolveError::Invalid(err) = with("{ add_generation_prompt: true }").unwrap_err();
        assert_eq!(
            err.field,
            "training.data.chat_template_kwargs.add_generation_prompt"
        );
        assert!(
            err.why.contains("set by shardrun for every record") && err.fix.contains("messages"),
            "{err}"
        );
        let text = "    kind: text\n    files: [a.txt]\n    tokenizer: { path: tok }\n    chat_template_kwargs: { a: 1 }\n";
        let ResolveError::Invalid(err) = data_in(dir.path(), text).unwrap_err();
        assert!(
            err.why.contains(
                "`chat_template_kwargs` does not apply to `text` data (it applies to chat)"
            ),
            "{err}"
        );
    }

    #[test]
    fn a_model_folder_without_tokenizer_json_is_named_with_both_ways_out() {
        let dir = jobs();
        let model = dir.path().join("model");
        let scratch = "name: t\ntraining:\n  model: { kind: llama, vocab_size: 300, dim: 16, n_layers: 1, n_heads: 2, ffn_dim: 32 }\n  data: { kind: synthetic, seq_len: 8 }\n  steps: 1\n  total_batch_size: 2\n  batch_size_per_device: 2\n";
        let scratch = resolve(
            &parse(scratch, Path::new("j.yaml")).unwrap(),
            &Overrides::default(),
        );
        crate::resolve::model::tests::folder(&model, &scratch.unwrap().train.model);
        std::fs::write(model.join("tokenizer.model"), "").unwrap();
        let spec = "name: t\ntraining:\n  model: { kind: hf, path: model }\n  data:\n    kind: text\n    files: [a.txt]\n    seq_len: 8\n  steps: 2\n  total_batch_size: 2\n  batch_size_per_device: 2\n";
        let loaded = parse(spec, &dir.path().join("job.yaml")).unwrap();
        let ResolveError::Invalid(err) = resolve(&loaded, &Overrides::default()).unwrap_err();
        assert_eq!(
            (err.field.as_str(), err.line),
            ("training.data.tokenizer", Some(4))
        );
        assert!(
            err.why
                .starts_with("text data takes its tokenizer from the model's folder: ")
                && err.why.contains("SentencePiece"),
            "{err}"
        );
        assert!(
            err.fix.contains("save_pretrained") && err.fix.contains("tokenizer: { path:"),
            "{err}"
        );
        bytes_tokenizer(&model, "<eos>");
        resolve(&loaded, &Overrides::default()).unwrap();
    }

    /// A job whose model has `vocab` ids, on text tokenized by the byte tokenizer (257 ids:
    /// the bytes and `<eos>`) saved as a Hugging Face folder whose end of document is `eos`.
    fn resolve_on_bytes(vocab: u64, eos: &str) -> Result<ResolvedJob, ResolveError> {
        let dir = jobs();
        bytes_tokenizer(&dir.path().join("bytes-tok"), eos);
        let spec = format!(
            "name: t\nrun_root: /tmp/runs\ntraining:\n  model: {{ kind: transformer, \
             vocab_size: {vocab}, dim: 8, n_layers: 1, n_heads: 2, max_seq_len: 16 }}\n  \
             data: {{ kind: text, files: [a.txt], tokenizer: {{ path: bytes-tok }} }}\n  \
             steps: 2\n  total_batch_size: 2\n  batch_size_per_device: 2\n"
        );
        let loaded = parse(&spec, &dir.path().join("job.yaml")).unwrap();
        resolve(&loaded, &Overrides::default())
    }

    #[test]
    fn a_tokenizer_with_more_ids_than_the_model_is_refused_before_the_job_is_queued() {
        // 257 ids fit a vocabulary of 257, not of 256.
        resolve_on_bytes(257, "<eos>").unwrap();
        let ResolveError::Invalid(err) = resolve_on_bytes(256, "<eos>").unwrap_err();
        assert_eq!(err.field, "training.data.tokenizer.path");
        assert!(
            err.why.contains("has 257 ids, the model's vocabulary 256"),
            "{err}"
        );
        assert!(
            err.why
                .ends_with("its end-of-document token \"<eos>\" (id 256) is past it"),
            "{err}"
        );
        assert!(err.fix.contains("raise the model's `vocab_size`"), "{err}");
    }

    #[test]
    fn a_special_token_the_tokenizer_lacks_is_refused_at_its_line_before_the_job_is_queued() {
        let dir = jobs();
        let text = "    kind: text\n    files: [a.txt]\n    tokenizer:\n      path: tok\n      eos_token: \"</s>\"\n";
        let ResolveError::Invalid(err) = data_in(dir.path(), text).unwrap_err();
        assert_eq!(
            (err.field.as_str(), err.line),
            ("training.data.tokenizer.eos_token", Some(10))
        );
        assert!(
            err.why
                .ends_with("has no token `</s>`; its special tokens: `<eos>`"),
            "{err}"
        );
        assert!(err.fix.contains("remove `eos_token`"), "{err}");
        let text = "    kind: text\n    files: [a.txt]\n    tokenizer: { path: tok, bos_token: \"<s>\" }\n";
        let ResolveError::Invalid(err) = data_in(dir.path(), text).unwrap_err();
        assert_eq!(err.field, "training.data.tokenizer.bos_token");
        let text = "    kind: text\n    files: [a.txt]\n    tokenizer: { path: tok, eos_token: \"<eos>\" }\n";
        data_in(dir.path(), text).unwrap();
    }

    #[test]
    fn a_tokenizer_that_does_not_load_is_refused_at_its_path() {
        let dir = jobs();
        std::fs::write(dir.path().join("tok/tokenizer.json"), "{}").unwrap();
        let text = "    kind: text\n    files: [a.txt]\n    tokenizer: { path: tok }\n";
        let ResolveError::Invalid(err) = data_in(dir.path(), text).unwrap_err();
        assert_eq!(err.field, "training.data.tokenizer.path");
        assert!(
            err.why
                .contains("not a tokenizer file the `tokenizers` library reads"),
            "{err}"
        );
        // A tokenizer without an end-of-document token says how to name one.
        bytes_tokenizer(&dir.path().join("tok"), "<eos>");
        std::fs::remove_file(dir.path().join("tok/tokenizer_config.json")).unwrap();
        let ResolveError::Invalid(err) = data_in(dir.path(), text).unwrap_err();
        assert!(
            err.why.contains("name one with `data.tokenizer.eos_token`"),
            "{err}"
        );
        // generation_config.json is read only where nothing before it names the token: a
        // broken one stops a folder whose tokenizer_config.json names it no more than it
        // stops `from_pretrained`.
        bytes_tokenizer(&dir.path().join("tok"), "<eos>");
        std::fs::write(dir.path().join("tok/generation_config.json"), "{not json").unwrap();
        data_in(dir.path(), text).unwrap();
        // A file naming a token the tokenizer lacks: said, with what to do.
        bytes_tokenizer(&dir.path().join("tok"), "</s>");
        let ResolveError::Invalid(err) = data_in(dir.path(), text).unwrap_err();
        assert!(
            err.why.contains("names `</s>` as the eos token") && !err.fix.is_empty(),
            "{err}"
        );
    }

    #[test]
    fn fine_tuning_examples_streamed_by_default_are_a_warning() {
        let dir = jobs();
        let warned = |data: &str| {
            let spec = format!(
                "name: t\nrun_root: /tmp/runs\ntraining:\n  model: {{ kind: transformer, \
                 vocab_size: 300, dim: 8, n_layers: 1, n_heads: 2, max_seq_len: 16 }}\n  \
                 data: {{ {data}, tokenizer: {{ path: tok }} }}\n  steps: 2\n  \
                 total_batch_size: 2\n  batch_size_per_device: 2\n"
            );
            let loaded = parse(&spec, &dir.path().join("job.yaml")).unwrap();
            let job = resolve(&loaded, &Overrides::default()).unwrap();
            job.warnings
                .iter()
                .find(|w| w.starts_with("`training.data.packing` is `stream` unless set"))
                .cloned()
        };
        let chat = warned("kind: chat, files: [a.jsonl], chat_template: chat.jinja").unwrap();
        assert!(
            chat.contains("the conversations are packed back to back"),
            "{chat}"
        );
        let pairs = warned("kind: jsonl, files: [a.jsonl], prompt_field: p, completion_field: c");
        assert!(pairs
            .unwrap()
            .contains("the prompt/completion records are packed"));
        for quiet in [
            "kind: chat, files: [a.jsonl], chat_template: chat.jinja, packing: stream",
            "kind: chat, files: [a.jsonl], chat_template: chat.jinja, packing: whole_documents",
            "kind: jsonl, files: [a.jsonl]",
            "kind: text, files: [a.txt]",
        ] {
            assert_eq!(warned(quiet), None, "{quiet}");
        }
    }

    #[test]
    fn ids_past_the_vocabulary_other_than_the_end_of_document_are_a_warning() {
        // A byte as the end of document: <eos> (id 256) is the one id past 256.
        let job = resolve_on_bytes(256, "A").unwrap();
        assert!(
            job.warnings.iter().any(|w| w
                .contains("has 257 ids, the model's vocabulary 256: a document holding ids 256")),
            "{:?}",
            job.warnings
        );
    }

    #[test]
    fn what_a_path_holds_is_looked_up_once() {
        let dir = jobs();
        let spec = "name: t\ntraining:\n  model: { kind: transformer, vocab_size: 300, dim: 8, n_layers: 1, n_heads: 2, max_seq_len: 16 }\n  data: { kind: text, files: [\"*.txt\"], tokenizer: { path: tok } }\n  steps: 2\n  total_batch_size: 2\n  batch_size_per_device: 2\n";
        let loaded = parse(spec, &dir.path().join("job.yaml")).unwrap();
        let mut lookups = crate::resolve::Lookups::default();
        crate::resolve::resolve_with(&loaded, &Overrides::default(), &mut lookups).unwrap();
        // A sweep's next point does not look again.
        std::fs::remove_file(dir.path().join("a.txt")).unwrap();
        std::fs::remove_file(dir.path().join("tok/tokenizer.json")).unwrap();
        crate::resolve::resolve_with(&loaded, &Overrides::default(), &mut lookups).unwrap();
        assert!(resolve(&loaded, &Overrides::default()).is_err());
    }
}
