//! The run directory: everything about one run in one folder, created atomically.
//!
//! Layout (the controller writes the second group):
//! ```text
//! <run_root>/<name>/
//!   job.yaml  resolved.json  train_config.json  plan.txt  job.sbatch  manifest.json  secret
//!   train.log  logs/rank-N.log  logs/rank-N.metrics.jsonl  logs/rank-N.debug.log
//!   metrics.jsonl  events.jsonl  controller.addr  controller.lock  result.json
//!   requeue_count  data.json  checkpoints/
//! ```
//! It is built as `<name>.tmp-XXXX` next to its final place and renamed, so a failure
//! leaves nothing half-written under the real name. A sweep point's directory holds only
//! `manifest.json resolved.json train_config.json secret`: its spec and batch script are
//! the sweep folder's (`sweeps::point_dirs`, `sweeps::journal`). A re-run that continues a run
//! rewrites the spec files in place ([`RunDir::update_spec`]); [`lock`] tells a live run from
//! a dead one.

pub mod access;
pub mod line_files;
mod lock;

pub use lock::{
    Holder, LockError, LockState, RunLock, SignalError, StartLock, LOCK_FILE, STARTING_FILE,
};

use crate::resolve::ResolvedJob;
use rand::Rng;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

pub const MANIFEST_VERSION: u32 = 1;

#[derive(Debug, thiserror::Error)]
pub enum RunDirError {
    #[error("{0} already exists and is not a run directory (no manifest.json)\n  fix: pick another `name` or --run-dir, or remove it by hand")]
    Exists(PathBuf),
    /// Another `shardrun` created the run directory while this one was writing its own.
    #[error("another shardrun created the run directory {} at this moment, and runs it; nothing was changed\n  fix: `shardrun status {}` shows it; to start a run of your own beside it, give it another `name` (or --run-dir)", .0.display(), crate::output::pasteable(.0))]
    CreatedMeanwhile(PathBuf),
    /// `--force` at a path that holds something else than a run: never deleted.
    #[error("{why}; --force deletes only run directories and empty folders\n  fix: pick another --run-dir (or `name`), or remove {path} by hand if it is meant to go")]
    NotReplaceable { path: PathBuf, why: String },
    #[error("no run directory at {0} (no manifest.json)\n  fix: create one with `shardrun submit job.yaml` or `shardrun run job.yaml`")]
    NotARunDir(PathBuf),
    /// The folder a new run directory goes in takes nothing: not this user's to write, on a
    /// read-only file system, or full.
    #[error("cannot create the run directory {}: {} {} ({source})\n  fix: {}", run_dir.display(), folder.display(), unwritable_why(source), unwritable_fix(source))]
    Unwritable {
        run_dir: PathBuf,
        folder: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{what} {path}: {source}")]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{path} is not valid: {source}\n  fix: {}", corrupt_fix(.path))]
    Corrupt {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
}

/// What is wrong with a folder a run directory cannot be created in.
fn unwritable_why(source: &io::Error) -> &'static str {
    match source.raw_os_error() {
        Some(libc::ENOSPC | libc::EDQUOT) => "has no room",
        Some(libc::EFBIG) => "takes no file this large",
        _ => "cannot be written",
    }
}

/// What to do about a folder a run directory cannot be created in.
fn unwritable_fix(source: &io::Error) -> &'static str {
    match source.raw_os_error() {
        Some(libc::ENOSPC | libc::EDQUOT) => {
            "free space there (older runs, checkpoints, data caches) or raise the quota, or choose \
             a folder on another disk: `run_root` in the spec (or `--set run_root=DIR`), or \
             `shardrun run --run-dir DIR`"
        }
        Some(libc::EFBIG) => {
            "raise the limit on the size of files this process writes (`ulimit -f`)"
        }
        _ => {
            "choose a folder this user can write: `run_root` in the spec (or `--set run_root=DIR`), \
             or `shardrun run --run-dir DIR`"
        }
    }
}

/// Whether an I/O error says a folder takes nothing (rather than that something is wrong
/// with one file).
fn takes_nothing(source: &io::Error) -> bool {
    matches!(
        source.raw_os_error(),
        Some(libc::EACCES | libc::EPERM | libc::EROFS | libc::ENOSPC | libc::EDQUOT | libc::EFBIG)
    )
}

/// Entries of a folder that is not a run directory a refusal names before counting the rest.
const ENTRIES_SHOWN: usize = 5;

/// `--force` replaces a run directory or an empty folder; anything else at `path` (a user's
/// folder, a file) is refused, saying what it holds: one mistyped --run-dir must not lose it.
fn refuse_unless_replaceable(path: &Path) -> Result<(), RunDirError> {
    if RunDir::at(path).manifest_path().is_file() {
        return Ok(());
    }
    let refuse = |why: String| RunDirError::NotReplaceable {
        path: path.to_path_buf(),
        why,
    };
    if !path.is_dir() {
        return Err(refuse(format!(
            "{} is a file, not a run directory",
            path.display()
        )));
    }
    let mut names: Vec<String> = fs::read_dir(path)
        .map_err(io_err("cannot read", path))?
        .map(|entry| {
            let entry = entry.map_err(io_err("cannot read", path))?;
            let mut name = entry.file_name().to_string_lossy().into_owned();
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                name.push('/');
            }
            Ok(name)
        })
        .collect::<Result<_, RunDirError>>()?;
    if names.is_empty() {
        return Ok(());
    }
    names.sort();
    let mut holds = names
        .iter()
        .take(ENTRIES_SHOWN)
        .cloned()
        .collect::<Vec<_>>()
        .join(", ");
    if names.len() > ENTRIES_SHOWN {
        holds.push_str(&format!(" and {} more", names.len() - ENTRIES_SHOWN));
    }
    Err(refuse(format!(
        "{} is not a run directory (no manifest.json): it holds {holds}",
        path.display()
    )))
}

pub(crate) fn io_err<'a>(
    what: &'static str,
    path: &'a Path,
) -> impl FnOnce(io::Error) -> RunDirError + 'a {
    move |source| RunDirError::Io {
        what,
        path: path.to_path_buf(),
        source,
    }
}

/// Life cycle of a run as recorded in its manifest. The Slurm states are copied in by
/// `shardrun status` once the job has ended, so the answer survives Slurm forgetting the job.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum RunState {
    /// Directory written, not submitted (dry run or local run not started).
    Created,
    /// `sbatch` accepted it.
    Submitted,
    /// `sbatch` refused it or could not be run; see `error`.
    SubmitFailed,
    Running,
    Completed,
    Failed,
    Cancelled,
    Timeout,
    Preempted,
    OutOfMemory,
    NodeFail,
    /// A local run whose controller is gone without saying how the run ended (killed, or
    /// its machine went down). `shardrun status` says so; the manifest keeps `Running`, as
    /// only the controller's lock, asked at the time, can tell (`slurm::runs::died`).
    Died,
}

/// As the manifest and `status` write it (`SUBMIT_FAILED`).
impl std::fmt::Display for RunState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let name = serde_json::to_value(self)
            .ok()
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_default();
        f.write_str(&name)
    }
}

impl RunState {
    /// True when nothing more will happen to the run without a resubmission.
    pub fn is_terminal(self) -> bool {
        !matches!(
            self,
            RunState::Created | RunState::Submitted | RunState::Running
        )
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    pub version: u32,
    pub name: String,
    pub state: RunState,
    /// `TrainConfig::config_hash` of `train_config.json`.
    pub config_hash: String,
    /// Unix seconds.
    pub created_at: u64,
    pub updated_at: u64,
    /// Every Slurm job id this run was submitted as, oldest first (`1234` or `1234_5` for
    /// an array task).
    #[serde(default)]
    pub slurm_job_ids: Vec<String>,
    /// Sweep points: the parameters this run got from the sweep, by dotted path.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub sweep_params: BTreeMap<String, serde_json::Value>,
    /// What went wrong (sbatch's stderr for `SUBMIT_FAILED`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Sweep points: the job array this point was last put in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sweep_array: Option<ArrayRef>,
    /// The folder of the spec the run was made from: relative paths in its `job.yaml` are
    /// relative to it (`shardrun run <run dir>`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec_dir: Option<PathBuf>,
    /// How the run had ended when it was last submitted again to continue it: the state it
    /// goes back to when the new job refuses to start (its training data changed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended_before: Option<Ended>,
    /// Where the run directory was when its spec files were written: the paths they record
    /// below it (the checkpoint folder) follow the directory when it is moved or copied.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_dir: Option<PathBuf>,
}

/// A run's state and its error, as they were before it was started again.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Ended {
    pub state: RunState,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl Manifest {
    /// The state to go back to when a start of the run is refused before anything ran: its
    /// own, or for a job submitted to continue the run, how the run had ended before.
    pub fn before_start(&self) -> Ended {
        match (self.state, &self.ended_before) {
            (RunState::Submitted, Some(ended)) => ended.clone(),
            _ => Ended {
                state: self.state,
                error: self.error.clone(),
            },
        }
    }

    /// A Slurm job refused to start the run before anything ran (`why`, one line): the run
    /// goes back to how it had ended (`before`), or, if it had not, is FAILED, and either
    /// way says which job refused and why: `status` shows it, where Slurm's record would only
    /// say the job exited 1.
    pub fn refused_start(&mut self, before: Ended, why: &str) {
        let job = match self.slurm_job_ids.last() {
            Some(id) => format!("Slurm job {id}"),
            None => "the job".to_string(),
        };
        // A point whose retry was refused did get submitted: it is not SUBMIT_FAILED.
        self.state = match before.state {
            RunState::SubmitFailed => RunState::Failed,
            state if state.is_terminal() => state,
            _ => RunState::Failed,
        };
        self.error = Some(format!("{job} refused to start: {why}"));
    }

    /// The manifest of a run just made for `resolved`, not yet submitted.
    pub fn created(
        resolved: &ResolvedJob,
        sweep_params: BTreeMap<String, serde_json::Value>,
    ) -> Manifest {
        let now = now_unix();
        Manifest {
            version: MANIFEST_VERSION,
            name: resolved.name.clone(),
            state: RunState::Created,
            config_hash: resolved.train.config_hash(),
            created_at: now,
            updated_at: now,
            slurm_job_ids: Vec::new(),
            sweep_params,
            error: None,
            sweep_array: None,
            spec_dir: None,
            ended_before: None,
            run_dir: None,
        }
    }
}

/// Array `index` of the `count` job arrays one `shardrun sweep` (its `submission`) split its
/// points into; its files are `arrays/<submission>-<index>.*` in the sweep folder.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArrayRef {
    pub submission: String,
    pub index: usize,
    pub count: usize,
}

impl ArrayRef {
    /// `<submission>-<index>`: the stem of the array's files.
    pub fn id(&self) -> String {
        format!("{}-{}", self.submission, self.index)
    }
}

impl std::fmt::Display for ArrayRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{} of {}", self.index, self.count, self.submission)
    }
}

/// What goes into a new run directory.
#[derive(Debug, Clone, Copy)]
pub struct NewRun<'a> {
    pub resolved: &'a ResolvedJob,
    /// The spec text exactly as written (copied to `job.yaml`).
    pub job_yaml: &'a str,
    /// The rendered batch script, if the run is for Slurm.
    pub sbatch: Option<&'a str>,
    pub sweep_params: &'a BTreeMap<String, serde_json::Value>,
    /// Replace an existing run directory of the same name.
    pub force: bool,
    /// The spec's folder, for the relative paths in `job_yaml` (absolute).
    pub spec_dir: Option<&'a Path>,
    /// Its data is prepared on this machine (a local run), so a run it resumes can compare
    /// the data with its checkpoint before anything of the run is rewritten; a Slurm job
    /// prepares it in its allocation and compares there.
    pub data_here: bool,
}

/// The file of a run directory that records what its training data is made of
/// ([`RunDir::data_identity`]).
pub const DATA_IDENTITY_FILE: &str = "data.json";

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunDir {
    path: PathBuf,
}

pub fn now_unix() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

fn random_suffix() -> String {
    let mut rng = rand::rng();
    (0..6)
        .map(|_| char::from(b'a' + rng.random_range(0..26u8)))
        .collect()
}

/// `recorded`, a path a run directory's files name below the folder the run was `created`
/// in, moved to where the directory is now (`here`, absolute). Without `created` (the
/// manifest deleted or damaged in a copy), a recorded path outside `here` whose last
/// component is a folder in it (`checkpoints`) is taken to be that folder, not another
/// run's.
pub fn follow_move(here: &Path, created: Option<&Path>, recorded: &mut PathBuf) {
    match created {
        Some(created) => {
            if let Ok(below) = recorded.strip_prefix(created) {
                *recorded = here.join(below);
            }
        }
        None if recorded.is_absolute() && !recorded.starts_with(here) => {
            if let Some(own) = recorded
                .file_name()
                .map(|name| here.join(name))
                .filter(|own| own.is_dir())
            {
                *recorded = own;
            }
        }
        None => {}
    }
}

/// What to do about a run directory's file that does not read: restore it, and what still
/// works meanwhile, before starting over (which deletes the run).
fn corrupt_fix(path: &Path) -> String {
    let manifest = path.file_name().is_some_and(|n| n == "manifest.json");
    let meanwhile = if manifest {
        " (the run's logs, metrics and checkpoints are not in it: `shardrun logs`, `metrics` \
         and `export` still read them)"
    } else {
        ""
    };
    // The checkpoints are intact: a new run can start from their weights.
    let keep_weights = match path.parent() {
        Some(run) if manifest => format!(
            "; or keep the trained weights: a new run (another `name`) with \
             `training.checkpoint.from: {}/checkpoints/step-<N>` (with the default \
             `checkpoint.dir`) starts from them",
            run.display()
        ),
        _ => String::new(),
    };
    format!(
        "the file was edited or truncated: restore it from a copy if there is one{meanwhile}; \
         else start the run over with --force, which deletes what the run directory holds\
         {keep_weights}"
    )
}

impl RunDir {
    /// Absolute `<run_root>/<name>`: the run directory of the job `name` (a sweep's folder of
    /// points); a relative root is relative to the current directory.
    pub fn planned_path(run_root: &Path, name: &str) -> Result<PathBuf, RunDirError> {
        let path = run_root.join(name);
        std::path::absolute(&path).map_err(io_err("cannot resolve", &path))
    }

    /// Write a complete run directory at `path` (normally [`RunDir::planned_path`]).
    pub fn create(path: &Path, new: NewRun<'_>) -> Result<RunDir, RunDirError> {
        let path = std::path::absolute(path).map_err(io_err("cannot resolve", path))?;
        if path.exists() {
            if !new.force {
                return Err(RunDirError::Exists(path));
            }
            refuse_unless_replaceable(&path)?;
        }
        let parent = path.parent().unwrap_or(Path::new("/")).to_path_buf();
        // The folder that refuses: the nearest one there (those below it are to be made).
        let refusing = parent
            .ancestors()
            .find(|folder| folder.is_dir())
            .unwrap_or(&parent)
            .to_path_buf();
        let unwritable = |source: io::Error| match takes_nothing(&source) {
            true => RunDirError::Unwritable {
                run_dir: path.clone(),
                folder: refusing.clone(),
                source,
            },
            false => io_err("cannot create", &parent)(source),
        };
        fs::create_dir_all(&parent).map_err(unwritable)?;
        let file_name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let tmp = parent.join(format!("{file_name}.tmp-{}", random_suffix()));
        let result = Self::fill(&tmp, &path, new)
            .and_then(|()| Self::move_into_place(&tmp, &path, new.force));
        if result.is_err() {
            let _ = fs::remove_dir_all(&tmp);
        }
        match result {
            Ok(()) => Ok(RunDir { path }),
            Err(RunDirError::Io { source, .. }) if takes_nothing(&source) => {
                Err(unwritable(source))
            }
            Err(e) => Err(e),
        }
    }

    fn fill(tmp: &Path, final_path: &Path, new: NewRun<'_>) -> Result<(), RunDirError> {
        fs::create_dir(tmp).map_err(io_err("cannot create", tmp))?;
        let dir = RunDir {
            path: tmp.to_path_buf(),
        };
        fs::create_dir(dir.logs_dir()).map_err(io_err("cannot create", &dir.logs_dir()))?;
        let resolved = dir.write_spec_files(final_path, new)?;
        let mut secret = [0u8; 32];
        rand::rng().fill(&mut secret);
        let secret_path = dir.secret();
        let mut file = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&secret_path)
            .map_err(io_err("cannot create", &secret_path))?;
        file.write_all(hex::encode(secret).as_bytes())
            .map_err(io_err("cannot write", &secret_path))?;
        let mut manifest = Manifest::created(&resolved, new.sweep_params.clone());
        manifest.spec_dir = new.spec_dir.map(Path::to_path_buf);
        manifest.run_dir = Some(final_path.to_path_buf());
        dir.write_manifest(&manifest)
    }

    /// The resolved job as this run directory records it: a relative checkpoint folder is
    /// made absolute (workers may run elsewhere).
    pub fn recorded(resolved: &ResolvedJob, run_path: &Path) -> ResolvedJob {
        let mut resolved = resolved.clone();
        if let Some(ckpt) = resolved.train.checkpoint.dir.as_mut() {
            if ckpt.is_relative() {
                *ckpt = run_path.join(&*ckpt);
            }
        }
        resolved
    }

    /// `job.yaml`, `resolved.json`, `train_config.json`, `plan.txt` and `job.sbatch`, each
    /// replaced atomically; paths inside name `final_path`.
    fn write_spec_files(
        &self,
        final_path: &Path,
        new: NewRun<'_>,
    ) -> Result<ResolvedJob, RunDirError> {
        let resolved = Self::recorded(new.resolved, final_path);
        write_file(&self.job_yaml(), new.job_yaml.as_bytes())?;
        write_json(&self.resolved_json(), &resolved)?;
        write_json(&self.train_config(), &resolved.train)?;
        write_file(&self.plan_txt(), resolved.summary().as_bytes())?;
        if let Some(script) = new.sbatch {
            write_file(&self.sbatch(), script.as_bytes())?;
        }
        Ok(resolved)
    }

    /// A re-run continues this run with `new` (its spec may differ in the fields that are
    /// safe to change on resume): the spec files and the manifest's config hash follow.
    pub fn update_spec(&self, new: NewRun<'_>) -> Result<(), RunDirError> {
        let spec_dir = new.spec_dir.map(Path::to_path_buf);
        let resolved = self.write_spec_files(&self.path, new)?;
        let here = self.absolute();
        self.update_manifest(|m| {
            m.config_hash = resolved.train.config_hash();
            m.run_dir = Some(here);
            if spec_dir.is_some() {
                m.spec_dir = spec_dir;
            }
        })
        .map(|_| ())
    }

    fn move_into_place(tmp: &Path, path: &Path, force: bool) -> Result<(), RunDirError> {
        let mut old = None;
        if force && path.exists() {
            let aside = path.with_file_name(format!(
                "{}.old-{}",
                path.file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default(),
                random_suffix()
            ));
            fs::rename(path, &aside).map_err(io_err("cannot move aside", path))?;
            old = Some(aside);
        }
        // rename(2) refuses a non-empty target, so a directory that appeared meanwhile is
        // never overwritten.
        if let Err(e) = fs::rename(tmp, path) {
            if let Some(aside) = &old {
                let _ = fs::rename(aside, path);
            }
            return Err(if RunDir::at(path).manifest_path().is_file() {
                RunDirError::CreatedMeanwhile(path.to_path_buf())
            } else if path.exists() {
                RunDirError::Exists(path.to_path_buf())
            } else {
                io_err("cannot rename into", path)(e)
            });
        }
        if let Some(aside) = old {
            // Exported models are the user's, not the run's state: after --force they may be
            // the only copy of what the run trained. Should they not move, the old folder
            // stays rather than take them with it.
            if keep_exports(&aside, path) {
                let _ = fs::remove_dir_all(aside);
            }
        }
        Ok(())
    }

    /// The folder of models `shardrun export` wrote into this run directory by default, if
    /// there is one: `<checkpoint root>/export`, when the root is in the run directory.
    pub fn exports(&self) -> Option<PathBuf> {
        let exports = self.checkpoints().join(shardrun_protocol::config::EXPORTS);
        (exports.starts_with(&self.path) && exports.is_dir()).then_some(exports)
    }

    /// The paths of a run directory at `path` whose files are still being written (sweep
    /// points are created in batches, see `sweeps::point_dirs`).
    pub fn at(path: &Path) -> RunDir {
        RunDir {
            path: path.to_path_buf(),
        }
    }

    /// Open an existing run directory (it must hold a `manifest.json`).
    pub fn open(path: &Path) -> Result<RunDir, RunDirError> {
        let path = std::path::absolute(path).map_err(io_err("cannot resolve", path))?;
        let dir = RunDir { path };
        if !dir.manifest_path().is_file() {
            return Err(RunDirError::NotARunDir(dir.path));
        }
        Ok(dir)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether the folder holds, beside its manifest, another of the files a run directory
    /// is made with: one of them lost (deleted by hand) leaves it a run to list, and report
    /// on, while a data cache's `manifest.json` alone is not one.
    pub fn made_by_shardrun(&self) -> bool {
        [
            self.resolved_json(),
            self.train_config(),
            self.job_yaml(),
            self.plan_txt(),
        ]
        .iter()
        .any(|file| file.is_file())
    }
    pub fn job_yaml(&self) -> PathBuf {
        self.path.join("job.yaml")
    }
    pub fn resolved_json(&self) -> PathBuf {
        self.path.join("resolved.json")
    }
    /// The `TrainConfig` every worker reads.
    pub fn train_config(&self) -> PathBuf {
        self.path.join("train_config.json")
    }
    pub fn plan_txt(&self) -> PathBuf {
        self.path.join("plan.txt")
    }
    pub fn sbatch(&self) -> PathBuf {
        self.path.join("job.sbatch")
    }
    pub fn manifest_path(&self) -> PathBuf {
        self.path.join("manifest.json")
    }
    /// Per-job secret for the controller/worker handshake (mode 0600).
    pub fn secret(&self) -> PathBuf {
        self.path.join("secret")
    }
    /// Merged log of all ranks, written by the controller.
    pub fn train_log(&self) -> PathBuf {
        self.path.join("train.log")
    }
    pub fn logs_dir(&self) -> PathBuf {
        self.path.join("logs")
    }
    pub fn rank_log(&self, rank: u64) -> PathBuf {
        self.logs_dir().join(format!("rank-{rank}.log"))
    }
    /// One record per logged step of the whole job (see [`crate::step_record`]).
    pub fn metrics(&self) -> PathBuf {
        self.path.join("metrics.jsonl")
    }
    /// Each rank's own metrics records.
    pub fn rank_metrics(&self, rank: u64) -> PathBuf {
        self.logs_dir().join(format!("rank-{rank}.metrics.jsonl"))
    }
    /// What happened to the run: starts, checkpoints, stops, resumes (see
    /// [`crate::events_file`]).
    pub fn events(&self) -> PathBuf {
        self.path.join("events.jsonl")
    }
    /// `host:port` of the running controller.
    pub fn controller_addr(&self) -> PathBuf {
        self.path.join("controller.addr")
    }
    /// What the run's training data is made of (its files, tokenizer and fingerprint),
    /// written by the controller once the data is ready: a resume on other data is refused
    /// naming what changed.
    pub fn data_identity(&self) -> PathBuf {
        self.path.join(DATA_IDENTITY_FILE)
    }
    /// Written by the controller when the job ends.
    pub fn result(&self) -> PathBuf {
        self.path.join("result.json")
    }
    /// How many times the controller requeued the current Slurm job after preemption.
    pub fn requeue_count(&self) -> PathBuf {
        self.path.join("requeue_count")
    }
    /// Before a new job of the run is released: it counts its requeues afresh, and the
    /// verdict of the job before no longer holds.
    pub fn forget_last_job(&self) -> std::io::Result<()> {
        remove_if_there(&self.requeue_count())?;
        self.forget_verdict()
    }
    /// When an attempt starts: the attempt before's verdict (`result.json`) no longer holds,
    /// even if this one ends before it writes its own.
    pub fn forget_verdict(&self) -> std::io::Result<()> {
        remove_if_there(&self.result())
    }
    /// Where this run's checkpoints are: `checkpoint.dir` of its config, else
    /// `checkpoints/` here (the controller's ranks save there even with periodic saves off).
    pub fn checkpoints(&self) -> PathBuf {
        self.read_train_config()
            .ok()
            .and_then(|config| config.checkpoint.root(Some(&self.path)))
            .unwrap_or_else(|| self.path.join(shardrun_protocol::config::RUN_CHECKPOINTS))
    }
    /// Slurm's `--output` file of job `job_id` (`<name>-<job id>.out`).
    pub fn slurm_output(&self, name: &str, job_id: &str) -> PathBuf {
        self.path.join(format!("{name}-{job_id}.out"))
    }

    /// Appends `lines` to the run's `train.log` as `[shardrun]` lines (what a command did to
    /// the run while no controller ran it), where `tail -f` and a Slurm job's reader see them.
    pub fn note_in_train_log(&self, lines: &[String]) -> std::io::Result<()> {
        use crate::job_controller::clock;
        use std::io::Write;
        let mut log = line_files::append_lines(&self.train_log())?;
        let stamp = clock::format_utc(clock::now());
        for line in lines {
            writeln!(log, "{stamp} [shardrun] {}", line.trim_start())?;
        }
        Ok(())
    }

    pub fn read_manifest(&self) -> Result<Manifest, RunDirError> {
        read_json(&self.manifest_path())
    }

    /// Replace the manifest atomically (write a temporary file, then rename).
    pub fn write_manifest(&self, manifest: &Manifest) -> Result<(), RunDirError> {
        write_json(&self.manifest_path(), manifest)
    }

    /// Read, change and write back the manifest, stamping `updated_at`.
    pub fn update_manifest(
        &self,
        change: impl FnOnce(&mut Manifest),
    ) -> Result<Manifest, RunDirError> {
        let mut manifest = self.read_manifest()?;
        change(&mut manifest);
        manifest.updated_at = now_unix();
        self.write_manifest(&manifest)?;
        Ok(manifest)
    }

    pub fn read_resolved(&self) -> Result<ResolvedJob, RunDirError> {
        let mut resolved: ResolvedJob = read_json(&self.resolved_json())?;
        self.follow_move(&mut resolved.train.checkpoint.dir);
        Ok(resolved)
    }

    pub fn read_train_config(&self) -> Result<shardrun_protocol::TrainConfig, RunDirError> {
        let mut config: shardrun_protocol::TrainConfig = read_json(&self.train_config())?;
        self.follow_move(&mut config.checkpoint.dir);
        Ok(config)
    }

    /// A path the spec files recorded below the directory where the run was created, moved
    /// to where the directory is now (a run folder archived with `cp -a` or moved to other
    /// storage keeps its own checkpoints, not those a new run of the old path saves).
    fn follow_move(&self, path: &mut Option<PathBuf>) {
        if let Some(recorded) = path.as_mut() {
            let created = self.read_manifest().ok().and_then(|m| m.run_dir);
            follow_move(&self.absolute(), created.as_deref(), recorded);
        }
    }

    fn absolute(&self) -> PathBuf {
        std::path::absolute(&self.path).unwrap_or_else(|_| self.path.clone())
    }

    /// The run's recorded data ([`RunDir::data_identity`]); `None` for a run that recorded
    /// none (synthetic data, or not prepared yet).
    pub fn read_data_identity(&self) -> Option<shardrun_data::DataIdentity> {
        read_json(&self.data_identity()).ok()
    }

    pub fn write_data_identity(
        &self,
        identity: &shardrun_data::DataIdentity,
    ) -> Result<(), RunDirError> {
        write_json(&self.data_identity(), identity)
    }

    pub fn read_secret(&self) -> Result<String, RunDirError> {
        let path = self.secret();
        fs::read_to_string(&path)
            .map(|s| s.trim().to_string())
            .map_err(io_err("cannot read", &path))
    }
}

fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> Result<T, RunDirError> {
    let bytes = fs::read(path).map_err(io_err("cannot read", path))?;
    serde_json::from_slice(&bytes).map_err(|source| RunDirError::Corrupt {
        path: path.to_path_buf(),
        source,
    })
}

pub(crate) fn write_json<T: Serialize>(path: &Path, value: &T) -> Result<(), RunDirError> {
    let mut bytes = serde_json::to_vec_pretty(value).map_err(|source| RunDirError::Corrupt {
        path: path.to_path_buf(),
        source,
    })?;
    bytes.push(b'\n');
    write_file(path, &bytes)
}

/// Write via a temporary file and rename, so readers never see half a file.
pub fn write_file(path: &Path, bytes: &[u8]) -> Result<(), RunDirError> {
    replace_file(path, bytes).map_err(io_err("cannot write", path))
}

/// [`write_file`] with the bare I/O error: the temporary file is removed when a write fails
/// (a full disk), so a failure leaves the old file and nothing else.
pub fn replace_file(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = path.with_file_name(format!(
        ".{}.tmp-{}",
        path.file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default(),
        random_suffix()
    ));
    let result = (|| {
        let mut file = fs::File::create(&tmp)?;
        file.write_all(bytes)?;
        file.sync_all()?;
        fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

/// A run directory whose manifest says a local run (no Slurm job) is running, for the tests
/// of how a run's state is judged.
/// Removes `path`; one already gone is no error.
fn remove_if_there(path: &Path) -> std::io::Result<()> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

#[cfg(test)]
pub(crate) fn running_local_run(dir: &Path) -> RunDir {
    fs::write(
        dir.join("manifest.json"),
        r#"{"version": 1, "name": "demo", "state": "RUNNING", "config_hash": "h", "created_at": 0, "updated_at": 0}"#,
    )
    .unwrap();
    RunDir::open(dir).unwrap()
}

/// Moves the exported models of the run moved aside to `aside` to the same place in the new
/// run directory at `path`; false when they could not be moved.
fn keep_exports(aside: &Path, path: &Path) -> bool {
    let Some(exports) = RunDir::at(aside).exports() else {
        return true;
    };
    let Ok(within) = exports.strip_prefix(aside) else {
        return true;
    };
    let target = path.join(within);
    target
        .parent()
        .is_some_and(|parent| fs::create_dir_all(parent).is_ok())
        && fs::rename(&exports, &target).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resolve::{resolve, Overrides};
    use crate::spec::parse;

    fn job(root: &Path) -> ResolvedJob {
        let yaml = include_str!("../../../examples/demo.yaml");
        let mut job = resolve(
            &parse(yaml, Path::new("demo.yaml")).unwrap(),
            &Overrides::default(),
        )
        .unwrap();
        job.run_root = root.to_path_buf();
        job
    }

    /// A run directory in a folder that takes nothing (here /sys, which even root cannot
    /// write) is refused saying which folder and what to do.
    #[test]
    fn a_run_directory_in_a_folder_that_takes_nothing_says_what_to_do() {
        let job = job(Path::new("/sys"));
        let params = BTreeMap::new();
        let path = Path::new("/sys/shardrun-runs/a/run");
        let err = RunDir::create(path, new_run(&job, &params, false)).unwrap_err();
        assert!(
            matches!(&err, RunDirError::Unwritable { folder, .. } if folder == Path::new("/sys")),
            "{err:?}"
        );
        let said = err.to_string();
        assert!(
            said.starts_with("cannot create the run directory /sys/shardrun-runs/a/run: /sys cannot be written (")
                && said.ends_with(
                    "\n  fix: choose a folder this user can write: `run_root` in the spec (or `--set run_root=DIR`), or `shardrun run --run-dir DIR`"
                ),
            "{said}"
        );
    }

    /// A write that fails (here the rename, onto a folder) leaves the old file and no
    /// temporary one beside it.
    #[test]
    fn a_failed_write_leaves_no_temporary_file() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("result.json");
        fs::create_dir(&target).unwrap();
        fs::write(target.join("kept"), "x").unwrap();
        assert!(replace_file(&target, b"{}").is_err());
        let names: Vec<String> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, ["result.json"]);
        assert!(target.join("kept").is_file());
        // And a write that succeeds leaves only the file.
        let other = dir.path().join("controller_addr");
        replace_file(&other, b"host:1\n").unwrap();
        assert_eq!(fs::read_to_string(&other).unwrap(), "host:1\n");
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 2);
    }

    fn new_run<'a>(
        job: &'a ResolvedJob,
        params: &'a BTreeMap<String, serde_json::Value>,
        force: bool,
    ) -> NewRun<'a> {
        NewRun {
            resolved: job,
            job_yaml: "name: demo\n",
            sbatch: Some("#!/bin/bash\n"),
            sweep_params: params,
            force,
            spec_dir: None,
            data_here: false,
        }
    }

    #[test]
    fn creates_every_file_atomically() {
        let tmp = tempfile::tempdir().unwrap();
        let job = job(tmp.path());
        let params = BTreeMap::new();
        let path = RunDir::planned_path(&job.run_root, &job.name).unwrap();
        let run = RunDir::create(&path, new_run(&job, &params, false)).unwrap();
        for file in [
            run.job_yaml(),
            run.resolved_json(),
            run.train_config(),
            run.plan_txt(),
            run.sbatch(),
            run.manifest_path(),
            run.secret(),
        ] {
            assert!(file.is_file(), "{} missing", file.display());
        }
        assert!(run.logs_dir().is_dir());
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(
            fs::metadata(run.secret()).unwrap().permissions().mode() & 0o777,
            0o600
        );
        assert_eq!(run.read_secret().unwrap().len(), 64);
        let manifest = run.read_manifest().unwrap();
        assert_eq!(manifest.state, RunState::Created);
        let train = run.read_train_config().unwrap();
        assert_eq!(manifest.config_hash, train.config_hash());
        assert_eq!(train.checkpoint.dir, Some(path.join("checkpoints")));
        let names: Vec<_> = fs::read_dir(tmp.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(
            names,
            vec![std::ffi::OsString::from("demo")],
            "no temporary directory left"
        );
    }

    #[test]
    fn refuses_an_existing_run_unless_forced() {
        let tmp = tempfile::tempdir().unwrap();
        let job = job(tmp.path());
        let params = BTreeMap::new();
        let path = RunDir::planned_path(&job.run_root, &job.name).unwrap();
        let run = RunDir::create(&path, new_run(&job, &params, false)).unwrap();
        fs::write(run.path().join("marker"), "old").unwrap();
        let err = RunDir::create(&path, new_run(&job, &params, false)).unwrap_err();
        assert!(matches!(err, RunDirError::Exists(_)));
        assert!(
            run.path().join("marker").exists(),
            "refusal must not touch the old run"
        );
        RunDir::create(&path, new_run(&job, &params, true)).unwrap();
        assert!(!run.path().join("marker").exists());
        assert_eq!(
            fs::read_dir(tmp.path()).unwrap().count(),
            1,
            "no set-aside directory left"
        );
    }

    #[test]
    fn a_failed_create_leaves_nothing() {
        let tmp = tempfile::tempdir().unwrap();
        let blocker = tmp.path().join("file");
        fs::write(&blocker, "").unwrap();
        let job = job(&blocker);
        let params = BTreeMap::new();
        assert!(RunDir::create(&blocker.join("demo"), new_run(&job, &params, false)).is_err());
        assert_eq!(fs::read_dir(tmp.path()).unwrap().count(), 1);
    }

    #[test]
    fn a_start_refused_before_anything_ran_goes_back_to_how_the_run_had_ended() {
        let tmp = tempfile::tempdir().unwrap();
        let mut manifest = Manifest::created(&job(tmp.path()), BTreeMap::new());
        manifest.state = RunState::Cancelled;
        manifest.error = Some("cancelled by SIGINT".into());
        let cancelled = Ended {
            state: RunState::Cancelled,
            error: Some("cancelled by SIGINT".into()),
        };
        assert_eq!(manifest.before_start(), cancelled);
        // Submitted again to continue: the state recorded at submission, not SUBMITTED.
        manifest.state = RunState::Submitted;
        manifest.error = None;
        manifest.ended_before = Some(cancelled.clone());
        assert_eq!(manifest.before_start(), cancelled);
        let json = serde_json::to_string(&manifest).unwrap();
        let read: Manifest = serde_json::from_str(&json).unwrap();
        assert_eq!(read.before_start(), cancelled);
    }

    #[test]
    fn a_refused_job_says_so_and_leaves_the_run_as_it_had_ended() {
        let tmp = tempfile::tempdir().unwrap();
        let mut manifest = Manifest::created(&job(tmp.path()), BTreeMap::new());
        manifest.slurm_job_ids = vec!["41".into(), "57_3".into()];
        manifest.state = RunState::Submitted;
        let ended = Ended {
            state: RunState::Preempted,
            error: None,
        };
        manifest.refused_start(ended, "its training data changed");
        assert_eq!(manifest.state, RunState::Preempted);
        assert_eq!(
            manifest.error.as_deref(),
            Some("Slurm job 57_3 refused to start: its training data changed")
        );
        // A run that had not ended (a requeued job) failed: nothing more will happen to it.
        let running = Ended {
            state: RunState::Running,
            error: None,
        };
        manifest.refused_start(running, "its training data changed");
        assert_eq!(manifest.state, RunState::Failed);
        // A retried point that had failed to submit was submitted this time.
        let submit_failed = Ended {
            state: RunState::SubmitFailed,
            error: Some("sbatch: error".into()),
        };
        manifest.refused_start(submit_failed, "its training data changed");
        assert_eq!(manifest.state, RunState::Failed);
    }

    #[test]
    fn open_refuses_a_folder_without_manifest_and_reports_corruption() {
        let tmp = tempfile::tempdir().unwrap();
        assert!(matches!(
            RunDir::open(tmp.path()),
            Err(RunDirError::NotARunDir(_))
        ));
        fs::write(tmp.path().join("manifest.json"), "{\"version\": 1, \"na").unwrap();
        let run = RunDir::open(tmp.path()).unwrap();
        assert!(matches!(
            run.read_manifest(),
            Err(RunDirError::Corrupt { .. })
        ));
    }
}
