//! The process groups of a job. Every strategy is a (shard group, replicate group) pair on
//! the data communicator: parameters are sharded over the first and replicated over the
//! second, gradients reduce-scattered in the first and all-reduced in the second. Beside
//! them, the control communicator (always the CPU ring) and its shard group carry control
//! values and the CPU tensors of checkpoint gathers. Rank and world size are the control
//! communicator's.
//!
//! | strategy | shard group | replicate group |
//! | --- | --- | --- |
//! | FULL_SHARD, SHARD_GRAD_OP | world | itself alone |
//! | NO_SHARD | itself alone | world |
//! | HYBRID_SHARD | its node (`shard_group_size` ranks) | same position in every node |

use super::FsdpError;
use crate::collectives::{hybrid_groups, Comms, Communicator, DataPlane, SingleProcess};
use shardrun_protocol::config::ShardingStrategy;
use std::sync::Arc;

#[derive(Clone)]
pub struct ProcessGroups {
    /// The data communicators (engine only, see [`DataPlane`]).
    pub shard: Arc<dyn Communicator>,
    pub replicate: Arc<dyn Communicator>,
    /// Every rank, on the CPU: control values, agreement, barriers.
    pub control: Arc<dyn Communicator>,
    /// The shard group on the CPU: gathers of CPU tensors (full-format checkpoints).
    pub control_shard: Arc<dyn Communicator>,
}

impl ProcessGroups {
    /// The groups `strategy` needs, built from the job's communicators (collective: every
    /// rank calls it at the same point). `shard_group_size` is HYBRID_SHARD's ranks per group.
    pub fn for_strategy(
        comms: Comms,
        strategy: ShardingStrategy,
        shard_group_size: Option<u64>,
    ) -> Result<ProcessGroups, FsdpError> {
        let world: Arc<dyn Communicator> = Arc::new(DataPlane::new(comms.data));
        let control: Arc<dyn Communicator> = Arc::from(comms.control);
        let alone =
            || -> Arc<dyn Communicator> { Arc::new(DataPlane::new(Box::new(SingleProcess))) };
        Ok(match strategy {
            ShardingStrategy::FullShard | ShardingStrategy::ShardGradOp => ProcessGroups {
                shard: world,
                replicate: alone(),
                control_shard: control.clone(),
                control,
            },
            ShardingStrategy::NoShard => ProcessGroups {
                shard: alone(),
                replicate: world,
                control,
                control_shard: Arc::new(SingleProcess),
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
                let control_shard: Arc<dyn Communicator> = Arc::from(control.new_subgroup(&shard)?);
                let shard: Arc<dyn Communicator> = Arc::from(world.new_subgroup(&shard)?);
                let replicate: Arc<dyn Communicator> = Arc::from(world.new_subgroup(&replicate)?);
                // From here on only the two groups carry tensors: the world's own NCCL buffers
                // and connections would sit idle for the whole job. Every rank is here, and
                // NCCL's split groups do not share the parent's resources (no `splitShare`).
                world.finish()?;
                ProcessGroups {
                    shard,
                    replicate,
                    control,
                    control_shard,
                }
            }
        })
    }

    /// This process alone (world size 1, any device).
    pub fn single_process(strategy: ShardingStrategy) -> Result<ProcessGroups, FsdpError> {
        Self::for_strategy(Comms::single_process(), strategy, Some(1))
    }

    /// The clean end of a job: every rank arrives (control barrier), then the data
    /// communicators are finalized and destroyed. Any other way out aborts them instead (see
    /// [`Communicator::finish`]).
    pub fn leave_together(&self) -> Result<(), FsdpError> {
        self.control.barrier()?;
        for comm in [&self.replicate, &self.shard] {
            comm.finish()?;
        }
        Ok(())
    }
}
