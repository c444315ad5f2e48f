//! Collective communication on contiguous flat tensors, one interface, two backends:
//! NCCL on GPU (cudarc, loaded at run time) and a CPU backend over TCP sockets between
//! worker processes.
//!
//! Semantics (the same as `torch.distributed`'s):
//! * every rank of a communicator issues the same operations in the same order;
//! * operations are asynchronous: they return a [`Work`] that must be waited on before the
//!   output is read or the input is modified; operations complete in issue order;
//! * tensors are contiguous, on the backend's device, of one dtype (f32, bf16 or f16).

use tch::Tensor;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReduceOp {
    Sum,
    /// Sum divided by the communicator's size.
    Avg,
    Max,
}

#[derive(Debug, thiserror::Error)]
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

/// A pending collective. Dropping it without waiting is a bug in the caller.
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
        (self.0)()
    }
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
}
