//! One controller per run directory at a time. The controller holds an exclusive `flock` on
//! `<run>/controller.lock` while it runs (the kernel drops it when the process dies, however
//! it dies), so a re-run, `status` and `metrics` can tell a live run from one whose
//! controller was killed, and `cancel` can find the controller of a local run. The holder
//! writes `pid <pid> on <host>` into the file; the text stays after it dies.

use std::fs::File;
use std::io::{Read, Seek, Write};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

pub const LOCK_FILE: &str = "controller.lock";

/// How long [`RunLock::acquire`] waits out a lock that is taken: [`RunLock::state`] takes
/// it for a moment to look, and a controller starting then must not take that for a rival.
const ACQUIRE_PATIENCE: Duration = Duration::from_secs(1);

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
    #[error("another controller is running this run directory ({holder}); wait for it to end, or stop it (`shardrun cancel <run dir>`, Ctrl-C)")]
    Held { holder: Holder },
    #[error("another shardrun is starting the run directory {} ({holder}) at this moment; nothing was changed\n  fix: `shardrun status {}` shows the run once it has started", run_dir.display(), crate::output::pasteable(run_dir))]
    Starting { holder: Holder, run_dir: PathBuf },
    #[error(transparent)]
    NotUsable(#[from] super::access::NotUsable),
    #[error("{path}: {source}: the file system holding it takes nothing more; nothing was changed\n  fix: free space there (older runs, checkpoints, data caches) or raise the quota, then run the same command again")]
    NoRoom {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

impl LockError {
    /// What an I/O error on the lock file `path` is: a full disk or quota said as such.
    fn io(path: &Path, source: std::io::Error) -> LockError {
        let path = path.to_path_buf();
        match source.raw_os_error() {
            Some(libc::ENOSPC | libc::EDQUOT) => LockError::NoRoom { path, source },
            _ => LockError::Io { path, source },
        }
    }
}

/// The process that holds a run directory's lock, or held it last, as it wrote itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Holder {
    Process {
        pid: u32,
        host: String,
    },
    /// The file does not say: its holder writes it just after taking the lock.
    Unknown,
}

impl Holder {
    fn parse(text: &str) -> Holder {
        text.trim()
            .strip_prefix("pid ")
            .and_then(|rest| rest.split_once(" on "))
            .and_then(|(pid, host)| {
                Some(Holder::Process {
                    pid: pid.parse().ok()?,
                    host: host.to_string(),
                })
            })
            .unwrap_or(Holder::Unknown)
    }
}

impl std::fmt::Display for Holder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Holder::Process { pid, host } => write!(f, "pid {pid} on {host}"),
            Holder::Unknown => f.write_str("a process that has not said who it is"),
        }
    }
}

/// What a run directory's lock says about its controller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LockState {
    /// Nobody holds it: no controller runs the directory.
    Free,
    /// A live controller holds it.
    Held(Holder),
    /// The lock file cannot be read (another user's run, say): no telling.
    Unknown,
}

/// Why [`RunLock::signal_holder`] signalled nobody.
#[derive(Debug, thiserror::Error)]
pub enum SignalError {
    #[error("no controller holds its lock")]
    NotHeld,
    #[error("its controller has not recorded its pid yet (it is starting); try again")]
    Unnamed,
    #[error("its controller runs on {host} (pid {pid}), not on this machine")]
    OtherHost { pid: u32, host: String },
    #[error("its lock names pid {pid}, but that process does not hold the lock file open: not signalling it")]
    NotTheHolder { pid: u32 },
    #[error("its lock names pid {pid}, which runs as {owner}: this user can neither tell whether it is the run's controller nor signal it; only {owner} (or root) can stop it")]
    OtherUser { pid: u32, owner: String },
    #[error("cannot signal its controller (pid {pid}): {source}")]
    Kill {
        pid: u32,
        #[source]
        source: std::io::Error,
    },
}

/// The lock `shardrun run` and `shardrun submit` hold on an existing run directory while
/// they decide what to do with it and rewrite its spec files, until its controller holds
/// [`LOCK_FILE`] (or its job is submitted): two started at once would otherwise both
/// rewrite the spec, and the one that loses the controller's lock would leave its own.
pub const STARTING_FILE: &str = "starting.lock";

/// Held while the value lives; see [`STARTING_FILE`].
#[derive(Debug)]
pub struct StartLock {
    _file: File,
}

impl StartLock {
    /// The starting lock of the run directory at `path` when one is there (a new run's
    /// directory appears whole, by one rename, and needs none).
    pub fn of_existing(path: &Path) -> Result<Option<StartLock>, LockError> {
        match super::RunDir::open(path).is_ok() {
            true => match StartLock::acquire(path) {
                // Another user's run, whose folder this user may not write, or a run on a
                // read-only file system: said so.
                Err(LockError::Io { source, .. })
                    if (source.kind() == std::io::ErrorKind::PermissionDenied
                        || source.raw_os_error() == Some(libc::EROFS))
                        && super::access::first_unusable(path).is_some() =>
                {
                    Err(super::access::check_usable(path)
                        .expect_err("an unusable file was just found")
                        .into())
                }
                acquired => acquired.map(Some),
            },
            false => Ok(None),
        }
    }

    /// Takes the starting lock of `run_dir`, or says which process is starting it.
    pub fn acquire(run_dir: &Path) -> Result<StartLock, LockError> {
        let file = take(&run_dir.join(STARTING_FILE), |holder| LockError::Starting {
            holder,
            run_dir: run_dir.to_path_buf(),
        })?;
        Ok(StartLock { _file: file })
    }
}

impl RunLock {
    /// Takes the lock of `run_dir` and writes who holds it, or says who already does.
    pub fn acquire(run_dir: &Path) -> Result<RunLock, LockError> {
        let file = take(&run_dir.join(LOCK_FILE), |holder| LockError::Held {
            holder,
        })?;
        Ok(RunLock { _file: file })
    }

    /// Whether a controller holds the lock of `run_dir`, and which. Looking takes the lock
    /// shared for a moment when it is free (flock has no other way to ask): shared, so that
    /// two looking at once (two `shardrun status`) do not take each other for a controller.
    pub fn state(run_dir: &Path) -> LockState {
        let path = run_dir.join(LOCK_FILE);
        // Read-only: a shared look needs no more, on NFS too (where flock is a POSIX lock,
        // and a shared one a read lock), so another user's run is told apart there as well.
        let opened = File::open(&path);
        let mut file = match opened {
            Ok(file) => file,
            // No controller ever ran here.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return LockState::Free,
            Err(_) => return LockState::Unknown,
        };
        match try_flock(&file, libc::LOCK_SH) {
            // Taken and released again when `file` closes.
            Ok(true) => LockState::Free,
            Ok(false) => LockState::Held(read_holder(&mut file)),
            Err(_) => LockState::Unknown,
        }
    }

    /// Who holds the lock of `run_dir`, or `None` when nobody does (or there is no telling).
    pub fn holder(run_dir: &Path) -> Option<Holder> {
        match Self::state(run_dir) {
            LockState::Held(holder) => Some(holder),
            LockState::Free | LockState::Unknown => None,
        }
    }

    /// Who held the lock of `run_dir` last (a dead controller's pid), whether or not it still
    /// does.
    pub fn last_holder(run_dir: &Path) -> Option<Holder> {
        let text = std::fs::read_to_string(run_dir.join(LOCK_FILE)).ok()?;
        Some(Holder::parse(&text))
    }

    /// Sends `signal` to the controller holding the lock of `run_dir`, on this machine, once
    /// sure it is that process: the pid in the file could be a later process's, reused, or
    /// not yet rewritten by a controller that just took the lock. The holder has the lock
    /// file open; another process with the same pid does not. Returns the pid.
    pub fn signal_holder(run_dir: &Path, signal: i32) -> Result<u32, SignalError> {
        let (pid, host) = match Self::holder(run_dir).ok_or(SignalError::NotHeld)? {
            Holder::Process { pid, host } => (pid, host),
            Holder::Unknown => return Err(SignalError::Unnamed),
        };
        if host != shardrun_protocol::host::hostname() {
            return Err(SignalError::OtherHost { pid, host });
        }
        if !has_open(pid, &run_dir.join(LOCK_FILE))? {
            return Err(SignalError::NotTheHolder { pid });
        }
        // SAFETY: a plain syscall; the pid was just checked to be the holder's.
        if unsafe { libc::kill(pid as libc::pid_t, signal) } != 0 {
            return Err(SignalError::Kill {
                pid,
                source: std::io::Error::last_os_error(),
            });
        }
        Ok(pid)
    }
}

/// Whether process `pid` has `path` open (one of `/proc/<pid>/fd/*` links to it). Another
/// user's process hides its descriptors: the error names that user.
fn has_open(pid: u32, path: &Path) -> Result<bool, SignalError> {
    let Ok(target) = path.canonicalize() else {
        return Ok(false);
    };
    let fds = match std::fs::read_dir(format!("/proc/{pid}/fd")) {
        Ok(fds) => fds,
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
            use std::os::unix::fs::MetadataExt;
            let owner = std::fs::metadata(format!("/proc/{pid}"))
                .map(|m| super::access::user_name(m.uid()))
                .unwrap_or_else(|_| "another user".into());
            return Err(SignalError::OtherUser { pid, owner });
        }
        Err(_) => return Ok(false),
    };
    Ok(fds
        .flatten()
        .any(|fd| std::fs::read_link(fd.path()).is_ok_and(|link| link == target)))
}

/// `flock(mode | LOCK_NB)`, `mode` being `LOCK_EX` or `LOCK_SH`: true when taken, false
/// when someone else holds it in a mode that excludes `mode`.
fn try_flock(file: &File, mode: libc::c_int) -> std::io::Result<bool> {
    // SAFETY: a plain syscall on a descriptor this function's caller owns.
    let rc = unsafe { libc::flock(file.as_raw_fd(), mode | libc::LOCK_NB) };
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

fn read_holder(file: &mut File) -> Holder {
    let mut text = String::new();
    let _ = file.rewind().and_then(|_| file.read_to_string(&mut text));
    Holder::parse(&text)
}

/// Takes the `flock` of the file at `path` (waiting out a look at it, see
/// [`ACQUIRE_PATIENCE`]) and writes who holds it; `held` words a refusal from the holder.
fn take(path: &Path, held: impl FnOnce(Holder) -> LockError) -> Result<File, LockError> {
    let io = |source| LockError::io(path, source);
    let shardrun_protocol::lock_file::LockFile { mut file, writable } =
        shardrun_protocol::lock_file::open(path).map_err(io)?;
    let started = Instant::now();
    let locked = |file: &File| {
        try_flock(file, libc::LOCK_EX).map_err(|e| match e.raw_os_error() {
            // NFS takes locks only on files opened for writing.
            Some(libc::EBADF) if !writable => std::io::Error::other(format!(
                "cannot lock it through a read-only handle on this file system (NFS?), and it \
                 is not this user's to write ({}); ask its owner to make it group-writable \
                 (`chmod g+w`)",
                super::access::owner_and_mode(path)
                    .map(|(owner, mode)| format!("{owner}'s, mode {mode:o}"))
                    .unwrap_or_default()
            )),
            _ => e,
        })
    };
    while !locked(&file).map_err(io)? {
        if started.elapsed() > ACQUIRE_PATIENCE {
            return Err(held(read_holder(&mut file)));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    if !writable {
        // Left by another user: held all the same, with the holder it names out of date.
        return Ok(file);
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
    Ok(file)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_disk_is_said_with_what_to_do() {
        let path = Path::new("/runs/a/starting.lock");
        let full = LockError::io(path, std::io::Error::from_raw_os_error(libc::ENOSPC));
        assert!(matches!(full, LockError::NoRoom { .. }), "{full}");
        let said = full.to_string();
        assert!(
            said.starts_with("/runs/a/starting.lock: No space left on device")
                && said.contains("nothing was changed")
                && said.contains("fix: free space there"),
            "{said}"
        );
        let other = LockError::io(path, std::io::Error::from_raw_os_error(libc::EIO));
        assert!(matches!(other, LockError::Io { .. }), "{other}");
    }

    #[test]
    fn one_holder_at_a_time_and_released_on_drop() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(RunLock::state(dir.path()), LockState::Free);
        let lock = RunLock::acquire(dir.path()).unwrap();
        let me = Holder::Process {
            pid: std::process::id(),
            host: shardrun_protocol::host::hostname(),
        };
        assert_eq!(RunLock::holder(dir.path()), Some(me.clone()));
        let err = RunLock::acquire(dir.path()).unwrap_err();
        assert!(matches!(err, LockError::Held { .. }), "{err}");
        drop(lock);
        assert_eq!(RunLock::state(dir.path()), LockState::Free);
        // The file still names the controller that held it.
        assert_eq!(RunLock::last_holder(dir.path()), Some(me));
        RunLock::acquire(dir.path()).unwrap();
    }

    #[test]
    fn a_look_at_a_free_lock_is_no_holder_to_another_look() {
        let dir = tempfile::tempdir().unwrap();
        // A controller that died left its name.
        std::fs::write(dir.path().join(LOCK_FILE), "pid 7 on elsewhere\n").unwrap();
        // Another `shardrun status` is looking at this moment.
        let other_look = File::open(dir.path().join(LOCK_FILE)).unwrap();
        assert!(try_flock(&other_look, libc::LOCK_SH).unwrap());
        assert_eq!(RunLock::state(dir.path()), LockState::Free);
        assert_eq!(RunLock::holder(dir.path()), None);
    }

    #[test]
    fn only_the_process_holding_the_lock_is_signalled() {
        let dir = tempfile::tempdir().unwrap();
        assert!(matches!(
            RunLock::signal_holder(dir.path(), 0),
            Err(SignalError::NotHeld)
        ));
        let _lock = RunLock::acquire(dir.path()).unwrap();
        // Signal 0 checks without delivering anything.
        assert_eq!(
            RunLock::signal_holder(dir.path(), 0).unwrap(),
            std::process::id()
        );
        // A pid that is not the holder's (init never opens a run's lock).
        let host = shardrun_protocol::host::hostname();
        std::fs::write(dir.path().join(LOCK_FILE), format!("pid 1 on {host}\n")).unwrap();
        assert!(matches!(
            RunLock::signal_holder(dir.path(), 0),
            Err(SignalError::NotTheHolder { pid: 1 })
        ));
        std::fs::write(dir.path().join(LOCK_FILE), "pid 7 on elsewhere\n").unwrap();
        assert!(matches!(
            RunLock::signal_holder(dir.path(), 0),
            Err(SignalError::OtherHost { pid: 7, .. })
        ));
    }
}
