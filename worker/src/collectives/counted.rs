//! Counting the collective calls a rank enters, for the controller (see
//! [`crate::progress`]): every communicator a job builds is wrapped in [`Counted`], and so
//! are the groups split from it.

use super::{CommError, Communicator, ReduceOp, Work};
use crate::progress::entered_collective;
use tch::Tensor;

pub struct Counted {
    inner: Box<dyn Communicator>,
}

impl Counted {
    pub fn wrap(inner: Box<dyn Communicator>) -> Box<dyn Communicator> {
        Box::new(Counted { inner })
    }
}

impl Communicator for Counted {
    fn rank(&self) -> usize {
        self.inner.rank()
    }

    fn world_size(&self) -> usize {
        self.inner.world_size()
    }

    fn all_gather(&self, input: &Tensor, output: &Tensor) -> Result<Work, CommError> {
        entered_collective();
        self.inner.all_gather(input, output)
    }

    fn reduce_scatter(
        &self,
        input: &Tensor,
        output: &Tensor,
        op: ReduceOp,
    ) -> Result<Work, CommError> {
        entered_collective();
        self.inner.reduce_scatter(input, output, op)
    }

    fn all_reduce(&self, tensor: &Tensor, op: ReduceOp) -> Result<Work, CommError> {
        entered_collective();
        self.inner.all_reduce(tensor, op)
    }

    fn broadcast(&self, tensor: &Tensor, root: usize) -> Result<Work, CommError> {
        entered_collective();
        self.inner.broadcast(tensor, root)
    }

    fn barrier(&self) -> Result<(), CommError> {
        entered_collective();
        self.inner.barrier()
    }

    fn new_subgroup(&self, ranks: &[usize]) -> Result<Box<dyn Communicator>, CommError> {
        entered_collective();
        Ok(Counted::wrap(self.inner.new_subgroup(ranks)?))
    }

    fn finish(&self) -> Result<(), CommError> {
        self.inner.finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::collectives::SingleProcess;
    use crate::progress::collectives;

    #[test]
    fn every_call_is_counted_on_split_groups_too() {
        let comm = Counted::wrap(Box::new(SingleProcess));
        let t = Tensor::from_slice(&[1.0f32, 2.0]);
        let out = Tensor::zeros([2], (tch::Kind::Float, tch::Device::Cpu));
        // Other tests of this process count too: only increases are compared.
        let before = collectives();
        comm.all_reduce(&t, ReduceOp::Sum).unwrap().wait().unwrap();
        comm.broadcast(&t, 0).unwrap().wait().unwrap();
        comm.all_gather(&t, &out).unwrap().wait().unwrap();
        comm.reduce_scatter(&out, &t, ReduceOp::Sum)
            .unwrap()
            .wait()
            .unwrap();
        comm.barrier().unwrap();
        let group = comm.new_subgroup(&[0]).unwrap();
        group.all_reduce(&t, ReduceOp::Avg).unwrap().wait().unwrap();
        assert!(
            collectives() >= before + 7,
            "{} -> {}",
            before,
            collectives()
        );
    }
}
