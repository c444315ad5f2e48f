//! What a dataset is made of: the fingerprint of its sample stream, and the files and
//! tokenizer behind each prepared source. A run records it, so that resuming on other data
//! is refused before any rank starts, saying what changed.

use crate::cache::{CacheManifest, SourceFile};
use crate::error::Result;
use crate::files::{self, DataFile};
use crate::prepare::{file_hash, prepared_manifest, DatasetSources};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use shardrun_protocol::config::{DatasetConfig, HeldOut, Packing};
use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

/// File lines a change list shows before counting the rest.
const FILES_SHOWN: usize = 10;

/// The most a look at data files reads to tell whether files only touched (a new
/// modification time, the same size) changed: 2 GiB, seconds on a login node.
pub const READ_AT_MOST: u64 = 2 << 30;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DataIdentity {
    /// Identifies the sample stream (tokens, validation split, packing, truncation, order): equal
    /// fingerprints, equal samples at every position.
    pub fingerprint: String,
    pub training: SourceIdentity,
    /// Validation files of their own (a held-out fraction is part of `training`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub validation: Option<SourceIdentity>,
}

/// One prepared source, from its cache's manifest.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SourceIdentity {
    pub tokenizer: String,
    /// The hashes of the files the tokenizer was built from (caches prepared before they
    /// were recorded have none).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tokenizer_files: Vec<(String, String)>,
    /// As the cache's manifest lists them (modification times and token counts are not
    /// compared).
    pub files: Vec<SourceFile>,
    pub documents: u64,
    pub tokens: u64,
    /// Hash of the tokens, document offsets and loss mask.
    pub content_hash: String,
}

impl SourceIdentity {
    pub fn of(manifest: &CacheManifest) -> SourceIdentity {
        SourceIdentity {
            tokenizer: manifest.tokenizer.clone(),
            tokenizer_files: manifest.tokenizer_files.clone(),
            files: manifest.files.clone(),
            documents: manifest.documents,
            tokens: manifest.tokens,
            content_hash: manifest.content_hash.clone(),
        }
    }
}

impl DataIdentity {
    pub fn new(
        config: &DatasetConfig,
        training: SourceIdentity,
        validation: Option<SourceIdentity>,
    ) -> DataIdentity {
        let mut hash = Sha256::new();
        hash.update(training.content_hash.as_bytes());
        match config.validation.as_ref().map(|v| &v.held_out) {
            None => {}
            // Held-out documents were once each picked with probability `fraction`: a
            // checkpoint taken then trained on other documents.
            Some(HeldOut::Fraction { fraction }) => {
                hash.update(format!("|fraction {fraction}|held out: the nearest count"))
            }
            Some(HeldOut::Files { .. }) => {
                let content = validation.as_ref().map_or("", |v| v.content_hash.as_str());
                hash.update(format!("|validation {content}"));
            }
        }
        hash.update(format!(
            "|seq_len {}|packing {:?}|document_mask {}|shuffle {}",
            config.seq_len, config.packing, config.document_mask, config.shuffle
        ));
        if config.packing == Packing::WholeDocuments {
            // `whole_documents` sequences were once longest first: a checkpoint taken then
            // read other sequences at the same sample positions.
            hash.update("|sequences in document order");
        }
        // Said only when on, so the fingerprints of runs from before `truncate` stand.
        if config.truncate {
            hash.update("|truncated to seq_len");
        }
        DataIdentity {
            fingerprint: hex::encode(&hash.finalize()[..8]),
            training,
            validation,
        }
    }

    /// The identity of `config`'s data as already prepared, preparing nothing: `None` when a
    /// source has no cache for its files as they are now (never prepared, or changed since).
    pub fn probe(config: &DatasetConfig) -> Result<Option<DataIdentity>> {
        DataFiles::now(config)?.prepared_identity(config)
    }

    /// What differs from `earlier`, one line each: files added, removed or changed, another
    /// tokenizer; empty when the fingerprints agree.
    pub fn changes_since(&self, earlier: &DataIdentity) -> Vec<String> {
        if self.fingerprint == earlier.fingerprint {
            return Vec::new();
        }
        let mut lines = source_changes("", &earlier.training, &self.training);
        match (&earlier.validation, &self.validation) {
            (Some(was), Some(now)) => lines.extend(source_changes("validation ", was, now)),
            (None, Some(_)) => lines.push("validation files: added".into()),
            (Some(_), None) => lines.push("validation files: removed".into()),
            (None, None) => {}
        }
        if lines.is_empty() {
            lines.push(
                "the same files and tokenizer, read into other sequences (the split, packing, \
                 truncation or order of the samples changed)"
                    .into(),
            );
        }
        lines
    }
}

/// The files a dataset names as they are now, found without reading them: what can be told
/// of a change to the data before it is prepared again.
#[derive(Debug)]
pub struct DataFiles {
    training: Vec<DataFile>,
    /// `None` when validation holds out training documents, or there is none.
    validation: Option<Vec<DataFile>>,
    /// Contents hashed so far (files modified since a run listed them), each read once for
    /// any number of runs.
    hashes: RefCell<HashMap<PathBuf, Result<String, String>>>,
}

impl DataFiles {
    /// Expands the dataset's patterns and reads each file's size and modification time.
    pub fn now(config: &DatasetConfig) -> Result<DataFiles> {
        let sources = DatasetSources::new(config, 1);
        let validation = match sources.validation() {
            Some(spec) => Some(files::expand(spec.source.files())?),
            None => None,
        };
        Ok(DataFiles {
            training: files::expand(sources.training().source.files())?,
            validation,
            hashes: RefCell::default(),
        })
    }

    /// [`DataIdentity::probe`] of `config`, whose files these are (not listed again).
    pub fn prepared_identity(&self, config: &DatasetConfig) -> Result<Option<DataIdentity>> {
        let sources = DatasetSources::new(config, 1);
        let Some(training) = prepared_manifest(&sources.training(), &self.training)? else {
            return Ok(None);
        };
        let validation = match (sources.validation(), &self.validation) {
            (Some(spec), Some(files)) => match prepared_manifest(&spec, files)? {
                Some(manifest) => Some(SourceIdentity::of(&manifest)),
                None => return Ok(None),
            },
            _ => None,
        };
        Ok(Some(DataIdentity::new(
            config,
            SourceIdentity::of(&training),
            validation,
        )))
    }

    /// Files added, removed, resized, or modified to other contents since `earlier` listed
    /// them, one line each. A file is read only when its modification time changed and its
    /// size did not, once for any number of runs compared with the same `DataFiles`; when
    /// such files hold more than [`READ_AT_MOST`] together (data copied anew, every time
    /// new), none is read and they are taken as they were: looking must stay quick on a login
    /// node, and preparing the data, which reads them anyway, tells. A tokenizer change, or
    /// contents rewritten keeping the modification time, is not seen here (the prepared
    /// data's fingerprint tells those).
    pub fn changes_since(&self, earlier: &DataIdentity) -> Vec<String> {
        self.changes_reading_at_most(earlier, READ_AT_MOST)
    }

    /// [`Self::changes_since`], reading files only touched when they hold at most
    /// `read_at_most` bytes together.
    fn changes_reading_at_most(&self, earlier: &DataIdentity, read_at_most: u64) -> Vec<String> {
        let to_read = self.bytes_to_compare(&earlier.training.files, &self.training)
            + match (&earlier.validation, &self.validation) {
                (Some(was), Some(now)) => self.bytes_to_compare(&was.files, now),
                _ => 0,
            };
        let read = to_read <= read_at_most;
        let mut lines = self.file_changes("", &earlier.training.files, &self.training, read);
        match (&earlier.validation, &self.validation) {
            (Some(was), Some(now)) => {
                lines.extend(self.file_changes("validation ", &was.files, now, read))
            }
            (None, Some(_)) => lines.push("validation files: added".into()),
            (Some(_), None) => lines.push("validation files: removed".into()),
            (None, None) => {}
        }
        lines
    }

    /// The bytes [`Self::file_changes`] would read of one source: files of the same size
    /// whose modification time changed, not read yet.
    fn bytes_to_compare(&self, was: &[SourceFile], now: &[DataFile]) -> u64 {
        let before: BTreeMap<&PathBuf, &SourceFile> = was.iter().map(|f| (&f.path, f)).collect();
        let hashed = self.hashes.borrow();
        now.iter()
            .filter(|new| {
                before
                    .get(&new.path)
                    .is_some_and(|old| only_touched(old, new))
                    && !hashed.contains_key(&new.path)
            })
            .map(|new| new.size)
            .sum()
    }

    /// The files of one source that differ; `read`: whether files only touched are read to
    /// compare their contents (else they are taken as they were).
    fn file_changes(
        &self,
        what: &str,
        was: &[SourceFile],
        now: &[DataFile],
        read: bool,
    ) -> Vec<String> {
        let before: BTreeMap<&PathBuf, &SourceFile> = was.iter().map(|f| (&f.path, f)).collect();
        let after: BTreeMap<&PathBuf, &DataFile> = now.iter().map(|f| (&f.path, f)).collect();
        let mut files = Vec::new();
        for (path, old) in &before {
            let Some(new) = after.get(path) else {
                files.push(format!("{what}{}: removed", path.display()));
                continue;
            };
            let changed = if new.size != old.size {
                Some(format!("{} → {} bytes", old.size, new.size))
            } else if !only_touched(old, new) || !read {
                None
            } else {
                match self.hash(path) {
                    Ok(hash) if hash == old.xxh3 => None,
                    Ok(_) => Some(format!("same size, {} bytes, other contents", new.size)),
                    Err(e) => Some(format!("cannot be read: {e}")),
                }
            };
            if let Some(how) = changed {
                files.push(format!("{what}{}: changed ({how})", path.display()));
            }
        }
        for path in after.keys().filter(|p| !before.contains_key(*p)) {
            files.push(format!("{what}{}: added", path.display()));
        }
        shown(what, files)
    }

    fn hash(&self, path: &Path) -> Result<String, String> {
        self.hashes
            .borrow_mut()
            .entry(path.to_path_buf())
            .or_insert_with(|| file_hash(path).map_err(|e| e.to_string()))
            .clone()
    }
}

/// Whether a file listed as `old` is now `new` with the same size and another modification
/// time: only its contents can tell whether it changed. Identities recorded before they
/// listed modification times have 0: their files are compared by size only, not read on
/// every look.
fn only_touched(old: &SourceFile, new: &DataFile) -> bool {
    old.size == new.size && old.mtime_ns != 0 && old.mtime_ns != new.mtime_ns
}

/// At most [`FILES_SHOWN`] file lines, then how many more.
fn shown(what: &str, mut files: Vec<String>) -> Vec<String> {
    let more = files.len().saturating_sub(FILES_SHOWN);
    files.truncate(FILES_SHOWN);
    if more > 0 {
        files.push(format!("... and {more} more {what}file(s)"));
    }
    files
}

/// The changes of one source; `what` prefixes its lines (`validation `).
fn source_changes(what: &str, was: &SourceIdentity, now: &SourceIdentity) -> Vec<String> {
    let mut lines = Vec::new();
    if was.tokenizer != now.tokenizer {
        lines.push(format!(
            "{what}tokenizer: {} → {}",
            was.tokenizer, now.tokenizer
        ));
    }
    if !was.tokenizer_files.is_empty() && !now.tokenizer_files.is_empty() {
        lines.extend(
            tokenizer_file_changes(&was.tokenizer_files, &now.tokenizer_files)
                .into_iter()
                .map(|line| format!("{what}{line}")),
        );
    }
    let before: BTreeMap<&PathBuf, &SourceFile> = was.files.iter().map(|f| (&f.path, f)).collect();
    let after: BTreeMap<&PathBuf, &SourceFile> = now.files.iter().map(|f| (&f.path, f)).collect();
    let mut files = Vec::new();
    for (path, old) in &before {
        match after.get(path) {
            None => files.push(format!("{what}{}: removed", path.display())),
            Some(new) if new.xxh3 != old.xxh3 || new.size != old.size => {
                let sizes = if new.size == old.size {
                    format!("same size, {} bytes, other contents", new.size)
                } else {
                    format!("{} → {} bytes", old.size, new.size)
                };
                files.push(format!("{what}{}: changed ({sizes})", path.display()));
            }
            Some(_) => {}
        }
    }
    for path in after.keys().filter(|p| !before.contains_key(*p)) {
        files.push(format!("{what}{}: added", path.display()));
    }
    lines.extend(shown(what, files));
    if lines.is_empty() && was.content_hash != now.content_hash {
        lines.push(format!(
            "{what}the same files give other tokens: {} documents, {} tokens → {} documents, {} tokens",
            was.documents, was.tokens, now.documents, now.tokens
        ));
    }
    lines
}

/// How the files a tokenizer is built from changed, one line each (`tokenizer.json:
/// changed`, `chat_template.jinja: added`), from their recorded hashes
/// ([`SourceIdentity::tokenizer_files`]); empty when they are the same.
pub fn tokenizer_file_changes(was: &[(String, String)], now: &[(String, String)]) -> Vec<String> {
    let before: BTreeMap<&str, &str> = was.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let after: BTreeMap<&str, &str> = now.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let named = |key: &str| match key {
        "chat_template" => "the spec's chat_template file".to_string(),
        "rebuild" => "how transformers rebuilds the tokenizer from its files".to_string(),
        file => format!("tokenizer file {file}"),
    };
    let mut lines = Vec::new();
    for (key, old) in &before {
        match after.get(key) {
            None => lines.push(format!("{}: removed", named(key))),
            // The spec's own settings: their values, not hashes.
            Some(new) if key.ends_with("_token") && new != old => {
                lines.push(format!("{key}: {old} → {new}"))
            }
            Some(new) if new != old => lines.push(format!("{}: changed", named(key))),
            Some(_) => {}
        }
    }
    for key in after.keys().filter(|k| !before.contains_key(*k)) {
        lines.push(format!("{}: added", named(key)));
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    fn source(files: &[(&str, u64, &str)], content: &str) -> SourceIdentity {
        SourceIdentity {
            tokenizer: "UTF-8 bytes".into(),
            tokenizer_files: Vec::new(),
            files: files
                .iter()
                .map(|(path, size, xxh3)| SourceFile {
                    path: PathBuf::from(path),
                    size: *size,
                    mtime_ns: 0,
                    xxh3: xxh3.to_string(),
                    tokens: None,
                })
                .collect(),
            documents: 3,
            tokens: 30,
            content_hash: content.into(),
        }
    }

    fn identity(fingerprint: &str, training: SourceIdentity) -> DataIdentity {
        DataIdentity {
            fingerprint: fingerprint.into(),
            training,
            validation: None,
        }
    }

    #[test]
    fn tokenizer_file_changes_name_each_file() {
        let pairs = |list: &[(&str, &str)]| -> Vec<(String, String)> {
            list.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let was = pairs(&[
            ("tokenizer.json", "a"),
            ("tokenizer_config.json", "b"),
            ("special_tokens_map.json", "c"),
            ("eos_token", "None"),
        ]);
        let now = pairs(&[
            ("tokenizer.json", "a2"),
            ("tokenizer_config.json", "b"),
            ("chat_template.jinja", "d"),
            ("eos_token", "Some(\"</s>\")"),
        ]);
        assert_eq!(
            tokenizer_file_changes(&was, &now),
            [
                "eos_token: None → Some(\"</s>\")",
                "tokenizer file special_tokens_map.json: removed",
                "tokenizer file tokenizer.json: changed",
                "tokenizer file chat_template.jinja: added",
            ]
        );
        assert!(tokenizer_file_changes(&was, &was).is_empty());
        // A resume on other data names the tokenizer file behind the change.
        let mut before = source(&[("/d/a.txt", 10, "x")], "c1");
        before.tokenizer_files = was.clone();
        let mut after = source(&[("/d/a.txt", 10, "x")], "c2");
        after.tokenizer_files = pairs(&[
            ("tokenizer.json", "a2"),
            ("tokenizer_config.json", "b"),
            ("special_tokens_map.json", "c"),
            ("eos_token", "None"),
        ]);
        assert_eq!(
            identity("f2", after).changes_since(&identity("f1", before)),
            ["tokenizer file tokenizer.json: changed"]
        );
    }

    #[test]
    fn fingerprints_of_recorded_runs_stand_and_truncation_changes_them() {
        use shardrun_protocol::config::{DataSource, OnBadRecord, TextSplit, TokenizerConfig};
        let mut config = DatasetConfig {
            source: DataSource::Text {
                files: vec!["/d/a.txt".into()],
                split: TextSplit::Line,
            },
            seq_len: 12,
            tokenizer: TokenizerConfig::Bytes,
            packing: Packing::WholeDocuments,
            truncate: false,
            document_mask: true,
            shuffle: true,
            validation: None,
            cache_dir: "/d/cache".into(),
            on_bad_record: OnBadRecord::Stop,
        };
        let training = || source(&[("/d/a.txt", 10, "1")], "x");
        // A run recorded this fingerprint before `truncate` existed: it must still resume.
        let recorded = "8bc1a1b9b576d9c7";
        assert_eq!(
            DataIdentity::new(&config, training(), None).fingerprint,
            recorded
        );
        config.truncate = true;
        assert_ne!(
            DataIdentity::new(&config, training(), None).fingerprint,
            recorded
        );
    }

    #[test]
    fn identities_recorded_with_path_size_and_hash_only_still_read() {
        let recorded = r#"{"fingerprint": "a", "training": {"tokenizer": "UTF-8 bytes",
            "files": [{"path": "/d/a.txt", "size": 10, "xxh3": "1"}],
            "documents": 3, "tokens": 30, "content_hash": "x"}}"#;
        let recorded: DataIdentity = serde_json::from_str(recorded).unwrap();
        assert_eq!(
            recorded,
            identity("a", source(&[("/d/a.txt", 10, "1")], "x"))
        );
    }

    #[test]
    fn changes_name_each_file_added_removed_or_changed() {
        let was = identity(
            "a",
            source(&[("/d/a.txt", 10, "1"), ("/d/b.txt", 20, "2")], "x"),
        );
        let now = identity(
            "b",
            source(&[("/d/a.txt", 12, "9"), ("/d/c.txt", 5, "3")], "y"),
        );
        assert_eq!(
            now.changes_since(&was),
            vec![
                "/d/a.txt: changed (10 → 12 bytes)",
                "/d/b.txt: removed",
                "/d/c.txt: added"
            ]
        );
        assert!(was.changes_since(&was).is_empty());
        let same_files = identity(
            "c",
            source(&[("/d/a.txt", 10, "1"), ("/d/b.txt", 20, "2")], "x"),
        );
        assert_eq!(
            same_files.changes_since(&was),
            vec!["the same files and tokenizer, read into other sequences (the split, packing, truncation or order of the samples changed)"]
        );
    }

    #[test]
    fn files_as_they_are_now_name_what_was_added_removed_resized_or_rewritten() {
        let dir = tempfile::tempdir().unwrap();
        let write = |name: &str, text: &str| {
            let path = dir.path().join(name);
            std::fs::write(&path, text).unwrap();
            path
        };
        let listed = |path: &Path| {
            let file = files::expand(&[path.to_path_buf()]).unwrap().remove(0);
            SourceFile {
                path: file.path,
                size: file.size,
                mtime_ns: file.mtime_ns,
                xxh3: file_hash(path).unwrap(),
                tokens: None,
            }
        };
        let names = ["grown", "rewritten", "restored", "removed", "kept"];
        let paths: Vec<PathBuf> = names.iter().map(|n| write(n, "0123456789")).collect();
        let mut was = identity("a", source(&[], "x"));
        was.training.files = paths.iter().map(|p| listed(p)).collect();
        let now = |paths: &[&PathBuf]| DataFiles {
            training: files::expand(&paths.iter().map(|p| p.to_path_buf()).collect::<Vec<_>>())
                .unwrap(),
            validation: None,
            hashes: RefCell::default(),
        };
        let all: Vec<&PathBuf> = paths.iter().collect();
        assert!(now(&all).changes_since(&was).is_empty());

        let set_mtime = |path: &Path, secs: u64| {
            let time = std::time::UNIX_EPOCH + std::time::Duration::from_secs(secs);
            let file = std::fs::File::options().write(true).open(path).unwrap();
            file.set_modified(time).unwrap();
        };
        write("grown", "0123456789!");
        write("rewritten", "9876543210");
        set_mtime(&paths[1], 1);
        // Written again as it was: a newer modification time, the same bytes.
        write("restored", "0123456789");
        set_mtime(&paths[2], 2);
        let added = write("added", "new");
        let changes =
            now(&[&paths[0], &paths[1], &paths[2], &paths[4], &added]).changes_since(&was);
        let at = |name: &str| dir.path().join(name).display().to_string();
        assert_eq!(
            changes,
            vec![
                format!("{}: changed (10 → 11 bytes)", at("grown")),
                format!("{}: removed", at("removed")),
                format!(
                    "{}: changed (same size, 10 bytes, other contents)",
                    at("rewritten")
                ),
                format!("{}: added", at("added")),
            ]
        );
        // What sizes and names alone tell.
        let by_size = vec![
            format!("{}: changed (10 → 11 bytes)", at("grown")),
            format!("{}: removed", at("removed")),
            format!("{}: added", at("added")),
        ];
        let later = [&paths[0], &paths[1], &paths[2], &paths[4], &added];
        // Files only touched holding more than may be read (20 bytes, "rewritten" and
        // "restored"): none is read, they are taken as they were.
        assert_eq!(now(&later).changes_reading_at_most(&was, 19), by_size);
        let changes = now(&later).changes_reading_at_most(&was, 20);
        assert!(
            changes.iter().any(|c| c.contains("other contents")),
            "{changes:?}"
        );
        // Listed without modification times (identities of older runs): sizes only, no file
        // read.
        for file in &mut was.training.files {
            file.mtime_ns = 0;
        }
        assert_eq!(now(&later).changes_since(&was), by_size);
    }
}
