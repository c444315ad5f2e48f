//! Who may use the data communicator: the FSDP engine, and nothing else.
//!
//! Every job has two communicators, as PyTorch jobs have a gloo group beside NCCL: the
//! *control* one, always the CPU socket ring, for control values (which checkpoint to load,
//! preemption and step agreement, overflow flags, metrics, checkpoint gathers of CPU
//! tensors), and the *data* one (NCCL on GPUs) for the engine's parameter and gradient
//! tensors. A CPU tensor handed to NCCL fails at run time, but only on a GPU; on CPU runs both
//! are socket rings and the mistake would go unnoticed. So the rule is checked on every
//! backend: the engine marks its own calls with an [`EngineScope`], and [`DataPlane`], the
//! wrapper every data communicator is built in, refuses calls made outside one.

use super::{CommError, Communicator, ReduceOp, Work};
use std::cell::Cell;
use tch::Tensor;

thread_local! {
    static ENGINE_DEPTH: Cell<u32> = const { Cell::new(0) };
}

/// While alive, the current thread is the engine moving its tensors. Not `Send`: it marks
/// the thread that made it.
pub struct EngineScope {
    _not_send: std::marker::PhantomData<*const ()>,
}

impl EngineScope {
    pub(crate) fn enter() -> EngineScope {
        ENGINE_DEPTH.with(|d| d.set(d.get() + 1));
        EngineScope {
            _not_send: std::marker::PhantomData,
        }
    }
}

impl Drop for EngineScope {
    fn drop(&mut self) {
        ENGINE_DEPTH.with(|d| d.set(d.get().saturating_sub(1)));
    }
}

fn in_engine() -> bool {
    ENGINE_DEPTH.with(|d| d.get() > 0)
}

/// A data communicator: the engine's tensors only.
pub struct DataPlane {
    inner: Box<dyn Communicator>,
}

impl DataPlane {
    pub fn new(inner: Box<dyn Communicator>) -> DataPlane {
        DataPlane { inner }
    }

    fn guard(&self, op: &str) -> Result<(), CommError> {
        if in_engine() {
            return Ok(());
        }
        Err(CommError::Invalid(format!(
            "{op} on the data communicator from outside the FSDP engine: the data \
             communicator (NCCL on GPUs) carries only the engine's parameters and gradients; \
             control values and CPU tensors go over ProcessGroups::control (the CPU \
             communicator)"
        )))
    }
}

impl Communicator for DataPlane {
    fn rank(&self) -> usize {
        self.inner.rank()
    }

    fn world_size(&self) -> usize {
        self.inner.world_size()
    }

    fn all_gather(&self, input: &Tensor, output: &Tensor) -> Result<Work, CommError> {
        self.guard("all_gather")?;
        self.inner.all_gather(input, output)
    }

    fn reduce_scatter(
        &self,
        input: &Tensor,
        output: &Tensor,
        op: ReduceOp,
    ) -> Result<Work, CommError> {
        self.guard("reduce_scatter")?;
        self.inner.reduce_scatter(input, output, op)
    }

    fn all_reduce(&self, tensor: &Tensor, op: ReduceOp) -> Result<Work, CommError> {
        self.guard("all_reduce")?;
        self.inner.all_reduce(tensor, op)
    }

    fn broadcast(&self, tensor: &Tensor, root: usize) -> Result<Work, CommError> {
        self.guard("broadcast")?;
        self.inner.broadcast(tensor, root)
    }

    fn barrier(&self) -> Result<(), CommError> {
        self.guard("barrier")?;
        self.inner.barrier()
    }

    /// Building the engine's groups happens outside the engine; they are data planes too.
    fn new_subgroup(&self, ranks: &[usize]) -> Result<Box<dyn Communicator>, CommError> {
        Ok(Box::new(DataPlane::new(self.inner.new_subgroup(ranks)?)))
    }

    fn finish(&self) -> Result<(), CommError> {
        self.inner.finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::collectives::SingleProcess;

    #[test]
    fn only_calls_inside_an_engine_scope_reach_the_communicator() {
        let data = DataPlane::new(Box::new(SingleProcess));
        let t = Tensor::from_slice(&[1.0f32, 2.0]);
        let err = data.broadcast(&t, 0).err().expect("outside the engine");
        assert!(err.to_string().contains("ProcessGroups::control"), "{err}");
        {
            let _engine = EngineScope::enter();
            data.broadcast(&t, 0).unwrap().wait().unwrap();
            let sub = data.new_subgroup(&[0]).unwrap();
            sub.all_reduce(&t, ReduceOp::Sum).unwrap().wait().unwrap();
        }
        assert!(data.all_reduce(&t, ReduceOp::Sum).is_err());
    }
}
