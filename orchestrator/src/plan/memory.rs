//! Memory per rank: the model state each strategy keeps, against the GPU's memory.

use super::{yaml_name, MemoryEstimate, GIB};
use shardrun_protocol::config::{DeviceKind, ShardingStrategy};

/// What the plan knows when it estimates memory.
pub struct MemoryInputs {
    pub num_params: u64,
    pub strategy: ShardingStrategy,
    pub world_size: u64,
    /// Ranks per shard group (HYBRID_SHARD), else ranks per node.
    pub shard_group: u64,
    pub device: DeviceKind,
    pub gpu_memory_gb: Option<f64>,
}

pub fn estimate_memory(m: &MemoryInputs, warnings: &mut Vec<String>) -> MemoryEstimate {
    let per_strategy: Vec<_> = [
        ShardingStrategy::FullShard,
        ShardingStrategy::ShardGradOp,
        ShardingStrategy::HybridShard,
        ShardingStrategy::NoShard,
    ]
    .into_iter()
    .map(|s| {
        (
            s,
            s.model_state_bytes_per_rank(m.num_params, m.world_size, m.shard_group),
        )
    })
    .collect();
    let bytes_per_rank =
        m.strategy
            .model_state_bytes_per_rank(m.num_params, m.world_size, m.shard_group);
    let gpu_memory_bytes = m.gpu_memory_gb.map(|gb| (gb * GIB) as u64);
    if let Some(limit) = gpu_memory_bytes {
        if m.device == DeviceKind::Cpu {
            warnings.push(
                "`resources.gpu_memory_gb` is set but the job runs CPU ranks; it is ignored".into(),
            );
        } else if bytes_per_rank > limit {
            let fits: Vec<String> = per_strategy
                .iter()
                .filter(|(_, b)| *b <= limit)
                .map(|(s, _)| yaml_name(s))
                .collect();
            warnings.push(format!(
                "model state needs {:.2} GiB per rank with {} but a GPU has {:.2} GiB: the job will run out of memory. {}",
                bytes_per_rank as f64 / GIB,
                yaml_name(&m.strategy),
                limit as f64 / GIB,
                if fits.is_empty() { "Use more GPUs or a smaller model.".to_string() } else { format!("Strategies that fit: {}.", fits.join(", ")) }
            ));
        }
    }
    MemoryEstimate {
        num_params: m.num_params,
        strategy: m.strategy,
        bytes_per_rank,
        per_strategy,
        gpu_memory_bytes,
    }
}
