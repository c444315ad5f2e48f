//! NCCL backend through cudarc, with libnccl loaded at run time so the same binary builds and
//! runs on machines without CUDA.
//!
//! Collectives are enqueued on the legacy default (null) CUDA stream, where libtorch runs its
//! kernels too: they are ordered with the compute before and after them without events, so
//! [`Work::wait`] only has to check NCCL for asynchronous errors.

use super::dtype::{check, check_pair, Dtype};
use super::{subgroup_members, CommError, Communicator, ReduceOp, Work};
use cudarc::nccl::{result, sys};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use tch::{Device, Tensor};

/// Bytes in an NCCL unique id.
const UNIQUE_ID_BYTES: usize = 128;

/// An NCCL communicator handle.
struct Handle(sys::ncclComm_t);

// SAFETY: an NCCL communicator is not tied to the thread that created it (only to its
// device); NCCL forbids *concurrent* calls on one communicator, which the Mutex around every
// Handle rules out. Nothing else aliases the pointer.
unsafe impl Send for Handle {}

impl Drop for Handle {
    fn drop(&mut self) {
        // SAFETY: the handle came from a successful init/split and is destroyed once.
        let _ = unsafe { result::comm_destroy(self.0) };
    }
}

pub struct NcclCommunicator {
    handle: Arc<Mutex<Handle>>,
    rank: usize,
    size: usize,
}

/// Where pip's NCCL lives next to the libtorch this process loaded:
/// `<site-packages>/torch/lib/libtorch_cpu.so` -> `<site-packages>/nvidia/nccl/lib/libnccl.so.2`.
pub fn find_pip_nccl() -> Option<PathBuf> {
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    let torch_lib = maps
        .lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .find(|p| p.ends_with("/libtorch_cpu.so"))
        .and_then(|p| Path::new(p).parent().map(Path::to_path_buf))?;
    let candidate = torch_lib.join("../../nvidia/nccl/lib/libnccl.so.2");
    candidate
        .exists()
        .then(|| candidate.canonicalize().unwrap_or(candidate))
}

/// What to do when libnccl cannot be loaded.
pub fn library_hint() -> String {
    let fix = |lib: &str| {
        format!(
            "mkdir -p ~/.cache/shardrun/nccl && ln -sf {lib} ~/.cache/shardrun/nccl/libnccl.so && \
             export LD_LIBRARY_PATH=~/.cache/shardrun/nccl:$LD_LIBRARY_PATH"
        )
    };
    match find_pip_nccl() {
        Some(lib) => format!(
            "NCCL is loaded by the bare name libnccl.so, but pip installs it as {}; link it \
             under that name into a folder on the loader path: {}",
            lib.display(),
            fix(&lib.display().to_string())
        ),
        None => format!(
            "no libnccl.so on the loader path and no pip NCCL next to libtorch (install \
             nvidia-nccl-cu13 into torch's venv); with NCCL at <dir>/libnccl.so.2: {}",
            fix("<dir>/libnccl.so.2")
        ),
    }
}

/// Fails with instructions instead of cudarc's panic when libnccl is missing.
pub fn ensure_loadable() -> Result<(), CommError> {
    // SAFETY: only tries to dlopen the library by its candidate names.
    if unsafe { sys::is_culib_present() } {
        Ok(())
    } else {
        Err(CommError::Nccl(library_hint()))
    }
}

fn nccl_error(what: &str, e: result::NcclError) -> CommError {
    // SAFETY: ncclGetErrorString returns a static NUL-terminated string for any result.
    let text = unsafe { std::ffi::CStr::from_ptr(sys::ncclGetErrorString(e.0)) };
    CommError::Nccl(format!("{what}: {:?} ({})", e.0, text.to_string_lossy()))
}

/// Rank 0's unique id, to be sent to every rank through the rendezvous.
pub fn new_unique_id() -> Result<Vec<u8>, CommError> {
    ensure_loadable()?;
    let id = result::get_uniqueid().map_err(|e| nccl_error("ncclGetUniqueId", e))?;
    Ok(id.internal.iter().map(|&c| c as u8).collect())
}

fn nccl_dtype(dtype: Dtype) -> sys::ncclDataType_t {
    match dtype {
        Dtype::F32 => sys::ncclDataType_t::ncclFloat32,
        Dtype::BF16 => sys::ncclDataType_t::ncclBfloat16,
        Dtype::F16 => sys::ncclDataType_t::ncclFloat16,
    }
}

fn nccl_op(op: ReduceOp) -> sys::ncclRedOp_t {
    match op {
        ReduceOp::Sum => sys::ncclRedOp_t::ncclSum,
        ReduceOp::Avg => sys::ncclRedOp_t::ncclAvg,
        ReduceOp::Max => sys::ncclRedOp_t::ncclMax,
    }
}

/// The legacy default stream, libtorch's (tch exposes no other).
fn stream() -> sys::cudaStream_t {
    std::ptr::null_mut()
}

fn cuda_device(t: &Tensor) -> Result<Device, CommError> {
    match t.device() {
        d @ Device::Cuda(_) => Ok(d),
        d => Err(CommError::Invalid(format!(
            "NCCL collectives take CUDA tensors, got one on {d:?}"
        ))),
    }
}

impl NcclCommunicator {
    /// Joins the communicator of `world_size` ranks named by rank 0's `unique_id`
    /// (collective: blocks until every rank has called it). Uses the current CUDA device.
    pub fn new(
        unique_id: &[u8],
        rank: usize,
        world_size: usize,
    ) -> Result<NcclCommunicator, CommError> {
        ensure_loadable()?;
        if unique_id.len() != UNIQUE_ID_BYTES {
            return Err(CommError::Invalid(format!(
                "an NCCL unique id has {UNIQUE_ID_BYTES} bytes, got {}",
                unique_id.len()
            )));
        }
        let mut id = sys::ncclUniqueId {
            internal: [0; UNIQUE_ID_BYTES],
        };
        for (dst, &src) in id.internal.iter_mut().zip(unique_id) {
            *dst = src as std::ffi::c_char;
        }
        let mut comm = std::ptr::null_mut();
        // SAFETY: `comm` is a valid out-pointer; rank < world_size is checked by the caller
        // (bootstrap) and by NCCL.
        unsafe { result::comm_init_rank(&mut comm, world_size as i32, id, rank as i32) }
            .map_err(|e| nccl_error("ncclCommInitRank", e))?;
        Ok(NcclCommunicator {
            handle: Arc::new(Mutex::new(Handle(comm))),
            rank,
            size: world_size,
        })
    }

    /// Runs `call` with the communicator; the returned work checks asynchronous errors and
    /// keeps the tensors alive until waited on.
    fn enqueue(
        &self,
        what: &'static str,
        keep: Vec<Tensor>,
        call: impl FnOnce(sys::ncclComm_t) -> Result<result::NcclStatus, result::NcclError>,
    ) -> Result<Work, CommError> {
        let guard = self
            .handle
            .lock()
            .map_err(|_| CommError::Nccl("communicator poisoned".into()))?;
        call(guard.0).map_err(|e| nccl_error(what, e))?;
        drop(guard);
        let handle = Arc::clone(&self.handle);
        Ok(Work::new(move || {
            let _keep = keep;
            let guard = handle
                .lock()
                .map_err(|_| CommError::Nccl("communicator poisoned".into()))?;
            let mut state = sys::ncclResult_t::ncclSuccess;
            // SAFETY: a live communicator and a valid out-pointer.
            unsafe { sys::ncclCommGetAsyncError(guard.0, &mut state) }
                .result()
                .map_err(|e| nccl_error("ncclCommGetAsyncError", e))?;
            state.result().map(|_| ()).map_err(|e| nccl_error(what, e))
        }))
    }
}

impl Communicator for NcclCommunicator {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.size
    }

    fn all_gather(&self, input: &Tensor, output: &Tensor) -> Result<Work, CommError> {
        let device = cuda_device(input)?;
        let dtype = check_pair(input, output, self.size, true, Some(device))?;
        let (src, dst, count) = (input.data_ptr(), output.data_ptr(), input.numel());
        self.enqueue(
            "ncclAllGather",
            vec![input.shallow_clone(), output.shallow_clone()],
            |comm| {
                // SAFETY: contiguous device buffers of `count` and `size * count` elements of
                // `dtype` (checked), kept alive by the work; stream-ordered with libtorch.
                unsafe { result::all_gather(src, dst, count, nccl_dtype(dtype), comm, stream()) }
            },
        )
    }

    fn reduce_scatter(
        &self,
        input: &Tensor,
        output: &Tensor,
        op: ReduceOp,
    ) -> Result<Work, CommError> {
        let device = cuda_device(input)?;
        let dtype = check_pair(input, output, self.size, false, Some(device))?;
        let (src, dst, count) = (input.data_ptr(), output.data_ptr(), output.numel());
        self.enqueue(
            "ncclReduceScatter",
            vec![input.shallow_clone(), output.shallow_clone()],
            |comm| {
                // SAFETY: as in all_gather, with `count` output elements.
                unsafe {
                    result::reduce_scatter(
                        src,
                        dst,
                        count,
                        nccl_dtype(dtype),
                        nccl_op(op),
                        comm,
                        stream(),
                    )
                }
            },
        )
    }

    fn all_reduce(&self, tensor: &Tensor, op: ReduceOp) -> Result<Work, CommError> {
        let device = cuda_device(tensor)?;
        let dtype = check(tensor, "tensor", Some(device))?.dtype;
        let (ptr, count) = (tensor.data_ptr(), tensor.numel());
        self.enqueue("ncclAllReduce", vec![tensor.shallow_clone()], |comm| {
            // SAFETY: in place on a contiguous device buffer of `count` elements.
            unsafe {
                result::all_reduce(
                    ptr,
                    ptr,
                    count,
                    nccl_dtype(dtype),
                    nccl_op(op),
                    comm,
                    stream(),
                )
            }
        })
    }

    fn broadcast(&self, tensor: &Tensor, root: usize) -> Result<Work, CommError> {
        let device = cuda_device(tensor)?;
        let dtype = check(tensor, "tensor", Some(device))?.dtype;
        if root >= self.size {
            return Err(CommError::Invalid(format!(
                "broadcast root {root} in a world of {}",
                self.size
            )));
        }
        let (ptr, count) = (tensor.data_ptr(), tensor.numel());
        self.enqueue("ncclBroadcast", vec![tensor.shallow_clone()], |comm| {
            // SAFETY: in place on a contiguous device buffer of `count` elements.
            unsafe {
                result::broadcast(
                    ptr,
                    ptr,
                    count,
                    nccl_dtype(dtype),
                    root as i32,
                    comm,
                    stream(),
                )
            }
        })
    }

    fn barrier(&self) -> Result<(), CommError> {
        // NCCL has no barrier: a one-element all-reduce every rank must reach, then wait for
        // it on the host.
        let t = Tensor::zeros([1], (tch::Kind::Float, Device::Cuda(0)));
        self.all_reduce(&t, ReduceOp::Sum)?.wait()?;
        tch::Cuda::synchronize(0);
        Ok(())
    }

    fn new_subgroup(&self, ranks: &[usize]) -> Result<Box<dyn Communicator>, CommError> {
        let (members, my_index) = subgroup_members(self.rank, self.size, ranks)?;
        let guard = self
            .handle
            .lock()
            .map_err(|_| CommError::Nccl("communicator poisoned".into()))?;
        let mut comm = std::ptr::null_mut();
        // Groups partition the ranks, so the smallest member names a group; the parent rank
        // orders members as the sorted list does.
        // SAFETY: a live parent communicator, a valid out-pointer, default config (null).
        unsafe {
            sys::ncclCommSplit(
                guard.0,
                members[0] as i32,
                self.rank as i32,
                &mut comm,
                std::ptr::null_mut(),
            )
        }
        .result()
        .map_err(|e| nccl_error("ncclCommSplit", e))?;
        let handle = Handle(comm);
        // SAFETY: a live communicator.
        let count =
            unsafe { result::comm_count(handle.0) }.map_err(|e| nccl_error("ncclCommCount", e))?;
        if count as usize != members.len() {
            return Err(CommError::Invalid(format!(
                "subgroup {ranks:?}: NCCL formed a group of {count}; every member must pass the same ranks"
            )));
        }
        Ok(Box::new(NcclCommunicator {
            handle: Arc::new(Mutex::new(handle)),
            rank: my_index,
            size: members.len(),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn library_loading_and_ids_fail_with_a_fix_not_a_panic() {
        // Machines with a loadable libnccl.so (GPU hosts) have nothing to check here.
        if ensure_loadable().is_ok() {
            // Where libnccl loads, rank 0 can make an id (no GPU needed for that); without a
            // GPU, joining is an error, not a crash.
            let id = new_unique_id().unwrap();
            assert_eq!(id.len(), UNIQUE_ID_BYTES);
            if !tch::Cuda::is_available() {
                let err = NcclCommunicator::new(&id, 0, 1).err().unwrap();
                eprintln!("{err}");
            }
        } else if let Err(e) = ensure_loadable() {
            let text = e.to_string();
            assert!(
                text.contains("libnccl.so") && text.contains("LD_LIBRARY_PATH"),
                "{text}"
            );
            assert!(new_unique_id().is_err());
            if let Some(pip) = find_pip_nccl() {
                assert!(text.contains(&pip.display().to_string()), "{text}");
            }
            eprintln!("{text}");
        }
    }
}
