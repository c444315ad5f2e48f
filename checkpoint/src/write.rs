//! The writing half of a save: every rank writes its files into `step-<N>.partial/`, then a
//! small report (RNG state, file digests) that rank 0 merges at commit.

use crate::durable::{sync_dir, write_new};
use crate::error::{CheckpointError, Result};
use crate::layout::Layout;
use crate::metadata::{FileEntry, FileRole, RankReport, RankState};
use crate::naming::{
    optimizer_tensor_name, partial_dir_name, rank_report_file_name, shard_file_name,
    shard_tensor_name, StateKind, MODEL_FILE, OPTIMIZER_FILE,
};
use crate::tensor_file::{TensorFileWriter, TensorSpec};
use std::path::{Path, PathBuf};

/// One save in progress: `<root>/step-<step>.partial/` written by `world_size` ranks.
#[derive(Debug, Clone)]
pub struct SaveTarget {
    pub root: PathBuf,
    pub step: u64,
    pub world_size: u64,
}

impl SaveTarget {
    pub fn new(root: impl Into<PathBuf>, step: u64, world_size: u64) -> Self {
        SaveTarget {
            root: root.into(),
            step,
            world_size,
        }
    }

    pub fn partial_dir(&self) -> PathBuf {
        self.root.join(partial_dir_name(self.step))
    }

    /// Rank 0, then a barrier before any rank writes: drop what an earlier, killed attempt
    /// at this step left, and create an empty partial folder.
    pub fn prepare(&self) -> Result<()> {
        std::fs::create_dir_all(&self.root).map_err(CheckpointError::io(
            &self.root,
            "cannot create the checkpoint folder",
        ))?;
        let dir = self.partial_dir();
        if dir.exists() {
            std::fs::remove_dir_all(&dir).map_err(CheckpointError::io(
                &dir,
                "cannot remove a stale partial checkpoint",
            ))?;
        }
        std::fs::create_dir(&dir).map_err(CheckpointError::io(&dir, "cannot create"))?;
        sync_dir(&self.root)
    }
}

/// Writes shard `index` of every unit (parameters and both AdamW moments) to
/// `rank-<index>-of-<W>.safetensors`, one unit at a time, in layout order.
pub struct ShardWriter {
    file: TensorFileWriter,
    name: String,
    index: u64,
    shard_sizes: Vec<u64>,
    next_unit: usize,
}

impl ShardWriter {
    pub fn create(target: &SaveTarget, layout: &Layout, index: u64) -> Result<ShardWriter> {
        let name = shard_file_name(index, target.world_size);
        let specs = layout
            .units
            .iter()
            .enumerate()
            .flat_map(|(u, unit)| {
                StateKind::ALL.into_iter().map(move |kind| {
                    TensorSpec::new(shard_tensor_name(u, kind), vec![unit.shard_size])
                })
            })
            .collect();
        let file = TensorFileWriter::create(&target.partial_dir().join(&name), specs)?;
        Ok(ShardWriter {
            file,
            name,
            index,
            shard_sizes: layout.units.iter().map(|u| u.shard_size).collect(),
            next_unit: 0,
        })
    }

    /// This rank's shard of unit `unit` (`shard_size` little-endian f32 each, padding included).
    pub fn write_unit(
        &mut self,
        unit: usize,
        param: &[u8],
        exp_avg: &[u8],
        exp_avg_sq: &[u8],
    ) -> Result<()> {
        if unit != self.next_unit || unit >= self.shard_sizes.len() {
            return Err(CheckpointError::InvalidLayout(format!(
                "shard writer expected unit {} next, got unit {unit}",
                self.next_unit
            )));
        }
        for (kind, bytes) in StateKind::ALL.into_iter().zip([param, exp_avg, exp_avg_sq]) {
            self.file
                .write_tensor(&shard_tensor_name(unit, kind), bytes)?;
        }
        self.next_unit += 1;
        Ok(())
    }

    pub fn finish(self) -> Result<FileEntry> {
        let digest = self.file.finish()?;
        Ok(FileEntry {
            name: self.name,
            role: FileRole::Shard { index: self.index },
            size: digest.size,
            sha256: digest.sha256,
        })
    }
}

/// Writes `model.safetensors` and `optimizer.safetensors` with PyTorch parameter names, one
/// unit at a time (rank 0 of a full save, or `shardrun export`).
pub struct FullWriter {
    model: TensorFileWriter,
    optimizer: TensorFileWriter,
    layout: Layout,
    next_unit: usize,
}

impl FullWriter {
    pub fn create(target: &SaveTarget, layout: &Layout) -> Result<FullWriter> {
        let dir = target.partial_dir();
        let model_specs = layout
            .params()
            .map(|(_, p)| TensorSpec::new(p.name.clone(), p.shape.clone()))
            .collect();
        let optimizer_specs = layout
            .params()
            .flat_map(|(_, p)| {
                [StateKind::ExpAvg, StateKind::ExpAvgSq].map(|kind| {
                    TensorSpec::new(optimizer_tensor_name(&p.name, kind), p.shape.clone())
                })
            })
            .collect();
        Ok(FullWriter {
            model: TensorFileWriter::create(&dir.join(MODEL_FILE), model_specs)?,
            optimizer: TensorFileWriter::create(&dir.join(OPTIMIZER_FILE), optimizer_specs)?,
            layout: layout.clone(),
            next_unit: 0,
        })
    }

    /// Unit `unit`'s whole flat buffers (at least `numel` little-endian f32 each; padding
    /// after that is ignored).
    pub fn write_unit(
        &mut self,
        unit: usize,
        param: &[u8],
        exp_avg: &[u8],
        exp_avg_sq: &[u8],
    ) -> Result<()> {
        let Some(layout) = self
            .layout
            .units
            .get(unit)
            .filter(|_| unit == self.next_unit)
        else {
            return Err(CheckpointError::InvalidLayout(format!(
                "full writer expected unit {} next, got unit {unit}",
                self.next_unit
            )));
        };
        let needed = layout.numel as usize * 4;
        if [param, exp_avg, exp_avg_sq]
            .iter()
            .any(|b| b.len() < needed)
        {
            return Err(CheckpointError::InvalidLayout(format!(
                "unit {} needs {needed} bytes per buffer, got {} / {} / {}",
                layout.name,
                param.len(),
                exp_avg.len(),
                exp_avg_sq.len()
            )));
        }
        for p in &layout.params {
            let bytes = (p.offset as usize * 4)..((p.offset + p.numel) as usize * 4);
            self.model.write_tensor(&p.name, &param[bytes.clone()])?;
            self.optimizer.write_tensor(
                &optimizer_tensor_name(&p.name, StateKind::ExpAvg),
                &exp_avg[bytes.clone()],
            )?;
            self.optimizer.write_tensor(
                &optimizer_tensor_name(&p.name, StateKind::ExpAvgSq),
                &exp_avg_sq[bytes],
            )?;
        }
        self.next_unit += 1;
        Ok(())
    }

    pub fn finish(self) -> Result<Vec<FileEntry>> {
        let model = self.model.finish()?;
        let optimizer = self.optimizer.finish()?;
        Ok(vec![
            FileEntry {
                name: MODEL_FILE.into(),
                role: FileRole::Model,
                size: model.size,
                sha256: model.sha256,
            },
            FileEntry {
                name: OPTIMIZER_FILE.into(),
                role: FileRole::Optimizer,
                size: optimizer.size,
                sha256: optimizer.sha256,
            },
        ])
    }
}

/// Every rank's last act in a save: its RNG state and the files it wrote (none for ranks
/// that hold no distinct shard), fsynced, for rank 0 to merge after the barrier.
pub fn write_rank_report(
    target: &SaveTarget,
    rank: u64,
    rng: Vec<u8>,
    files: Vec<FileEntry>,
) -> Result<()> {
    let report = RankReport {
        state: RankState { rank, rng },
        files,
    };
    let json = serde_json::to_vec(&report).expect("rank report serializes");
    write_new(
        &report_path(&target.partial_dir(), rank, target.world_size),
        &json,
    )
}

pub(crate) fn report_path(partial: &Path, rank: u64, world_size: u64) -> PathBuf {
    partial.join(rank_report_file_name(rank, world_size))
}
