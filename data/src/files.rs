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

/// Every file the patterns name, each once (however it is named: `d/../d/a.txt` and a
/// link to it are `d/a.txt`), in pattern order and sorted within a pattern (so the document
/// order does not depend on the file system).
pub fn expand(patterns: &[PathBuf]) -> Result<Vec<DataFile>> {
    let mut files: Vec<DataFile> = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for pattern in patterns {
        let text = utf8(pattern)?;
        let mut matched: Vec<PathBuf> = if is_glob(text) && !pattern.is_file() {
            glob_files(text)?.collect::<Result<_>>()?
        } else {
            vec![literal(pattern, text)?]
        };
        if matched.is_empty() {
            return Err(DataError::NoFiles {
                pattern: text.to_string(),
            });
        }
        matched.sort();
        for path in matched {
            let file = std::fs::canonicalize(&path).unwrap_or_else(|_| path.clone());
            if seen.insert(file) {
                files.push(stat(&path)?);
            }
        }
    }
    Ok(files)
}

/// Whether `pattern` names at least one file, as [`expand`] reads it, found without listing
/// every match: `shardrun plan` checks each pattern before anything is queued.
pub fn check(pattern: &Path) -> Result<()> {
    let text = utf8(pattern)?;
    if !is_glob(text) || pattern.is_file() {
        return literal(pattern, text).map(|_| ());
    }
    match glob_files(text)?.next() {
        Some(first) => first.map(|_| ()),
        None => Err(DataError::NoFiles {
            pattern: text.to_string(),
        }),
    }
}

fn utf8(pattern: &Path) -> Result<&str> {
    pattern.to_str().ok_or_else(|| DataError::Pattern {
        pattern: pattern.display().to_string(),
        why: "the path is not valid UTF-8".into(),
    })
}

/// The files a glob pattern matches, in the order `glob` yields them. As in the shell and
/// Python's `glob`, a wildcard does not match a name starting with a dot: hidden files and
/// folders (`.ipynb_checkpoints/`, editor swap files) are not data unless named.
fn glob_files(text: &str) -> Result<impl Iterator<Item = Result<PathBuf>>> {
    let options = glob::MatchOptions {
        require_literal_leading_dot: true,
        ..glob::MatchOptions::new()
    };
    let paths = glob::glob_with(text, options).map_err(|e| DataError::Pattern {
        pattern: text.to_string(),
        why: e.to_string(),
    })?;
    Ok(paths.filter_map(|entry| match entry {
        // A pattern like `dir/**` also yields folders: they hold the files, they are not
        // documents.
        Ok(path) => (!path.is_dir()).then_some(Ok(path)),
        Err(e) => Some(Err(DataError::Io {
            doing: "list",
            path: e.path().to_path_buf(),
            source: e.into(),
        })),
    }))
}

/// A path without pattern characters: the file itself.
fn literal(pattern: &Path, text: &str) -> Result<PathBuf> {
    match std::fs::metadata(pattern) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(DataError::NoFiles {
            pattern: text.to_string(),
        }),
        Err(e) => Err(DataError::io("read", pattern)(e)),
        Ok(meta) if meta.is_dir() => Err(DataError::Folder {
            path: pattern.to_path_buf(),
        }),
        Ok(_) => Ok(pattern.to_path_buf()),
    }
}

pub fn stat(path: &Path) -> Result<DataFile> {
    let meta = std::fs::metadata(path).map_err(DataError::io("read", path))?;
    Ok(DataFile {
        path: path.to_path_buf(),
        size: meta.len(),
        mtime_ns: mtime_ns(&meta),
        ctime_ns: i128::from(meta.ctime()) * 1_000_000_000 + i128::from(meta.ctime_nsec()),
    })
}

/// A file's modification time, nanoseconds since the epoch.
pub fn mtime_ns(meta: &std::fs::Metadata) -> i128 {
    i128::from(meta.mtime()) * 1_000_000_000 + i128::from(meta.mtime_nsec())
}

/// Whether `text` has pattern characters (else it names one file). A file whose name has
/// them (`data[1].jsonl`) is taken as named.
pub fn is_glob(text: &str) -> bool {
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

    #[test]
    fn wildcards_skip_hidden_names_and_each_file_is_read_once() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::create_dir_all(d.join("data/.ipynb_checkpoints")).unwrap();
        for name in [
            "data/a.jsonl",
            "data/.a.jsonl.swp.jsonl",
            "data/.ipynb_checkpoints/a-checkpoint.jsonl",
            "data/b[1].jsonl",
        ] {
            std::fs::write(d.join(name), "{}").unwrap();
        }
        std::os::unix::fs::symlink(d.join("data/a.jsonl"), d.join("link.jsonl")).unwrap();
        let names = |patterns: &[&str]| -> Vec<String> {
            let patterns: Vec<PathBuf> = patterns.iter().map(|p| d.join(p)).collect();
            expand(&patterns)
                .unwrap()
                .iter()
                .map(|f| f.path.strip_prefix(d).unwrap().display().to_string())
                .collect()
        };
        // As the shell and Python's glob: hidden names only when written.
        assert_eq!(
            names(&["data/**/*.jsonl"]),
            ["data/a.jsonl", "data/b[1].jsonl"]
        );
        assert_eq!(
            names(&["data/.ipynb_checkpoints/*.jsonl"]),
            ["data/.ipynb_checkpoints/a-checkpoint.jsonl"]
        );
        // One file under three names is read once, as first named.
        assert_eq!(
            names(&["data/*.jsonl", "data/../data/a.jsonl", "link.jsonl"]),
            ["data/a.jsonl", "data/b[1].jsonl"]
        );
        // A name with pattern characters that is a file is that file.
        assert_eq!(names(&["data/b[1].jsonl"]), ["data/b[1].jsonl"]);
        check(&d.join("data/b[1].jsonl")).unwrap();
    }

    #[test]
    fn check_agrees_with_expand() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("deep/er")).unwrap();
        std::fs::write(dir.path().join("deep/er/a.txt"), "x").unwrap();
        for found in ["**/*.txt", "deep/er/a.txt", "deep/**/*"] {
            check(&dir.path().join(found)).unwrap_or_else(|e| panic!("{found}: {e}"));
        }
        for (missing, folder) in [("*.txt", false), ("deep/a.txt", false), ("deep", true)] {
            let pattern = dir.path().join(missing);
            let (checked, expanded) = (check(&pattern), expand(&[pattern]));
            match folder {
                false => assert!(
                    matches!(checked, Err(DataError::NoFiles { .. }))
                        && matches!(expanded, Err(DataError::NoFiles { .. })),
                    "{missing}"
                ),
                true => assert!(
                    matches!(checked, Err(DataError::Folder { .. }))
                        && matches!(expanded, Err(DataError::Folder { .. })),
                    "{missing}"
                ),
            }
        }
        assert!(matches!(
            check(&dir.path().join("[x")),
            Err(DataError::Pattern { .. })
        ));
    }
}
