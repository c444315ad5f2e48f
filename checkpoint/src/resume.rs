//! Choosing what to resume from: the newest checkpoint that opens and verifies, walking
//! back past damaged or incomplete ones and saying why each was skipped.

use crate::checkpoint::{Checkpoint, Verify};
use crate::durable::sync_dir;
use crate::error::{CheckpointError, Result};
use crate::naming::{list_entries, EntryKind, COMPLETE_FILE, METADATA_FILE};
use std::path::{Path, PathBuf};

#[derive(Debug)]
pub struct ResumePoint {
    /// `None`: no usable checkpoint (start from scratch).
    pub checkpoint: Option<Checkpoint>,
    /// Newer checkpoints that were passed over, newest first, with the reason.
    pub skipped: Vec<(PathBuf, CheckpointError)>,
}

impl ResumePoint {
    /// One line per skipped checkpoint, for the log ("falling back ...").
    pub fn fallback_messages(&self) -> Vec<String> {
        let to = match &self.checkpoint {
            Some(c) => format!("falling back to {}", c.dir().display()),
            None => "no older checkpoint to fall back to".into(),
        };
        self.skipped
            .iter()
            .map(|(path, err)| format!("skipping checkpoint {}: {err}; {to}", path.display()))
            .collect()
    }
}

/// The newest valid committed checkpoint under `root` (a folder of `step-<N>/`). A missing
/// `root` means no checkpoint yet. `latest` is not trusted: the folders themselves are.
pub fn find_latest(root: &Path, verify: Verify) -> Result<ResumePoint> {
    let mut skipped = Vec::new();
    if !root.exists() {
        return Ok(ResumePoint {
            checkpoint: None,
            skipped,
        });
    }
    for (kind, path) in list_entries(root)? {
        if let EntryKind::Complete(_) = kind {
            match Checkpoint::open(&path, verify) {
                Ok(checkpoint) => {
                    return Ok(ResumePoint {
                        checkpoint: Some(checkpoint),
                        skipped,
                    })
                }
                Err(err) => skipped.push((path, err)),
            }
        }
    }
    Ok(ResumePoint {
        checkpoint: None,
        skipped,
    })
}

/// A path given by a person (`from:`, `shardrun export`): either one checkpoint folder or a
/// folder of them (then the newest valid one). Unlike [`find_latest`], finding nothing is an
/// error.
pub fn resolve(path: &Path, verify: Verify) -> Result<ResumePoint> {
    if path.join(COMPLETE_FILE).exists() || path.join(METADATA_FILE).exists() {
        let checkpoint = Checkpoint::open(path, verify)?;
        return Ok(ResumePoint {
            checkpoint: Some(checkpoint),
            skipped: Vec::new(),
        });
    }
    if !path.is_dir() {
        return Err(CheckpointError::NotFound {
            path: path.to_owned(),
            what:
                "no such folder; give a checkpoint folder (step-<N>/) or the folder that holds them"
                    .into(),
        });
    }
    let found = find_latest(path, verify)?;
    if found.checkpoint.is_none() {
        let what = match found.skipped.first() {
            Some((p, e)) => format!(
                "every checkpoint is damaged or incomplete (newest: {}: {e})",
                p.display()
            ),
            None => "it holds no step-<N>/ folder; has the job saved one yet?".into(),
        };
        return Err(CheckpointError::NotFound {
            path: path.to_owned(),
            what,
        });
    }
    Ok(found)
}

/// Remove what killed saves left behind (`step-<N>.partial`, `step-<N>.replaced`). Rank 0
/// calls it at start-up, before any rank starts a save.
pub fn clean_stale(root: &Path) -> Result<Vec<PathBuf>> {
    if !root.exists() {
        return Ok(Vec::new());
    }
    let mut removed = Vec::new();
    for (kind, path) in list_entries(root)? {
        if matches!(kind, EntryKind::Partial(_) | EntryKind::Replaced(_)) {
            std::fs::remove_dir_all(&path).map_err(CheckpointError::io(
                &path,
                "cannot remove a stale partial checkpoint",
            ))?;
            removed.push(path);
        }
    }
    if !removed.is_empty() {
        sync_dir(root)?;
    }
    Ok(removed)
}
