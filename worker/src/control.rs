//! Control values agreed across ranks over the control communicator (the CPU ring, see
//! [`crate::fsdp::ProcessGroups::control`]): host numbers in, host numbers out, in f64 so
//! step numbers and sums are exact. Never the data communicator: that one carries the
//! engine's tensors only.

use crate::collectives::{CommError, Communicator, ReduceOp};
use tch::Tensor;

fn reduce(comm: &dyn Communicator, values: &[f64], op: ReduceOp) -> Result<Vec<f64>, CommError> {
    if comm.world_size() == 1 {
        return Ok(values.to_vec());
    }
    let t = Tensor::from_slice(values);
    comm.all_reduce(&t, op)?.wait()?;
    Vec::<f64>::try_from(&t).map_err(|e| CommError::Other(e.to_string()))
}

/// Element-wise sums over every rank of `comm`.
pub fn sum(comm: &dyn Communicator, values: &[f64]) -> Result<Vec<f64>, CommError> {
    reduce(comm, values, ReduceOp::Sum)
}

/// Element-wise maxima over every rank of `comm`.
pub fn max(comm: &dyn Communicator, values: &[f64]) -> Result<Vec<f64>, CommError> {
    reduce(comm, values, ReduceOp::Max)
}

/// `root`'s values, on every rank of `comm` (the others pass as many placeholders).
pub fn broadcast(
    comm: &dyn Communicator,
    values: &[f64],
    root: usize,
) -> Result<Vec<f64>, CommError> {
    if comm.world_size() == 1 {
        return Ok(values.to_vec());
    }
    let t = Tensor::from_slice(values);
    comm.broadcast(&t, root)?.wait()?;
    Vec::<f64>::try_from(&t).map_err(|e| CommError::Other(e.to_string()))
}
