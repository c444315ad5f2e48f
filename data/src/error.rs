//! What can go wrong with data, each error naming the file (and record) and what to do.

use std::fmt;
use std::path::{Path, PathBuf};

/// Where a document came from: a file, and the line its record starts on (0 when the whole
/// file is the document).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Origin {
    pub path: PathBuf,
    pub line: u64,
}

impl Origin {
    pub fn new(path: &Path, line: u64) -> Origin {
        Origin {
            path: path.to_path_buf(),
            line,
        }
    }
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.line == 0 {
            write!(f, "{}", self.path.display())
        } else {
            write!(f, "{}:{}", self.path.display(), self.line)
        }
    }
}

/// What to do about a bad record, unless the record says more.
pub const SKIP_HINT: &str =
    "fix or remove it, or set `data.on_bad_record: skip` to skip bad records";

#[derive(Debug, thiserror::Error)]
pub enum DataError {
    #[error("no file matches `{pattern}` (data.files): check the path; relative paths are relative to the job spec")]
    NoFiles { pattern: String },
    #[error("{} is a folder: name the files in it, e.g. `{}/**/*.txt`", path.display(), path.display())]
    Folder { path: PathBuf },
    #[error("`{pattern}` is not a valid file pattern: {why}")]
    Pattern { pattern: String, why: String },
    #[error("cannot {doing} {}: {source}", path.display())]
    Io {
        doing: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    /// A data cache folder this user cannot add the preparation of this data to.
    #[error("{}", cache_not_writable(path, whose, this_user))]
    CacheNotWritable {
        path: PathBuf,
        /// Its owner and permission bits, where they can be read.
        whose: Option<(String, u32)>,
        this_user: String,
    },
    /// The data cache's file system took no more while the data was prepared (a full disk,
    /// a quota); nothing of the preparation is left.
    #[error("the data cache {} ran out of room while preparing {what} ({source}); nothing of it was kept\n  fix: free space there (or raise the quota), or set `data.cache_dir` to a folder on a disk with room: it takes {needs} for these {data_size} of data files", path.display())]
    CacheFull {
        path: PathBuf,
        what: String,
        /// The data files' size, in words (`2.50 MB`).
        data_size: String,
        /// How much the cache takes, in words (`about 10 MB (4 bytes a token)`).
        needs: String,
        source: std::io::Error,
    },
    /// A record (or a whole file) that cannot be used; `on_bad_record: skip` skips these.
    #[error("{origin}: {why}; {fix}")]
    BadRecord {
        origin: Origin,
        why: String,
        fix: String,
    },
    #[error("tokenizer {}: {why}", path.display())]
    Tokenizer { path: PathBuf, why: String },
    /// A special token the spec names (`data.tokenizer.eos_token` or `bos_token`, the `key`)
    /// that the tokenizer does not have; `special` lists the ones it has, in words.
    #[error("tokenizer {}: data.tokenizer.{key} names `{token}`, but the tokenizer has no such token{special}", path.display())]
    UnknownSpecToken {
        path: PathBuf,
        key: String,
        token: String,
        special: String,
    },
    #[error("chat template {}: {why}", path.display())]
    ChatTemplate { path: PathBuf, why: String },
    /// Chat data with no template named and none in the tokenizer folder.
    #[error("chat template {}: no chat template (chat_template.jinja, additional_chat_templates/, or `chat_template` in tokenizer_config.json); name a Jinja file in `data.chat_template`", folder.display())]
    NoChatTemplate { folder: PathBuf },
    #[error("{origin}: token id {token} is outside the model's vocabulary (vocab_size {vocab_size}); {fix}")]
    TokenOutOfRange {
        origin: Origin,
        token: u64,
        vocab_size: u64,
        fix: String,
    },
    #[error("{origin}: a document of {tokens} tokens does not fit a sequence of {seq_len} (packing: whole_documents); raise `seq_len`, set `data.truncate: true` to keep its first {seq_len} tokens, use `packing: stream` (documents continue into the next sequence), or set `data.on_bad_record: skip` to leave it out")]
    DocumentTooLong {
        origin: Origin,
        tokens: u64,
        seq_len: u64,
    },
    #[error("data cache {}: {why}", path.display())]
    Cache { path: PathBuf, why: String },
    /// A token file read in place (`kind: tokens`) that is no longer as it was prepared.
    #[error("{}: {why}; run again (its data is then prepared anew), and write no token file a job reads", path.display())]
    TokenFileChanged { path: PathBuf, why: String },
    /// A data file written to while it was tokenized: its tokens are of no one version.
    #[error("{} changed while it was being tokenized ({change}): its tokens would match neither version; run again once nothing writes to it", path.display())]
    ChangedWhileRead { path: PathBuf, change: String },
    #[error("{why}; {fix}")]
    NotEnoughData { why: String, fix: String },
    #[error("{0}")]
    Config(String),
}

fn cache_not_writable(path: &Path, whose: &Option<(String, u32)>, this_user: &str) -> String {
    let path = path.display();
    let fix = "or set `data.cache_dir` to a folder of your own";
    match whose {
        Some((owner, mode)) if owner == this_user => format!(
            "the data cache {path} cannot be written (it is this user's, mode {mode:o}: made \
             read-only, or on a read-only file system) and holds no preparation of this data \
             as its files are now: `chmod u+w` it, {fix}"
        ),
        Some((owner, mode)) => format!(
            "this user ({this_user}) cannot write the data cache {path}, which is {owner}'s \
             (mode {mode:o}), and it holds no preparation of this data as its files are now: \
             ask {owner} to run `shardrun prepare` with this job spec, {fix}"
        ),
        None => format!(
            "this user ({this_user}) cannot write the data cache {path}, and it holds no \
             preparation of this data as its files are now: ask its owner to run `shardrun \
             prepare` with this job spec, {fix}"
        ),
    }
}

impl DataError {
    pub fn io<'a>(
        doing: &'static str,
        path: &'a Path,
    ) -> impl FnOnce(std::io::Error) -> DataError + 'a {
        move |source| DataError::Io {
            doing,
            path: path.to_path_buf(),
            source,
        }
    }

    pub fn bad(origin: Origin, why: impl Into<String>) -> DataError {
        DataError::BadRecord {
            origin,
            why: why.into(),
            fix: SKIP_HINT.into(),
        }
    }

    /// Whether `on_bad_record: skip` may skip this error's record.
    pub fn is_skippable(&self) -> bool {
        matches!(
            self,
            DataError::BadRecord { .. } | DataError::DocumentTooLong { .. }
        )
    }
}

pub type Result<T, E = DataError> = std::result::Result<T, E>;
