//! The tokenized cache: one folder per (data files as they are now, tokenizer, reading
//! options), named by a hash of all of them, so any change lands in a new folder and nothing
//! stale is ever read.
//!
//! ```text
//! <cache_dir>/<kind>-<key>/        complete; never changed once it exists
//!     manifest.json                what it was built from and what it holds
//!     tokens.u32                   every document's ids, little-endian, back to back
//!     documents.u64                n + 1 offsets into tokens.u32
//!     lines.u64                    per document: file index << 40 | line (for error messages)
//!     loss_mask.u8                 1 where a token is a training target (masked kinds only)
//! <cache_dir>/.<kind>-<key>.lock   held while building: other processes wait on it
//! <cache_dir>/.<kind>-<key>.tmp-<pid>-<host>/   the folder being built, renamed into place
//!                                  when complete (fsynced first), removed if the build fails,
//!                                  or once its process is found dead (killed mid-build)
//! ```
//!
//! The key uses each file's size, modification and status-change times (not its contents,
//! which would mean reading every byte on every start; any write or replacement changes the
//! status-change time); the manifest records a content hash of every file. A key missed only
//! because the files' times changed (`touch`, a copy without `-p`, a checkout) finds the
//! cache of the same contents by [`KeyInputs::contents_name`] and the files' hashes, and
//! links its files instead of tokenizing again.

use crate::error::{DataError, Result};
use crate::files::DataFile;
use crate::progress::Observer;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use shardrun_models::partial::PartialFolders;
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

/// Bumped when the cache layout or the way documents are tokenized changes.
pub const FORMAT_VERSION: u32 = 4;
pub const MANIFEST: &str = "manifest.json";
pub const TOKENS: &str = "tokens.u32";
pub const DOCUMENTS: &str = "documents.u64";
pub const LINES: &str = "lines.u64";
pub const LOSS_MASK: &str = "loss_mask.u8";

/// Bits of a `lines.u64` entry holding the line; the file index sits above them.
pub const LINE_BITS: u32 = 40;

/// One input file of a cache.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourceFile {
    pub path: PathBuf,
    pub size: u64,
    /// Absent from data identities recorded before they listed it.
    #[serde(default)]
    pub mtime_ns: i128,
    /// xxh3-64 of the file's bytes.
    pub xxh3: String,
    /// Tokens of this file (pre-tokenized files only: it is one document).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens: Option<u64>,
}

/// What a cache folder holds, written last.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CacheManifest {
    pub format_version: u32,
    pub name: String,
    /// `text`, `jsonl`, `chat` or `tokens`.
    pub kind: String,
    pub files: Vec<SourceFile>,
    pub tokenizer: String,
    /// The hashes of the files the tokenizer was built from, as they name the folder
    /// ([`KeyInputs::tokenizer`]): an export compares them with the files it copies.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tokenizer_files: Vec<(String, String)>,
    pub documents: u64,
    pub tokens: u64,
    pub max_token_id: u64,
    pub loss_mask: bool,
    /// Tokens that are training targets (all of them without a loss mask).
    pub trained_tokens: u64,
    /// `u16`/`u32` when the tokens are read from the input files themselves.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_files_dtype: Option<shardrun_protocol::config::TokenDtype>,
    pub skipped_records: u64,
    /// The first skipped records, `file:line: why`.
    pub skipped_examples: Vec<String>,
    /// Documents with a loss mask that trains none of their tokens, and the first one
    /// (`file:line`).
    #[serde(default)]
    pub untrained_documents: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_untrained: Option<String>,
    /// Prompt/completion records whose prompt ends inside a token holding the completion's
    /// first characters, and the first one (`file:line`, the token's text).
    #[serde(default)]
    pub merged_boundaries: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_merged_boundary: Option<(String, String)>,
    /// Chat data none of whose conversations trains the end-of-document token: its text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub untrained_eos: Option<String>,
    /// With `untrained_eos`: the first conversation that trains tokens and where its trained
    /// part ends: the special token its assistant turns end with, or `None` for text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub turn_end: Option<(String, Option<String>)>,
    /// xxh3-128 of the tokens, document offsets and loss mask: equal hashes, equal data.
    pub content_hash: String,
    /// [`KeyInputs::contents_name`] of what it was built from (empty in caches built before
    /// it was recorded).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub contents_name: String,
    pub input_bytes: u64,
    pub seconds: f64,
    pub created_unix_s: f64,
}

/// What names a cache folder: the inputs that decide its contents.
#[derive(Debug, Serialize)]
pub struct KeyInputs<'a> {
    pub format_version: u32,
    /// The reading options (the source with its patterns left out: the files are below).
    pub source: serde_json::Value,
    pub on_bad_record: shardrun_protocol::config::OnBadRecord,
    pub files: &'a [DataFile],
    /// sha256 of every tokenizer and template file that can change the ids, and how the
    /// tokenizer is built from them.
    pub tokenizer: Vec<(String, String)>,
}

impl KeyInputs<'_> {
    /// `<kind>-<16 hex digits>`.
    pub fn name(&self, kind: &str) -> String {
        folder_name(kind, self)
    }

    /// The same inputs with each file's path and size only, times left out: caches of equal
    /// contents share it (their files' hashes then tell).
    pub fn contents_name(&self, kind: &str) -> String {
        let files: Vec<(&Path, u64)> = self
            .files
            .iter()
            .map(|f| (f.path.as_path(), f.size))
            .collect();
        let inputs = (
            self.format_version,
            &self.source,
            self.on_bad_record,
            files,
            &self.tokenizer,
        );
        folder_name(kind, &inputs)
    }
}

/// `<kind>-<16 hex digits>` of the sha256 of `inputs` as JSON.
fn folder_name(kind: &str, inputs: &impl Serialize) -> String {
    let json = serde_json::to_vec(inputs).expect("key inputs serialize");
    format!("{kind}-{}", hex::encode(&Sha256::digest(&json)[..8]))
}

/// The complete caches under `cache_dir` whose [`KeyInputs::contents_name`] is
/// `contents_name`, newest first.
pub fn same_inputs(cache_dir: &Path, contents_name: &str) -> Vec<(PathBuf, CacheManifest)> {
    let mut found: Vec<(PathBuf, CacheManifest)> = complete_folders(cache_dir)
        .into_iter()
        .filter(|(_, manifest)| manifest.contents_name == contents_name)
        .collect();
    found.sort_by(|a, b| b.1.created_unix_s.total_cmp(&a.1.created_unix_s));
    found
}

/// Every complete cache folder under `cache_dir` with its manifest: not those being built
/// (hidden), nor damaged ones or those of another format (opening their data says why).
pub fn complete_folders(cache_dir: &Path) -> Vec<(PathBuf, CacheManifest)> {
    let Ok(entries) = std::fs::read_dir(cache_dir) else {
        return Vec::new();
    };
    entries
        .flatten()
        .map(|e| e.path())
        .filter(|dir| {
            !dir.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with('.'))
        })
        .filter_map(|dir| {
            let manifest = read_manifest(&dir).ok()??;
            Some((dir, manifest))
        })
        .collect()
}

/// Puts the files of cache `from` (its manifest aside) into the folder being built, `to`:
/// hard links (a cache never changes once complete), copies where links are refused.
pub fn link_files(from: &Path, to: &Path) -> Result<()> {
    for entry in std::fs::read_dir(from).map_err(DataError::io("list", from))? {
        let entry = entry.map_err(DataError::io("list", from))?;
        if entry.file_name() == MANIFEST {
            continue;
        }
        let (source, target) = (entry.path(), to.join(entry.file_name()));
        if std::fs::hard_link(&source, &target).is_err() {
            std::fs::copy(&source, &target).map_err(DataError::io("copy", &source))?;
        }
    }
    Ok(())
}

/// The complete cache folder `name` under `cache_dir`, built by `build` (into a temporary
/// folder it is given) if it does not exist yet. Concurrent callers, on this machine or
/// others sharing the folder, build it once: the others wait on the lock and then read it.
/// Returns the folder, its manifest, and whether this call built it.
pub fn open_or_build(
    cache_dir: &Path,
    name: &str,
    observer: &dyn Observer,
    build: impl FnOnce(&Path) -> Result<CacheManifest>,
) -> Result<(PathBuf, CacheManifest, bool)> {
    let dir = cache_dir.join(name);
    // Complete, its data's builds of processes gone are killed ones (a live one would be
    // building it again for nothing).
    remove_stale_builds(cache_dir, name, dir.join(MANIFEST).is_file(), observer);
    if let Some(manifest) = read_manifest(&dir)? {
        return Ok((dir, manifest, false));
    }
    std::fs::create_dir_all(cache_dir).map_err(DataError::io("create", cache_dir))?;
    let lock_path = lock_path(cache_dir, name);
    let lock = shardrun_protocol::lock_file::open(&lock_path)
        .map_err(DataError::io("open", &lock_path))?
        .file;
    let locked = match lock.try_lock() {
        Ok(()) => true,
        Err(std::fs::TryLockError::WouldBlock) => {
            observer.line(&format!(
                "waiting for another process that is preparing {} (lock {})",
                dir.display(),
                lock_path.display()
            ));
            lock.lock().map_err(DataError::io("lock", &lock_path))?;
            true
        }
        // Some shared file systems refuse locks: building twice is wasted work, never a
        // torn cache (the folder appears by one rename).
        Err(std::fs::TryLockError::Error(e)) => {
            observer.line(&format!(
                "warning: cannot lock {} ({e}); other processes may prepare the same data at once",
                lock_path.display()
            ));
            false
        }
    };
    if let Some(manifest) = read_manifest(&dir)? {
        return Ok((dir, manifest, false));
    }
    // The process waited on may have been killed mid-build.
    remove_stale_builds(cache_dir, name, locked, observer);
    let tmp = cache_dir.join(format!("{}{}", building_prefix(name), this_owner()));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir(&tmp).map_err(DataError::io("create", &tmp))?;
    let guard = RemoveOnDrop::arm(tmp.clone());
    let manifest = with_heartbeat(&tmp, HEARTBEAT, || build(&tmp))?;
    write_durably(&tmp.join(MANIFEST), &manifest_json(&manifest))?;
    sync_dir(&tmp)?;
    guard.rename_into_place(&dir)?;
    sync_dir(cache_dir)?;
    Ok((dir, manifest, true))
}

/// The manifest of a complete cache folder, `None` if the folder does not exist.
pub fn read_manifest(dir: &Path) -> Result<Option<CacheManifest>> {
    let path = dir.join(MANIFEST);
    let bytes = match std::fs::read(&path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && !dir.exists() => return Ok(None),
        Err(e) => {
            return Err(DataError::Cache {
                path: dir.to_path_buf(),
                why: format!("{MANIFEST} cannot be read ({e}); remove the folder to rebuild it"),
            })
        }
    };
    let manifest: CacheManifest = serde_json::from_slice(&bytes).map_err(|e| DataError::Cache {
        path: dir.to_path_buf(),
        why: format!("{MANIFEST} is damaged ({e}); remove the folder to rebuild it"),
    })?;
    if manifest.format_version != FORMAT_VERSION {
        return Err(DataError::Cache {
            path: dir.to_path_buf(),
            why: format!(
                "written in cache format {}, this shardrun reads {FORMAT_VERSION}; remove the folder to rebuild it",
                manifest.format_version
            ),
        });
    }
    Ok(Some(manifest))
}

/// The lock file held while the folder `name` is built: `.<name>.lock` beside it.
pub(crate) fn lock_path(cache_dir: &Path, name: &str) -> PathBuf {
    cache_dir.join(format!(".{name}.lock"))
}

/// The cache folder a lock file (named by [`lock_path`]) guards, if `file_name` is one.
pub(crate) fn locked_folder(file_name: &str) -> Option<&str> {
    file_name
        .strip_prefix('.')
        .and_then(|n| n.strip_suffix(".lock"))
        .filter(|name| is_folder_name(name))
}

/// How the hidden folders building `name` start: `.<name>.tmp-`, then their owner.
pub(crate) fn building_prefix(name: &str) -> String {
    format!(".{name}{BUILDING_MARK}")
}

/// What parts a building folder's name from its owner: `.<name>.tmp-<pid>-<host>`.
const BUILDING_MARK: &str = ".tmp-";

/// How often a build marks its folder as written, well within [`OTHER_BUILD_QUIET`].
const HEARTBEAT: std::time::Duration = std::time::Duration::from_secs(60);

/// Runs `build` while a thread marks `folder` modified every `every`: a pass that writes
/// nothing for long (reading every record ahead, one huge document) still tells other
/// processes that its build is alive.
fn with_heartbeat<T>(folder: &Path, every: std::time::Duration, build: impl FnOnce() -> T) -> T {
    let (running, stopped) = std::sync::mpsc::channel::<()>();
    std::thread::scope(|scope| {
        scope.spawn(move || {
            while let Err(std::sync::mpsc::RecvTimeoutError::Timeout) = stopped.recv_timeout(every)
            {
                let _ =
                    File::open(folder).and_then(|f| f.set_modified(std::time::SystemTime::now()));
            }
        });
        let built = build();
        // Dropped on a panic too, so the thread always ends.
        drop(running);
        built
    })
}

fn manifest_json(manifest: &CacheManifest) -> Vec<u8> {
    let mut json = serde_json::to_vec_pretty(manifest).expect("manifest serializes");
    json.push(b'\n');
    json
}

/// Removes the folders of builds whose process was killed (Ctrl-C, a job's time limit):
/// those of this machine whose pid no process has, of `name` and of any other data (a build
/// killed before its files were edited is never opened again by its own key), each said to
/// `observer`. `name`'s builds are known dead at once where `sure` (its lock held by this
/// process, or its cache complete); others are taken for killed once quiet for a while
/// (a live build in another pid namespace of a host of the same name marks its folder every
/// minute). A cache folder shared by
/// machines whose file system refuses locks may hold another machine's live build, and its
/// pid says nothing here.
fn remove_stale_builds(cache_dir: &Path, name: &str, sure: bool, observer: &dyn Observer) {
    let Ok(entries) = std::fs::read_dir(cache_dir) else {
        return;
    };
    for entry in entries.flatten() {
        let file_name = entry.file_name();
        let Some((built, owner)) = file_name
            .to_str()
            .and_then(|n| n.strip_prefix('.'))
            .and_then(|n| n.split_once(BUILDING_MARK))
            .filter(|(built, _)| *built == name || is_folder_name(built))
        else {
            continue;
        };
        if !(built == name && sure) && written_within(&entry.path(), OTHER_BUILD_QUIET) {
            continue;
        }
        // `<pid>` alone: named by an earlier shardrun, which left out the machine; taken as
        // this one's.
        let owner = match owner.contains('-') {
            true => owner.to_string(),
            false => format!("{owner}-{}", this_host()),
        };
        if owner_is_gone(&owner) && std::fs::remove_dir_all(entry.path()).is_ok() {
            observer.line(&format!(
                "removed {}, left by a preparation that was killed",
                entry.path().display()
            ));
        }
    }
}

/// How long a build no lock tells about (another key's, or this key's where the lock cannot
/// be held) must have written nothing to be taken for a killed one.
const OTHER_BUILD_QUIET: std::time::Duration = std::time::Duration::from_secs(600);

/// Whether `folder` or a file in it was modified within `within` (unreadable: taken as yes).
fn written_within(folder: &Path, within: std::time::Duration) -> bool {
    let recent = |path: &Path| {
        std::fs::metadata(path)
            .and_then(|m| m.modified())
            .map_or(true, |t| t.elapsed().map_or(true, |age| age < within))
    };
    recent(folder)
        || std::fs::read_dir(folder).map_or(true, |entries| {
            entries.flatten().any(|entry| recent(&entry.path()))
        })
}

/// Whether `name` is one [`folder_name`] makes: `<kind>-<16 hex digits>`.
pub(crate) fn is_folder_name(name: &str) -> bool {
    name.rsplit_once('-').is_some_and(|(kind, key)| {
        !kind.is_empty() && key.len() == 16 && key.bytes().all(|b| b.is_ascii_hexdigit())
    })
}

/// `<pid>-<host>` of this process: what names the hidden folders it works in, so that
/// another process can tell whether they are left from a process that is gone.
pub(crate) fn this_owner() -> String {
    format!("{}-{}", std::process::id(), this_host())
}

/// Whether `owner` ([`this_owner`] of some process) names a process of this machine that is
/// gone; one of another machine, or unreadable, is not known to be.
pub(crate) fn owner_is_gone(owner: &str) -> bool {
    owner.split_once('-').is_some_and(|(pid, host)| {
        host == this_host() && pid.parse().is_ok_and(|pid: u32| !is_alive(pid))
    })
}

/// Whether a process of this machine has `pid` (when unsure, it does).
fn is_alive(pid: u32) -> bool {
    // 0 and negative pids name process groups, not a process.
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return true;
    };
    if pid <= 0 {
        return true;
    }
    // SAFETY: signal 0 sends nothing; it only checks that the process exists.
    let found = unsafe { libc::kill(pid, 0) } == 0;
    found || std::io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
}

/// This machine's name, as a folder name can hold it.
fn this_host() -> String {
    shardrun_protocol::host::hostname().replace(['/', '\0'], "_")
}

pub fn write_durably(path: &Path, bytes: &[u8]) -> Result<()> {
    let mut file = File::create(path).map_err(DataError::io("create", path))?;
    file.write_all(bytes)
        .map_err(DataError::io("write", path))?;
    file.sync_all().map_err(DataError::io("sync", path))
}

pub fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(DataError::io("sync", dir))
}

/// Removes a folder unless renamed into place: a failed or panicking build leaves nothing
/// behind.
struct RemoveOnDrop(Option<PathBuf>);

/// The folders being built in this process, for [`abandon_builds`].
static BUILDING: PartialFolders = PartialFolders::new();

impl RemoveOnDrop {
    fn arm(path: PathBuf) -> RemoveOnDrop {
        BUILDING.add(&path);
        RemoveOnDrop(Some(path))
    }

    /// Renames the finished folder to `dir`, unless [`abandon_builds`] took it meanwhile.
    fn rename_into_place(mut self, dir: &Path) -> Result<()> {
        let Some(path) = self.0.take() else {
            return Ok(());
        };
        BUILDING.rename_into_place(&path, dir).map_err(|e| {
            let _ = std::fs::remove_dir_all(&path);
            DataError::io("rename into place", dir)(e)
        })
    }
}

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        if let Some(path) = self.0.take() {
            BUILDING.forget(&path);
            let _ = std::fs::remove_dir_all(path);
        }
    }
}

/// Removes the folders this process is still building, for a process about to end without
/// unwinding (a stop signal while the data is prepared): what they hold would be redone
/// from the start anyway. Returns them.
pub fn abandon_builds() -> Vec<PathBuf> {
    BUILDING.abandon_where(|_| true)
}

pub fn now_unix_s() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::progress::Quiet;

    fn manifest(name: &str) -> CacheManifest {
        CacheManifest {
            format_version: FORMAT_VERSION,
            name: name.into(),
            kind: "text".into(),
            files: vec![],
            tokenizer: "t".into(),
            contents_name: String::new(),
            tokenizer_files: Vec::new(),
            documents: 1,
            tokens: 2,
            max_token_id: 1,
            loss_mask: false,
            trained_tokens: 2,
            token_files_dtype: None,
            skipped_records: 0,
            skipped_examples: vec![],
            untrained_documents: 0,
            first_untrained: None,
            merged_boundaries: 0,
            first_merged_boundary: None,
            untrained_eos: None,
            turn_end: None,
            content_hash: "h".into(),
            input_bytes: 2,
            seconds: 0.0,
            created_unix_s: 0.0,
        }
    }

    /// What a cache folder holds besides its lock files.
    fn left_besides_locks(cache_dir: &Path) -> Vec<String> {
        std::fs::read_dir(cache_dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|n| !n.ends_with(".lock"))
            .collect()
    }

    /// A build that writes nothing for a while (reading every record ahead) still marks its
    /// folder written, so another process never takes it for a killed one; the marking ends
    /// with the build.
    #[test]
    fn a_quiet_build_marks_its_folder_written() {
        let dir = tempfile::tempdir().unwrap();
        let folder = dir.path().join(".text-9.tmp-1-h");
        std::fs::create_dir(&folder).unwrap();
        let an_hour_ago = std::time::SystemTime::now() - std::time::Duration::from_secs(3600);
        File::open(&folder)
            .unwrap()
            .set_modified(an_hour_ago)
            .unwrap();
        let quiet = std::time::Duration::from_secs(600);
        assert!(!written_within(&folder, quiet));
        let marked = with_heartbeat(&folder, std::time::Duration::from_millis(5), || {
            let give_up = std::time::Instant::now() + std::time::Duration::from_secs(30);
            while !written_within(&folder, quiet) && std::time::Instant::now() < give_up {
                std::thread::yield_now();
            }
            written_within(&folder, quiet)
        });
        assert!(marked, "the folder was never marked while its build ran");
        File::open(&folder)
            .unwrap()
            .set_modified(an_hour_ago)
            .unwrap();
        // The heartbeat thread has ended: nothing marks the folder any more.
        assert!(!written_within(&folder, quiet));
    }

    /// A process ending without unwinding (a stop signal while its data is prepared) takes
    /// the folder it was building with it; the build then fails, and leaves nothing either.
    #[test]
    fn an_abandoned_build_leaves_no_folder() {
        let dir = tempfile::tempdir().unwrap();
        let (started_tx, started) = std::sync::mpsc::channel();
        let (go_on, wait) = std::sync::mpsc::channel::<()>();
        let root = dir.path().to_path_buf();
        let building = std::thread::spawn(move || {
            open_or_build(&root, "text-9", &Quiet, |tmp| {
                std::fs::write(tmp.join(TOKENS), b"half").unwrap();
                started_tx.send(tmp.to_path_buf()).unwrap();
                wait.recv().unwrap();
                Ok(manifest("text-9"))
            })
        });
        let tmp = started.recv().unwrap();
        assert!(tmp.join(TOKENS).is_file());
        // Only this test's: other tests build in this process at the same time.
        BUILDING.abandon_where(|path| path.starts_with(dir.path()));
        assert!(!tmp.exists());
        go_on.send(()).unwrap();
        assert!(building.join().unwrap().is_err());
        let left = left_besides_locks(dir.path());
        assert!(left.is_empty(), "{left:?}");
    }

    #[test]
    fn failed_build_leaves_nothing_and_second_open_reuses() {
        let dir = tempfile::tempdir().unwrap();
        let err = open_or_build(dir.path(), "text-1", &Quiet, |tmp| {
            std::fs::write(tmp.join(TOKENS), b"half").unwrap();
            Err(DataError::Config("boom".into()))
        })
        .unwrap_err();
        assert!(err.to_string().contains("boom"));
        let left = left_besides_locks(dir.path());
        assert!(left.is_empty(), "{left:?}");

        let (path, m, built) =
            open_or_build(dir.path(), "text-1", &Quiet, |_| Ok(manifest("text-1"))).unwrap();
        assert!(built && path.join(MANIFEST).is_file());
        let (_, again, built) = open_or_build(dir.path(), "text-1", &Quiet, |_| {
            panic!("must not build twice")
        })
        .unwrap();
        assert!(!built);
        assert_eq!(again, m);
    }
}
