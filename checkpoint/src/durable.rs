//! Durability on POSIX file systems: data reaches the disk only after `fsync` of the file,
//! and a new or renamed directory entry only after `fsync` of the directory holding it.

use crate::error::{CheckpointError, Result};
use std::fs::File;
use std::io::Write;
use std::path::Path;

pub fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(CheckpointError::io(dir, "cannot fsync folder"))
}

/// Write a small file so that readers see either the old content or the whole new one:
/// temporary sibling, fsync, rename over, fsync the folder.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> Result<()> {
    // A bare file name has the empty path as its parent: the current folder.
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let tmp = dir.join(format!(
        ".{}.tmp",
        path.file_name()
            .map(|n| n.to_string_lossy())
            .unwrap_or_default()
    ));
    let write = || -> std::io::Result<()> {
        let mut f = File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    };
    write().map_err(CheckpointError::io(path, "cannot write"))?;
    sync_dir(dir)
}

/// Write a new file (it must not be replaced later) and fsync it; the caller syncs the
/// folder once for all its files.
pub fn write_new(path: &Path, bytes: &[u8]) -> Result<()> {
    let write = || -> std::io::Result<()> {
        let mut f = File::create(path)?;
        f.write_all(bytes)?;
        f.sync_all()
    };
    write().map_err(CheckpointError::io(path, "cannot write"))
}
