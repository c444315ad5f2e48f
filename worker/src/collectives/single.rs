//! World size 1: every collective is a copy or nothing.

use super::dtype::{check, check_pair};
use super::{subgroup_members, CommError, Communicator, ReduceOp, Work};
use tch::Tensor;

#[derive(Debug, Default, Clone, Copy)]
pub struct SingleProcess;

impl SingleProcess {
    fn copy(input: &Tensor, output: &Tensor) -> Result<(), CommError> {
        if input.data_ptr() != output.data_ptr() {
            output
                .shallow_clone()
                .f_copy_(input)
                .map_err(|e| CommError::Other(format!("copy failed: {e}")))?;
        }
        Ok(())
    }
}

impl Communicator for SingleProcess {
    fn rank(&self) -> usize {
        0
    }

    fn world_size(&self) -> usize {
        1
    }

    fn all_gather(&self, input: &Tensor, output: &Tensor) -> Result<Work, CommError> {
        check_pair(input, output, 1, true, None)?;
        Self::copy(input, output)?;
        Ok(Work::done())
    }

    fn reduce_scatter(
        &self,
        input: &Tensor,
        output: &Tensor,
        _op: ReduceOp,
    ) -> Result<Work, CommError> {
        // Sum, average and max of one contribution are all the contribution itself.
        check_pair(input, output, 1, false, None)?;
        Self::copy(input, output)?;
        Ok(Work::done())
    }

    fn all_reduce(&self, tensor: &Tensor, _op: ReduceOp) -> Result<Work, CommError> {
        check(tensor, "tensor", None)?;
        Ok(Work::done())
    }

    fn broadcast(&self, tensor: &Tensor, root: usize) -> Result<Work, CommError> {
        check(tensor, "tensor", None)?;
        if root != 0 {
            return Err(CommError::Invalid(format!(
                "broadcast root {root} in a world of 1"
            )));
        }
        Ok(Work::done())
    }

    fn barrier(&self) -> Result<(), CommError> {
        Ok(())
    }

    fn new_subgroup(&self, ranks: &[usize]) -> Result<Box<dyn Communicator>, CommError> {
        subgroup_members(0, 1, ranks)?;
        Ok(Box::new(SingleProcess))
    }

    fn finish(&self) -> Result<(), CommError> {
        Ok(())
    }
}
