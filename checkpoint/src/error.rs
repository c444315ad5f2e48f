//! Every way a checkpoint can fail to save or load. Each variant names the file (or folder)
//! involved and the message says what to do next, so a log line is enough to act on.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error("{path}: {what}: {source}")]
    Io {
        path: PathBuf,
        what: &'static str,
        #[source]
        source: std::io::Error,
    },

    #[error("{path} is not a complete checkpoint (no COMPLETE marker): its save did not finish, or the marker was removed since; it cannot be used (a resume sets a `step-<N>` folder without one aside as `step-<N>.damaged`, kept for repair)")]
    Incomplete { path: PathBuf },

    #[error("{path}: file is {actual} bytes, the metadata says {expected}: the file is truncated or was replaced; this checkpoint cannot be used")]
    SizeMismatch {
        path: PathBuf,
        expected: u64,
        actual: u64,
    },

    #[error("{path}: sha256 is {actual}, {recorded_in} says {expected}: the file is corrupted; this checkpoint cannot be used")]
    ChecksumMismatch {
        path: PathBuf,
        expected: String,
        actual: String,
        /// Where `expected` is written: `the metadata` for a data file, `COMPLETE` for
        /// `metadata.json` itself.
        recorded_in: &'static str,
    },

    #[error("{path}: {what}")]
    Malformed { path: PathBuf, what: String },

    #[error("{path}: written by checkpoint format version {found}, this build reads version {supported}: use a shardrun build of the same version to read or export it")]
    UnsupportedVersion {
        path: PathBuf,
        found: u32,
        supported: u32,
    },

    #[error("{path}: the checkpoint does not fit this model: {what}. Check that the job spec's model matches the one that wrote the checkpoint")]
    LayoutMismatch { path: PathBuf, what: String },

    #[error("invalid layout: {0}")]
    InvalidLayout(String),

    #[error("{path}: {what}")]
    Commit { path: PathBuf, what: String },

    #[error("no checkpoint in {path}: {what}")]
    NotFound { path: PathBuf, what: String },

    /// A checkpoint that cannot be read (permissions, a file system error) is not known to
    /// be damaged: nothing resumes past it, which would train its steps again.
    #[error("{checkpoint} cannot be read ({cause}): it is not known to be damaged, so it is not passed over as a damaged one would be\n  fix: make it readable to this user (the files' permissions and owner, the file system) and run it again; {if_lost}")]
    Unreadable {
        checkpoint: PathBuf,
        cause: Box<CheckpointError>,
        /// What to do if it is lost for good: move it aside, and what is used then.
        if_lost: String,
    },
}

pub type Result<T, E = CheckpointError> = std::result::Result<T, E>;

impl CheckpointError {
    pub(crate) fn io(
        path: impl Into<PathBuf>,
        what: &'static str,
    ) -> impl FnOnce(std::io::Error) -> Self {
        let path = path.into();
        move |source| CheckpointError::Io { path, what, source }
    }

    /// Whether the files could not be read at all (permission denied, an I/O error of the
    /// file system, a file server or mount that did not answer), as opposed to read and found
    /// wrong: missing, cut short, corrupted, a file where a folder should be. Only what was
    /// found wrong is damage; any other error of the system is taken as not being able to
    /// read, so a checkpoint is never passed over for a hiccup of its file system.
    pub fn is_unreadable(&self) -> bool {
        match self {
            CheckpointError::Io { source, .. } => {
                !matches!(
                    source.kind(),
                    std::io::ErrorKind::UnexpectedEof | std::io::ErrorKind::InvalidData
                ) && !matches!(
                    source.raw_os_error(),
                    Some(libc::ENOENT | libc::ENOTDIR | libc::EISDIR | libc::ELOOP)
                )
            }
            CheckpointError::Unreadable { .. } => true,
            _ => false,
        }
    }

    pub(crate) fn malformed(path: impl Into<PathBuf>, what: impl Into<String>) -> Self {
        CheckpointError::Malformed {
            path: path.into(),
            what: what.into(),
        }
    }
}
