//! Checkpoint format (issue 5): `step-N/` folders of per-rank safetensors shards plus layout
//! metadata, committed atomically, verified on load, reshardable from N to M ranks.
