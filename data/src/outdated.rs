//! Cache folders no preparation opens again: one of the files a folder was built from has
//! since been edited or removed, so its key (which holds the files' sizes and times) is
//! never asked for again. Every edit of the data leaves one behind; they are found here so
//! that `shardrun prepare` can say how much they hold and remove them on request.
//!
//! Only the data files decide, and only what the manifest can tell: a file of another size,
//! or one gone from a folder that is there (a folder that is not may be a mount this machine
//! lacks). A file whose time alone changed (`touch`, a checkout) may still hold the bytes the
//! folder was made from, which the next preparation links instead of tokenizing: such a
//! folder is outdated only once a newer folder of the same contents exists. A file replaced
//! by a copy that keeps size and time (`cp -p`, `rsync -a`) is not seen. A folder whose
//! files are as they were stays, even if nothing uses its tokenizer any more (another spec
//! may).

use crate::cache::{self, CacheManifest};
use crate::error::{DataError, Result};
use crate::files;
use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// A complete cache folder whose data files are no longer as they were.
#[derive(Debug, Clone, PartialEq)]
pub struct OutdatedCache {
    pub dir: PathBuf,
    /// The first of its files that changed and how: `data/b.txt: removed`.
    pub why: String,
    /// What removing it frees once the outdated folders listed before it are gone: its files
    /// not linked from a folder that stays or comes after it (a folder prepared again
    /// after a `touch` links its files to the older one's, both outdated by a later edit).
    pub bytes: u64,
}

/// The outdated folders under `cache_dir`, oldest first. Folders being built, damaged ones
/// and those of another cache format are left out (preparing their data says what to do).
pub fn find(cache_dir: &Path) -> Vec<OutdatedCache> {
    let mut folders = cache::complete_folders(cache_dir);
    folders.sort_by(|a, b| a.1.created_unix_s.total_cmp(&b.1.created_unix_s));
    let mut found: Vec<OutdatedCache> = folders
        .iter()
        .enumerate()
        .filter_map(|(i, (dir, manifest))| {
            let why = match change(manifest)? {
                Change::Gone(why) => why,
                // Its bytes may be those of the files now: outdated once a newer folder of
                // the same contents took its place.
                Change::Retimed(why) => {
                    let superseded = !manifest.contents_name.is_empty()
                        && folders[i + 1..]
                            .iter()
                            .any(|(_, newer)| newer.contents_name == manifest.contents_name);
                    superseded.then_some(why)?
                }
            };
            Some(OutdatedCache {
                dir: dir.clone(),
                why,
                bytes: 0,
            })
        })
        .collect();
    count_freed_bytes(&mut found);
    found
}

/// Sets each folder's [`OutdatedCache::bytes`] for their removal in order: a file's bytes
/// are freed with the last of its links, counted to the last of these folders that holds
/// one, when every link is among them.
fn count_freed_bytes(folders: &mut [OutdatedCache]) {
    /// One file (an inode) of the folders, and its links among them.
    struct Linked {
        seen: u64,
        links: u64,
        size: u64,
        last_folder: usize,
    }
    let mut files: HashMap<(u64, u64), Linked> = HashMap::new();
    for (i, folder) in folders.iter().enumerate() {
        let Ok(entries) = std::fs::read_dir(&folder.dir) else {
            continue;
        };
        for meta in entries.flatten().filter_map(|e| e.metadata().ok()) {
            if meta.is_file() {
                let file = files.entry((meta.dev(), meta.ino())).or_insert(Linked {
                    seen: 0,
                    links: meta.nlink(),
                    size: meta.len(),
                    last_folder: i,
                });
                file.seen += 1;
                file.last_folder = i;
            }
        }
    }
    for file in files.into_values() {
        if file.seen == file.links {
            folders[file.last_folder].bytes += file.size;
        }
    }
}

/// Removes an outdated folder and its lock file. The folder is first renamed out of the
/// way, so a preparation that lists the cache then sees it whole or not at all. A folder
/// another process removed meanwhile is removed.
pub fn remove(outdated: &OutdatedCache) -> Result<()> {
    let (Some(parent), Some(name)) = (outdated.dir.parent(), outdated.dir.file_name()) else {
        return Ok(());
    };
    let name = name.to_string_lossy();
    let doomed = parent.join(format!(".{name}{REMOVING}{}", cache::this_owner()));
    match std::fs::rename(&outdated.dir, &doomed) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(DataError::io("move", &outdated.dir)(e)),
    }
    std::fs::remove_dir_all(&doomed).map_err(DataError::io("remove", &doomed))?;
    // Nobody waits on it: no preparation asks for this folder's key any more.
    let _ = std::fs::remove_file(cache::lock_path(parent, &name));
    Ok(())
}

/// What a removal's hidden folder is named after its folder: `.<name>.removing-<pid>-<host>`.
const REMOVING: &str = ".removing-";

/// Removes what removals killed midway left under `cache_dir` (hidden folders of a process
/// of this machine that is gone), and returns how many.
pub fn remove_interrupted(cache_dir: &Path) -> usize {
    let Ok(entries) = std::fs::read_dir(cache_dir) else {
        return 0;
    };
    entries
        .flatten()
        .filter(|entry| {
            let name = entry.file_name();
            let gone = name
                .to_str()
                .filter(|n| n.starts_with('.'))
                .and_then(|n| n.split_once(REMOVING))
                .is_some_and(|(_, owner)| cache::owner_is_gone(owner));
            gone && std::fs::remove_dir_all(entry.path()).is_ok()
        })
        .count()
}

/// Removes the lock files of data that no folder holds and no build is making (left by
/// preparations that failed or were killed), and returns how many: only those no process
/// holds, each held while it is removed. A preparation that opened one just before then
/// locks a file no other sees, and may build once more than needed: never a torn cache.
pub fn remove_orphan_locks(cache_dir: &Path) -> usize {
    let Ok(entries) = std::fs::read_dir(cache_dir) else {
        return 0;
    };
    let names: Vec<String> = entries
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .collect();
    names
        .iter()
        .filter(|name| {
            let Some(key) = cache::locked_folder(name) else {
                return false;
            };
            let building = cache::building_prefix(key);
            if names.iter().any(|n| n == key || n.starts_with(&building)) {
                return false;
            }
            let path = cache_dir.join(name);
            let Ok(lock) = std::fs::File::open(&path) else {
                return false;
            };
            // Held: a preparation of that data is starting now.
            lock.try_lock().is_ok() && std::fs::remove_file(&path).is_ok()
        })
        .count()
}

/// How one of a folder's files differs from what is on disk now.
enum Change {
    /// Removed, or of another size: the folder's data is gone.
    Gone(String),
    /// Its modification time alone differs.
    Retimed(String),
}

/// How the first of the manifest's files that changed did, `None` if none did (or none is
/// known to have). Size and modification time, as recorded when the folder was built (a
/// manifest written before it recorded times has only sizes to compare).
fn change(manifest: &CacheManifest) -> Option<Change> {
    manifest.files.iter().find_map(|file| {
        let path = file.path.display();
        let meta = match std::fs::metadata(&file.path) {
            Ok(meta) => meta,
            // Gone from a folder that is there; a folder that is not may be a mount this
            // machine lacks (a compute node's scratch, a container's bind mount).
            Err(e)
                if e.kind() == std::io::ErrorKind::NotFound
                    && file.path.parent().is_some_and(Path::is_dir) =>
            {
                return Some(Change::Gone(format!("{path}: removed")));
            }
            // Unreadable now (permissions, a file system away): not known to be outdated.
            Err(_) => return None,
        };
        if meta.len() != file.size {
            Some(Change::Gone(format!(
                "{path}: changed, {} → {} bytes",
                file.size,
                meta.len()
            )))
        } else if file.mtime_ns != 0 && files::mtime_ns(&meta) != file.mtime_ns {
            Some(Change::Retimed(format!("{path}: modified since")))
        } else {
            None
        }
    })
}
