//! The sweep folder's record of its job arrays (`arrays/`), written before and after each
//! `sbatch`, so a submission cut short anywhere (an array rejected, sbatch or shardrun
//! killed) leaves every point in a state the next `shardrun sweep` resolves: an array Slurm
//! accepted is found again by its `--comment` tag and adopted, one it never saw is dropped.
//!
//! ```text
//! arrays/<submission>-<k>.points   run directories of array k, one per line (task N: line N+1)
//! arrays/<submission>-<k>.sbatch   its batch script
//! arrays/<submission>-<k>.json     its record (below)
//! arrays/<submission>.yaml         the spec as written (with the `--set` overrides applied and
//!                                  named, as a run's job.yaml), for every array of that submission
//! arrays/current.points            the run directory names of the points of the spec the
//!                                  last `shardrun sweep` expanded (finished ones included)
//! arrays/.lock                     held by the `shardrun sweep` submitting
//! ```

use crate::rundir::{self, io_err, ArrayRef, RunDirError};
use serde::{Deserialize, Serialize};
use std::ffi::OsString;
use std::fs;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

/// Where one array is in its submission.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ArrayState {
    /// About to be given to sbatch; Slurm may or may not have it.
    Submitting,
    /// sbatch accepted it (held, `job_id` known); its points may not be recorded yet.
    Held,
    /// Its points are recorded and Slurm may run it.
    Released,
    /// sbatch refused it; its points are SUBMIT_FAILED.
    Rejected,
    /// Slurm never had it (found no trace); its points were left as they were.
    Abandoned,
}

impl ArrayState {
    /// The next `shardrun sweep` must look at this array before deciding anything.
    pub fn unresolved(self) -> bool {
        matches!(self, ArrayState::Submitting | ArrayState::Held)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArrayRecord {
    #[serde(flatten)]
    pub array: ArrayRef,
    pub tasks: usize,
    /// `--comment` given to sbatch: finds the array in `squeue` if its id was never recorded.
    pub tag: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job_id: Option<String>,
    /// Arrays this one starts after (`--dependency=afterany:...`), for the throttle.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub after: Vec<String>,
    pub state: ArrayState,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    pub updated_at: u64,
}

/// The `arrays/` folder of one sweep.
#[derive(Debug, Clone)]
pub struct Journal {
    dir: PathBuf,
}

#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    #[error(transparent)]
    Io(#[from] RunDirError),
    #[error("another `shardrun sweep` is submitting this sweep ({0} is locked)\n  fix: wait for it to finish, then run this again")]
    Busy(PathBuf),
    #[error("{path} is not a valid array record: {source}\n  fix: the file was edited or truncated; restore it, or remove it if its array is in no point's manifest")]
    Corrupt {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
}

/// Held while a `shardrun sweep` submits; released when dropped (the file descriptor
/// closes, also when the process dies).
#[derive(Debug)]
pub struct SweepLock {
    _file: fs::File,
}

impl Journal {
    pub fn new(sweep_dir: &Path) -> Journal {
        Journal {
            dir: sweep_dir.join("arrays"),
        }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Take the sweep's lock, creating `arrays/`; fails at once if another process holds it.
    pub fn lock(&self) -> Result<SweepLock, JournalError> {
        fs::create_dir_all(&self.dir).map_err(io_err("cannot create", &self.dir))?;
        let path = self.dir.join(".lock");
        let file = fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(io_err("cannot open", &path))?;
        // SAFETY: flock on a descriptor this function owns.
        let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        if rc != 0 {
            return Err(JournalError::Busy(path));
        }
        Ok(SweepLock { _file: file })
    }

    pub fn record_path(&self, array: &ArrayRef) -> PathBuf {
        self.dir.join(format!("{}.json", array.id()))
    }
    pub fn points_path(&self, array: &ArrayRef) -> PathBuf {
        self.dir.join(format!("{}.points", array.id()))
    }
    pub fn script_path(&self, array: &ArrayRef) -> PathBuf {
        self.dir.join(format!("{}.sbatch", array.id()))
    }
    pub fn spec_path(&self, submission: &str) -> PathBuf {
        self.dir.join(format!("{submission}.yaml"))
    }

    fn current_points_path(&self) -> PathBuf {
        self.dir.join("current.points")
    }

    /// Record which run directories are the points of the spec being submitted: any other
    /// run in the sweep folder is left from an earlier version of the spec.
    pub fn write_current_points<'a>(
        &self,
        names: impl IntoIterator<Item = &'a str>,
    ) -> Result<(), JournalError> {
        let mut text = String::new();
        for name in names {
            text.push_str(name);
            text.push('\n');
        }
        rundir::write_file(&self.current_points_path(), text.as_bytes())?;
        Ok(())
    }

    /// Write (or replace) an array's record atomically.
    pub fn write(&self, record: &mut ArrayRecord) -> Result<(), JournalError> {
        record.updated_at = rundir::now_unix();
        let path = self.record_path(&record.array);
        let mut bytes =
            serde_json::to_vec_pretty(record).map_err(|source| JournalError::Corrupt {
                path: path.clone(),
                source,
            })?;
        bytes.push(b'\n');
        rundir::write_file(&path, &bytes)?;
        Ok(())
    }

    /// Every array record, oldest submission first.
    pub fn records(&self) -> Result<Vec<ArrayRecord>, JournalError> {
        let entries = match fs::read_dir(&self.dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(io_err("cannot read", &self.dir)(e).into()),
        };
        let mut records = Vec::new();
        for entry in entries.flatten() {
            let path = entry.path();
            if path.extension().is_none_or(|e| e != "json") {
                continue;
            }
            let bytes = fs::read(&path).map_err(io_err("cannot read", &path))?;
            let record: ArrayRecord =
                serde_json::from_slice(&bytes).map_err(|source| JournalError::Corrupt {
                    path: path.clone(),
                    source,
                })?;
            records.push(record);
        }
        records.sort_by(|a, b| {
            (&a.array.submission, a.array.index).cmp(&(&b.array.submission, b.array.index))
        });
        Ok(records)
    }

    /// Write an array's points file: one run directory per line.
    pub fn write_points(&self, array: &ArrayRef, runs: &[PathBuf]) -> Result<(), JournalError> {
        let mut text = String::new();
        for run in runs {
            text.push_str(&run.to_string_lossy());
            text.push('\n');
        }
        rundir::write_file(&self.points_path(array), text.as_bytes())?;
        Ok(())
    }

    /// The run directories of an array, task 0 first.
    pub fn read_points(&self, array: &ArrayRef) -> Result<Vec<PathBuf>, JournalError> {
        let path = self.points_path(array);
        let text = fs::read_to_string(&path).map_err(io_err("cannot read", &path))?;
        Ok(text.lines().map(PathBuf::from).collect())
    }
}

/// The points each sweep folder's last `shardrun sweep` recorded, read once per folder: a
/// table of thousands of points asks about every one of them.
#[derive(Debug, Default)]
pub struct CurrentPoints {
    folders: std::collections::HashMap<PathBuf, Option<std::collections::HashSet<OsString>>>,
}

impl CurrentPoints {
    /// Whether `run` is in a sweep folder but not one of the points of the spec last
    /// submitted there (false where no `shardrun sweep` recorded them).
    pub fn superseded(&mut self, run: &Path) -> bool {
        let (Some(folder), Some(name)) = (run.parent(), run.file_name()) else {
            return false;
        };
        let points = self.folders.entry(folder.to_path_buf()).or_insert_with(|| {
            fs::read_to_string(Journal::new(folder).current_points_path())
                .ok()
                .map(|text| text.lines().map(OsString::from).collect())
        });
        points.as_ref().is_some_and(|points| !points.contains(name))
    }
}

/// `<unix seconds>-<pid>`: names one `shardrun sweep`'s arrays, in the order they happened.
pub fn new_submission_id() -> String {
    format!("{}-{}", rundir::now_unix(), std::process::id())
}

/// The `--comment` that finds an array of this sweep in `squeue`.
pub fn tag(sweep_name: &str, array: &ArrayRef) -> String {
    format!("shardrun-sweep:{sweep_name}:{}", array.id())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(submission: &str, index: usize) -> ArrayRecord {
        let array = ArrayRef {
            submission: submission.into(),
            index,
            count: 3,
        };
        ArrayRecord {
            tag: tag("grid", &array),
            array,
            tasks: 10,
            job_id: None,
            after: vec![],
            state: ArrayState::Submitting,
            error: None,
            updated_at: 0,
        }
    }

    #[test]
    fn records_round_trip_in_submission_order() {
        let dir = tempfile::tempdir().unwrap();
        let journal = Journal::new(dir.path());
        let _lock = journal.lock().unwrap();
        for (submission, index) in [("200-1", 2), ("100-9", 1), ("200-1", 1)] {
            journal.write(&mut record(submission, index)).unwrap();
        }
        let mut held = record("200-1", 2);
        held.job_id = Some("42".into());
        held.state = ArrayState::Held;
        journal.write(&mut held).unwrap();
        let records = journal.records().unwrap();
        let order: Vec<String> = records.iter().map(|r| r.array.id()).collect();
        assert_eq!(order, ["100-9-1", "200-1-1", "200-1-2"]);
        assert_eq!(records[2].job_id.as_deref(), Some("42"));
        assert_eq!(records[2].tag, "shardrun-sweep:grid:200-1-2");

        let runs = vec![PathBuf::from("/r/it's a dir/p-1"), PathBuf::from("/r/p-2")];
        journal.write_points(&held.array, &runs).unwrap();
        assert_eq!(journal.read_points(&held.array).unwrap(), runs);
    }

    #[test]
    fn a_second_submitter_is_refused_while_the_lock_is_held() {
        let dir = tempfile::tempdir().unwrap();
        let journal = Journal::new(dir.path());
        let lock = journal.lock().unwrap();
        assert!(matches!(journal.lock(), Err(JournalError::Busy(_))));
        drop(lock);
        journal.lock().expect("free again once dropped");
    }

    #[test]
    fn a_truncated_record_is_reported_with_its_path() {
        let dir = tempfile::tempdir().unwrap();
        let journal = Journal::new(dir.path());
        fs::create_dir_all(journal.dir()).unwrap();
        fs::write(journal.dir().join("1-1-1.json"), "{\"submission\": \"1-").unwrap();
        let err = journal.records().unwrap_err().to_string();
        assert!(err.contains("1-1-1.json"), "{err}");
    }
}
