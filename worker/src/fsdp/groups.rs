//! The process groups a sharding strategy uses. Every strategy is a (shard group,
//! replicate group) pair: parameters are sharded over the first and replicated over the
//! second, gradients reduce-scattered in the first and all-reduced in the second.
//!
//! | strategy | shard group | replicate group |
//! | --- | --- | --- |
//! | FULL_SHARD, SHARD_GRAD_OP | world | itself alone |
//! | NO_SHARD | itself alone | world |
//! | HYBRID_SHARD | its node (`shard_group_size` ranks) | same position in every node |

use super::FsdpError;
use crate::collectives::{hybrid_groups, Communicator, SingleProcess};
use shardrun_protocol::config::ShardingStrategy;
use std::sync::Arc;

#[derive(Clone)]
pub struct ProcessGroups {
    pub world: Arc<dyn Communicator>,
    pub shard: Arc<dyn Communicator>,
    pub replicate: Arc<dyn Communicator>,
}

impl ProcessGroups {
    /// The groups `strategy` needs, built from the world communicator (collective: every rank
    /// calls it at the same point). `shard_group_size` is HYBRID_SHARD's ranks per group.
    pub fn for_strategy(
        world: Arc<dyn Communicator>,
        strategy: ShardingStrategy,
        shard_group_size: Option<u64>,
    ) -> Result<ProcessGroups, FsdpError> {
        let alone: Arc<dyn Communicator> = Arc::new(SingleProcess);
        Ok(match strategy {
            ShardingStrategy::FullShard | ShardingStrategy::ShardGradOp => ProcessGroups {
                shard: world.clone(),
                replicate: alone,
                world,
            },
            ShardingStrategy::NoShard => ProcessGroups {
                shard: alone,
                replicate: world.clone(),
                world,
            },
            ShardingStrategy::HybridShard => {
                let size = shard_group_size.ok_or_else(|| {
                    FsdpError::Invalid(
                        "HYBRID_SHARD needs fsdp.shard_group_size (ranks per shard group, usually the GPUs per node)"
                            .into(),
                    )
                })?;
                let (shard, replicate) =
                    hybrid_groups(world.rank(), world.world_size(), size as usize)?;
                let shard: Arc<dyn Communicator> = Arc::from(world.new_subgroup(&shard)?);
                let replicate: Arc<dyn Communicator> = Arc::from(world.new_subgroup(&replicate)?);
                ProcessGroups {
                    world,
                    shard,
                    replicate,
                }
            }
        })
    }
}
