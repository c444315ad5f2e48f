//! `metadata.json` (what a checkpoint holds and how to read it back) and the `COMPLETE`
//! marker that seals it.

use crate::error::{CheckpointError, Result};
use crate::layout::Layout;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use shardrun_protocol::config::{CheckpointFormat, DType, ShardingStrategy};
use std::path::Path;

/// Bumped on any change that an older reader would misread.
pub const FORMAT_VERSION: u32 = 1;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CheckpointMetadata {
    pub format_version: u32,
    pub format: CheckpointFormat,
    /// Optimizer steps completed when the checkpoint was taken.
    pub step: u64,
    pub world_size: u64,
    pub strategy: ShardingStrategy,
    /// Ranks a unit is sharded over (the world for FULL_SHARD / SHARD_GRAD_OP, 1 for
    /// NO_SHARD, the group for HYBRID_SHARD). Shard `i` is written by rank `i`.
    pub shard_group_size: u64,
    pub dtypes: StateDtypes,
    pub layout: Layout,
    pub trainer: TrainerState,
    /// Indexed by rank.
    pub ranks: Vec<RankState>,
    pub files: Vec<FileEntry>,
    /// [`shardrun_protocol::TrainConfig::config_hash`] of the job that wrote it.
    pub config_hash: String,
    pub created_unix_s: f64,
    /// The job config that wrote it (`TrainConfig` as JSON), so that a job resuming from it
    /// can name the settings it changed; absent from checkpoints written before it was kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config: Option<serde_json::Value>,
}

/// Stored dtypes (always fp32 master state) and the dtype training computed in.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StateDtypes {
    pub param: DType,
    pub exp_avg: DType,
    pub exp_avg_sq: DType,
    pub compute: DType,
}

impl StateDtypes {
    pub fn fp32_state(compute: DType) -> Self {
        StateDtypes {
            param: DType::F32,
            exp_avg: DType::F32,
            exp_avg_sq: DType::F32,
            compute,
        }
    }
}

/// Everything besides tensors that a resumed run needs to continue exactly.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrainerState {
    /// Updates applied: AdamW's step count (bias correction), which is also the LR
    /// schedule's position. Less than the checkpoint's step when fp16 overflows skipped some.
    pub optimizer_step: u64,
    pub scheduler: SchedulerState,
    pub data: DataPosition,
    /// The seed parameters and data were drawn from.
    pub seed: u64,
    /// fp16 dynamic loss scaling, when used.
    pub loss_scale: Option<LossScaleState>,
    /// The step at which the run diverged: its update left the weights not finite, so this
    /// checkpoint holds such weights when its step is that or later. Carried over on resume;
    /// the newest checkpoint from before it is kept whatever `keep` says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub diverged_at: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SchedulerState {
    /// Scheduler steps taken: updates applied, as `optimizer_step` (a step skipped for an
    /// fp16 overflow does not advance the schedule); the schedule itself is in the job's
    /// config. Checkpoints written before skipped steps stopped advancing the schedule hold
    /// the checkpoint's step here; a resume reads the position from `optimizer_step`.
    pub step: u64,
    /// Learning rate of the last update applied.
    pub last_lr: f64,
}

/// Where the data stream continues. `samples_done` counts global samples, independent of
/// the world size, so a resharded resume reads the same batches.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DataPosition {
    pub samples_done: u64,
    /// Global micro-batches consumed (depends on the batch plan that wrote it).
    pub micro_batches_done: u64,
    /// Epochs of the training documents completed (absent for synthetic data, and in
    /// checkpoints written before epochs were recorded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub epoch: Option<u64>,
    /// Fingerprint of the training data's sample stream (tokens, validation split, packing,
    /// truncation, sequence length): resuming on other data is refused. Absent for synthetic data and in
    /// older checkpoints, which resume unchecked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_fingerprint: Option<String>,
}

/// `GradScaler`-style state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LossScaleState {
    pub scale: f64,
    pub growth_tracker: u64,
}

/// One rank's RNG state (the generator's opaque bytes, e.g. `torch.get_rng_state()`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RankState {
    pub rank: u64,
    #[serde(with = "hex_bytes")]
    pub rng: Vec<u8>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileEntry {
    pub name: String,
    pub role: FileRole,
    pub size: u64,
    pub sha256: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum FileRole {
    /// Shard `index` of every unit (sharded format).
    Shard { index: u64 },
    /// `model.safetensors` (full format).
    Model,
    /// `optimizer.safetensors` (full format).
    Optimizer,
}

/// What one rank reports to the committing rank 0 through a file in the partial folder.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RankReport {
    pub state: RankState,
    pub files: Vec<FileEntry>,
}

impl CheckpointMetadata {
    pub fn to_json(&self) -> Vec<u8> {
        let mut json = serde_json::to_vec_pretty(self).expect("metadata serializes");
        json.push(b'\n');
        json
    }

    pub fn from_json(path: &Path, bytes: &[u8]) -> Result<CheckpointMetadata> {
        // Read the version first so a newer format says "version", not "unknown field".
        #[derive(Deserialize)]
        struct Version {
            format_version: u32,
        }
        let version: Version = serde_json::from_slice(bytes).map_err(|e| {
            CheckpointError::malformed(
                path,
                format!("unreadable metadata ({e}): the file is corrupted"),
            )
        })?;
        if version.format_version != FORMAT_VERSION {
            return Err(CheckpointError::UnsupportedVersion {
                path: path.to_owned(),
                found: version.format_version,
                supported: FORMAT_VERSION,
            });
        }
        let metadata: CheckpointMetadata = serde_json::from_slice(bytes).map_err(|e| {
            CheckpointError::malformed(
                path,
                format!("unreadable metadata ({e}): the file is corrupted"),
            )
        })?;
        metadata
            .layout
            .validate()
            .map_err(|e| CheckpointError::malformed(path, e.to_string()))?;
        Ok(metadata)
    }

    pub fn file(&self, role: FileRole) -> Option<&FileEntry> {
        self.files.iter().find(|f| f.role == role)
    }
}

/// Content of `COMPLETE`: the step and the sha256 of `metadata.json` (so a corrupted
/// metadata file is caught even when it still parses), then a checksum of those lines (so
/// damage to the marker itself is told apart from damage to the metadata).
pub fn complete_marker(step: u64, metadata_json: &[u8]) -> String {
    let body = format!(
        "shardrun checkpoint v{FORMAT_VERSION}\nstep {step}\nmetadata_sha256 {}\n",
        hex::encode(Sha256::digest(metadata_json))
    );
    let seal = hex::encode(&Sha256::digest(body.as_bytes())[..8]);
    format!("{body}seal {seal}\n")
}

/// The step a well-formed marker seals, or an error naming the marker.
pub fn parse_complete_marker(marker_path: &Path, marker: &str) -> Result<(u64, String)> {
    let corrupted = || {
        CheckpointError::malformed(
            marker_path,
            "the completion marker is damaged: the file is corrupted",
        )
    };
    let (body, seal) = marker
        .strip_suffix('\n')
        .and_then(|m| m.rsplit_once("seal "))
        .ok_or_else(corrupted)?;
    if hex::encode(&Sha256::digest(body.as_bytes())[..8]) != seal {
        return Err(corrupted());
    }
    let field = |key: &str| {
        body.lines()
            .find_map(|l| l.strip_prefix(key))
            .map(str::to_owned)
    };
    let step = field("step ")
        .and_then(|s| s.parse().ok())
        .ok_or_else(corrupted)?;
    let sha = field("metadata_sha256 ").ok_or_else(corrupted)?;
    Ok((step, sha))
}

/// Check a sealed `COMPLETE` against the metadata bytes; returns the step it seals.
pub fn check_complete_marker(
    marker_path: &Path,
    marker: &str,
    metadata_json: &[u8],
) -> Result<u64> {
    let (step, recorded) = parse_complete_marker(marker_path, marker)?;
    let actual = hex::encode(Sha256::digest(metadata_json));
    if recorded != actual {
        return Err(CheckpointError::ChecksumMismatch {
            path: marker_path.with_file_name(crate::naming::METADATA_FILE),
            expected: recorded,
            actual,
            recorded_in: "COMPLETE",
        });
    }
    Ok(step)
}

mod hex_bytes {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(bytes: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&hex::encode(bytes))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let text = String::deserialize(d)?;
        hex::decode(text).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn data_positions_of_older_checkpoints_still_read() {
        // What checkpoints held before epochs and data fingerprints were recorded.
        let old: DataPosition =
            serde_json::from_str(r#"{"samples_done": 48, "micro_batches_done": 8}"#).unwrap();
        assert_eq!(
            (old.samples_done, old.epoch, old.data_fingerprint),
            (48, None, None)
        );
        let new = DataPosition {
            samples_done: 96,
            micro_batches_done: 16,
            epoch: Some(2),
            data_fingerprint: Some("0123456789abcdef".into()),
        };
        let json = serde_json::to_string(&new).unwrap();
        assert_eq!(serde_json::from_str::<DataPosition>(&json).unwrap(), new);
        // An unknown field is still refused (a newer format), not silently dropped.
        assert!(serde_json::from_str::<DataPosition>(
            r#"{"samples_done": 1, "micro_batches_done": 1, "shard_cursor": 3}"#
        )
        .is_err());
    }
}
