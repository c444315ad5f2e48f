//! What every backend checks about the tensors it is handed: contiguous, one supported
//! dtype, sizes that fit the operation.

use super::CommError;
use tch::{Device, Kind, Tensor};

/// Element types the collectives move and reduce.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dtype {
    F32,
    /// Control values (losses, norms, flags, step numbers) on the CPU communicator.
    F64,
    BF16,
    F16,
}

impl Dtype {
    pub fn of(tensor: &Tensor, what: &str) -> Result<Dtype, CommError> {
        match tensor.kind() {
            Kind::Float => Ok(Dtype::F32),
            Kind::Double => Ok(Dtype::F64),
            Kind::BFloat16 => Ok(Dtype::BF16),
            Kind::Half => Ok(Dtype::F16),
            other => Err(CommError::Invalid(format!(
                "{what} has dtype {other:?}; collectives take f32, f64, bf16 or f16"
            ))),
        }
    }

    pub fn size(self) -> usize {
        match self {
            Dtype::F32 => 4,
            Dtype::F64 => 8,
            Dtype::BF16 | Dtype::F16 => 2,
        }
    }
}

/// A checked collective argument: contiguous, supported dtype, on `device`.
pub struct Checked {
    pub dtype: Dtype,
    pub numel: usize,
}

pub fn check(tensor: &Tensor, what: &str, device: Option<Device>) -> Result<Checked, CommError> {
    let dtype = Dtype::of(tensor, what)?;
    if !tensor.is_contiguous() {
        return Err(CommError::Invalid(format!("{what} is not contiguous")));
    }
    if let Some(device) = device {
        if tensor.device() != device {
            return Err(CommError::Invalid(format!(
                "{what} is on {:?}; this communicator works on {device:?}",
                tensor.device()
            )));
        }
    }
    Ok(Checked {
        dtype,
        numel: tensor.numel(),
    })
}

/// Checks the (input, output) pair of an all-gather (`gather` true: output = world × input)
/// or a reduce-scatter (input = world × output).
pub fn check_pair(
    input: &Tensor,
    output: &Tensor,
    world_size: usize,
    gather: bool,
    device: Option<Device>,
) -> Result<Dtype, CommError> {
    let i = check(input, "input", device)?;
    let o = check(output, "output", device)?;
    if i.dtype != o.dtype {
        return Err(CommError::Invalid(format!(
            "input is {:?} but output is {:?}; use one dtype",
            i.dtype, o.dtype
        )));
    }
    let (small, big, op) = if gather {
        (i.numel, o.numel, "all_gather")
    } else {
        (o.numel, i.numel, "reduce_scatter")
    };
    if small * world_size != big {
        return Err(CommError::Invalid(format!(
            "{op} on {world_size} ranks needs {} elements for {small} per rank, got {big}",
            small * world_size
        )));
    }
    Ok(i.dtype)
}
