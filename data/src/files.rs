//! `data.files`: patterns expanded to files, and what identifies each file's version without
//! reading it: size, modification time, and status-change time (which no tool can set back,
//! so a file replaced or rewritten keeping its size and modification time is still noticed).

use crate::error::{DataError, Result};
use serde::{Deserialize, Serialize};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// One data file as it is now.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DataFile {
    pub path: PathBuf,
    pub size: u64,
    /// Modification time, nanoseconds since the epoch.
    pub mtime_ns: i128,
    /// Status-change time, nanoseconds since the epoch.
    pub ctime_ns: i128,
}

/// Every file the patterns name, each once, in pattern order and sorted within a pattern
/// (so the document order does not depend on the file system).
pub fn expand(patterns: &[PathBuf]) -> Result<Vec<DataFile>> {
    let mut files: Vec<DataFile> = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for pattern in patterns {
        let text = pattern.to_str().ok_or_else(|| DataError::Pattern {
            pattern: pattern.display().to_string(),
            why: "the path is not valid UTF-8".into(),
        })?;
        let mut matched: Vec<PathBuf> = if is_glob(text) {
            let paths = glob::glob(text).map_err(|e| DataError::Pattern {
                pattern: text.to_string(),
                why: e.to_string(),
            })?;
            let mut found = Vec::new();
            for entry in paths {
                let path = entry.map_err(|e| DataError::Io {
                    doing: "list",
                    path: e.path().to_path_buf(),
                    source: e.into(),
                })?;
                // A pattern like `dir/**` also yields folders: they hold the files, they
                // are not documents.
                if !path.is_dir() {
                    found.push(path);
                }
            }
            found
        } else {
            match std::fs::metadata(pattern) {
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    return Err(DataError::NoFiles {
                        pattern: text.to_string(),
                    })
                }
                Err(e) => return Err(DataError::io("read", pattern)(e)),
                Ok(meta) if meta.is_dir() => {
                    return Err(DataError::Folder {
                        path: pattern.clone(),
                    })
                }
                Ok(_) => vec![pattern.clone()],
            }
        };
        if matched.is_empty() {
            return Err(DataError::NoFiles {
                pattern: text.to_string(),
            });
        }
        matched.sort();
        for path in matched {
            if seen.insert(path.clone()) {
                files.push(stat(&path)?);
            }
        }
    }
    Ok(files)
}

pub fn stat(path: &Path) -> Result<DataFile> {
    let meta = std::fs::metadata(path).map_err(DataError::io("read", path))?;
    Ok(DataFile {
        path: path.to_path_buf(),
        size: meta.len(),
        mtime_ns: i128::from(meta.mtime()) * 1_000_000_000 + i128::from(meta.mtime_nsec()),
        ctime_ns: i128::from(meta.ctime()) * 1_000_000_000 + i128::from(meta.ctime_nsec()),
    })
}

fn is_glob(text: &str) -> bool {
    text.contains(['*', '?', '['])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_expand_sorted_once_each() {
        let dir = tempfile::tempdir().unwrap();
        for name in ["b.txt", "a.txt", "c.md"] {
            std::fs::write(dir.path().join(name), "x").unwrap();
        }
        std::fs::create_dir(dir.path().join("sub.txt")).unwrap();
        let files = expand(&[dir.path().join("*.txt"), dir.path().join("a.txt")]).unwrap();
        let names: Vec<_> = files
            .iter()
            .map(|f| f.path.file_name().unwrap().to_str().unwrap().to_string())
            .collect();
        assert_eq!(names, ["a.txt", "b.txt"]);
        assert!(matches!(
            expand(&[dir.path().join("*.json")]),
            Err(DataError::NoFiles { .. })
        ));
        assert!(matches!(
            expand(&[dir.path().join("missing.txt")]),
            Err(DataError::NoFiles { .. })
        ));
        assert!(matches!(
            expand(&[dir.path().to_path_buf()]),
            Err(DataError::Folder { .. })
        ));
    }
}
