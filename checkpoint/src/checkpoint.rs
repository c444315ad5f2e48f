//! A committed checkpoint opened for reading: the seal, the metadata and every file's size,
//! header and (optionally) sha256 are checked before anything is read, so a damaged
//! checkpoint fails here with the file named, never half-way through a load.

use crate::error::{CheckpointError, Result};
use crate::layout::{Layout, ParamSlot};
use crate::metadata::{check_complete_marker, CheckpointMetadata, FileEntry, FileRole};
use crate::naming::{
    optimizer_tensor_name, shard_tensor_name, step_of_dir, StateKind, COMPLETE_FILE, METADATA_FILE,
};
use crate::tensor_file::{digest_file, TensorFile};
use shardrun_protocol::config::{CheckpointFormat, DType};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// How much to check when opening.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verify {
    /// Seal, metadata, file sizes and safetensors headers (reads only headers).
    Structure,
    /// Also the sha256 of every file (reads everything once).
    Checksums,
}

#[derive(Debug)]
pub struct Checkpoint {
    dir: PathBuf,
    metadata: CheckpointMetadata,
    /// Sharded: indexed by shard. Full: model, optimizer.
    files: Vec<TensorFile>,
    /// Parameter name → (unit, slot) in this checkpoint's layout.
    params: HashMap<String, (usize, ParamSlot)>,
}

impl Checkpoint {
    pub fn open(dir: &Path, verify: Verify) -> Result<Checkpoint> {
        let marker_path = dir.join(COMPLETE_FILE);
        let metadata_path = dir.join(METADATA_FILE);
        let sealed = marker_path
            .try_exists()
            .map_err(CheckpointError::io(&marker_path, "cannot read"))?;
        if !sealed {
            if !dir.exists() {
                return Err(CheckpointError::NotFound {
                    path: dir.to_owned(),
                    what: "the folder does not exist".into(),
                });
            }
            return Err(CheckpointError::Incomplete {
                path: dir.to_owned(),
            });
        }
        let marker = std::fs::read(&marker_path)
            .map_err(CheckpointError::io(&marker_path, "cannot read"))?;
        let json = std::fs::read(&metadata_path)
            .map_err(CheckpointError::io(&metadata_path, "cannot read"))?;
        let marker = String::from_utf8_lossy(&marker);
        let step = check_complete_marker(&marker_path, &marker, &json)?;
        let metadata = CheckpointMetadata::from_json(&metadata_path, &json)?;
        if metadata.step != step || step_of_dir(dir).is_some_and(|s| s != step) {
            return Err(CheckpointError::malformed(
                &metadata_path,
                format!(
                    "records step {} but sits in {}",
                    metadata.step,
                    dir.display()
                ),
            ));
        }
        if [
            metadata.dtypes.param,
            metadata.dtypes.exp_avg,
            metadata.dtypes.exp_avg_sq,
        ] != [DType::F32; 3]
        {
            return Err(CheckpointError::malformed(
                &metadata_path,
                "stored state is not fp32; this build reads fp32 state only",
            ));
        }

        let roles: Vec<FileRole> = match metadata.format {
            CheckpointFormat::Sharded => (0..metadata.shard_group_size)
                .map(|index| FileRole::Shard { index })
                .collect(),
            CheckpointFormat::Full => vec![FileRole::Model, FileRole::Optimizer],
        };
        let entries: Vec<&FileEntry> = roles
            .iter()
            .map(|&role| {
                metadata.file(role).ok_or_else(|| {
                    CheckpointError::malformed(
                        &metadata_path,
                        format!("lists no file for {role:?}"),
                    )
                })
            })
            .collect::<Result<_>>()?;
        for entry in &entries {
            let path = dir.join(&entry.name);
            let size = std::fs::metadata(&path)
                .map_err(CheckpointError::io(&path, "missing from the checkpoint"))?
                .len();
            if size != entry.size {
                return Err(CheckpointError::SizeMismatch {
                    path,
                    expected: entry.size,
                    actual: size,
                });
            }
        }
        if verify == Verify::Checksums {
            let started = std::time::Instant::now();
            verify_checksums(dir, &entries)?;
            tracing::debug!(
                dir = %dir.display(),
                files = entries.len(),
                seconds = started.elapsed().as_secs_f64(),
                "checkpoint checksums verified"
            );
        }
        let files = entries
            .iter()
            .map(|e| TensorFile::open(&dir.join(&e.name)))
            .collect::<Result<Vec<_>>>()?;

        let params = metadata
            .layout
            .params()
            .map(|(u, p)| (p.name.clone(), (u, p.clone())))
            .collect();
        let checkpoint = Checkpoint {
            dir: dir.to_owned(),
            metadata,
            files,
            params,
        };
        checkpoint.check_headers()?;
        Ok(checkpoint)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn metadata(&self) -> &CheckpointMetadata {
        &self.metadata
    }

    pub fn step(&self) -> u64 {
        self.metadata.step
    }

    pub fn layout(&self) -> &Layout {
        &self.metadata.layout
    }

    /// The RNG state `rank` saved, when the world size is the same as at save time (with
    /// another world size there is no rank-to-rank correspondence to restore).
    pub fn rng_for(&self, rank: u64, world_size: u64) -> Option<&[u8]> {
        if world_size != self.metadata.world_size {
            return None;
        }
        self.metadata
            .ranks
            .get(rank as usize)
            .map(|r| r.rng.as_slice())
    }

    /// The checkpoint holds exactly `target`'s parameters with the same shapes (offsets,
    /// units and sharding may differ: loading reshards by name).
    pub fn check_compatible(&self, target: &Layout) -> Result<()> {
        let mismatch = |what: String| CheckpointError::LayoutMismatch {
            path: self.dir.join(METADATA_FILE),
            what,
        };
        for (_, p) in target.params() {
            match self.params.get(&p.name) {
                None => return Err(mismatch(format!("it has no parameter {}", p.name))),
                Some((_, saved)) if saved.shape != p.shape => {
                    return Err(mismatch(format!(
                        "{} has shape {:?} in the checkpoint and {:?} in the model",
                        p.name, saved.shape, p.shape
                    )))
                }
                Some(_) => {}
            }
        }
        if self.params.len() != target.params().count() {
            let wanted: std::collections::HashSet<&str> =
                target.params().map(|(_, p)| p.name.as_str()).collect();
            let extra: Vec<&str> = self
                .params
                .keys()
                .map(String::as_str)
                .filter(|n| !wanted.contains(n))
                .take(5)
                .collect();
            return Err(mismatch(format!(
                "it has parameters the model lacks: {}",
                extra.join(", ")
            )));
        }
        Ok(())
    }

    /// Each file's header lists the tensors the layout implies, with the right shapes.
    fn check_headers(&self) -> Result<()> {
        let expect = |file: &TensorFile, name: &str, shape: &[u64]| -> Result<()> {
            let found = file.shape(name)?;
            if found != shape {
                return Err(CheckpointError::malformed(
                    file.path(),
                    format!("tensor {name} has shape {found:?}, the metadata implies {shape:?}"),
                ));
            }
            Ok(())
        };
        match self.metadata.format {
            CheckpointFormat::Sharded => {
                for file in &self.files {
                    for (u, unit) in self.metadata.layout.units.iter().enumerate() {
                        for kind in StateKind::ALL {
                            expect(file, &shard_tensor_name(u, kind), &[unit.shard_size])?;
                        }
                    }
                }
            }
            CheckpointFormat::Full => {
                for (_, p) in self.metadata.layout.params() {
                    expect(&self.files[0], &p.name, &p.shape)?;
                    for kind in [StateKind::ExpAvg, StateKind::ExpAvgSq] {
                        expect(
                            &self.files[1],
                            &optimizer_tensor_name(&p.name, kind),
                            &p.shape,
                        )?;
                    }
                }
            }
        }
        Ok(())
    }

    pub(crate) fn files(&self) -> &[TensorFile] {
        &self.files
    }

    pub(crate) fn saved_param(&self, name: &str) -> Option<&(usize, ParamSlot)> {
        self.params.get(name)
    }
}

/// sha256 of every file, several files at once (hashing is CPU-bound, the disk is not).
fn verify_checksums(dir: &Path, entries: &[&FileEntry]) -> Result<()> {
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(entries.len().max(1));
    let chunks: Vec<Vec<&FileEntry>> = (0..threads)
        .map(|t| entries.iter().skip(t).step_by(threads).copied().collect())
        .collect();
    std::thread::scope(|scope| {
        let handles: Vec<_> = chunks
            .into_iter()
            .map(|chunk| {
                scope.spawn(move || -> Result<()> {
                    for entry in chunk {
                        let path = dir.join(&entry.name);
                        let digest = digest_file(&path)?;
                        if digest.sha256 != entry.sha256 {
                            return Err(CheckpointError::ChecksumMismatch {
                                path,
                                expected: entry.sha256.clone(),
                                actual: digest.sha256,
                                recorded_in: "the metadata",
                            });
                        }
                    }
                    Ok(())
                })
            })
            .collect();
        handles
            .into_iter()
            .try_for_each(|h| h.join().expect("checksum thread does not panic"))
    })
}
