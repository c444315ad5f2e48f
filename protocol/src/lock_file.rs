//! Lock files in folders several people share (a group's project folder: run directories, a
//! data cache). Whoever creates one makes it group-writable, whatever their umask (the
//! folder's group where the folder is setgid, as shared project folders are), and one that
//! cannot be written is still locked through a read-only handle: `flock` needs none on local
//! disks, so a lock file left by one user does not stop another there. NFS locks only files
//! opened for writing.

use std::fs::{File, OpenOptions, Permissions};
use std::io::ErrorKind;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;

/// Group-writable, as a group's shared folder needs; never writable by others.
const MODE: u32 = 0o664;

/// An opened lock file, not yet locked.
#[derive(Debug)]
pub struct LockFile {
    pub file: File,
    /// Whether the handle can write (record who holds the lock).
    pub writable: bool,
}

/// Opens (creating if needed) the lock file at `path`.
pub fn open(path: &Path) -> std::io::Result<LockFile> {
    match OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(MODE)
        .open(path)
    {
        Ok(file) => {
            // The umask took bits away from `mode`; a lock file's are wanted as they are.
            let _ = file.set_permissions(Permissions::from_mode(MODE));
            return Ok(LockFile {
                file,
                writable: true,
            });
        }
        Err(e) if e.kind() == ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    match OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
    {
        Ok(file) => Ok(LockFile {
            file,
            writable: true,
        }),
        Err(e) if e.kind() == ErrorKind::PermissionDenied => {
            File::open(path).map(|file| LockFile {
                file,
                writable: false,
            })
        }
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn made_group_writable_whatever_the_umask_and_locked_read_only_when_not_writable() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(".lock");
        // Whatever this process's umask (022 and 077 would take the group's write bit).
        assert!(open(&path).unwrap().writable);
        assert_eq!(std::fs::metadata(&path).unwrap().mode() & 0o777, 0o664);

        // One its user cannot write (root may write anything: a read-only handle is what
        // another user gets, and it locks all the same).
        std::fs::set_permissions(&path, Permissions::from_mode(0o444)).unwrap();
        let held = File::open(&path).unwrap();
        held.try_lock().unwrap();
        let other = File::open(&path).unwrap();
        assert!(matches!(
            other.try_lock(),
            Err(std::fs::TryLockError::WouldBlock)
        ));
        drop(held);
        other.try_lock().unwrap();
    }
}
