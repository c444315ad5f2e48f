//! Sweep points' run directories, written in batches. A point's directory holds only what is
//! its own (`manifest.json`, `resolved.json`, `train_config.json`, `secret`); the spec and the
//! batch script are the sweep folder's (`arrays/`).
//!
//! A new point is first written under a temporary name without its manifest ([`prepare`]);
//! once its array has a Slurm job id, a [`ManifestBatch`] writes every manifest (new points' and the
//! retried points' replacements) under temporary names, makes the whole batch durable with
//! one `syncfs` instead of an `fsync` per file, and renames everything into place. A crash
//! leaves each directory and manifest either whole under its real name or not there at all.

use crate::rundir::{io_err, now_unix, Manifest, RunDir, RunDirError};
use crate::sweeps::SweepPoint;
use rand::Rng;
use serde::Serialize;
use std::fs;
use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

fn json<T: Serialize>(path: &Path, value: &T) -> Result<Vec<u8>, RunDirError> {
    let mut bytes = serde_json::to_vec_pretty(value).map_err(|source| RunDirError::Corrupt {
        path: path.to_path_buf(),
        source,
    })?;
    bytes.push(b'\n');
    Ok(bytes)
}

fn write_new(path: &Path, bytes: &[u8], mode: u32) -> Result<(), RunDirError> {
    let mut file = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)
        .map_err(io_err("cannot create", path))?;
    file.write_all(bytes).map_err(io_err("cannot write", path))
}

/// Flush every written file of the filesystem holding `dir` to disk (one call for a batch).
fn sync_filesystem(dir: &Path) -> Result<(), RunDirError> {
    let handle = fs::File::open(dir).map_err(io_err("cannot open", dir))?;
    // SAFETY: syncfs on a descriptor this function owns.
    if unsafe { libc::syncfs(handle.as_raw_fd()) } != 0 {
        return Err(io_err("cannot sync", dir)(std::io::Error::last_os_error()));
    }
    Ok(())
}

fn suffix() -> String {
    let mut rng = rand::rng();
    (0..6)
        .map(|_| char::from(b'a' + rng.random_range(0..26u8)))
        .collect()
}

/// `<name>.tmp-`: the prefix of a point's directory while it is being written.
fn tmp_prefix(name: &str) -> String {
    format!("{name}.tmp-")
}

/// A new point's run directory, written under a temporary name but for its manifest.
/// Dropped without [`ManifestBatch::add_new`], it is removed.
#[derive(Debug)]
pub struct NewPointDir {
    tmp: Option<PathBuf>,
    path: PathBuf,
    manifest: Manifest,
}

impl NewPointDir {
    /// Where the directory will be once committed.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for NewPointDir {
    fn drop(&mut self) {
        if let Some(tmp) = self.tmp.take() {
            let _ = fs::remove_dir_all(tmp);
        }
    }
}

/// Write the files of a new point's run directory in `sweep_dir`, all but its manifest.
pub fn prepare(sweep_dir: &Path, point: &SweepPoint) -> Result<NewPointDir, RunDirError> {
    let path = sweep_dir.join(&point.name);
    let tmp = sweep_dir.join(format!("{}{}", tmp_prefix(&point.name), suffix()));
    fs::create_dir(&tmp).map_err(io_err("cannot create", &tmp))?;
    let dir = RunDir::at(&tmp);
    // Paths inside the files name the final directory, not the temporary one.
    let mut resolved = point.job.clone();
    if let Some(ckpt) = resolved.train.checkpoint.dir.as_mut() {
        if ckpt.is_relative() {
            *ckpt = path.join(&*ckpt);
        }
    }
    // From here on, dropping `new` removes the temporary directory.
    let mut manifest = Manifest::created(&resolved, point.params.clone());
    manifest.run_dir = Some(std::path::absolute(&path).unwrap_or_else(|_| path.clone()));
    let new = NewPointDir {
        tmp: Some(tmp.clone()),
        path: path.clone(),
        manifest,
    };
    write_new(
        &dir.resolved_json(),
        &json(&dir.resolved_json(), &resolved)?,
        0o644,
    )?;
    write_new(
        &dir.train_config(),
        &json(&dir.train_config(), &resolved.train)?,
        0o644,
    )?;
    let mut secret = [0u8; 32];
    rand::rng().fill(&mut secret);
    write_new(&dir.secret(), hex::encode(secret).as_bytes(), 0o600)?;
    Ok(new)
}

/// Remove every point directory of `sweep_dir` still under its temporary name: what
/// submissions killed while writing them left (Ctrl-C ends `shardrun sweep` at once). Only
/// for a sweep that holds the sweep folder's lock, once an interrupted submission's arrays
/// are resolved: no other writer can be at work. The number removed.
pub fn remove_interrupted_writes(sweep_dir: &Path) -> usize {
    let Ok(entries) = fs::read_dir(sweep_dir) else {
        return 0;
    };
    let half_written = |name: &str| {
        name.split_once(".tmp-").is_some_and(|(point, tail)| {
            !point.is_empty()
                && !point.contains('.')
                && tail.len() == 6
                && tail.bytes().all(|b| b.is_ascii_lowercase())
        })
    };
    entries
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .filter(|e| half_written(&e.file_name().to_string_lossy()))
        .filter(|e| fs::remove_dir_all(e.path()).is_ok())
        .count()
}

/// Manifests (and new points' directories) written under temporary names, made durable and
/// renamed into place together by [`ManifestBatch::commit`]. Dropped uncommitted, it removes them.
#[derive(Debug)]
pub struct ManifestBatch {
    sync_dir: PathBuf,
    /// (temporary, final) paths, renamed in order at commit.
    pending: Vec<(PathBuf, PathBuf)>,
}

impl ManifestBatch {
    /// A batch of files on the filesystem of `sync_dir` (the sweep folder).
    pub fn new(sync_dir: &Path) -> ManifestBatch {
        ManifestBatch {
            sync_dir: sync_dir.to_path_buf(),
            pending: Vec::new(),
        }
    }

    /// Give a new point its manifest (`change` sets state, job id, array); its directory
    /// goes into place at commit.
    pub fn add_new(
        &mut self,
        mut dir: NewPointDir,
        change: impl FnOnce(&mut Manifest),
    ) -> Result<(), RunDirError> {
        let tmp = dir.tmp.take().expect("a prepared directory is added once");
        change(&mut dir.manifest);
        dir.manifest.updated_at = now_unix();
        let manifest_path = RunDir::at(&tmp).manifest_path();
        self.pending.push((tmp, dir.path.clone()));
        write_new(&manifest_path, &json(&manifest_path, &dir.manifest)?, 0o644)
    }

    /// Replace an existing run's manifest at commit, changed by `change`.
    pub fn update(
        &mut self,
        run: &RunDir,
        change: impl FnOnce(&mut Manifest),
    ) -> Result<(), RunDirError> {
        let mut manifest = run.read_manifest()?;
        change(&mut manifest);
        manifest.updated_at = now_unix();
        let path = run.manifest_path();
        let tmp = run.path().join(format!(".manifest.json.tmp-{}", suffix()));
        self.pending.push((tmp.clone(), path.clone()));
        write_new(&tmp, &json(&path, &manifest)?, 0o644)
    }

    /// Sync the batch to disk, rename everything into place, sync the renames.
    pub fn commit(mut self) -> Result<(), RunDirError> {
        if self.pending.is_empty() {
            return Ok(());
        }
        sync_filesystem(&self.sync_dir)?;
        let pending = std::mem::take(&mut self.pending);
        for (i, (tmp, path)) in pending.iter().enumerate() {
            // rename(2) refuses to replace a non-empty directory: a point directory made
            // meanwhile stays as it is.
            if let Err(e) = fs::rename(tmp, path) {
                self.pending = pending[i..].to_vec();
                return Err(if tmp.is_dir() && path.exists() {
                    RunDirError::Exists(path.clone())
                } else {
                    io_err("cannot rename into", path)(e)
                });
            }
        }
        sync_filesystem(&self.sync_dir)
    }
}

impl Drop for ManifestBatch {
    fn drop(&mut self) {
        for (tmp, _) in &self.pending {
            if tmp.is_dir() {
                let _ = fs::remove_dir_all(tmp);
            } else {
                let _ = fs::remove_file(tmp);
            }
        }
    }
}

/// The run directories of every point of the sweep in `spec` (YAML), written into
/// `sweep_dir` as a submission writes them, for the tests of what is read back from a sweep
/// folder.
#[cfg(test)]
pub(crate) fn written_points(sweep_dir: &Path, spec: &str) -> Vec<RunDir> {
    let loaded = crate::spec::parse(spec, Path::new("sweep.yaml")).unwrap();
    let points = crate::sweeps::expand(&loaded, &crate::resolve::Overrides::submitting()).unwrap();
    let mut batch = ManifestBatch::new(sweep_dir);
    for point in &points {
        batch
            .add_new(prepare(sweep_dir, point).unwrap(), |_| {})
            .unwrap();
    }
    batch.commit().unwrap();
    points
        .iter()
        .map(|p| RunDir::open(&sweep_dir.join(&p.name)).unwrap())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rundir::RunState;
    use crate::spec::parse;

    fn points() -> Vec<SweepPoint> {
        crate::sweeps::expand(
            &parse(
                include_str!("../../../examples/sweep.yaml"),
                Path::new("sweep.yaml"),
            )
            .unwrap(),
            &crate::resolve::Overrides::submitting(),
        )
        .unwrap()
    }

    fn names(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn a_point_holds_only_its_own_files_once_committed() {
        let dir = tempfile::tempdir().unwrap();
        let points = points();
        let prepared: Vec<NewPointDir> = points
            .iter()
            .map(|p| prepare(dir.path(), p).unwrap())
            .collect();
        assert!(
            points.iter().all(|p| !dir.path().join(&p.name).exists()),
            "nothing under a real name before the commit"
        );
        let mut batch = ManifestBatch::new(dir.path());
        for (i, new) in prepared.into_iter().enumerate() {
            batch
                .add_new(new, |m| {
                    m.state = RunState::Submitted;
                    m.slurm_job_ids.push(format!("77_{i}"));
                })
                .unwrap();
        }
        batch.commit().unwrap();
        for (i, point) in points.iter().enumerate() {
            let run = RunDir::open(&dir.path().join(&point.name)).unwrap();
            assert_eq!(
                names(run.path()),
                [
                    "manifest.json",
                    "resolved.json",
                    "secret",
                    "train_config.json"
                ]
            );
            let manifest = run.read_manifest().unwrap();
            assert_eq!(manifest.state, RunState::Submitted);
            assert_eq!(manifest.slurm_job_ids, [format!("77_{i}")]);
            assert_eq!(manifest.sweep_params, point.params);
            let train = run.read_train_config().unwrap();
            assert_eq!(manifest.config_hash, train.config_hash());
            assert_eq!(train.name, point.name);
            assert_eq!(run.read_secret().unwrap().len(), 64);
            use std::os::unix::fs::PermissionsExt;
            assert_eq!(
                fs::metadata(run.secret()).unwrap().permissions().mode() & 0o777,
                0o600
            );
        }
        assert!(names(dir.path()).iter().all(|n| !n.contains(".tmp-")));
    }

    #[test]
    fn an_uncommitted_batch_leaves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let points = points();
        let kept = prepare(dir.path(), &points[0]).unwrap();
        {
            let mut batch = ManifestBatch::new(dir.path());
            batch
                .add_new(prepare(dir.path(), &points[1]).unwrap(), |_| {})
                .unwrap();
            let _dropped = prepare(dir.path(), &points[2]).unwrap();
        }
        assert_eq!(names(dir.path()).len(), 1, "{:?}", names(dir.path()));
        drop(kept);
        assert!(names(dir.path()).is_empty());
    }

    #[test]
    fn a_point_made_meanwhile_is_not_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let points = points();
        let prepared = prepare(dir.path(), &points[3]).unwrap();
        fs::create_dir(dir.path().join(&points[3].name)).unwrap();
        fs::write(dir.path().join(&points[3].name).join("keep"), "x").unwrap();
        let mut batch = ManifestBatch::new(dir.path());
        batch.add_new(prepared, |_| {}).unwrap();
        let err = batch.commit().unwrap_err();
        assert!(matches!(err, RunDirError::Exists(_)), "{err}");
        assert!(dir.path().join(&points[3].name).join("keep").exists());
        assert_eq!(names(dir.path()), [points[3].name.clone()]);
    }

    #[test]
    fn existing_manifests_are_replaced_and_leftovers_removed() {
        let dir = tempfile::tempdir().unwrap();
        let points = points();
        let mut batch = ManifestBatch::new(dir.path());
        batch
            .add_new(prepare(dir.path(), &points[0]).unwrap(), |m| {
                m.state = RunState::Failed
            })
            .unwrap();
        batch.commit().unwrap();
        let run = RunDir::open(&dir.path().join(&points[0].name)).unwrap();
        let mut batch = ManifestBatch::new(dir.path());
        batch
            .update(&run, |m| {
                m.state = RunState::Submitted;
                m.slurm_job_ids.push("9_0".into());
            })
            .unwrap();
        batch.commit().unwrap();
        let manifest = run.read_manifest().unwrap();
        assert_eq!(
            (manifest.state, manifest.slurm_job_ids),
            (RunState::Submitted, vec!["9_0".to_string()])
        );
        assert!(names(run.path()).iter().all(|n| !n.contains(".tmp-")));

        // A directory a killed submission left under its temporary name.
        let left = prepare(dir.path(), &points[1]).unwrap();
        std::mem::forget(left);
        assert_eq!(names(dir.path()).len(), 2);
        assert_eq!(remove_interrupted_writes(dir.path()), 1);
        assert_eq!(names(dir.path()), [points[0].name.clone()]);

        // Killed submissions' directories of any point, and nothing else, go at the next.
        std::mem::forget(prepare(dir.path(), &points[1]).unwrap());
        std::mem::forget(prepare(dir.path(), &points[2]).unwrap());
        for other in ["notes.tmp-1", ".x.tmp-abcdef", "a.b.tmp-abcdef"] {
            fs::create_dir(dir.path().join(other)).unwrap();
        }
        fs::write(dir.path().join("file.tmp-abcdef"), "").unwrap();
        assert_eq!(remove_interrupted_writes(dir.path()), 2);
        let mut left = names(dir.path());
        let mut kept: Vec<String> = [".x.tmp-abcdef", "a.b.tmp-abcdef", "file.tmp-abcdef"]
            .into_iter()
            .chain(["notes.tmp-1", &points[0].name])
            .map(String::from)
            .collect();
        left.sort();
        kept.sort();
        assert_eq!(left, kept);
    }
}
