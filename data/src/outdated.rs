//! Cache folders no preparation opens again: one of the files a folder was built from has
//! since been edited, replaced or removed, so its key (which holds the files' sizes and
//! times) is never asked for again. Every edit of the data leaves one behind; they are found
//! here so that `shardrun prepare` can say how much they hold and remove them on request.
//!
//! Only the data files decide: a folder whose files are as they were stays, even if nothing
//! uses its tokenizer any more (another spec may).

use crate::cache::{self, CacheManifest};
use crate::error::{DataError, Result};
use crate::files;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// A complete cache folder whose data files are no longer as they were.
#[derive(Debug, Clone, PartialEq)]
pub struct OutdatedCache {
    pub dir: PathBuf,
    /// The first of its files that changed and how: `data/b.txt: removed`.
    pub why: String,
    /// What removing it frees: its files not linked from another folder.
    pub bytes: u64,
}

/// The outdated folders under `cache_dir`, oldest first. Folders being built, damaged ones
/// and those of another cache format are left out (preparing their data says what to do).
pub fn find(cache_dir: &Path) -> Vec<OutdatedCache> {
    let mut found = cache::complete_folders(cache_dir);
    found.sort_by(|a, b| a.1.created_unix_s.total_cmp(&b.1.created_unix_s));
    found
        .into_iter()
        .filter_map(|(dir, manifest)| {
            let why = changed_file(&manifest)?;
            let bytes = freed_bytes(&dir);
            Some(OutdatedCache { dir, why, bytes })
        })
        .collect()
}

/// Removes an outdated folder and its lock file. The folder is first renamed out of the
/// way, so a preparation that lists the cache then sees it whole or not at all.
pub fn remove(outdated: &OutdatedCache) -> Result<()> {
    let (Some(parent), Some(name)) = (outdated.dir.parent(), outdated.dir.file_name()) else {
        return Ok(());
    };
    let name = name.to_string_lossy();
    let doomed = parent.join(format!(".{name}.removing-{}", std::process::id()));
    std::fs::rename(&outdated.dir, &doomed).map_err(DataError::io("move", &outdated.dir))?;
    std::fs::remove_dir_all(&doomed).map_err(DataError::io("remove", &doomed))?;
    // Nobody waits on it: no preparation asks for this folder's key any more.
    let _ = std::fs::remove_file(parent.join(format!(".{name}.lock")));
    Ok(())
}

/// How the first of the manifest's files differs from what is on disk now, `None` if none
/// does. Size and modification time, as recorded when the folder was built (a manifest
/// written before it recorded times has only sizes to compare).
fn changed_file(manifest: &CacheManifest) -> Option<String> {
    manifest.files.iter().find_map(|file| {
        let path = file.path.display();
        let meta = match std::fs::metadata(&file.path) {
            Ok(meta) => meta,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Some(format!("{path}: removed"));
            }
            // Unreadable now (permissions, a file system away): not known to be outdated.
            Err(_) => return None,
        };
        if meta.len() != file.size {
            Some(format!(
                "{path}: changed, {} → {} bytes",
                file.size,
                meta.len()
            ))
        } else if file.mtime_ns != 0 && files::mtime_ns(&meta) != file.mtime_ns {
            Some(format!("{path}: modified since"))
        } else {
            None
        }
    })
}

/// The bytes of `dir`'s files that no other folder links to.
fn freed_bytes(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .filter_map(|e| e.metadata().ok())
        .filter(|meta| meta.is_file() && meta.nlink() == 1)
        .map(|meta| meta.len())
        .sum()
}
