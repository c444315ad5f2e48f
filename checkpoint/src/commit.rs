//! Rank 0's half of a save, after every rank has written and a barrier: check that all
//! files are there, seal the folder with `metadata.json` and `COMPLETE`, rename it into
//! place, point `latest` at it, prune old ones. Each stage is durable before the next, so a
//! job killed anywhere leaves either the previous checkpoints intact or the new one
//! complete. An export is committed the same way, without `latest` and without pruning
//! other exports.

use crate::durable::{sync_dir, write_atomically, write_new};
use crate::error::{CheckpointError, Result};
use crate::layout::Layout;
use crate::metadata::{
    complete_marker, CheckpointMetadata, FileEntry, FileRole, RankReport, RankState, StateDtypes,
    TrainerState, FORMAT_VERSION,
};
use crate::naming::{
    list_entries, newest_complete_before, pruned_dir_name, replaced_dir_name, step_dir_name,
    EntryKind, COMPLETE_FILE, LATEST_FILE, METADATA_FILE,
};
use crate::write::{report_path, SaveTarget};
use shardrun_protocol::config::{CheckpointFormat, ShardingStrategy};
use std::path::{Path, PathBuf};

/// What rank 0 knows about the save besides what the ranks reported.
#[derive(Debug, Clone)]
pub struct CommitRequest {
    pub format: CheckpointFormat,
    pub strategy: ShardingStrategy,
    pub shard_group_size: u64,
    pub dtypes: StateDtypes,
    pub layout: Layout,
    pub trainer: TrainerState,
    pub config_hash: String,
    /// The job config as JSON, for [`CheckpointMetadata::config`].
    pub config: Option<serde_json::Value>,
    pub kind: CommitKind,
}

/// What the folder the save goes into holds: it decides `latest` and pruning.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CommitKind {
    /// One of a run's checkpoints: `latest` points at it, and the `keep` newest committed
    /// checkpoints stay (at least the one just written).
    Checkpoint { keep: usize },
    /// An export: nothing resumes from its folder as a series, so no `latest` is written and
    /// every committed export stays; only what interrupted exports of earlier steps left
    /// goes.
    Export,
}

/// The commit sequence, in order. [`commit_until`] stops after a given stage so tests can
/// reproduce a job killed at that point.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum CommitStage {
    /// `metadata.json` written and fsynced (no `COMPLETE` yet).
    Metadata,
    /// `COMPLETE` written and the partial folder fsynced.
    Complete,
    /// `step-<N>.partial` renamed to `step-<N>`, parent fsynced.
    Rename,
    /// `latest` points at the new checkpoint (an export has no `latest`: nothing happens).
    Latest,
    /// Older checkpoints beyond `keep` and stale partial folders removed.
    Prune,
}

#[derive(Debug)]
pub struct Committed {
    pub dir: PathBuf,
    pub metadata: CheckpointMetadata,
    pub pruned: Pruned,
}

pub fn commit(target: &SaveTarget, request: &CommitRequest) -> Result<Committed> {
    commit_observed(target, request, CommitStage::Prune, &mut |_| {})
}

/// Stop after `last`, as a job killed there would (for crash tests).
pub fn commit_until(
    target: &SaveTarget,
    request: &CommitRequest,
    last: CommitStage,
) -> Result<Committed> {
    commit_observed(target, request, last, &mut |_| {})
}

/// Run the commit up to `last`, calling `on_stage` as each stage becomes durable (to log
/// timings, or to stop a test process at a precise point).
pub fn commit_observed(
    target: &SaveTarget,
    request: &CommitRequest,
    last: CommitStage,
    on_stage: &mut dyn FnMut(CommitStage),
) -> Result<Committed> {
    let partial = target.partial_dir();
    let started = std::time::Instant::now();
    let metadata = collect_metadata(target, request)?;
    tracing::debug!(
        dir = %partial.display(),
        files = metadata.files.len(),
        seconds = started.elapsed().as_secs_f64(),
        "checkpoint verify: every rank's files are there with the sizes they reported"
    );
    let json = metadata.to_json();
    write_new(&partial.join(METADATA_FILE), &json)?;
    // The reports are merged; dropping them leaves exactly the files the metadata lists.
    for rank in 0..target.world_size {
        let report = report_path(&partial, rank, target.world_size);
        std::fs::remove_file(&report).map_err(CheckpointError::io(&report, "cannot remove"))?;
    }
    let mut committed = Committed {
        dir: partial.clone(),
        metadata,
        pruned: Pruned::default(),
    };
    on_stage(CommitStage::Metadata);
    if last == CommitStage::Metadata {
        return Ok(committed);
    }

    write_new(
        &partial.join(COMPLETE_FILE),
        complete_marker(target.step, &json).as_bytes(),
    )?;
    sync_dir(&partial)?;
    tracing::debug!(dir = %partial.display(), "checkpoint sealed (metadata.json, COMPLETE, fsynced)");
    on_stage(CommitStage::Complete);
    if last == CommitStage::Complete {
        return Ok(committed);
    }

    let renaming = std::time::Instant::now();
    committed.dir = rename_into_place(target)?;
    tracing::debug!(
        from = %partial.display(),
        to = %committed.dir.display(),
        seconds = renaming.elapsed().as_secs_f64(),
        "checkpoint rename"
    );
    on_stage(CommitStage::Rename);
    if last == CommitStage::Rename {
        return Ok(committed);
    }

    let keep = match request.kind {
        CommitKind::Checkpoint { keep } => {
            write_atomically(
                &target.root.join(LATEST_FILE),
                format!("{}\n", step_dir_name(target.step)).as_bytes(),
            )?;
            keep
        }
        CommitKind::Export => usize::MAX,
    };
    on_stage(CommitStage::Latest);
    if last == CommitStage::Latest {
        return Ok(committed);
    }

    committed.pruned = prune(&target.root, target.step, keep, request.trainer.diverged_at)?;
    tracing::debug!(
        removed = committed.pruned.removed.len(),
        left = committed.pruned.left.len(),
        keep,
        "checkpoint prune"
    );
    on_stage(CommitStage::Prune);
    Ok(committed)
}

/// Merge the rank reports and check that every file the format needs is there, once, with
/// the size its writer reported.
fn collect_metadata(target: &SaveTarget, request: &CommitRequest) -> Result<CheckpointMetadata> {
    let partial = target.partial_dir();
    let mut ranks: Vec<RankState> = Vec::new();
    let mut files: Vec<FileEntry> = Vec::new();
    for rank in 0..target.world_size {
        let path = report_path(&partial, rank, target.world_size);
        let bytes = std::fs::read(&path).map_err(|e| CheckpointError::Commit {
            path: path.clone(),
            what: format!("rank {rank} did not finish writing its part ({e}); the checkpoint is not committed"),
        })?;
        let report: RankReport = serde_json::from_slice(&bytes).map_err(|e| {
            CheckpointError::malformed(&path, format!("unreadable rank report: {e}"))
        })?;
        ranks.push(report.state);
        files.extend(report.files);
    }

    let mut expected: Vec<FileRole> = match request.format {
        CheckpointFormat::Sharded => (0..request.shard_group_size)
            .map(|index| FileRole::Shard { index })
            .collect(),
        CheckpointFormat::Full => vec![FileRole::Model, FileRole::Optimizer],
    };
    for file in &files {
        let Some(pos) = expected.iter().position(|r| *r == file.role) else {
            return Err(CheckpointError::Commit {
                path: partial.join(&file.name),
                what: format!(
                    "{:?} was reported twice or does not belong to a {:?} checkpoint",
                    file.role, request.format
                ),
            });
        };
        expected.swap_remove(pos);
        let path = partial.join(&file.name);
        let size = std::fs::metadata(&path)
            .map_err(CheckpointError::io(&path, "reported but missing"))?
            .len();
        if size != file.size {
            return Err(CheckpointError::SizeMismatch {
                path,
                expected: file.size,
                actual: size,
            });
        }
    }
    if let Some(missing) = expected.first() {
        return Err(CheckpointError::Commit {
            path: partial,
            what: format!(
                "no rank wrote {missing:?}: the shard group size or the writers are misconfigured"
            ),
        });
    }
    files.sort_by(|a, b| a.name.cmp(&b.name));

    Ok(CheckpointMetadata {
        format_version: FORMAT_VERSION,
        format: request.format,
        step: target.step,
        world_size: target.world_size,
        strategy: request.strategy,
        shard_group_size: request.shard_group_size,
        dtypes: request.dtypes.clone(),
        layout: request.layout.clone(),
        trainer: request.trainer.clone(),
        ranks,
        files,
        config_hash: request.config_hash.clone(),
        created_unix_s: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64()),
        config: request.config.clone(),
    })
}

/// `step-<N>.partial` → `step-<N>`. A folder already there (a checkpoint of the same step
/// from before a fallback) is moved aside first and removed after, since rename cannot
/// replace a non-empty folder.
fn rename_into_place(target: &SaveTarget) -> Result<PathBuf> {
    let partial = target.partial_dir();
    let dest = target.root.join(step_dir_name(target.step));
    let aside = target.root.join(replaced_dir_name(target.step));
    let existed = dest.exists();
    if existed {
        if aside.exists() {
            std::fs::remove_dir_all(&aside)
                .map_err(CheckpointError::io(&aside, "cannot remove"))?;
        }
        std::fs::rename(&dest, &aside).map_err(CheckpointError::io(&dest, "cannot move aside"))?;
    }
    std::fs::rename(&partial, &dest)
        .map_err(CheckpointError::io(&partial, "cannot rename into place"))?;
    sync_dir(&target.root)?;
    if existed {
        std::fs::remove_dir_all(&aside).map_err(CheckpointError::io(&aside, "cannot remove"))?;
    }
    Ok(dest)
}

/// What [`prune`] removed, and what it could not.
#[derive(Debug, Default)]
pub struct Pruned {
    pub removed: Vec<PathBuf>,
    /// The newest checkpoint from before the run diverged, kept past `keep`.
    pub kept_from_before_divergence: Option<PathBuf>,
    /// Folders that stay, with why (another user's, a read-only file system): the new
    /// checkpoint is committed all the same, so these are for a warning, not an error.
    pub left: Vec<CheckpointError>,
}

/// Keep the `keep` newest committed checkpoints and always `just_written`; remove older
/// leftovers of killed saves. Partial folders of later steps are left alone: they may be
/// another save in progress. A run that diverged at step `diverged_at` also keeps its newest
/// checkpoint from before that step: the newer ones hold weights that are not finite, and
/// without it nothing would be left to go back to.
pub fn prune(
    root: &Path,
    just_written: u64,
    keep: usize,
    diverged_at: Option<u64>,
) -> Result<Pruned> {
    let entries = list_entries(root)?;
    let sound = diverged_at
        .and_then(|diverged| newest_complete_before(&entries, diverged))
        .map(|(step, _)| step);
    let mut kept = 0usize;
    let mut pruned = Pruned::default();
    for (kind, path) in entries {
        let remove = match kind {
            EntryKind::Complete(step) if step == just_written => false,
            EntryKind::Complete(step) => {
                // `just_written` counts towards `keep` wherever it sorts.
                kept += 1;
                let past_keep = kept >= keep.max(1);
                if past_keep && Some(step) == sound {
                    pruned.kept_from_before_divergence = Some(path.clone());
                }
                past_keep && Some(step) != sound
            }
            EntryKind::Partial(step) | EntryKind::Discarded(step) => step < just_written,
        };
        if !remove {
            continue;
        }
        // Out of the way first, in one rename: a removal cut short (a kill, a file that
        // will not go) leaves a folder no resume takes for a checkpoint.
        let doomed = match kind {
            EntryKind::Complete(step) => {
                let aside = root.join(pruned_dir_name(step));
                // One left by a removal cut short before.
                let _ = std::fs::remove_dir_all(&aside);
                match std::fs::rename(&path, &aside) {
                    Ok(()) => aside,
                    Err(e) => {
                        let why = "cannot move an older checkpoint aside to remove it";
                        pruned.left.push(CheckpointError::io(&path, why)(e));
                        continue;
                    }
                }
            }
            _ => path.clone(),
        };
        match std::fs::remove_dir_all(&doomed) {
            Ok(()) => pruned.removed.push(path),
            Err(e) => {
                // Refused before any file went (a folder its owner protected): still the
                // checkpoint it was, it takes its name back.
                let whole = doomed != path
                    && crate::Checkpoint::open(&doomed, crate::Verify::Structure).is_ok();
                let stays = match whole && std::fs::rename(&doomed, &path).is_ok() {
                    true => &path,
                    false => &doomed,
                };
                pruned.left.push(CheckpointError::io(
                    stays,
                    "cannot remove an older checkpoint",
                )(e));
            }
        }
    }
    if !pruned.removed.is_empty() {
        sync_dir(root)?;
    }
    Ok(pruned)
}
