//! Checkpoint format of shardrun (`docs/checkpoints.md` describes it for people).
//!
//! A checkpoint is a `step-<N>/` folder of safetensors files plus `metadata.json` and a
//! `COMPLETE` marker written last. Everything here works on raw little-endian f32 bytes and
//! never links libtorch, so the orchestrator (`shardrun export`) uses it as well as the
//! worker.
//!
//! * [`layout`]: units, parameters, offsets, padding and shards.
//! * [`naming`]: folder, file and tensor names.
//! * [`metadata`]: `metadata.json` and the `COMPLETE` seal.
//! * [`tensor_file`]: streaming safetensors writer (sha256, fsync) and ranged reader.
//! * [`write`]: what each rank writes during a save ([`ShardWriter`], [`FullWriter`]).
//! * [`commit`]: rank 0's atomic commit, `latest`, pruning.
//! * [`checkpoint`]: opening and verifying a committed checkpoint.
//! * [`reshard`]: reading any range of any unit of another layout (N → M ranks).
//! * [`resume`]: the newest valid checkpoint, with fallback and cleanup.
//! * [`export`]: sharded → full.
//!
//! A save, for a world of `W` ranks writing shards of a group of `G`:
//! 1. rank 0: [`SaveTarget::prepare`]; barrier;
//! 2. ranks `< G`: [`ShardWriter`] unit by unit (or rank 0: [`FullWriter`]); every rank:
//!    [`write_rank_report`]; barrier;
//! 3. rank 0: [`commit()`].

pub mod checkpoint;
pub mod commit;
mod durable;
pub mod error;
pub mod export;
pub mod layout;
pub mod metadata;
pub mod naming;
pub mod reshard;
pub mod resume;
pub mod tensor_file;
pub mod write;

pub use checkpoint::{Checkpoint, Verify};
pub use commit::{
    commit, commit_observed, commit_until, prune, CommitKind, CommitRequest, CommitStage,
    Committed, Pruned,
};
pub use error::{CheckpointError, Result};
pub use export::{export_full, FullExport};
pub use layout::{Layout, ParamSlot, UnitLayout};
pub use metadata::{
    CheckpointMetadata, DataPosition, FileEntry, FileRole, LossScaleState, RankState,
    SchedulerState, StateDtypes, TrainerState, FORMAT_VERSION,
};
pub use naming::StateKind;
pub use resume::{clean_stale, find_latest, find_latest_readable, resolve, ResumePoint};
pub use write::{write_rank_report, FullWriter, SaveTarget, ShardWriter};
