//! What the memory plan needs to know of an architecture: described with the architecture
//! itself in `shardrun_models` (parameters, segments, activation bytes per token).

pub use shardrun_models::footprint::{Footprint, SegmentFootprint};
