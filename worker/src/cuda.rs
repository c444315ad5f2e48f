//! The CUDA runtime calls tch does not expose: the current device, streams and events (NCCL
//! runs on its own stream, ordered with libtorch's work by events), device names and memory.
//!
//! Through cudarc's runtime bindings, loaded at run time so CPU machines need no CUDA. The
//! build's link folder, on the binaries' rpath ahead of `LD_LIBRARY_PATH` (`worker/build.rs`),
//! makes cudarc's `dlopen("libcudart.so")` open the runtime file libtorch already loaded, so
//! the device set here is libtorch's current device, and the legacy default stream here is
//! the one libtorch enqueues its kernels on.

use cudarc::runtime::sys;
use std::ffi::{c_char, c_void, CStr};
use std::path::PathBuf;
use std::sync::OnceLock;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("CUDA: {0}")]
pub struct CudaError(pub String);

/// Whether the CUDA runtime library can be loaded (cudarc panics on first use otherwise).
pub fn runtime_present() -> bool {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    // SAFETY: only tries to dlopen the library by its candidate names.
    *PRESENT.get_or_init(|| unsafe { sys::is_culib_present() })
}

/// The file a loaded symbol comes from (`dladdr`).
pub fn file_of_symbol(address: usize) -> Option<PathBuf> {
    let mut info = libc::Dl_info {
        dli_fname: std::ptr::null(),
        dli_fbase: std::ptr::null_mut(),
        dli_sname: std::ptr::null(),
        dli_saddr: std::ptr::null_mut(),
    };
    // SAFETY: dladdr only reads the loader's tables and fills `info`.
    if unsafe { libc::dladdr(address as *const c_void, &mut info) } == 0 || info.dli_fname.is_null()
    {
        return None;
    }
    // SAFETY: dli_fname is a NUL-terminated path owned by the loader.
    let name = unsafe { CStr::from_ptr(info.dli_fname as *const c_char) };
    let path = PathBuf::from(name.to_string_lossy().into_owned());
    Some(path.canonicalize().unwrap_or(path))
}

/// The CUDA runtime library these calls go to (libtorch's own, normally).
pub fn runtime_file() -> Option<PathBuf> {
    if !runtime_present() {
        return None;
    }
    // SAFETY: the library is present; cudarc keeps it open for the process.
    let library = unsafe { sys::culib() };
    // SAFETY: only the symbol's address is taken, never called through this type.
    let symbol = unsafe { library.get::<unsafe extern "C" fn()>(b"cudaGetDevice\0") }.ok()?;
    file_of_symbol(*symbol as usize)
}

fn runtime() -> Result<(), CudaError> {
    if runtime_present() {
        Ok(())
    } else {
        Err(CudaError(
            "the CUDA runtime (libcudart) cannot be loaded: this libtorch is a CPU build, or \
             the nvidia-* libraries next to it are missing"
                .into(),
        ))
    }
}

fn check(what: &str, code: sys::cudaError_t) -> Result<(), CudaError> {
    if code == sys::cudaError_t::cudaSuccess {
        return Ok(());
    }
    // SAFETY: cudaGetErrorString returns a static NUL-terminated string for any code.
    let text = unsafe { CStr::from_ptr(sys::cudaGetErrorString(code)) };
    Err(CudaError(format!(
        "{what} failed: {code:?} ({})",
        text.to_string_lossy()
    )))
}

/// The newest CUDA the installed driver supports, as `12.8` (`cudaDriverGetVersion`);
/// `None` without a driver.
pub fn driver_cuda_version() -> Option<String> {
    runtime().ok()?;
    let mut version = 0;
    // SAFETY: a valid out-pointer; the call needs no context and no device.
    let code = unsafe { sys::cudaDriverGetVersion(&mut version) };
    (code == sys::cudaError_t::cudaSuccess && version > 0)
        .then(|| format!("{}.{}", version / 1000, version % 1000 / 10))
}

/// CUDA devices this process can see (after `CUDA_VISIBLE_DEVICES`).
pub fn device_count() -> Result<usize, CudaError> {
    runtime()?;
    let mut n = 0;
    // SAFETY: a valid out-pointer.
    let code = unsafe { sys::cudaGetDeviceCount(&mut n) };
    match code {
        sys::cudaError_t::cudaSuccess => Ok(n.max(0) as usize),
        sys::cudaError_t::cudaErrorNoDevice => Ok(0),
        other => check("cudaGetDeviceCount", other).map(|_| 0),
    }
}

/// Makes `index` the calling thread's current device (libtorch's and NCCL's too).
pub fn set_device(index: usize) -> Result<(), CudaError> {
    runtime()?;
    let index = i32::try_from(index).map_err(|_| CudaError(format!("device {index}")))?;
    // SAFETY: plain call; an invalid index is reported as an error.
    check("cudaSetDevice", unsafe { sys::cudaSetDevice(index) })
}

pub fn current_device() -> Result<usize, CudaError> {
    runtime()?;
    let mut index = 0;
    // SAFETY: a valid out-pointer.
    check("cudaGetDevice", unsafe { sys::cudaGetDevice(&mut index) })?;
    Ok(index.max(0) as usize)
}

/// The device's marketing name, as NVML and `nvidia-smi` print it ("NVIDIA H100 80GB HBM3").
pub fn device_name(index: usize) -> Result<String, CudaError> {
    runtime()?;
    let index = i32::try_from(index).map_err(|_| CudaError(format!("device {index}")))?;
    // The name is the first field of cudaDeviceProp in every CUDA version; the buffer is
    // larger than the struct has ever been, so a layout difference cannot overflow it.
    let mut buffer = vec![0u64; 4096];
    // SAFETY: the buffer outsizes cudaDeviceProp and is 8-byte aligned.
    check("cudaGetDeviceProperties", unsafe {
        sys::cudaGetDeviceProperties(buffer.as_mut_ptr().cast(), index)
    })?;
    let bytes: Vec<u8> = buffer
        .iter()
        .flat_map(|w| w.to_ne_bytes())
        .take(256)
        .collect();
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    Ok(String::from_utf8_lossy(&bytes[..end]).trim().to_string())
}

/// (free, total) bytes of the current device: what every user of it (this process's context,
/// libtorch's cache, NCCL's buffers, other processes) leaves free.
pub fn memory_info() -> Result<(u64, u64), CudaError> {
    runtime()?;
    let (mut free, mut total) = (0usize, 0usize);
    // SAFETY: valid out-pointers.
    check("cudaMemGetInfo", unsafe {
        sys::cudaMemGetInfo(&mut free, &mut total)
    })?;
    Ok((free as u64, total as u64))
}

/// Waits on the host until every kernel queued on the current device has run.
pub fn synchronize() -> Result<(), CudaError> {
    runtime()?;
    // SAFETY: plain call.
    check("cudaDeviceSynchronize", unsafe {
        sys::cudaDeviceSynchronize()
    })
}

/// A raw stream handle as the CUDA libraries take it.
pub type RawStream = *mut c_void;

/// libtorch's stream: the legacy default stream (tch has no stream API, so every kernel goes
/// there). It synchronises with every blocking stream, which is why NCCL's stream is a
/// non-blocking one.
pub fn compute_stream() -> RawStream {
    std::ptr::null_mut()
}

/// A stream that does not synchronise with the legacy default stream, on the current device.
pub struct CudaStream(sys::cudaStream_t);

// SAFETY: a CUDA stream handle may be used from any thread of the process.
unsafe impl Send for CudaStream {}
unsafe impl Sync for CudaStream {}

impl CudaStream {
    /// At the device's greatest priority, as PyTorch FSDP2 makes its all-gather and
    /// reduce-scatter streams: the scheduler starts a collective's kernels ahead of queued
    /// compute, which the collective would otherwise wait behind, holding back the next unit.
    pub fn non_blocking() -> Result<CudaStream, CudaError> {
        runtime()?;
        let (mut least, mut greatest) = (0, 0);
        // SAFETY: valid out-pointers.
        check("cudaDeviceGetStreamPriorityRange", unsafe {
            sys::cudaDeviceGetStreamPriorityRange(&mut least, &mut greatest)
        })?;
        let mut stream = std::ptr::null_mut();
        // SAFETY: a valid out-pointer; `greatest` is in the device's range.
        check("cudaStreamCreateWithPriority", unsafe {
            sys::cudaStreamCreateWithPriority(&mut stream, sys::cudaStreamNonBlocking, greatest)
        })?;
        Ok(CudaStream(stream))
    }

    pub fn raw(&self) -> RawStream {
        self.0.cast()
    }
}

impl Drop for CudaStream {
    fn drop(&mut self) {
        // SAFETY: created by us, destroyed once; pending work still completes.
        let _ = unsafe { sys::cudaStreamDestroy(self.0) };
    }
}

/// A point in a stream's queue, for ordering another stream after it or polling it.
pub struct CudaEvent(sys::cudaEvent_t);

// SAFETY: a CUDA event handle may be recorded, waited on and queried from any thread.
unsafe impl Send for CudaEvent {}
unsafe impl Sync for CudaEvent {}

impl CudaEvent {
    /// An event recorded now on `stream`: it completes when everything queued there so far
    /// has run.
    pub fn record(stream: RawStream) -> Result<CudaEvent, CudaError> {
        runtime()?;
        let mut event = std::ptr::null_mut();
        // SAFETY: a valid out-pointer; timing off (cheaper, and never read).
        check("cudaEventCreateWithFlags", unsafe {
            sys::cudaEventCreateWithFlags(&mut event, sys::cudaEventDisableTiming)
        })?;
        let event = CudaEvent(event);
        // SAFETY: a live event and a stream of the current device.
        check("cudaEventRecord", unsafe {
            sys::cudaEventRecord(event.0, stream.cast())
        })?;
        Ok(event)
    }

    /// Makes work queued later on `stream` wait for this event (the host does not wait).
    pub fn block(&self, stream: RawStream) -> Result<(), CudaError> {
        // SAFETY: a live event; flags 0.
        check("cudaStreamWaitEvent", unsafe {
            sys::cudaStreamWaitEvent(stream.cast(), self.0, 0)
        })
    }

    /// Whether the work before the event has run, without waiting.
    pub fn is_complete(&self) -> Result<bool, CudaError> {
        // SAFETY: a live event.
        match unsafe { sys::cudaEventQuery(self.0) } {
            sys::cudaError_t::cudaSuccess => Ok(true),
            sys::cudaError_t::cudaErrorNotReady => Ok(false),
            other => check("cudaEventQuery", other).map(|_| false),
        }
    }
}

impl Drop for CudaEvent {
    fn drop(&mut self) {
        // SAFETY: created by us, destroyed once; CUDA defers the release until the event
        // completes, and waits already queued on it keep their meaning.
        let _ = unsafe { sys::cudaEventDestroy(self.0) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_a_gpu_the_runtime_reports_no_device_not_a_crash() {
        if !tch::Cuda::is_available() {
            // libtorch's own runtime is loaded (the pip wheel is a CUDA build) yet sees no
            // device: the same answer here, as a value.
            if runtime_present() {
                // No device, or no driver at all: a count of 0 or an error, never a crash.
                assert!(device_count().map_or(true, |n| n == 0));
                assert!(set_device(0).is_err());
            } else {
                assert!(device_count().is_err());
            }
        } else {
            let n = device_count().unwrap();
            assert_eq!(n as i64, tch::Cuda::device_count());
            set_device(n - 1).unwrap();
            assert_eq!(current_device().unwrap(), n - 1);
            assert!(!device_name(n - 1).unwrap().is_empty());
        }
    }
}
