//! From a source in the spec to a memory-mapped [`Corpus`]: the cache folder if it exists,
//! else tokenize (or check pre-tokenized files) into it, once per cache across processes.

use crate::cache::{self, CacheManifest, KeyInputs, SourceFile, FORMAT_VERSION};
use crate::chat::{additional_templates, has_generation_blocks, templates_in_folder, ChatTemplate};
use crate::corpus::{dtype_width, Corpus};
use crate::dataset::thousands;
use crate::documents::{fix_for_every_record_lacking, Skipped};
use crate::encode::Encoder;
use crate::error::{DataError, Origin, Result};
use crate::files::{self, DataFile};
use crate::progress::Observer;
use crate::tokenizer::{
    parse_json, read_tokenizer_json, tokenizer_folder, tokenizer_json_path, TextTokenizer,
    FOLDER_FILES,
};
use crate::writer::CorpusWriter;
use rayon::prelude::*;
use sha2::{Digest, Sha256};
use shardrun_models::hf::ADDITIONAL_CHAT_TEMPLATES;
use shardrun_protocol::config::{
    DataSource, DatasetConfig, HeldOut, JsonlText, OnBadRecord, TokenDtype, TokenizerConfig,
};
use shardrun_protocol::users;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// Skipped records named in the manifest and the log (the rest are counted).
const SKIPPED_SHOWN: usize = 20;

/// A prepared source and whether this call did the work.
pub struct Prepared {
    pub corpus: Corpus,
    pub built: bool,
    /// Time spent building the cache when `built` (not waiting for another process's
    /// build), else finding it.
    pub seconds: f64,
}

/// How one source is read and tokenized.
pub struct SourceSpec<'a> {
    pub source: &'a DataSource,
    pub tokenizer: &'a TokenizerConfig,
    pub on_bad_record: OnBadRecord,
    pub cache_dir: &'a Path,
    /// Tokenization threads.
    pub threads: usize,
    /// `training data`, `validation data`: for messages.
    pub what: &'a str,
}

/// The sources a dataset is prepared from: its training data and, when its validation data
/// are files of their own, those (a held-out fraction is part of the training data).
pub struct DatasetSources<'a> {
    config: &'a DatasetConfig,
    /// The training source's reading rules over the validation files.
    validation: Option<DataSource>,
    threads: usize,
}

impl<'a> DatasetSources<'a> {
    /// `threads`: tokenization threads.
    pub fn new(config: &'a DatasetConfig, threads: usize) -> DatasetSources<'a> {
        let validation = match config.validation.as_ref().map(|v| &v.held_out) {
            Some(HeldOut::Files { files }) => Some(config.source.with_files(files.clone())),
            _ => None,
        };
        DatasetSources {
            config,
            validation,
            threads,
        }
    }

    pub fn training(&self) -> SourceSpec<'_> {
        self.spec(&self.config.source, "training data")
    }

    /// `None` when validation holds out training documents, or there is none.
    pub fn validation(&self) -> Option<SourceSpec<'_>> {
        let source = self.validation.as_ref()?;
        Some(self.spec(source, "validation data"))
    }

    fn spec<'s>(&'s self, source: &'s DataSource, what: &'s str) -> SourceSpec<'s> {
        SourceSpec {
            source,
            tokenizer: &self.config.tokenizer,
            on_bad_record: self.config.on_bad_record,
            cache_dir: &self.config.cache_dir,
            threads: self.threads,
            what,
        }
    }
}

pub fn prepare_source(spec: &SourceSpec<'_>, observer: &dyn Observer) -> Result<Prepared> {
    let started = Instant::now();
    let files = files::expand(spec.source.files())?;
    let tokenizer_files = tokenizer_key(spec.tokenizer, spec.source)?;
    let key = cache_key(spec, &files, &tokenizer_files);
    let name = key.name(spec.source.kind_name());
    let contents_name = key.contents_name(spec.source.kind_name());
    if let Some(read_only) = read_only_cache(spec, &files, &name, &contents_name, observer)? {
        return Ok(Prepared {
            corpus: read_only,
            built: false,
            seconds: started.elapsed().as_secs_f64(),
        });
    }
    let (dir, manifest, built) = cache::open_or_build(spec.cache_dir, &name, observer, |tmp| {
        // From here: the time of building, not of waiting for another process's build.
        let building = Instant::now();
        let mut manifest = match same_contents(spec, &files, &contents_name, tmp, observer)? {
            Some(manifest) => manifest,
            None => {
                observer.line(&format!(
                    "preparing {} ({} file(s), {:.1} MB) into {}",
                    spec.what,
                    files.len(),
                    files.iter().map(|f| f.size).sum::<u64>() as f64 / 1e6,
                    spec.cache_dir.join(&name).display()
                ));
                match spec.source {
                    DataSource::Tokens { dtype, .. } => check_token_files(&files, *dtype, spec)?,
                    _ => tokenize_files(tmp, &files, spec, observer)?,
                }
            }
        };
        manifest.name = name.clone();
        manifest.contents_name = contents_name.clone();
        manifest.tokenizer_files = tokenizer_files.clone();
        manifest.seconds = building.elapsed().as_secs_f64();
        Ok(manifest)
    })
    .map_err(|e| not_writable(spec.cache_dir, e))
    .map_err(|e| out_of_room(spec, &files, e))?;
    let seconds = match built {
        true => manifest.seconds,
        false => started.elapsed().as_secs_f64(),
    };
    let corpus = Corpus::open(&dir, manifest)?;
    Ok(Prepared {
        corpus,
        built,
        seconds,
    })
}

/// The manifest of the source's cache for its files as they are now, without preparing
/// anything: `None` when that cache does not exist yet (the files were never prepared, or
/// changed since).
pub fn prepared_manifest(
    spec: &SourceSpec<'_>,
    files: &[DataFile],
) -> Result<Option<CacheManifest>> {
    let tokenizer_files = tokenizer_key(spec.tokenizer, spec.source)?;
    let key = cache_key(spec, files, &tokenizer_files);
    cache::read_manifest(&spec.cache_dir.join(key.name(spec.source.kind_name())))
}

/// What names the cache folder: everything that decides its contents.
fn cache_key<'f>(
    spec: &SourceSpec<'_>,
    files: &'f [DataFile],
    tokenizer_files: &[(String, String)],
) -> KeyInputs<'f> {
    KeyInputs {
        format_version: FORMAT_VERSION,
        source: serde_json::to_value(spec.source.with_files(Vec::new()))
            .expect("sources serialize"),
        on_bad_record: spec.on_bad_record,
        files,
        tokenizer: tokenizer_files.to_vec(),
    }
}

/// A cache of the same inputs whose files hold the same bytes, only their times differ: its
/// files linked into `tmp`, and its manifest with the files' times as they are now.
fn same_contents(
    spec: &SourceSpec<'_>,
    files: &[DataFile],
    contents_name: &str,
    tmp: &Path,
    observer: &dyn Observer,
) -> Result<Option<CacheManifest>> {
    let Some((dir, manifest)) = find_same_contents(spec, files, contents_name)? else {
        return Ok(None);
    };
    cache::link_files(&dir, tmp)?;
    observer.line(&format!(
        "{}: the files hold the bytes {} was made from (only their times changed): its \
         tokens are used, nothing is tokenized",
        spec.what,
        dir.display()
    ));
    Ok(Some(manifest))
}

/// The newest sound cache of the same inputs whose files hold the bytes `files` hold now,
/// with its manifest listing the files' times as they are now.
fn find_same_contents(
    spec: &SourceSpec<'_>,
    files: &[DataFile],
    contents_name: &str,
) -> Result<Option<(PathBuf, CacheManifest)>> {
    let candidates = cache::same_inputs(spec.cache_dir, contents_name);
    if candidates.is_empty() {
        return Ok(None);
    }
    let now = hash_files(files, spec.threads)?;
    for (dir, manifest) in candidates {
        let same =
            manifest.files.len() == now.len()
                && manifest.files.iter().zip(&now).all(|(was, is)| {
                    was.path == is.path && was.size == is.size && was.xxh3 == is.xxh3
                });
        if !same {
            continue;
        }
        // Its files are shared from now on: checked as a cache found under its own name is
        // before use (a damaged one is passed over, and the data tokenized again).
        if Corpus::open(&dir, manifest.clone())
            .and_then(|c| c.verify_content())
            .is_err()
        {
            continue;
        }
        let mut reused = manifest;
        for (file, listed) in reused.files.iter_mut().zip(files) {
            file.mtime_ns = listed.mtime_ns;
        }
        reused.created_unix_s = cache::now_unix_s();
        return Ok(Some((dir, reused)));
    }
    Ok(None)
}

/// A cache folder this user cannot write (another's in a shared project, or read-only) with
/// no folder for the files as they are now: the cache of the same bytes, read where it is
/// (a `chmod` or a copy changes only the files' times, and so the key). `None` when the
/// folder can be written, holds the key's folder, or nothing of the same bytes, so
/// [`cache::open_or_build`] goes on.
fn read_only_cache(
    spec: &SourceSpec<'_>,
    files: &[DataFile],
    name: &str,
    contents_name: &str,
    observer: &dyn Observer,
) -> Result<Option<Corpus>> {
    let cache_dir = spec.cache_dir;
    let writable = users::may(cache_dir, libc::W_OK | libc::X_OK);
    if writable || !cache_dir.is_dir() || cache_dir.join(name).exists() {
        return Ok(None);
    }
    // Nothing of the same bytes: [`cache::open_or_build`] waits for a build of the data
    // under way (its owner's), or fails for want of write access ([`not_writable`]).
    let Some((dir, manifest)) = find_same_contents(spec, files, contents_name)? else {
        return Ok(None);
    };
    observer.line(&format!(
        "{}: the files hold the bytes {} was made from (only their times changed): its \
         tokens are used where they are, as this user cannot write {} (each start hashes \
         the files again until `shardrun prepare` is run by someone who can)",
        spec.what,
        dir.display(),
        cache_dir.display()
    ));
    Corpus::open(&dir, manifest).map(Some)
}

/// A build this user could not start in a cache folder it cannot write, said as such: whose
/// the folder is and what to do, rather than the file the build could not create.
fn not_writable(cache_dir: &Path, error: DataError) -> DataError {
    let refused = matches!(
        &error,
        DataError::Io { source, .. } if matches!(
            source.kind(),
            std::io::ErrorKind::PermissionDenied | std::io::ErrorKind::ReadOnlyFilesystem
        )
    );
    // A folder not there yet is its parent's to create: the error names that.
    if !refused || !cache_dir.is_dir() || users::may(cache_dir, libc::W_OK | libc::X_OK) {
        return error;
    }
    DataError::CacheNotWritable {
        path: cache_dir.to_path_buf(),
        whose: users::owner_and_mode(cache_dir),
        this_user: users::this_user(),
    }
}

/// A build that ran out of room (a full disk, a quota), said as such: which cache, how much
/// the data is and what to do, rather than the temporary file a write failed on.
fn out_of_room(spec: &SourceSpec<'_>, files: &[DataFile], error: DataError) -> DataError {
    match error {
        DataError::Io { source, .. }
            if matches!(source.raw_os_error(), Some(libc::ENOSPC | libc::EDQUOT)) =>
        {
            let bytes: u64 = files.iter().map(|f| f.size).sum();
            let size = |factor: f64| indicatif::DecimalBytes((factor * bytes as f64) as u64);
            let needs = match (spec.source, spec.tokenizer) {
                // Token files are used where they are: only a manifest is written.
                (DataSource::Tokens { .. }, _) => "a few KB (token files are read where they \
                                                    are)"
                    .to_string(),
                // One token a byte of text.
                (_, TokenizerConfig::Bytes) => {
                    format!("about {} (4 bytes a token)", size(4.0))
                }
                // A BPE token holds about 3 to 4 characters of text.
                _ => format!(
                    "about {} to {} with a BPE tokenizer (4 bytes a token; less for JSON, \
                     whose keys and quotes are not tokens)",
                    size(1.0),
                    size(1.5)
                ),
            };
            DataError::CacheFull {
                path: spec.cache_dir.to_path_buf(),
                what: spec.what.to_string(),
                data_size: size(1.0).to_string(),
                needs,
                source,
            }
        }
        error => error,
    }
}

/// `, N bad record(s) skipped, the first <where>: <why>`, or nothing when none was: often
/// every record was bad for one reason, which the first one says.
fn skipped_note(skipped: &[Skipped]) -> String {
    match skipped.first() {
        None => String::new(),
        Some(first) => format!(
            ", {} bad record(s) skipped, the first {}: {}",
            skipped.len(),
            first.origin,
            first.why
        ),
    }
}

/// The hashes of the files the training data's tokenizer is built from as they are now, as
/// a cache's manifest records them (`tokenizer_files`).
pub fn tokenizer_file_hashes(config: &DatasetConfig) -> Result<Vec<(String, String)>> {
    tokenizer_key(&config.tokenizer, &config.source)
}

/// Hashes of the files that decide the ids (tokenizer, special tokens, chat template), and
/// how transformers builds the tokenizer from them when it does not use `tokenizer.json` as
/// saved.
fn tokenizer_key(config: &TokenizerConfig, source: &DataSource) -> Result<Vec<(String, String)>> {
    let sha = |bytes: &[u8]| hex::encode(&Sha256::digest(bytes)[..16]);
    let mut key = Vec::new();
    match config {
        TokenizerConfig::HuggingFace {
            path,
            bos_token,
            eos_token,
        } => {
            let bytes = read_tokenizer_json(&tokenizer_json_path(path))?;
            key.push(("tokenizer.json".into(), sha(&bytes)));
            // The folder the tokenizer is loaded from.
            let folder = tokenizer_folder(path);
            let mut read = BTreeMap::new();
            for name in &FOLDER_FILES[1..] {
                if let Ok(bytes) = std::fs::read(folder.join(name)) {
                    key.push((name.to_string(), sha(&bytes)));
                    read.insert(*name, bytes);
                }
            }
            // The rebuild follows from the files just hashed; it is named all the same, so
            // that caches tokenized from these files with `tokenizer.json` as saved are not
            // reused.
            let json = |name: &str| {
                read.get(name)
                    .map(|bytes| parse_json(&folder.join(name), bytes))
                    .transpose()
            };
            let rebuild = crate::rebuild::Rebuild::of(
                &bytes,
                json("tokenizer_config.json")?.as_ref(),
                json("config.json")?.as_ref(),
            );
            if let Some(rebuild) = rebuild {
                // Right after `tokenizer.json`, where the caches built with it have it.
                key.insert(1, ("rebuild".into(), rebuild.key()));
            }
            for path in additional_templates(&folder)? {
                if let (Ok(bytes), Some(name)) = (std::fs::read(&path), path.file_name()) {
                    let name = format!("{ADDITIONAL_CHAT_TEMPLATES}/{}", name.to_string_lossy());
                    key.push((name, sha(&bytes)));
                }
            }
            key.push(("bos_token".into(), format!("{bos_token:?}")));
            key.push(("eos_token".into(), format!("{eos_token:?}")));
        }
        TokenizerConfig::Bytes => key.push(("bytes".into(), "1".into())),
        TokenizerConfig::PreTokenized => {}
    }
    if let DataSource::Chat { chat_template, .. } = source {
        // The templates a chat is rendered with, as `ChatTemplate::load` finds them.
        let generation_blocks = match (chat_template, config) {
            (Some(path), _) => {
                let bytes = std::fs::read(path).map_err(|e| DataError::ChatTemplate {
                    path: path.clone(),
                    why: format!("cannot be read: {e}"),
                })?;
                key.push(("chat_template".into(), sha(&bytes)));
                has_generation_blocks(&String::from_utf8_lossy(&bytes))
            }
            (None, TokenizerConfig::HuggingFace { path, .. }) => {
                templates_in_folder(&tokenizer_folder(path))?
                    .iter()
                    .any(|template| has_generation_blocks(&template.source))
            }
            (None, _) => false,
        };
        // Caches of templates with blocks made before the blocks decided the loss mask had
        // masks from growing prefixes; named apart from them.
        if generation_blocks {
            key.push(("assistant_mask".into(), "generation blocks".into()));
        }
        // Caches made when a chat ended by eos and a newline got another eos are not reused.
        key.push(("chat_end".into(), "eos then whitespace".into()));
    }
    Ok(key)
}

fn tokenize_files(
    tmp: &Path,
    files: &[DataFile],
    spec: &SourceSpec<'_>,
    observer: &dyn Observer,
) -> Result<CacheManifest> {
    let tokenizer = TextTokenizer::load(spec.tokenizer)?;
    let chat = match spec.source {
        DataSource::Chat {
            chat_template,
            chat_template_kwargs,
            ..
        } => Some(
            ChatTemplate::load(&tokenizer, chat_template.as_deref())?
                .with_kwargs(chat_template_kwargs),
        ),
        _ => None,
    };
    let with_mask = matches!(
        spec.source,
        DataSource::Chat { .. }
            | DataSource::Jsonl {
                text: JsonlText::PromptCompletion { .. },
                ..
            }
    );
    let mut writer = CorpusWriter::create(tmp, with_mask)?;
    let encoder = Encoder {
        tokenizer: &tokenizer,
        chat: chat.as_ref(),
    };
    let skipped = crate::tokenize::tokenize(
        files,
        spec.source,
        &encoder,
        spec.on_bad_record,
        spec.threads,
        &mut writer,
        spec.what,
        observer,
    )?;
    let written = writer.finish()?;
    if written.documents == 0 {
        return Err(DataError::NotEnoughData {
            why: format!(
                "the {} holds no documents ({}{})",
                spec.what,
                match files {
                    [one] => one.path.display().to_string(),
                    _ => format!("{} file(s)", files.len()),
                },
                skipped_note(&skipped)
            ),
            // A field every record lacks: the one likely meant, as when the first record
            // stops the preparation.
            fix: fix_for_every_record_lacking(&skipped).unwrap_or_else(|| {
                format!(
                    "check `data.files` and how documents are read ({})",
                    match spec.source {
                        DataSource::Text { .. } => "`split`, `separator`",
                        DataSource::Jsonl { .. } =>
                            "`field`, or `prompt_field` and `completion_field`",
                        DataSource::Chat { .. } => "`messages_field`, the messages' roles",
                        DataSource::Tokens { .. } => "`dtype`",
                    }
                )
            }),
        });
    }
    // Where a document of the files is, for messages: `file:line`.
    let origin = |file: u32, line: u64| Origin::new(&files[file as usize].path, line).to_string();
    if with_mask && written.trained_tokens == 0 {
        let first = written
            .first_untrained
            .map(|(file, line)| origin(file, line))
            .unwrap_or_default();
        return Err(DataError::NotEnoughData {
            why: format!(
                "no token of the {} is in the loss: none of its {} record(s) has a token to \
                 train on (the first: {first}{}), so every step would train nothing",
                spec.what,
                crate::dataset::thousands(written.documents),
                skipped_note(&skipped)
            ),
            fix: "give conversations an assistant turn (and prompt/completion records a \
                  completion); a chat template's `{% generation %}` blocks mark what trains"
                .into(),
        });
    }
    // Chats, none of which trains the end-of-document token.
    let untrained_eos = written.chats > 0 && written.chats_training_eos == 0;
    let mut tokenizer_text = tokenizer.description.clone();
    if let Some(chat) = &chat {
        tokenizer_text.push_str(&format!("; chat template {}", chat.origin()));
    }
    Ok(CacheManifest {
        format_version: FORMAT_VERSION,
        name: String::new(),
        kind: spec.source.kind_name().into(),
        files: hash_files(files, spec.threads)?,
        tokenizer: tokenizer_text,
        tokenizer_files: Vec::new(),
        contents_name: String::new(),
        documents: written.documents,
        tokens: written.tokens,
        max_token_id: written.max_token_id,
        loss_mask: with_mask,
        trained_tokens: written.trained_tokens,
        token_files_dtype: None,
        skipped_records: skipped.len() as u64,
        skipped_examples: examples(&skipped),
        untrained_documents: written.untrained,
        first_untrained: written
            .first_untrained
            .map(|(file, line)| origin(file, line)),
        merged_boundaries: written.merged_boundaries,
        first_merged_boundary: written
            .first_merged_boundary
            .map(|(file, line, token)| (origin(file, line), token)),
        untrained_eos: untrained_eos.then(|| tokenizer.eos.text.clone()),
        turn_end: written
            .first_turn_end
            .filter(|_| untrained_eos)
            .map(|(file, line, id)| (origin(file, line), tokenizer.special_token(id))),
        content_hash: written.content_hash,
        input_bytes: files.iter().map(|f| f.size).sum(),
        seconds: 0.0,
        created_unix_s: cache::now_unix_s(),
    })
}

/// Pre-tokenized files are read in place: check each one (whole number of ids, not empty)
/// and record its largest id, so the vocabulary check needs no second pass.
fn check_token_files(
    files: &[DataFile],
    dtype: TokenDtype,
    spec: &SourceSpec<'_>,
) -> Result<CacheManifest> {
    let width = dtype_width(dtype);
    let checked: Vec<std::result::Result<(SourceFile, u64), Skipped>> = files
        .par_iter()
        .map(|f| check_token_file(f, dtype))
        .collect::<Result<_>>()?;
    let mut entries = Vec::new();
    let mut skipped = Vec::new();
    let mut max_token_id = 0;
    for item in checked {
        match item {
            Ok((entry, max)) => {
                max_token_id = max_token_id.max(max);
                entries.push(entry);
            }
            Err(s) => match spec.on_bad_record {
                OnBadRecord::Stop => return Err(DataError::bad(s.origin, s.why)),
                OnBadRecord::Skip => skipped.push(s),
            },
        }
    }
    if entries.is_empty() {
        return Err(DataError::NotEnoughData {
            why: format!("the {} has no usable token file", spec.what),
            fix: "check `data.files`".into(),
        });
    }
    let tokens: u64 = entries.iter().map(|e| e.size / width).sum();
    let mut hash = xxhash_rust::xxh3::Xxh3::new();
    for e in &entries {
        hash.update(e.xxh3.as_bytes());
    }
    Ok(CacheManifest {
        format_version: FORMAT_VERSION,
        name: String::new(),
        kind: "tokens".into(),
        files: entries.clone(),
        tokenizer: format!("pre-tokenized ({dtype:?} ids)").to_lowercase(),
        tokenizer_files: Vec::new(),
        contents_name: String::new(),
        documents: entries.len() as u64,
        tokens,
        max_token_id,
        loss_mask: false,
        trained_tokens: tokens,
        token_files_dtype: Some(dtype),
        skipped_records: skipped.len() as u64,
        skipped_examples: examples(&skipped),
        untrained_documents: 0,
        first_untrained: None,
        merged_boundaries: 0,
        first_merged_boundary: None,
        untrained_eos: None,
        turn_end: None,
        content_hash: format!("{:032x}", hash.digest128()),
        input_bytes: entries.iter().map(|e| e.size).sum(),
        seconds: 0.0,
        created_unix_s: cache::now_unix_s(),
    })
}

/// One token file's entry and largest id, or why it cannot be used.
fn check_token_file(
    file: &DataFile,
    dtype: TokenDtype,
) -> Result<std::result::Result<(SourceFile, u64), Skipped>> {
    let width = dtype_width(dtype);
    let bad = |why: String| Ok(Err(Skipped::new(Origin::new(&file.path, 0), why)));
    if file.size == 0 {
        return bad("the file is empty".into());
    }
    if !file.size.is_multiple_of(width) {
        return bad(format!(
            "its size ({} bytes) is not a whole number of {}-byte ids: not a {} token file",
            file.size,
            width,
            format!("{dtype:?}").to_lowercase()
        ));
    }
    // In chunks: token files are often larger than memory.
    let mut max = 0u64;
    let (mut first_chunk, mut looks_u32) = (true, false);
    let hash = match read_chunks(&file.path, |chunk| {
        if first_chunk && dtype == TokenDtype::U16 && file.size.is_multiple_of(4) {
            looks_u32 = u32_ids_as_u16(chunk);
        }
        first_chunk = false;
        let chunk_max = match dtype {
            TokenDtype::U16 => chunk
                .chunks_exact(2)
                .map(|c| u64::from(u16::from_le_bytes([c[0], c[1]])))
                .max(),
            TokenDtype::U32 => chunk
                .chunks_exact(4)
                .map(|c| u64::from(u32::from_le_bytes([c[0], c[1], c[2], c[3]])))
                .max(),
        };
        max = max.max(chunk_max.unwrap_or(0));
    }) {
        Ok(hash) => hash,
        Err(e) => return bad(format!("cannot be read: {e}")),
    };
    // Every dtype reads the file; a wrong one is not a bad file to skip but a setting to fix.
    if looks_u32 {
        return Err(DataError::BadRecord {
            origin: Origin::new(&file.path, 0),
            why: format!(
                "it looks like a file of u32 ids, not u16: read as u16 ids, every second one of \
                 its first {} is 0 (the high half of a u32 id below 65,536)",
                thousands(file.size.min(U32_PROBE_BYTES as u64) / 2)
            ),
            fix: "set `data.dtype: u32`".into(),
        });
    }
    Ok(Ok((
        SourceFile {
            path: file.path.clone(),
            size: file.size,
            mtime_ns: file.mtime_ns,
            xxh3: hash,
            tokens: Some(file.size / width),
        },
        max,
    )))
}

/// Bytes of a `u16` token file looked at for the zeros of `u32` ids.
const U32_PROBE_BYTES: usize = 1 << 20;

/// Whether the start of a file read as `u16` ids looks like `u32` ids below 65,536: at least
/// 64 ids, every odd one 0 (the high half of a `u32`), not all of them 0.
fn u32_ids_as_u16(start: &[u8]) -> bool {
    // Little-endian u32s: each 4 bytes are a low u16, then a high one.
    let pairs = start[..start.len().min(U32_PROBE_BYTES)].chunks_exact(4);
    pairs.len() >= 32
        && pairs.clone().all(|p| p[2] == 0 && p[3] == 0)
        && pairs.clone().any(|p| p[0] != 0 || p[1] != 0)
}

/// Content hashes of the input files (read again: they are in the page cache by now).
fn hash_files(files: &[DataFile], threads: usize) -> Result<Vec<SourceFile>> {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads.max(1))
        .build()
        .map_err(|e| DataError::Config(format!("cannot start hashing threads: {e}")))?;
    pool.install(|| {
        files
            .par_iter()
            .map(|f| {
                // A skipped unreadable file has no hash.
                let xxh3 = read_chunks(&f.path, |_| {}).unwrap_or_default();
                // Hashed after tokenizing: the hash is of the bytes tokenized only if the file
                // is as it was listed before.
                if let Ok(now) = files::stat(&f.path) {
                    if (now.size, now.mtime_ns) != (f.size, f.mtime_ns) {
                        return Err(DataError::ChangedWhileRead {
                            path: f.path.clone(),
                            change: if now.size != f.size {
                                format!("{} → {} bytes", f.size, now.size)
                            } else {
                                "modified, same size".into()
                            },
                        });
                    }
                }
                Ok(SourceFile {
                    path: f.path.clone(),
                    size: f.size,
                    mtime_ns: f.mtime_ns,
                    xxh3,
                    tokens: None,
                })
            })
            .collect()
    })
}

/// The xxh3-64 of `path`'s bytes, as a cache's manifest lists it.
pub(crate) fn file_hash(path: &Path) -> std::io::Result<String> {
    read_chunks(path, |_| {})
}

/// Reads `path` in chunks (a whole number of 4-byte ids each), handing each to `each`;
/// returns the xxh3-64 of the whole file.
fn read_chunks(path: &Path, mut each: impl FnMut(&[u8])) -> std::io::Result<String> {
    use std::io::Read;
    let mut file = std::fs::File::open(path)?;
    let mut hash = xxhash_rust::xxh3::Xxh3::new();
    let mut buf = vec![0u8; 8 << 20];
    loop {
        let mut filled = 0;
        while filled < buf.len() {
            let n = file.read(&mut buf[filled..])?;
            if n == 0 {
                break;
            }
            filled += n;
        }
        if filled == 0 {
            break;
        }
        hash.update(&buf[..filled]);
        each(&buf[..filled]);
        if filled < buf.len() {
            break;
        }
    }
    Ok(format!("{:016x}", hash.digest()))
}

fn examples(skipped: &[Skipped]) -> Vec<String> {
    skipped
        .iter()
        .take(SKIPPED_SHOWN)
        .map(|s| format!("{}: {}", s.origin, s.why))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A build that ran out of room names the cache folder, the data's size and what to do;
    /// other failures pass as they are.
    #[test]
    fn a_full_disk_is_said_as_such() {
        let source = DataSource::Text {
            files: vec!["a.txt".into()],
            split: shardrun_protocol::config::TextSplit::File,
        };
        let spec = SourceSpec {
            source: &source,
            tokenizer: &TokenizerConfig::Bytes,
            on_bad_record: OnBadRecord::Stop,
            cache_dir: Path::new("/data/cache"),
            threads: 1,
            what: "training data",
        };
        let files = [DataFile {
            path: "a.txt".into(),
            size: 2_500_000,
            mtime_ns: 0,
            ctime_ns: 0,
        }];
        let full = DataError::io("write", Path::new("/data/cache/.text-1.tmp-1-h/tokens.u32"))(
            std::io::Error::from_raw_os_error(libc::ENOSPC),
        );
        let said = out_of_room(&spec, &files, full).to_string();
        assert!(
            said.starts_with(
                "the data cache /data/cache ran out of room while preparing training data (No \
                 space left on device"
            ) && said.contains("set `data.cache_dir` to a folder on a disk with room")
                && said.ends_with(
                    "it takes about 10.00 MB (4 bytes a token) for these 2.50 MB of data files"
                ),
            "{said}"
        );
        let other =
            DataError::io("write", Path::new("/x"))(std::io::Error::from_raw_os_error(libc::EIO));
        assert!(matches!(
            out_of_room(&spec, &files, other),
            DataError::Io { .. }
        ));
    }

    #[test]
    fn a_file_written_while_it_was_tokenized_fails_the_cache() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("records.jsonl");
        std::fs::write(&path, "{\"text\": \"a\"}\n").unwrap();
        let listed = files::stat(&path).unwrap();
        assert_eq!(
            hash_files(std::slice::from_ref(&listed), 1).unwrap().len(),
            1
        );

        // Edited in place (same size), then appended to.
        std::fs::write(&path, "{\"text\": \"b\"}\n").unwrap();
        let touched = files::stat(&path).unwrap();
        let listed_before = DataFile {
            mtime_ns: touched.mtime_ns - 1,
            ..listed.clone()
        };
        let e = hash_files(&[listed_before], 1).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!(
                "{} changed while it was being tokenized (modified, same size): its tokens \
                 would match neither version; run again once nothing writes to it",
                path.display()
            )
        );
        std::fs::write(&path, "{\"text\": \"bigger\"}\n").unwrap();
        let e = hash_files(&[listed], 1).unwrap_err();
        assert!(e.to_string().contains("(14 → 19 bytes)"), "{e}");
    }

    fn key_of(tokenizer_config: &str, model_config: Option<&str>) -> Vec<(String, String)> {
        try_key_of(tokenizer_config, model_config).unwrap()
    }

    fn try_key_of(
        tokenizer_config: &str,
        model_config: Option<&str>,
    ) -> Result<Vec<(String, String)>> {
        let folder = tempfile::tempdir().unwrap();
        std::fs::write(folder.path().join("tokenizer.json"), "{}").unwrap();
        std::fs::write(
            folder.path().join("tokenizer_config.json"),
            tokenizer_config,
        )
        .unwrap();
        if let Some(config) = model_config {
            std::fs::write(folder.path().join("config.json"), config).unwrap();
        }
        let config = TokenizerConfig::HuggingFace {
            path: folder.path().to_path_buf(),
            bos_token: None,
            eos_token: None,
        };
        let source = DataSource::Text {
            files: Vec::new(),
            split: shardrun_protocol::config::TextSplit::File,
        };
        tokenizer_key(&config, &source)
    }

    fn names(key: &[(String, String)]) -> Vec<&str> {
        key.iter().map(|(name, _)| name.as_str()).collect()
    }

    #[test]
    fn chat_cache_keys_name_how_masks_and_ends_are_made() {
        // Their masks come from the blocks; caches made when they came from growing
        // prefixes must not be reused. Caches of other templates keep their names.
        let folder = tempfile::tempdir().unwrap();
        std::fs::write(folder.path().join("tokenizer.json"), "{}").unwrap();
        let template = |text: &str| {
            std::fs::write(folder.path().join("chat_template.jinja"), text).unwrap();
        };
        let config = TokenizerConfig::HuggingFace {
            path: folder.path().to_path_buf(),
            bos_token: None,
            eos_token: None,
        };
        let spec_template = folder.path().join("spec.jinja");
        std::fs::write(&spec_template, "{{ messages[0].content }}").unwrap();
        let chat = |spec: bool| DataSource::Chat {
            files: Vec::new(),
            messages_field: "messages".into(),
            chat_template: spec.then(|| spec_template.clone()),
            chat_template_kwargs: Default::default(),
        };
        let text = DataSource::Text {
            files: Vec::new(),
            split: shardrun_protocol::config::TextSplit::File,
        };
        let marks = |source: &DataSource| {
            let key = tokenizer_key(&config, source).unwrap();
            names(&key).contains(&"assistant_mask")
        };
        template("{% for m in messages %}{{ m.content }}{% endfor %}");
        assert!(!marks(&chat(false)));
        template("{% for m in messages %}{%- generation %}{{ m.content }}{% endgeneration %}{% endfor %}");
        assert!(marks(&chat(false)));
        assert!(
            !marks(&chat(true)),
            "the spec's template takes the folder's place"
        );
        assert!(!marks(&text));
        let ends = |source: &DataSource| {
            let key = tokenizer_key(&config, source).unwrap();
            names(&key).contains(&"chat_end")
        };
        assert!(ends(&chat(false)) && ends(&chat(true)) && !ends(&text));
    }

    #[test]
    fn the_cache_key_of_a_rebuilt_tokenizer_names_the_rebuild() {
        // The files are those an older shardrun tokenized with `tokenizer.json` as saved:
        // the key must differ from theirs, or their caches (other ids) would be reused.
        for class in ["LlamaTokenizer", "LlamaTokenizerFast", "CodeLlamaTokenizer"] {
            let key = key_of(
                &format!(r#"{{"tokenizer_class": "{class}"}}"#),
                Some(r#"{"model_type": "llama"}"#),
            );
            let rebuild = key.iter().find(|(name, _)| name == "rebuild");
            assert!(
                rebuild.is_some_and(|(_, how)| how.contains(class.trim_end_matches("Fast"))),
                "{class}: {key:?}"
            );
            // Where the caches built with the rebuild have it: elsewhere, their names change.
            assert_eq!(
                names(&key),
                [
                    "tokenizer.json",
                    "rebuild",
                    "tokenizer_config.json",
                    "config.json",
                    "bos_token",
                    "eos_token"
                ]
            );
        }
        let key = key_of(r#"{"tokenizer_class": "LlamaTokenizer"}"#, None);
        assert_eq!(
            key[1].1,
            "transformers 5 rebuild v1: built as transformers 5 builds LlamaTokenizer: no \
             normalizer, Metaspace prepend_scheme first"
        );
        let key = key_of(
            r#"{"tokenizer_class": "TokenizersBackend"}"#,
            Some(r#"{"model_type": "qwen2"}"#),
        );
        assert_eq!(
            key[1].1,
            "transformers 5 rebuild v1: built as transformers 5 builds Qwen2Tokenizer: NFC, \
             Qwen's pre-tokenizer, add_prefix_space false"
        );
        let err = try_key_of(r#"{"tokenizer_class": "#, None).unwrap_err();
        assert!(err.to_string().contains("not valid JSON"), "{err}");
        // Tokenizers transformers uses as saved keep the key they had.
        for (tokenizer_config, model_config) in [
            (r#"{"tokenizer_class": "PreTrainedTokenizerFast"}"#, None),
            (
                r#"{"tokenizer_class": "LlamaTokenizer"}"#,
                Some(r#"{"model_type": "mistral"}"#),
            ),
        ] {
            let key = key_of(tokenizer_config, model_config);
            let files = if model_config.is_some() { 3 } else { 2 };
            let mut want = vec!["tokenizer.json", "tokenizer_config.json", "config.json"];
            want.truncate(files);
            want.extend(["bos_token", "eos_token"]);
            assert_eq!(names(&key), want, "{tokenizer_config}");
        }
    }
}
