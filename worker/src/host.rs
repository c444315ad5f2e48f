//! Device values read on the host, all through here.
//!
//! On a GPU, reading a device value waits for every kernel queued before it: a step that read
//! its loss per micro-step, a norm and a finiteness flag per unit and a few all-reduced
//! scalars stalled the GPU that many times. The training loop keeps those values on the
//! device and reads them together, once per optimizer step ([`read`]); the other transfers
//! (checkpoint exports, final weights) go through [`to_cpu`] and happen only at save points.
//!
//! Before a read, NCCL's collectives in flight are waited for with their deadlines
//! ([`crate::collectives::nccl::watch::wait_all`]), so a dead peer is an error here rather
//! than a read blocked forever. Reads are counted per thread, which is what the "one read per
//! step" test checks.

use crate::collectives::nccl::watch;
use crate::fsdp::FsdpError;
use std::cell::Cell;
use tch::{Device, Kind, Tensor};

thread_local! {
    static READS: Cell<u64> = const { Cell::new(0) };
}

/// How many times this thread has read device values with [`read`] or [`to_cpu`].
pub fn reads() -> u64 {
    READS.with(Cell::get)
}

/// Copies `tensor` to the CPU (after the collectives in flight, when on a GPU).
pub fn to_cpu(tensor: &Tensor) -> Result<Tensor, FsdpError> {
    READS.with(|r| r.set(r.get() + 1));
    if matches!(tensor.device(), Device::Cuda(_)) {
        watch::wait_all()?;
    }
    Ok(tensor.f_to_device(Device::Cpu)?)
}

/// The values of an f32 `tensor` (any shape), in one transfer.
pub fn f32_values(tensor: &Tensor) -> Result<Vec<f32>, FsdpError> {
    let cpu = to_cpu(&tensor.f_reshape([-1])?)?;
    Ok(Vec::<f32>::try_from(&cpu)?)
}

/// The values of `tensor` (any shape, any float dtype) as f64, in one transfer.
pub fn read(tensor: &Tensor) -> Result<Vec<f64>, FsdpError> {
    let wide = tensor.f_to_kind(Kind::Double)?.f_reshape([-1])?;
    let cpu = to_cpu(&wide)?;
    Ok(Vec::<f64>::try_from(&cpu)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_convert_and_count() {
        let before = reads();
        let values = read(&Tensor::from_slice(&[1.5f32, -2.0]).view([2, 1])).unwrap();
        assert_eq!(values, vec![1.5, -2.0]);
        assert_eq!(reads(), before + 1);
    }

    /// The step's code reads device values only through this module: a stray read
    /// (`double_value`, a copy to the CPU) in these files fails here.
    #[test]
    fn training_code_reads_the_device_only_through_this_module() {
        let sources = [
            ("train.rs", include_str!("train.rs")),
            ("fsdp/engine.rs", include_str!("fsdp/engine.rs")),
            ("fsdp/unit.rs", include_str!("fsdp/unit.rs")),
            ("optim.rs", include_str!("optim.rs")),
        ];
        let reads = [
            "double_value(",
            "int64_value(",
            "f_double_value(",
            "f_int64_value(",
            "to_device(Device::Cpu)",
            "Vec::<f32>::try_from",
            "Vec::<f64>::try_from",
            "Vec::<i64>::try_from",
            ".item(",
        ];
        for (file, text) in sources {
            let code = text.split("#[cfg(test)]").next().unwrap_or(text);
            for pattern in reads {
                assert!(
                    !code.contains(pattern),
                    "{file} reads a device value on the host with `{pattern}`: keep it on the \
                     device, or read it with host::read together with the step's other values"
                );
            }
        }
    }
}
