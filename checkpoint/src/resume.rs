//! Choosing what to resume from: the newest checkpoint that opens and verifies, walking
//! back past damaged or incomplete ones and saying why each was skipped.

use crate::checkpoint::{Checkpoint, Verify};
use crate::durable::sync_dir;
use crate::error::{CheckpointError, Result};
use crate::naming::{
    damaged_dir_name, list_entries, step_of_dir, EntryKind, COMPLETE_FILE, METADATA_FILE,
};
use std::path::{Path, PathBuf};

/// Skipped checkpoints named in one line; a run keeps few (`keep`), but need not.
const NAMED_AT_MOST: usize = 8;

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
            None if self.skipped.len() > 1 => "no checkpoint of this run loads".into(),
            None => "no older checkpoint to fall back to".into(),
        };
        self.skipped
            .iter()
            .map(|(path, err)| format!("skipping checkpoint {}: {err}; {to}", path.display()))
            .collect()
    }

    /// The folders of the checkpoints passed over, newest first (`step-20, step-10`): the
    /// first [`NAMED_AT_MOST`], then how many more.
    pub fn skipped_names(&self) -> String {
        let names: Vec<String> = self
            .skipped
            .iter()
            .take(NAMED_AT_MOST)
            .map(|(path, _)| {
                path.file_name()
                    .unwrap_or_default()
                    .to_string_lossy()
                    .into()
            })
            .collect();
        match self.skipped.len().saturating_sub(NAMED_AT_MOST) {
            0 => names.join(", "),
            more => format!("{} and {more} more", names.join(", ")),
        }
    }

    /// Renames the checkpoints passed over (newer than the one chosen, and failing to load)
    /// to `step-<N>.damaged`: the run trains on past their steps, so left in place they
    /// would count among the newest `keep` (pruning good ones) and be met again at every
    /// resume. Kept, not deleted: a shard copied back from elsewhere repairs one. Returns
    /// each (old, new) path.
    pub fn set_aside_skipped(&self) -> Result<Vec<(PathBuf, PathBuf)>> {
        let mut moved = Vec::new();
        for (path, _) in &self.skipped {
            let Some(aside) = aside_name(path) else {
                continue;
            };
            std::fs::rename(path, &aside).map_err(CheckpointError::io(
                path,
                "cannot set aside a checkpoint that does not load",
            ))?;
            moved.push((path.clone(), aside));
        }
        if let Some((_, aside)) = moved.first() {
            sync_dir(aside.parent().unwrap_or(Path::new(".")))?;
        }
        Ok(moved)
    }
}

/// Where a checkpoint that does not load is set aside: the first unused of
/// `step-<N>.damaged`, `step-<N>.damaged-2`, ...; `None` for a folder not named by its step.
fn aside_name(path: &Path) -> Option<PathBuf> {
    let (step, root) = (step_of_dir(path)?, path.parent()?);
    (1..)
        .map(|attempt| root.join(damaged_dir_name(step, attempt)))
        .find(|p| !p.exists())
}

/// The error for checkpoint `path` that cannot be read (`cause`), with what to do if it is
/// lost for good; `older`: whether a checkpoint older than it is there to use instead.
fn unreadable(path: PathBuf, cause: CheckpointError, older: bool) -> CheckpointError {
    let then = match older {
        true => "to use the checkpoint before it",
        false => "(no checkpoint is older than it)",
    };
    let if_lost = match aside_name(&path) {
        Some(aside) => format!(
            "if it is lost for good, move it aside {then}: mv {} {}",
            path.display(),
            aside.display()
        ),
        None => format!("if it is lost for good, move it aside {then}"),
    };
    CheckpointError::Unreadable {
        checkpoint: path,
        cause: Box::new(cause),
        if_lost,
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
    let entries = list_entries(root)?;
    for (at, (kind, path)) in entries.iter().enumerate() {
        if let EntryKind::Complete(_) = kind {
            match Checkpoint::open(path, verify) {
                Ok(checkpoint) => {
                    return Ok(ResumePoint {
                        checkpoint: Some(checkpoint),
                        skipped,
                    })
                }
                Err(err) if err.is_unreadable() => {
                    let older = entries[at + 1..]
                        .iter()
                        .any(|(kind, _)| matches!(kind, EntryKind::Complete(_)));
                    return Err(unreadable(path.clone(), err, older));
                }
                Err(err) => skipped.push((path.clone(), err)),
            }
        }
    }
    Ok(ResumePoint {
        checkpoint: None,
        skipped,
    })
}

/// [`find_latest`] for a look that loads nothing (a login node's, the controller's): only a
/// checkpoint that cannot be read is an error; a root that cannot be listed as a folder of
/// checkpoints (a file there) holds none.
pub fn find_latest_readable(root: &Path, verify: Verify) -> Result<ResumePoint> {
    match find_latest(root, verify) {
        Err(e) if !e.is_unreadable() => Ok(ResumePoint {
            checkpoint: None,
            skipped: Vec::new(),
        }),
        found => found,
    }
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
    let mut found = find_latest(path, verify)?;
    // A run still training prunes old checkpoints as it saves new ones: one that vanished
    // while it was read was not damaged, and a newer one is there to take.
    if found.checkpoint.is_none() && found.skipped.iter().any(|(p, _)| !p.exists()) {
        found = find_latest(path, verify)?;
    }
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

/// Remove what killed saves and removals left behind (`step-<N>.partial`,
/// `step-<N>.replaced`, `step-<N>.pruned`; [`crate::naming::left_by`] says which). Rank 0
/// calls it at start-up, before any rank starts a save.
pub fn clean_stale(root: &Path) -> Result<Vec<PathBuf>> {
    if !root.exists() {
        return Ok(Vec::new());
    }
    let mut removed = Vec::new();
    for (kind, path) in list_entries(root)? {
        match kind {
            EntryKind::Partial(_) => {
                std::fs::remove_dir_all(&path).map_err(CheckpointError::io(
                    &path,
                    "cannot remove a stale partial checkpoint",
                ))?;
                removed.push(path);
            }
            // A folder a removal left (cut short, or refused and said then): tried again,
            // never in the way.
            EntryKind::Discarded(_) => {
                if std::fs::remove_dir_all(&path).is_ok() {
                    removed.push(path);
                }
            }
            EntryKind::Complete(_) => {}
        }
    }
    if !removed.is_empty() {
        sync_dir(root)?;
    }
    Ok(removed)
}
