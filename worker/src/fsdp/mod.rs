//! Fully sharded data parallelism (ZeRO-3) over tch, apart from the model code:
//!
//! * [`wrap`]: auto-wrap policies, which parameters form which unit;
//! * [`flat`]: a unit's flat-parameter layout and its even (padded) sharding;
//! * [`unit`]: one unit at run time: shard, gradient shard, AdamW state, gather/free/reduce;
//! * [`engine`]: forward and backward segment by segment, gathering units just in time
//!   (with prefetch and a limit on gathers in flight), freeing them per strategy, and
//!   reduce-scattering gradients as each unit's backward finishes;
//! * [`groups`]: the process groups a strategy shards and replicates over.
//!
//! Freeing gathered parameters and the seeded unit backward go through [`crate::shim`].

pub mod engine;
pub mod flat;
pub mod groups;
pub mod unit;
pub mod wrap;

pub use engine::{EngineOptions, FsdpEngine, LoadingStats, MemoryStats, UnitShardState};
pub use flat::{FlatLayout, FlatParam};
pub use groups::ProcessGroups;

use crate::collectives::CommError;

#[derive(Debug, thiserror::Error)]
pub enum FsdpError {
    #[error(transparent)]
    Comm(#[from] CommError),
    #[error(transparent)]
    Shim(#[from] crate::shim::ShimError),
    #[error("torch: {0}")]
    Torch(#[from] tch::TchError),
    #[error(transparent)]
    Load(#[from] shardrun_models::hf::HfError),
    #[error("{0}")]
    Invalid(String),
}

impl FsdpError {
    /// The other rank this error follows from, when a collective names one.
    pub fn peer_at_fault(&self) -> Option<usize> {
        match self {
            FsdpError::Comm(e) => e.peer_at_fault(),
            _ => None,
        }
    }
}
