//! One controller per run directory at a time. The controller holds an exclusive `flock` on
//! `<run>/controller.lock` while it runs (the kernel drops it when the process dies, however
//! it dies), so a re-run can tell a live run from one whose controller was killed.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, Write};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

pub const LOCK_FILE: &str = "controller.lock";

/// Held while the value lives.
#[derive(Debug)]
pub struct RunLock {
    _file: File,
}

#[derive(Debug, thiserror::Error)]
pub enum LockError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("another controller is running this run directory ({holder}); wait for it to end, or stop it (`shardrun cancel`, Ctrl-C)")]
    Held { holder: String },
}

impl RunLock {
    /// Takes the lock of `run_dir` and writes who holds it, or says who already does.
    pub fn acquire(run_dir: &Path) -> Result<RunLock, LockError> {
        let path = run_dir.join(LOCK_FILE);
        let io = |source| LockError::Io {
            path: path.clone(),
            source,
        };
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(io)?;
        if !try_flock(&file).map_err(io)? {
            return Err(LockError::Held {
                holder: read_holder(&mut file),
            });
        }
        file.set_len(0).map_err(io)?;
        file.rewind().map_err(io)?;
        writeln!(
            file,
            "pid {} on {}",
            std::process::id(),
            shardrun_protocol::host::hostname()
        )
        .map_err(io)?;
        Ok(RunLock { _file: file })
    }

    /// Who holds the lock of `run_dir` (`"pid 123 on node1"`), or `None` when nobody does.
    pub fn holder(run_dir: &Path) -> Option<String> {
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(run_dir.join(LOCK_FILE))
            .ok()?;
        match try_flock(&file) {
            // Taken and released again when `file` closes.
            Ok(true) => None,
            Ok(false) => Some(read_holder(&mut file)),
            Err(_) => None,
        }
    }
}

/// `flock(LOCK_EX | LOCK_NB)`: true when taken, false when someone else holds it.
fn try_flock(file: &File) -> std::io::Result<bool> {
    // SAFETY: a plain syscall on a descriptor this function's caller owns.
    let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if rc == 0 {
        return Ok(true);
    }
    let err = std::io::Error::last_os_error();
    if err.raw_os_error() == Some(libc::EWOULDBLOCK) {
        Ok(false)
    } else {
        Err(err)
    }
}

fn read_holder(file: &mut File) -> String {
    let mut text = String::new();
    let _ = file.rewind().and_then(|_| file.read_to_string(&mut text));
    match text.trim() {
        "" => "a process that has not said who it is".to_string(),
        holder => holder.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_holder_at_a_time_and_released_on_drop() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(RunLock::holder(dir.path()), None);
        let lock = RunLock::acquire(dir.path()).unwrap();
        let holder = RunLock::holder(dir.path()).expect("held");
        assert!(
            holder.starts_with(&format!("pid {}", std::process::id())),
            "{holder}"
        );
        let err = RunLock::acquire(dir.path()).unwrap_err();
        assert!(matches!(err, LockError::Held { .. }), "{err}");
        drop(lock);
        assert_eq!(RunLock::holder(dir.path()), None);
        RunLock::acquire(dir.path()).unwrap();
    }
}
