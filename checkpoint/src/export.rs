//! Sharded → full: rebuild each unit's flat buffers from the shards and stream its
//! parameters into `model.safetensors` / `optimizer.safetensors`, one unit in memory at a
//! time, committed like any other save. Needs neither a GPU nor libtorch.

use crate::checkpoint::Checkpoint;
use crate::commit::{commit, CommitKind, CommitRequest, Committed};
use crate::error::{CheckpointError, Result};
use crate::naming::{step_dir_name, StateKind};
use crate::write::{write_rank_report, FullWriter, SaveTarget};
use shardrun_protocol::config::CheckpointFormat;
use std::path::Path;

/// A full export, committed, and what it read on the way.
#[derive(Debug)]
pub struct FullExport {
    pub committed: Committed,
    /// Parameter values that are not finite (NaN or inf): a diverged run's weights, which
    /// the export writes as they are.
    pub params_not_finite: u64,
}

/// Write `source` as a full checkpoint `<out_root>/step-<N>/`. The trainer state and every
/// rank's RNG state are carried over, so the result also resumes training. `out_root` holds
/// exports, not a run's series of checkpoints: no `latest` points into it.
pub fn export_full(source: &Checkpoint, out_root: &Path) -> Result<FullExport> {
    let meta = source.metadata();
    let out = out_root.join(step_dir_name(meta.step));
    if out.exists() {
        return Err(CheckpointError::Commit {
            path: out,
            what: "already exists: remove it or choose another --out".into(),
        });
    }
    let target = SaveTarget::new(out_root, meta.step, meta.world_size);
    target.prepare()?;
    let written = write_full(source, &target);
    if written.is_err() {
        // A failed export (a full disk) leaves nothing behind to fill it.
        let _ = std::fs::remove_dir_all(target.partial_dir());
    }
    written
}

fn write_full(source: &Checkpoint, target: &SaveTarget) -> Result<FullExport> {
    let meta = source.metadata();
    let layout = source.layout();
    let mut writer = FullWriter::create(target, layout)?;
    let mut params_not_finite = 0u64;
    for (u, unit) in layout.units.iter().enumerate() {
        let whole = 0..unit.numel;
        let mut buffers = [StateKind::Param, StateKind::ExpAvg, StateKind::ExpAvgSq]
            .map(|_| vec![0u8; unit.numel as usize * 4]);
        for (kind, buffer) in StateKind::ALL.into_iter().zip(buffers.iter_mut()) {
            source.read_unit_range(kind, unit, whole.clone(), buffer)?;
        }
        let [param, exp_avg, exp_avg_sq] = &buffers;
        // Parameters are stored as f32 (see `Checkpoint::read_unit_range`).
        params_not_finite += param
            .chunks_exact(4)
            .filter(|b| !f32::from_le_bytes([b[0], b[1], b[2], b[3]]).is_finite())
            .count() as u64;
        writer.write_unit(u, param, exp_avg, exp_avg_sq)?;
    }
    let files = writer.finish()?;
    let mut files = Some(files);
    for rank in &meta.ranks {
        let mine = if rank.rank == 0 {
            files.take().unwrap_or_default()
        } else {
            Vec::new()
        };
        write_rank_report(target, rank.rank, rank.rng.clone(), mine)?;
    }
    let committed = commit(
        target,
        &CommitRequest {
            format: CheckpointFormat::Full,
            strategy: meta.strategy,
            shard_group_size: meta.shard_group_size,
            dtypes: meta.dtypes.clone(),
            layout: layout.clone(),
            trainer: meta.trainer.clone(),
            config_hash: meta.config_hash.clone(),
            config: meta.config.clone(),
            kind: CommitKind::Export,
        },
    )?;
    Ok(FullExport {
        committed,
        params_not_finite,
    })
}
