//! Folders this process writes under a hidden name and renames into place once complete (a
//! Hugging Face export, a data cache build). A process about to end without unwinding (a
//! stop signal) removes them instead of leaving them until the next write to the same place,
//! and a folder so removed is never renamed into place: both take the same list.

use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

/// The folders one kind of writer has under way.
pub struct PartialFolders(Mutex<Vec<PathBuf>>);

/// Why [`PartialFolders::rename_into_place`] renamed nothing.
const ABANDONED: &str = "abandoned: this process is ending";

impl PartialFolders {
    pub const fn new() -> PartialFolders {
        PartialFolders(Mutex::new(Vec::new()))
    }

    fn list(&self) -> MutexGuard<'_, Vec<PathBuf>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `path` is being written from now on.
    pub fn add(&self, path: &Path) {
        self.list().push(path.to_path_buf());
    }

    /// `path` is no longer written (its writer failed and removes it itself).
    pub fn forget(&self, path: &Path) {
        self.list().retain(|p| p != path);
    }

    /// Renames the complete folder `path` to `to`, unless it was abandoned meanwhile (an
    /// error whose text is [`ABANDONED`]). The list is held through the rename, so a folder
    /// is never removed while it is renamed.
    pub fn rename_into_place(&self, path: &Path, to: &Path) -> std::io::Result<()> {
        let mut list = self.list();
        if !list.iter().any(|p| p == path) {
            return Err(std::io::Error::other(ABANDONED));
        }
        list.retain(|p| p != path);
        std::fs::rename(path, to)
    }

    /// Removes the folders under way that `which` picks and returns them. Taken off the list
    /// first, they are never renamed into place; their writers may still be writing: a few
    /// tries.
    pub fn abandon_where(&self, which: impl Fn(&Path) -> bool) -> Vec<PathBuf> {
        let abandoned: Vec<PathBuf> = {
            let mut list = self.list();
            let (abandoned, kept) = std::mem::take(&mut *list)
                .into_iter()
                .partition(|p| which(p));
            *list = kept;
            abandoned
        };
        for path in &abandoned {
            for _ in 0..3 {
                if std::fs::remove_dir_all(path).is_ok() || !path.exists() {
                    break;
                }
            }
        }
        abandoned
    }
}

impl Default for PartialFolders {
    fn default() -> Self {
        PartialFolders::new()
    }
}
