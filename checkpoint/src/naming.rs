//! Names of folders, files and tensors inside a checkpoint folder:
//!
//! ```text
//! <checkpoint dir>/
//!   latest                         "step-<N>": the newest committed checkpoint, for people
//!   step-<N>/                      committed: renamed from step-<N>.partial/ after COMPLETE
//!     rank-<r>-of-<W>.safetensors  sharded: units.<u>.{param,exp_avg,exp_avg_sq}
//!     model.safetensors            full: PyTorch parameter names
//!     optimizer.safetensors        full: <name>.exp_avg, <name>.exp_avg_sq
//!     metadata.json                layout, trainer state, sha256 of every file
//!     COMPLETE                     written last: step and sha256 of metadata.json
//!   step-<M>.partial/              being written (or left by a killed job: ignored)
//! ```

use crate::error::{CheckpointError, Result};
use std::path::{Path, PathBuf};

pub const METADATA_FILE: &str = "metadata.json";
pub const COMPLETE_FILE: &str = "COMPLETE";
pub const LATEST_FILE: &str = "latest";
pub const MODEL_FILE: &str = "model.safetensors";
pub const OPTIMIZER_FILE: &str = "optimizer.safetensors";
const PARTIAL_SUFFIX: &str = ".partial";
/// A committed folder moved aside while a re-written checkpoint of the same step replaces it.
const REPLACED_SUFFIX: &str = ".replaced";
/// A committed folder moved aside to be pruned: a removal cut short leaves it under this
/// name, never a `step-<N>` missing some of its files.
const PRUNED_SUFFIX: &str = ".pruned";

/// The three per-parameter tensors a checkpoint stores.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StateKind {
    Param,
    ExpAvg,
    ExpAvgSq,
}

impl StateKind {
    pub const ALL: [StateKind; 3] = [StateKind::Param, StateKind::ExpAvg, StateKind::ExpAvgSq];

    pub fn as_str(self) -> &'static str {
        match self {
            StateKind::Param => "param",
            StateKind::ExpAvg => "exp_avg",
            StateKind::ExpAvgSq => "exp_avg_sq",
        }
    }
}

pub fn step_dir_name(step: u64) -> String {
    format!("step-{step}")
}

pub fn partial_dir_name(step: u64) -> String {
    format!("step-{step}{PARTIAL_SUFFIX}")
}

pub(crate) fn replaced_dir_name(step: u64) -> String {
    format!("step-{step}{REPLACED_SUFFIX}")
}

pub(crate) fn pruned_dir_name(step: u64) -> String {
    format!("step-{step}{PRUNED_SUFFIX}")
}

/// What left a folder that [`crate::clean_stale`] removes, in words.
pub fn left_by(path: &Path) -> &'static str {
    match path.to_str().is_some_and(|p| p.ends_with(PRUNED_SUFFIX)) {
        true => "a removal of an old checkpoint that did not finish",
        false => "a save that did not finish",
    }
}

/// The line that says [`crate::clean_stale`] removed `path`: `removed <path>, left by ...`.
pub fn removed_line(path: &Path) -> String {
    format!("removed {}, left by {}", path.display(), left_by(path))
}

/// A committed checkpoint that failed to load, set aside (`step-<N>.damaged`, then
/// `.damaged-2`, ...): kept for repair, no longer a checkpoint (no step parses from it).
pub(crate) fn damaged_dir_name(step: u64, attempt: u32) -> String {
    match attempt {
        0 | 1 => format!("step-{step}.damaged"),
        n => format!("step-{step}.damaged-{n}"),
    }
}

pub fn shard_file_name(rank: u64, world_size: u64) -> String {
    format!("rank-{rank}-of-{world_size}.safetensors")
}

/// Each rank's report (its RNG state and the digests of the files it wrote), merged into
/// `metadata.json` by rank 0 at commit and then removed.
pub fn rank_report_file_name(rank: u64, world_size: u64) -> String {
    format!("rank-{rank}-of-{world_size}.json")
}

pub fn shard_tensor_name(unit: usize, kind: StateKind) -> String {
    format!("units.{unit}.{}", kind.as_str())
}

pub fn optimizer_tensor_name(param: &str, kind: StateKind) -> String {
    format!("{param}.{}", kind.as_str())
}

/// What a folder inside the checkpoint dir is, by its name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryKind {
    Complete(u64),
    Partial(u64),
    /// A committed folder moved aside to be removed (`.replaced`, `.pruned`).
    Discarded(u64),
}

pub fn parse_entry(name: &str) -> Option<EntryKind> {
    let rest = name.strip_prefix("step-")?;
    let (digits, kind): (&str, fn(u64) -> EntryKind) =
        if let Some(d) = rest.strip_suffix(PARTIAL_SUFFIX) {
            (d, EntryKind::Partial)
        } else if let Some(d) = rest
            .strip_suffix(REPLACED_SUFFIX)
            .or_else(|| rest.strip_suffix(PRUNED_SUFFIX))
        {
            (d, EntryKind::Discarded)
        } else {
            (rest, EntryKind::Complete)
        };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok().map(kind)
}

/// Every `step-*` folder of a checkpoint dir, newest step first.
pub fn list_entries(root: &Path) -> Result<Vec<(EntryKind, PathBuf)>> {
    let read = std::fs::read_dir(root).map_err(CheckpointError::io(
        root,
        "cannot list the checkpoint folder",
    ))?;
    let mut entries = Vec::new();
    for entry in read {
        let entry = entry.map_err(CheckpointError::io(
            root,
            "cannot list the checkpoint folder",
        ))?;
        let name = entry.file_name();
        if let Some(kind) = name.to_str().and_then(parse_entry) {
            entries.push((kind, entry.path()));
        }
    }
    let step = |k: &EntryKind| match *k {
        EntryKind::Complete(s) | EntryKind::Partial(s) | EntryKind::Discarded(s) => s,
    };
    entries.sort_by_key(|e| std::cmp::Reverse(step(&e.0)));
    Ok(entries)
}

/// The newest committed checkpoint among `entries` ([`list_entries`], newest first) from
/// before `step`: its step and folder.
pub fn newest_complete_before(entries: &[(EntryKind, PathBuf)], step: u64) -> Option<(u64, &Path)> {
    entries.iter().find_map(|(kind, path)| match *kind {
        EntryKind::Complete(s) if s < step => Some((s, path.as_path())),
        _ => None,
    })
}

/// The folder of the newest committed checkpoint under `root` from before `step` (the one
/// a run that diverged at `step` keeps), if `root` lists and holds one.
pub fn newest_complete_folder_before(root: &Path, step: u64) -> Option<PathBuf> {
    let entries = list_entries(root).ok()?;
    newest_complete_before(&entries, step).map(|(_, path)| path.to_path_buf())
}

/// Step of a committed checkpoint folder from its name.
pub fn step_of_dir(dir: &Path) -> Option<u64> {
    match dir.file_name()?.to_str().and_then(parse_entry)? {
        EntryKind::Complete(step) => Some(step),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn folder_names_round_trip() {
        assert_eq!(
            parse_entry(&step_dir_name(12)),
            Some(EntryKind::Complete(12))
        );
        assert_eq!(
            parse_entry(&partial_dir_name(7)),
            Some(EntryKind::Partial(7))
        );
        assert_eq!(
            parse_entry(&replaced_dir_name(7)),
            Some(EntryKind::Discarded(7))
        );
        assert_eq!(
            parse_entry(&pruned_dir_name(7)),
            Some(EntryKind::Discarded(7))
        );
        for junk in [
            "step-",
            "step-x",
            "step-1.tmp",
            "latest",
            "step--1",
            "export",
        ] {
            assert_eq!(parse_entry(junk), None, "{junk}");
        }
    }
}
