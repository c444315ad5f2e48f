//! Safe wrappers over `shim/storage_shim.cpp`: what tch does not expose.
//!
//! * [`release_storage`] / [`allocate_storage`]: drop and re-create the memory behind a
//!   tensor's storage while every view of it (parameters, tensors autograd saved for backward)
//!   keeps pointing at the same storage object. This is how FULL_SHARD frees gathered
//!   parameters after forward without recomputing the forward in backward.
//! * [`grad`]: backward of one unit seeded with the upstream gradient, returning gradients
//!   rather than accumulating them into `.grad`.
//! * [`fused_adamw`]: AdamW on many tensors in one call (`_fused_adamw_`).
//! * [`cuda_memory`]: the CUDA caching allocator's statistics.
//! * [`flash_varlen`]: causal attention within packed documents, by flash attention's
//!   variable-length kernel.
//! * [`pin_memory`]: a page-locked copy of a host tensor (tch's passes a device argument
//!   libtorch deprecates, with two warnings a call).
//! * [`WithoutCudnnAttention`]: SDPA kept off cuDNN's kernel while it lives.

use std::ffi::{c_char, c_int, CStr};
use tch::Tensor;

#[derive(Debug, thiserror::Error)]
#[error("libtorch: {0}")]
pub struct ShimError(String);

type CTensor = *mut torch_sys::C_tensor;

extern "C" {
    fn shardrun_free_error(message: *mut c_char);
    fn shardrun_storage_release(tensor: CTensor) -> *mut c_char;
    fn shardrun_storage_allocate(tensor: CTensor, nbytes: usize) -> *mut c_char;
    fn shardrun_storage_nbytes(tensor: CTensor) -> usize;
    fn shardrun_cuda_memory(
        device: c_int,
        allocated: *mut i64,
        peak_allocated: *mut i64,
        reserved: *mut i64,
        peak_reserved: *mut i64,
    ) -> *mut c_char;
    #[allow(clippy::too_many_arguments)]
    fn shardrun_fused_adamw(
        params: *const CTensor,
        grads: *const CTensor,
        exp_avgs: *const CTensor,
        exp_avg_sqs: *const CTensor,
        n: c_int,
        step: CTensor,
        lr: f64,
        beta1: f64,
        beta2: f64,
        weight_decay: f64,
        eps: f64,
    ) -> *mut c_char;
    fn shardrun_flash_varlen(
        q: CTensor,
        k: CTensor,
        v: CTensor,
        offsets: CTensor,
        longest: i64,
        out: *mut CTensor,
        refused: *mut c_int,
    ) -> *mut c_char;
    fn shardrun_pin_memory(tensor: CTensor, out: *mut CTensor) -> *mut c_char;
    fn shardrun_sdp_use_cudnn(enabled: bool);
    fn shardrun_sdp_cudnn_enabled() -> bool;
    fn shardrun_grad(
        output: CTensor,
        upstream: CTensor,
        inputs: *const CTensor,
        n_inputs: c_int,
        grads: *mut CTensor,
    ) -> *mut c_char;
}

fn check(message: *mut c_char) -> Result<(), ShimError> {
    if message.is_null() {
        return Ok(());
    }
    // SAFETY: the shim returns a NUL-terminated string from strdup, freed right here.
    let text = unsafe { CStr::from_ptr(message) }
        .to_string_lossy()
        .into_owned();
    unsafe { shardrun_free_error(message) };
    Err(ShimError(text))
}

/// Frees the memory of `tensor`'s storage. Every tensor sharing that storage must not be read
/// until [`allocate_storage`] gives it memory again (reading it would be a use after free).
pub fn release_storage(tensor: &Tensor) -> Result<(), ShimError> {
    // SAFETY: the pointer is a live at::Tensor owned by `tensor`.
    check(unsafe { shardrun_storage_release(tensor.as_ptr() as CTensor) })
}

/// Gives `tensor`'s storage fresh (uninitialised) memory of `nbytes` from its own allocator.
pub fn allocate_storage(tensor: &Tensor, nbytes: usize) -> Result<(), ShimError> {
    // SAFETY: as above.
    check(unsafe { shardrun_storage_allocate(tensor.as_ptr() as CTensor, nbytes) })
}

/// Bytes currently held by `tensor`'s storage (0 once released).
pub fn storage_nbytes(tensor: &Tensor) -> usize {
    // SAFETY: as above; reads only the storage's size.
    unsafe { shardrun_storage_nbytes(tensor.as_ptr() as CTensor) }
}

/// Gradients of `sum(output * upstream)` (or of the scalar `output` when `upstream` is
/// `None`) with respect to `inputs`; `None` for inputs the output does not depend on.
/// Frees the graph.
pub fn grad(
    output: &Tensor,
    upstream: Option<&Tensor>,
    inputs: &[&Tensor],
) -> Result<Vec<Option<Tensor>>, ShimError> {
    let input_ptrs: Vec<CTensor> = inputs.iter().map(|t| t.as_ptr() as CTensor).collect();
    let mut grads: Vec<CTensor> = vec![std::ptr::null_mut(); inputs.len()];
    let upstream = upstream.map_or(std::ptr::null_mut(), |g| g.as_ptr() as CTensor);
    let n = c_int::try_from(inputs.len()).map_err(|_| ShimError("too many inputs".into()))?;
    // SAFETY: all pointers are live at::Tensors; the shim writes `n` new at::Tensor* into
    // `grads`, which we take ownership of.
    check(unsafe {
        shardrun_grad(
            output.as_ptr() as CTensor,
            upstream,
            input_ptrs.as_ptr(),
            n,
            grads.as_mut_ptr(),
        )
    })?;
    Ok(grads
        .into_iter()
        .map(|ptr| {
            // SAFETY: each pointer was allocated by the shim with `new at::Tensor`.
            let t = unsafe { Tensor::from_ptr(ptr) };
            t.defined().then_some(t)
        })
        .collect())
}

/// Why [`flash_varlen`] gave no output.
#[derive(Debug, thiserror::Error)]
pub enum VarlenError {
    /// The kernel's checks refused these inputs, before any launch (an unsupported GPU,
    /// dtype or head size): nothing happened on the device, another kernel may run instead.
    #[error("{0}")]
    Refused(ShimError),
    /// It failed otherwise (out of device memory, a CUDA error): the step cannot go on.
    #[error("{0}")]
    Failed(ShimError),
}

/// Causal attention of each document with itself, the documents laid end to end: `q`
/// (tokens, heads, head_dim), `k` and `v` (tokens, kv_heads, head_dim; fewer heads are
/// grouped-query attention), fp16 or bf16 on a CUDA device of compute capability 8.0 or
/// more; `offsets` (int32, on the same device) the first token of every document and then
/// the token count, `longest` the longest document's length. Scaled by 1/sqrt(head_dim).
/// Differentiable.
pub fn flash_varlen(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    offsets: &Tensor,
    longest: i64,
) -> Result<Tensor, VarlenError> {
    let mut out: CTensor = std::ptr::null_mut();
    let mut refused: c_int = 0;
    // SAFETY: all pointers are live at::Tensors; on success the shim writes one new
    // at::Tensor* into `out`, which we take ownership of.
    let status = check(unsafe {
        shardrun_flash_varlen(
            q.as_ptr() as CTensor,
            k.as_ptr() as CTensor,
            v.as_ptr() as CTensor,
            offsets.as_ptr() as CTensor,
            longest,
            &mut out,
            &mut refused,
        )
    });
    match status {
        // SAFETY: allocated by the shim with `new at::Tensor`.
        Ok(()) => Ok(unsafe { Tensor::from_ptr(out) }),
        Err(e) if refused != 0 => Err(VarlenError::Refused(e)),
        Err(e) => Err(VarlenError::Failed(e)),
    }
}

/// A page-locked copy of the host tensor `tensor` (an error where no GPU driver is).
pub fn pin_memory(tensor: &Tensor) -> Result<Tensor, ShimError> {
    let mut out: CTensor = std::ptr::null_mut();
    // SAFETY: a live at::Tensor; on success the shim writes one new at::Tensor* into `out`.
    check(unsafe { shardrun_pin_memory(tensor.as_ptr() as CTensor, &mut out) })?;
    // SAFETY: allocated by the shim with `new at::Tensor`.
    Ok(unsafe { Tensor::from_ptr(out) })
}

/// Whether SDPA may choose cuDNN's attention kernel now.
pub fn cudnn_attention_enabled() -> bool {
    // SAFETY: reads a flag of libtorch's global context.
    unsafe { shardrun_sdp_cudnn_enabled() }
}

/// While one lives, SDPA does not choose cuDNN's attention kernel (it takes flash, the
/// memory-efficient kernel or math, as `torch.backends.cuda.enable_cudnn_sdp(False)`); when
/// the last one alive drops, the setting before the first comes back. Counted over the
/// process, so guards on several threads, or nested, end in the right order.
pub struct WithoutCudnnAttention(());

/// Guards alive, and the setting before the first of them.
static CUDNN_OFF: std::sync::Mutex<(usize, bool)> = std::sync::Mutex::new((0, true));

impl WithoutCudnnAttention {
    pub fn enter() -> WithoutCudnnAttention {
        let mut state = CUDNN_OFF.lock().unwrap_or_else(|e| e.into_inner());
        if state.0 == 0 {
            state.1 = cudnn_attention_enabled();
            // SAFETY: sets a flag of libtorch's global context.
            unsafe { shardrun_sdp_use_cudnn(false) };
        }
        state.0 += 1;
        WithoutCudnnAttention(())
    }
}

impl Drop for WithoutCudnnAttention {
    fn drop(&mut self) {
        let mut state = CUDNN_OFF.lock().unwrap_or_else(|e| e.into_inner());
        state.0 -= 1;
        if state.0 == 0 {
            // SAFETY: as in `enter`.
            unsafe { shardrun_sdp_use_cudnn(state.1) };
        }
    }
}

/// The CUDA caching allocator on one device, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CudaMemory {
    pub allocated: u64,
    pub peak_allocated: u64,
    pub reserved: u64,
    pub peak_reserved: u64,
}

pub fn cuda_memory(device: usize) -> Result<CudaMemory, ShimError> {
    let device =
        c_int::try_from(device).map_err(|_| ShimError("device index out of range".into()))?;
    let mut v = [0i64; 4];
    let [a, b, c, d] = &mut v;
    // SAFETY: writes four i64 through valid pointers.
    check(unsafe { shardrun_cuda_memory(device, a, b, c, d) })?;
    let bytes = |x: i64| x.max(0) as u64;
    Ok(CudaMemory {
        allocated: bytes(v[0]),
        peak_allocated: bytes(v[1]),
        reserved: bytes(v[2]),
        peak_reserved: bytes(v[3]),
    })
}

/// Hyper-parameters of one AdamW step.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdamWStep {
    pub lr: f64,
    pub beta1: f64,
    pub beta2: f64,
    pub weight_decay: f64,
    pub eps: f64,
}

/// `torch.optim.AdamW(fused=True)` on every `(param, grad, exp_avg, exp_avg_sq)` at once;
/// `step` (a float scalar tensor on their device) counts from 1.
pub fn fused_adamw(
    tensors: &[(&Tensor, &Tensor, &Tensor, &Tensor)],
    step: &Tensor,
    hyper: AdamWStep,
) -> Result<(), ShimError> {
    let ptrs = |pick: fn(&(&Tensor, &Tensor, &Tensor, &Tensor)) -> *mut torch_sys::C_tensor| {
        tensors.iter().map(pick).collect::<Vec<CTensor>>()
    };
    let params = ptrs(|t| t.0.as_ptr() as CTensor);
    let grads = ptrs(|t| t.1.as_ptr() as CTensor);
    let exp_avgs = ptrs(|t| t.2.as_ptr() as CTensor);
    let exp_avg_sqs = ptrs(|t| t.3.as_ptr() as CTensor);
    let n = c_int::try_from(tensors.len()).map_err(|_| ShimError("too many tensors".into()))?;
    // SAFETY: four arrays of `n` live at::Tensor pointers and a live step tensor; the shim
    // updates the tensors in place and keeps no pointer.
    check(unsafe {
        shardrun_fused_adamw(
            params.as_ptr(),
            grads.as_ptr(),
            exp_avgs.as_ptr(),
            exp_avg_sqs.as_ptr(),
            n,
            step.as_ptr() as CTensor,
            hyper.lr,
            hyper.beta1,
            hyper.beta2,
            hyper.weight_decay,
            hyper.eps,
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether any guard lives, and the setting, read together.
    fn guards_and_setting() -> (usize, bool) {
        let state = CUDNN_OFF.lock().unwrap();
        (state.0, cudnn_attention_enabled())
    }

    #[test]
    fn cudnn_attention_comes_back_as_it_was() {
        // Other tests may hold guards on other threads: the setting is checked while this
        // test's own guards keep it off, and otherwise only while no guard lives.
        for before in [true, false] {
            assert_eq!(
                guards_and_setting().0,
                0,
                "no guard lives between tests here"
            );
            // SAFETY: sets a flag of libtorch's global context.
            unsafe { shardrun_sdp_use_cudnn(before) };
            let outer = WithoutCudnnAttention::enter();
            assert!(!cudnn_attention_enabled());
            {
                let _inner = WithoutCudnnAttention::enter();
                assert!(!cudnn_attention_enabled());
            }
            assert!(
                !cudnn_attention_enabled(),
                "the inner guard left the outer's setting"
            );
            let other = std::thread::spawn(WithoutCudnnAttention::enter)
                .join()
                .expect("a guard taken on another thread");
            drop(outer);
            assert!(
                !cudnn_attention_enabled(),
                "the other thread's guard keeps it off"
            );
            drop(other);
            assert_eq!(
                guards_and_setting(),
                (0, before),
                "the setting found comes back"
            );
        }
        // SAFETY: as above: libtorch's default again.
        unsafe { shardrun_sdp_use_cudnn(true) };
    }

    #[test]
    fn pinning_without_a_gpu_driver_is_an_error_not_a_crash() {
        let t = Tensor::from_slice(&[1i64, 2, 3]);
        match pin_memory(&t) {
            Ok(pinned) => assert_eq!(Vec::<i64>::try_from(&pinned).unwrap(), [1, 2, 3]),
            Err(e) => {
                assert!(!tch::Cuda::is_available(), "{e}");
                eprintln!("no GPU here: {e}");
            }
        }
    }
}
