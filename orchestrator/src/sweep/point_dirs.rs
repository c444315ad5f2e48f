//! Sweep points' run directories, written in batches. A point's directory holds only what is
//! its own (`manifest.json`, `resolved.json`, `train_config.json`, `secret`); the spec and the
//! batch script are the sweep folder's (`arrays/`). Thousands of small files are made durable
//! with one `syncfs` per batch instead of an `fsync` each, and still appear atomically: each
//! directory (each new manifest) is written under a temporary name, the batch is synced, then
//! everything is renamed into place and synced again.

use crate::rundir::{io_err, Manifest, RunDir, RunDirError, RunState, MANIFEST_VERSION};
use crate::sweep::SweepPoint;
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

/// Create the run directories of new points in `sweep_dir` (named by each point's name).
/// On error nothing of the batch is left under a final name that was not complete.
pub fn create(sweep_dir: &Path, points: &[&SweepPoint]) -> Result<Vec<RunDir>, RunDirError> {
    fs::create_dir_all(sweep_dir).map_err(io_err("cannot create", sweep_dir))?;
    let mut built: Vec<(PathBuf, PathBuf)> = Vec::with_capacity(points.len());
    let result = (|| {
        for point in points {
            let path = sweep_dir.join(&point.name);
            let tmp = sweep_dir.join(format!("{}.tmp-{}", point.name, suffix()));
            built.push((tmp.clone(), path.clone()));
            fill(&tmp, &path, point)?;
        }
        sync_filesystem(sweep_dir)?;
        for (tmp, path) in &built {
            // rename(2) refuses a non-empty target: a directory made meanwhile stays.
            fs::rename(tmp, path).map_err(|e| {
                if path.exists() {
                    RunDirError::Exists(path.clone())
                } else {
                    io_err("cannot rename into", path)(e)
                }
            })?;
        }
        sync_filesystem(sweep_dir)
    })();
    if let Err(err) = result {
        for (tmp, _) in &built {
            let _ = fs::remove_dir_all(tmp);
        }
        return Err(err);
    }
    built.iter().map(|(_, path)| RunDir::open(path)).collect()
}

fn fill(tmp: &Path, final_path: &Path, point: &SweepPoint) -> Result<(), RunDirError> {
    fs::create_dir(tmp).map_err(io_err("cannot create", tmp))?;
    let dir = RunDir::at(tmp);
    // Paths inside the files name the final directory, not the temporary one.
    let mut resolved = point.job.clone();
    if let Some(ckpt) = resolved.train.checkpoint.dir.as_mut() {
        if ckpt.is_relative() {
            *ckpt = final_path.join(&*ckpt);
        }
    }
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
    let now = crate::rundir::now_unix();
    let manifest = Manifest {
        version: MANIFEST_VERSION,
        name: resolved.name.clone(),
        state: RunState::Created,
        config_hash: resolved.train.config_hash(),
        created_at: now,
        updated_at: now,
        slurm_job_ids: Vec::new(),
        sweep_params: point.params.clone(),
        error: None,
        sweep_array: None,
    };
    write_new(
        &dir.manifest_path(),
        &json(&dir.manifest_path(), &manifest)?,
        0o644,
    )
}

/// Change the manifests of `runs` (the closure gets each run's index), all durable together.
/// Each manifest is replaced atomically; a crash leaves each either old or new.
pub fn update_manifests(
    runs: &[RunDir],
    mut change: impl FnMut(usize, &mut Manifest),
) -> Result<(), RunDirError> {
    let Some(first) = runs.first() else {
        return Ok(());
    };
    let mut written: Vec<(PathBuf, PathBuf)> = Vec::with_capacity(runs.len());
    let result = (|| {
        for (i, run) in runs.iter().enumerate() {
            let mut manifest = run.read_manifest()?;
            change(i, &mut manifest);
            manifest.updated_at = crate::rundir::now_unix();
            let path = run.manifest_path();
            let tmp = run.path().join(format!(".manifest.json.tmp-{}", suffix()));
            written.push((tmp.clone(), path.clone()));
            write_new(&tmp, &json(&path, &manifest)?, 0o644)?;
        }
        sync_filesystem(first.path())?;
        for (tmp, path) in &written {
            fs::rename(tmp, path).map_err(io_err("cannot replace", path))?;
        }
        sync_filesystem(first.path())
    })();
    if result.is_err() {
        for (tmp, _) in &written {
            let _ = fs::remove_file(tmp);
        }
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::parse;

    fn points() -> Vec<SweepPoint> {
        crate::sweep::expand(
            &parse(
                include_str!("../../../examples/sweep.yaml"),
                Path::new("sweep.yaml"),
            )
            .unwrap(),
        )
        .unwrap()
    }

    #[test]
    fn a_point_holds_only_its_own_files() {
        let dir = tempfile::tempdir().unwrap();
        let points = points();
        let refs: Vec<&SweepPoint> = points.iter().collect();
        let runs = create(dir.path(), &refs).unwrap();
        assert_eq!(runs.len(), points.len());
        for (run, point) in runs.iter().zip(&points) {
            assert_eq!(run.path(), dir.path().join(&point.name));
            let mut files: Vec<String> = fs::read_dir(run.path())
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect();
            files.sort();
            assert_eq!(
                files,
                [
                    "manifest.json",
                    "resolved.json",
                    "secret",
                    "train_config.json"
                ]
            );
            let manifest = run.read_manifest().unwrap();
            assert_eq!(manifest.state, RunState::Created);
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
        let leftovers = fs::read_dir(dir.path())
            .unwrap()
            .filter(|e| {
                e.as_ref()
                    .unwrap()
                    .file_name()
                    .to_string_lossy()
                    .contains(".tmp-")
            })
            .count();
        assert_eq!(leftovers, 0);
    }

    #[test]
    fn an_existing_point_fails_the_batch_and_leaves_no_temporary_directory() {
        let dir = tempfile::tempdir().unwrap();
        let points = points();
        fs::create_dir(dir.path().join(&points[3].name)).unwrap();
        fs::write(dir.path().join(&points[3].name).join("keep"), "x").unwrap();
        let refs: Vec<&SweepPoint> = points.iter().collect();
        let err = create(dir.path(), &refs).unwrap_err();
        assert!(matches!(err, RunDirError::Exists(_)), "{err}");
        assert!(dir.path().join(&points[3].name).join("keep").exists());
        let names: Vec<String> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert!(names.iter().all(|n| !n.contains(".tmp-")), "{names:?}");
    }

    #[test]
    fn manifests_are_updated_together() {
        let dir = tempfile::tempdir().unwrap();
        let points = points();
        let refs: Vec<&SweepPoint> = points.iter().collect();
        let runs = create(dir.path(), &refs).unwrap();
        update_manifests(&runs, |i, m| {
            m.state = RunState::Submitted;
            m.slurm_job_ids.push(format!("77_{i}"));
        })
        .unwrap();
        for (i, run) in runs.iter().enumerate() {
            let m = run.read_manifest().unwrap();
            assert_eq!(m.state, RunState::Submitted);
            assert_eq!(m.slurm_job_ids, [format!("77_{i}")]);
            let stray = fs::read_dir(run.path())
                .unwrap()
                .filter(|e| {
                    e.as_ref()
                        .unwrap()
                        .file_name()
                        .to_string_lossy()
                        .contains(".tmp-")
                })
                .count();
            assert_eq!(stray, 0);
        }
    }
}
