//! The process groups a sharding strategy uses. Every strategy is a (shard group,
//! replicate group) pair: parameters are sharded over the first and replicated over the
//! second, gradients reduce-scattered in the first and all-reduced in the second.
//!
//! | strategy | shard group | replicate group |
//! | --- | --- | --- |
//! | FULL_SHARD, SHARD_GRAD_OP | world | itself alone |
//! | NO_SHARD | itself alone | world |
//! | HYBRID_SHARD | its node (`shard_group_size` ranks) | same position in every node |

use crate::collectives::Communicator;
use std::sync::Arc;

#[derive(Clone)]
pub struct ProcessGroups {
    pub world: Arc<dyn Communicator>,
    pub shard: Arc<dyn Communicator>,
    pub replicate: Arc<dyn Communicator>,
}
