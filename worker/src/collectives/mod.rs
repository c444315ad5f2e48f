//! Collective communication on contiguous flat tensors, one interface, two backends:
//! NCCL on GPU (cudarc, loaded at run time) and a CPU backend over TCP sockets between
//! worker processes.
//!
//! Semantics (the same as `torch.distributed`'s):
//! * every rank of a communicator issues the same operations in the same order;
//! * operations are asynchronous: they return a [`Work`] that must be waited on before the
//!   output is used or the input is modified; operations complete in issue order;
//! * tensors are contiguous, on the backend's device, of one dtype (f32, f64, bf16 or f16);
//!   all-gather and reduce-scatter may run in place (the small tensor being this rank's
//!   segment of the big one), as NCCL allows.
//!
//! Every job has two communicators ([`Comms`]): the *control* one, always the CPU ring, for
//! control values, and the *data* one (NCCL on GPUs) for the FSDP engine's tensors only, which
//! [`DataPlane`] enforces.
//!
//! Building them: [`prepare`] before the rendezvous (its `collective_addr` / `nccl_unique_id`
//! go into the registration), [`PendingComms::connect`] with the [`StartInfo`] after it. World
//! size 1 is [`SingleProcess`] on every device (no NCCL communicator); HYBRID_SHARD's groups
//! come from [`Communicator::new_subgroup`] with the ranks [`hybrid_groups`] names.
//!
//! * [`cpu`]: ring algorithms over TCP between processes, one thread per communicator;
//! * [`nccl`]: NCCL through cudarc on its own stream, with deadlines and abort;
//! * `single`, `bootstrap`, `dtype`, `data_plane`, `counted`: world size 1, construction,
//!   argument checks, the engine-only rule, the count of calls entered the controller sees.
//!
//! [`StartInfo`]: shardrun_protocol::messages::StartInfo

mod bootstrap;
mod counted;
pub mod cpu;
mod data_plane;
mod dtype;
pub mod nccl;
mod single;

pub use bootstrap::{prepare, CommOptions, Comms, PendingComms};
pub use data_plane::DataPlane;
pub(crate) use data_plane::EngineScope;
pub use single::SingleProcess;

use tch::Tensor;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReduceOp {
    Sum,
    /// Sum divided by the communicator's size.
    Avg,
    Max,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CommError {
    #[error("peer rank {rank} ({addr}) {what}")]
    Peer {
        rank: usize,
        addr: String,
        what: String,
    },
    #[error("collective timed out after {secs} s waiting for rank {rank}")]
    Timeout { rank: usize, secs: u64 },
    #[error("invalid collective call: {0}")]
    Invalid(String),
    #[error("NCCL: {0}")]
    Nccl(String),
    #[error("{0}")]
    Other(String),
}

impl CommError {
    /// The other rank this error comes from: the peer that closed the connection or aborted
    /// the collective, or the one waited for until the timeout.
    pub fn peer_at_fault(&self) -> Option<usize> {
        match *self {
            CommError::Peer { rank, .. } | CommError::Timeout { rank, .. } => Some(rank),
            _ => None,
        }
    }
}

/// A pending collective. Dropping it without waiting is a bug in the caller. On the CPU
/// backend `wait` returns when the operation is done; on NCCL it orders the work libtorch
/// queues afterwards after the collective, without blocking the host (host reads of device
/// values wait for collectives first: [`nccl::watch::wait_all`]).
#[must_use = "wait on collective work before using its output"]
pub struct Work(Box<dyn FnOnce() -> Result<(), CommError> + Send>);

impl Work {
    pub fn new(wait: impl FnOnce() -> Result<(), CommError> + Send + 'static) -> Self {
        Work(Box::new(wait))
    }

    /// Work that already finished (e.g. world size 1).
    pub fn done() -> Self {
        Work(Box::new(|| Ok(())))
    }

    pub fn wait(self) -> Result<(), CommError> {
        let started = std::time::Instant::now();
        let done = (self.0)();
        let waited = u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX);
        WAITED_NANOS.fetch_add(waited, std::sync::atomic::Ordering::Relaxed);
        done
    }
}

/// Nanoseconds this process has spent in [`Work::wait`].
static WAITED_NANOS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Time this process has spent waiting for collectives to finish, all told. On the CPU
/// backend that is the training thread blocked, mostly on the slower ranks: the ranks leave
/// each step together, and a rank's step time less this wait is its own work. (On NCCL a
/// wait blocks no host thread, so this says nothing there.)
pub fn waited() -> std::time::Duration {
    std::time::Duration::from_nanos(WAITED_NANOS.load(std::sync::atomic::Ordering::Relaxed))
}

pub trait Communicator: Send + Sync {
    fn rank(&self) -> usize;
    fn world_size(&self) -> usize;
    /// `output` (world_size × input.numel() elements) receives every rank's `input`, in rank
    /// order.
    fn all_gather(&self, input: &Tensor, output: &Tensor) -> Result<Work, CommError>;
    /// `input` has world_size × output.numel() elements; `output` receives this rank's chunk
    /// of the element-wise reduction of all ranks' inputs.
    fn reduce_scatter(
        &self,
        input: &Tensor,
        output: &Tensor,
        op: ReduceOp,
    ) -> Result<Work, CommError>;
    /// In place.
    fn all_reduce(&self, tensor: &Tensor, op: ReduceOp) -> Result<Work, CommError>;
    /// In place: every rank's `tensor` becomes `root`'s.
    fn broadcast(&self, tensor: &Tensor, root: usize) -> Result<Work, CommError>;
    fn barrier(&self) -> Result<(), CommError>;
    /// A communicator over a subset of this one's ranks (HYBRID_SHARD: the shard group within
    /// a node, the replicate group across nodes). Collective on `self`: every rank of `self`
    /// calls it at the same point, each passing the parent ranks of its own group (which
    /// contains the caller); the groups must partition the parent's ranks. The new
    /// communicator's rank of a member is its index in `ranks` sorted ascending.
    fn new_subgroup(&self, ranks: &[usize]) -> Result<Box<dyn Communicator>, CommError>;
    /// The clean end, once every rank has finished its collectives (after a barrier on the
    /// control communicator). NCCL finalizes and destroys here and only here; dropped any
    /// other way, a communicator is aborted, which never waits for peers. No default: a
    /// wrapper that forgot to pass it on would leave NCCL aborted at every clean end.
    fn finish(&self) -> Result<(), CommError>;
}

/// The two groups of `rank` for HYBRID_SHARD with `shard_size` ranks per shard group:
/// (shard group: `shard_size` consecutive ranks, replicate group: the ranks holding the same
/// shard in every shard group). E.g. world 4, shard 2: rank 1 -> ([0, 1], [1, 3]).
pub fn hybrid_groups(
    rank: usize,
    world_size: usize,
    shard_size: usize,
) -> Result<(Vec<usize>, Vec<usize>), CommError> {
    if shard_size == 0 || !world_size.is_multiple_of(shard_size) || rank >= world_size {
        return Err(CommError::Invalid(format!(
            "HYBRID_SHARD needs the shard group size ({shard_size}) to divide the world size \
             ({world_size}) and rank {rank} < world size"
        )));
    }
    let first = rank / shard_size * shard_size;
    let shard = (first..first + shard_size).collect();
    let replicate = (rank % shard_size..world_size)
        .step_by(shard_size)
        .collect();
    Ok((shard, replicate))
}

/// Checks a subgroup request common to all backends; returns the sorted member list and the
/// caller's rank in it.
pub(crate) fn subgroup_members(
    parent_rank: usize,
    parent_size: usize,
    ranks: &[usize],
) -> Result<(Vec<usize>, usize), CommError> {
    let mut members = ranks.to_vec();
    members.sort_unstable();
    members.dedup();
    if members.len() != ranks.len() {
        return Err(CommError::Invalid(format!(
            "subgroup {ranks:?} names a rank twice"
        )));
    }
    if let Some(bad) = members.iter().find(|&&r| r >= parent_size) {
        return Err(CommError::Invalid(format!(
            "subgroup {ranks:?} names rank {bad}, outside a communicator of {parent_size}"
        )));
    }
    let Some(my_index) = members.iter().position(|&r| r == parent_rank) else {
        return Err(CommError::Invalid(format!(
            "rank {parent_rank} asked for subgroup {ranks:?}, which does not contain it: each \
             rank passes its own group"
        )));
    };
    Ok((members, my_index))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hybrid_groups_of_four_in_two() {
        assert_eq!(hybrid_groups(0, 4, 2).unwrap(), (vec![0, 1], vec![0, 2]));
        assert_eq!(hybrid_groups(1, 4, 2).unwrap(), (vec![0, 1], vec![1, 3]));
        assert_eq!(hybrid_groups(3, 4, 2).unwrap(), (vec![2, 3], vec![1, 3]));
        assert!(hybrid_groups(0, 4, 3).is_err());
    }

    #[test]
    fn subgroup_members_checks_the_request() {
        assert_eq!(subgroup_members(2, 4, &[3, 2]).unwrap(), (vec![2, 3], 0));
        assert!(subgroup_members(1, 4, &[2, 3]).is_err());
        assert!(subgroup_members(1, 4, &[1, 1]).is_err());
        assert!(subgroup_members(1, 4, &[1, 4]).is_err());
    }
}
