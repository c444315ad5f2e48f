//! NCCL backend through cudarc, with libnccl loaded at run time ([`library`]) so the same
//! binary builds and runs on machines without CUDA.
//!
//! Streams: libtorch runs every kernel on the legacy default stream (tch has no stream API).
//! Each communicator enqueues its collectives on its own non-blocking stream, so they run
//! while the compute proceeds (the next unit's all-gather during this unit's forward, a
//! unit's reduce-scatter during the previous unit's backward). Events order the two:
//! * at issue, the collective's stream waits for everything queued on the compute stream so
//!   far (the inputs are written, and memory the caching allocator handed out again is no
//!   longer read by earlier kernels);
//! * [`Work::wait`] makes the compute stream wait for the collective's completion event. It
//!   does not block the host; buffers the collective reads or writes are kept alive until
//!   then, so anything that reuses their memory afterwards is queued after the collective.
//!
//! Failures never hang a rank ([`watch`]): communicators are non-blocking (NCCL calls return
//! at once and are polled), every collective has a deadline checked by event queries and
//! `ncclCommGetAsyncError` (host waits and a watchdog thread), and a communicator is aborted
//! (`ncclCommAbort`) on every path but a clean finish (`ncclCommFinalize` +
//! `ncclCommDestroy`, [`Communicator::finish`]).

pub mod library;
pub mod watch;

use super::dtype::{check, check_pair, Dtype};
use super::{
    subgroup_members, CommError, CommOptions, Communicator, ReduceOp, SingleProcess, Work,
};
use crate::cuda::{self, CudaEvent, CudaStream};
use cudarc::nccl::sys;
use std::collections::VecDeque;
use std::ffi::c_int;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use tch::{Device, Tensor};
use watch::Pending;

/// Bytes in an NCCL unique id.
const UNIQUE_ID_BYTES: usize = 128;
/// `NCCL_SPLIT_NOCOLOR`: this rank joins no communicator in a split.
const SPLIT_NOCOLOR: c_int = -1;
/// `NCCL_CONFIG_UNDEF_INT`: leave the field to NCCL's default.
const UNDEF_INT: c_int = c_int::MIN;

fn nccl_error(what: &str, e: sys::ncclResult_t) -> CommError {
    // SAFETY: ncclGetErrorString returns a static NUL-terminated string for any result.
    let text = unsafe { std::ffi::CStr::from_ptr(sys::ncclGetErrorString(e)) };
    CommError::Nccl(format!("{what}: {e:?} ({})", text.to_string_lossy()))
}

fn cuda_error(e: cuda::CudaError) -> CommError {
    CommError::Nccl(e.to_string())
}

/// `NCCL_CONFIG_INITIALIZER` with the one field set here: whether calls block (non-blocking
/// ones return `ncclInProgress`, so joining and splitting can be given a deadline).
fn config(blocking: bool) -> sys::ncclConfig_t {
    sys::ncclConfig_t {
        size: std::mem::size_of::<sys::ncclConfig_t>(),
        magic: 0xcafe_beef,
        // The layout of these bindings: NCCL_VERSION(2, 28, 0).
        version: 22800,
        blocking: c_int::from(blocking),
        cgaClusterSize: UNDEF_INT,
        minCTAs: UNDEF_INT,
        maxCTAs: UNDEF_INT,
        netName: std::ptr::null(),
        splitShare: UNDEF_INT,
        trafficClass: UNDEF_INT,
        commName: std::ptr::null(),
        collnetEnable: UNDEF_INT,
        CTAPolicy: UNDEF_INT,
        shrinkShare: UNDEF_INT,
        nvlsCTAs: UNDEF_INT,
        nChannelsPerNetPeer: UNDEF_INT,
        nvlinkCentricSched: UNDEF_INT,
    }
}

/// Rank 0's unique id, to be sent to every rank through the rendezvous.
pub fn new_unique_id() -> Result<Vec<u8>, CommError> {
    library::load()?;
    let mut id = sys::ncclUniqueId { internal: [0; 128] };
    // SAFETY: a valid out-pointer.
    let status = unsafe { sys::ncclGetUniqueId(&mut id) };
    if status != sys::ncclResult_t::ncclSuccess {
        return Err(nccl_error("ncclGetUniqueId", status));
    }
    Ok(id.internal.iter().map(|&c| c as u8).collect())
}

fn nccl_dtype(dtype: Dtype) -> sys::ncclDataType_t {
    match dtype {
        Dtype::F32 => sys::ncclDataType_t::ncclFloat32,
        Dtype::F64 => sys::ncclDataType_t::ncclFloat64,
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

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Life {
    Live,
    /// Finalized and destroyed after every rank finished (the only destroy).
    Finished,
    Aborted,
}

/// One NCCL communicator handle, its stream and its collectives in flight. Aborted when
/// dropped unless finished cleanly.
pub(crate) struct Comm {
    raw: sys::ncclComm_t,
    /// What it is, for messages ("the world", "the group of ranks [0, 1]").
    label: String,
    device: usize,
    stream: CudaStream,
    timeout: Duration,
    /// Made blocking ([`CommOptions::nccl_blocking`]); its children are made the same.
    blocking: bool,
    /// Serialises this process's calls on the handle (NCCL forbids concurrent ones).
    calls: Mutex<()>,
    /// Whether the handle is still live; held while it is queried, finished or aborted.
    life: Mutex<Life>,
    in_flight: Mutex<VecDeque<Pending>>,
}

// SAFETY: the handle is only used under `calls` (enqueueing) or `life` (state queries,
// finish, abort), never concurrently with its destruction; NCCL handles are not tied to the
// thread that created them.
unsafe impl Send for Comm {}
unsafe impl Sync for Comm {}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Comm {
    /// NCCL's state of the handle: `Ok(true)` ready, `Ok(false)` still in progress.
    fn state(&self) -> Result<bool, CommError> {
        let _calls = lock(&self.calls);
        self.query_state()
    }

    /// [`Comm::state`] for a caller that holds `calls` (NCCL allows one thread at a time on
    /// a communicator, its error queries included).
    fn query_state(&self) -> Result<bool, CommError> {
        let life = lock(&self.life);
        if *life != Life::Live {
            let how = if *life == Life::Finished {
                "finished"
            } else {
                "aborted"
            };
            return Err(CommError::Nccl(format!(
                "the communicator of {} was {how}",
                self.label
            )));
        }
        let mut state = sys::ncclResult_t::ncclSuccess;
        // SAFETY: a live handle (held live by `life`) and a valid out-pointer.
        let status = unsafe { sys::ncclCommGetAsyncError(self.raw, &mut state) };
        drop(life);
        if status != sys::ncclResult_t::ncclSuccess {
            return Err(nccl_error("ncclCommGetAsyncError", status));
        }
        match state {
            sys::ncclResult_t::ncclSuccess => Ok(true),
            sys::ncclResult_t::ncclInProgress => Ok(false),
            error => Err(nccl_error(
                &format!("{} (asynchronous error)", self.label),
                error,
            )),
        }
    }

    /// Polls until NCCL finished the last call on the handle; aborts past `deadline`. The
    /// caller holds `calls`.
    ///
    /// A non-blocking communicator launches each call from a thread of its own, so a
    /// collective settles within tens of microseconds: short sleeps first.
    fn settle(&self, what: &str, deadline: Instant) -> Result<(), CommError> {
        let mut spins = 0u32;
        loop {
            match self.query_state() {
                Ok(true) => return Ok(()),
                Ok(false) if Instant::now() < deadline => {
                    spins += 1;
                    if spins < 64 {
                        std::thread::yield_now();
                    } else {
                        // From 20 us up to 1 ms: collectives settle fast, init and split
                        // take seconds and need not be asked thousands of times a second.
                        let doublings = ((spins - 64) / 16).min(6);
                        std::thread::sleep(Duration::from_micros(20 << doublings));
                    }
                }
                Ok(false) => {
                    self.abort();
                    return Err(CommError::Nccl(format!(
                        "{what} on {} did not complete within {} s; communicator aborted",
                        self.label,
                        self.timeout.as_secs()
                    )));
                }
                Err(e) => {
                    self.abort();
                    return Err(e);
                }
            }
        }
    }

    /// A call on the handle returned `status`: an error aborts the communicator, otherwise
    /// the call is settled (a non-blocking call returns `ncclInProgress`). The caller holds
    /// `calls`.
    fn complete(
        &self,
        what: &str,
        status: sys::ncclResult_t,
        deadline: Instant,
    ) -> Result<(), CommError> {
        if !matches!(
            status,
            sys::ncclResult_t::ncclSuccess | sys::ncclResult_t::ncclInProgress
        ) {
            self.abort();
            return Err(nccl_error(what, status));
        }
        self.settle(what, deadline)
    }

    /// Drops the collectives that have completed (in issue order).
    fn reap(&self) -> Result<(), CommError> {
        let mut queue = lock(&self.in_flight);
        while let Some(front) = queue.front() {
            if front.event.is_complete().map_err(cuda_error)? {
                queue.pop_front();
            } else {
                break;
            }
        }
        Ok(())
    }

    /// The oldest collective still running past its deadline: (what, seconds running).
    fn overdue(&self, now: Instant) -> Option<(&'static str, u64)> {
        let queue = lock(&self.in_flight);
        queue
            .front()
            .filter(|p| now.duration_since(p.issued) > self.timeout)
            .map(|p| (p.what, now.duration_since(p.issued).as_secs()))
    }

    /// Waits on the host until every collective issued so far has completed: event queries
    /// and NCCL's error state, polled; aborts past the deadline.
    pub(crate) fn wait_idle(&self) -> Result<(), CommError> {
        let mut spins = 0u32;
        loop {
            self.state()?;
            self.reap()?;
            if lock(&self.in_flight).is_empty() {
                return Ok(());
            }
            if let Some((what, secs)) = self.overdue(Instant::now()) {
                self.abort();
                return Err(CommError::Nccl(format!(
                    "{what} on {} has not completed after {secs} s (a peer died or hangs, or \
                     the network failed); communicator aborted",
                    self.label
                )));
            }
            spins += 1;
            if spins < 100 {
                std::thread::yield_now();
            } else {
                std::thread::sleep(Duration::from_micros(200));
            }
        }
    }

    /// `ncclCommAbort`: ends the communicator without waiting for peers. Idempotent.
    fn abort(&self) {
        let mut life = lock(&self.life);
        if *life == Life::Live {
            // SAFETY: a live handle, no longer used after this (life is not Live).
            let _ = unsafe { sys::ncclCommAbort(self.raw) };
            *life = Life::Aborted;
        }
    }

    /// The clean end: every rank has finished its collectives (after a barrier on the
    /// control plane). `ncclCommFinalize` flushes NCCL's work, then `ncclCommDestroy` frees.
    fn finish(&self) -> Result<(), CommError> {
        if *lock(&self.life) == Life::Finished {
            return Ok(());
        }
        self.wait_idle()?;
        let deadline = Instant::now() + self.timeout;
        // `calls` held to the end: the watchdog sees the handle live and settled, or closed.
        let _calls = lock(&self.calls);
        // SAFETY: a live handle.
        let status = unsafe { sys::ncclCommFinalize(self.raw) };
        self.complete("ncclCommFinalize", status, deadline)?;
        let mut life = lock(&self.life);
        if *life == Life::Live {
            // SAFETY: finalized, idle, destroyed once (life is then Finished).
            let _ = unsafe { sys::ncclCommDestroy(self.raw) };
            *life = Life::Finished;
        }
        Ok(())
    }
}

impl Drop for Comm {
    fn drop(&mut self) {
        // Any end but `finish` is not clean: abort, never destroy (destroy waits on peers).
        self.abort();
    }
}

pub struct NcclCommunicator {
    comm: Arc<Comm>,
    rank: usize,
    size: usize,
}

/// The tensors a collective reads or writes, kept alive until its completion is ordered
/// before later compute ([`Work::wait`]); a work dropped unwaited leaves them with the
/// communicator until its event completes.
struct Keep {
    tensors: Vec<Tensor>,
    comm: Arc<Comm>,
    event: Arc<CudaEvent>,
}

impl Drop for Keep {
    fn drop(&mut self) {
        if self.tensors.is_empty() {
            return;
        }
        let tensors = std::mem::take(&mut self.tensors);
        let mut queue = lock(&self.comm.in_flight);
        if let Some(p) = queue
            .iter_mut()
            .find(|p| Arc::ptr_eq(&p.event, &self.event))
        {
            p.keep = tensors;
        }
    }
}

impl NcclCommunicator {
    /// Joins the communicator of `world_size` ranks named by rank 0's `unique_id` on the
    /// current CUDA device (collective: returns when every rank has joined, or fails after
    /// the options' timeout, unless its communicators block).
    pub fn new(
        unique_id: &[u8],
        rank: usize,
        world_size: usize,
        options: &CommOptions,
    ) -> Result<NcclCommunicator, CommError> {
        let timeout = options.timeout;
        library::load()?;
        if unique_id.len() != UNIQUE_ID_BYTES {
            return Err(CommError::Invalid(format!(
                "an NCCL unique id has {UNIQUE_ID_BYTES} bytes, got {}",
                unique_id.len()
            )));
        }
        let mut id = sys::ncclUniqueId { internal: [0; 128] };
        for (dst, &src) in id.internal.iter_mut().zip(unique_id) {
            *dst = src as std::ffi::c_char;
        }
        let device = cuda::current_device().map_err(cuda_error)?;
        tracing::debug!(rank, world_size, device, "joining the NCCL communicator");
        let joining = Instant::now();
        let mut raw = std::ptr::null_mut();
        let mut cfg = config(options.nccl_blocking);
        // SAFETY: valid out-pointer and config; rank < world_size is checked by the caller
        // (bootstrap) and by NCCL.
        let status = unsafe {
            sys::ncclCommInitRankConfig(&mut raw, world_size as c_int, id, rank as c_int, &mut cfg)
        };
        if !matches!(
            status,
            sys::ncclResult_t::ncclSuccess | sys::ncclResult_t::ncclInProgress
        ) || raw.is_null()
        {
            return Err(nccl_error("ncclCommInitRankConfig", status));
        }
        let comm = Comm::wrap(raw, "the world".into(), device, options)?;
        {
            let _calls = lock(&comm.calls);
            comm.settle("ncclCommInitRank", Instant::now() + timeout)?;
        }
        tracing::debug!(
            seconds = joining.elapsed().as_secs_f64(),
            "NCCL communicator ready"
        );
        Ok(NcclCommunicator {
            comm,
            rank,
            size: world_size,
        })
    }

    fn device(&self) -> Device {
        Device::Cuda(self.comm.device)
    }

    /// Enqueues one collective on the communicator's stream, after the compute so far; the
    /// returned work orders later compute after it.
    fn enqueue(
        &self,
        what: &'static str,
        keep: Vec<Tensor>,
        call: impl FnOnce(sys::ncclComm_t, sys::cudaStream_t) -> sys::ncclResult_t,
    ) -> Result<Work, CommError> {
        let comm = &self.comm;
        if tracing::enabled!(tracing::Level::TRACE) {
            let bytes = keep
                .iter()
                .map(|t| t.numel() * t.kind().elt_size_in_bytes())
                .max()
                .unwrap_or(0);
            tracing::trace!(
                collective = what,
                bytes,
                ranks = self.size,
                communicator = comm.label,
                "collective issued"
            );
        }
        comm.state()?;
        comm.reap()?;
        let ready = CudaEvent::record(cuda::compute_stream()).map_err(cuda_error)?;
        ready.block(comm.stream.raw()).map_err(cuda_error)?;
        {
            let _calls = lock(&comm.calls);
            let status = call(comm.raw, comm.stream.raw().cast());
            comm.complete(what, status, Instant::now() + comm.timeout)?;
        }
        let done = match CudaEvent::record(comm.stream.raw()) {
            Ok(event) => Arc::new(event),
            Err(e) => {
                // Nothing can order the collective's end before its buffers go back to the
                // allocator: the communicator is aborted, the buffers kept for the rest of the
                // process (which this error ends).
                comm.abort();
                std::mem::forget(keep);
                return Err(cuda_error(e));
            }
        };
        lock(&comm.in_flight).push_back(Pending {
            event: done.clone(),
            what,
            issued: Instant::now(),
            keep: Vec::new(),
        });
        let mut kept = Keep {
            tensors: keep,
            comm: comm.clone(),
            event: done.clone(),
        };
        let comm = comm.clone();
        Ok(Work::new(move || {
            comm.state()?;
            done.block(cuda::compute_stream()).map_err(cuda_error)?;
            // Later kernels are ordered after the collective: its buffers may go.
            kept.tensors.clear();
            Ok(())
        }))
    }
}

impl Comm {
    fn wrap(
        raw: sys::ncclComm_t,
        label: String,
        device: usize,
        options: &CommOptions,
    ) -> Result<Arc<Comm>, CommError> {
        let stream = match CudaStream::non_blocking() {
            Ok(s) => s,
            Err(e) => {
                // SAFETY: a handle just created and not shared.
                let _ = unsafe { sys::ncclCommAbort(raw) };
                return Err(cuda_error(e));
            }
        };
        let comm = Arc::new(Comm {
            raw,
            label,
            device,
            stream,
            timeout: options.timeout,
            blocking: options.nccl_blocking,
            calls: Mutex::new(()),
            life: Mutex::new(Life::Live),
            in_flight: Mutex::new(VecDeque::new()),
        });
        watch::register(&comm);
        Ok(comm)
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
        let dtype = check_pair(input, output, self.size, true, Some(self.device()))?;
        let (src, dst, count) = (input.data_ptr(), output.data_ptr(), input.numel());
        self.enqueue(
            "all-gather",
            vec![input.shallow_clone(), output.shallow_clone()],
            |comm, stream| {
                // SAFETY: contiguous device buffers of `count` and `size * count` elements of
                // `dtype` (checked), kept alive until the compute stream waits for them.
                unsafe { sys::ncclAllGather(src, dst, count, nccl_dtype(dtype), comm, stream) }
            },
        )
    }

    fn reduce_scatter(
        &self,
        input: &Tensor,
        output: &Tensor,
        op: ReduceOp,
    ) -> Result<Work, CommError> {
        let dtype = check_pair(input, output, self.size, false, Some(self.device()))?;
        let (src, dst, count) = (input.data_ptr(), output.data_ptr(), output.numel());
        self.enqueue(
            "reduce-scatter",
            vec![input.shallow_clone(), output.shallow_clone()],
            |comm, stream| {
                // SAFETY: as in all_gather, with `count` output elements.
                unsafe {
                    sys::ncclReduceScatter(
                        src,
                        dst,
                        count,
                        nccl_dtype(dtype),
                        nccl_op(op),
                        comm,
                        stream,
                    )
                }
            },
        )
    }

    fn all_reduce(&self, tensor: &Tensor, op: ReduceOp) -> Result<Work, CommError> {
        let dtype = check(tensor, "tensor", Some(self.device()))?.dtype;
        let (ptr, count) = (tensor.data_ptr(), tensor.numel());
        self.enqueue(
            "all-reduce",
            vec![tensor.shallow_clone()],
            |comm, stream| {
                // SAFETY: in place on a contiguous device buffer of `count` elements.
                unsafe {
                    sys::ncclAllReduce(
                        ptr,
                        ptr,
                        count,
                        nccl_dtype(dtype),
                        nccl_op(op),
                        comm,
                        stream,
                    )
                }
            },
        )
    }

    fn broadcast(&self, tensor: &Tensor, root: usize) -> Result<Work, CommError> {
        let dtype = check(tensor, "tensor", Some(self.device()))?.dtype;
        if root >= self.size {
            return Err(CommError::Invalid(format!(
                "broadcast root {root} in a world of {}",
                self.size
            )));
        }
        let (ptr, count) = (tensor.data_ptr(), tensor.numel());
        self.enqueue("broadcast", vec![tensor.shallow_clone()], |comm, stream| {
            // SAFETY: in place on a contiguous device buffer of `count` elements.
            unsafe {
                sys::ncclBroadcast(
                    ptr,
                    ptr,
                    count,
                    nccl_dtype(dtype),
                    root as c_int,
                    comm,
                    stream,
                )
            }
        })
    }

    fn barrier(&self) -> Result<(), CommError> {
        // NCCL has no barrier: a one-element all-reduce every rank must reach, waited for on
        // the host (with the deadline).
        let t = Tensor::zeros([1], (tch::Kind::Float, self.device()));
        self.all_reduce(&t, ReduceOp::Sum)?.wait()?;
        self.comm.wait_idle()
    }

    fn new_subgroup(&self, ranks: &[usize]) -> Result<Box<dyn Communicator>, CommError> {
        let (members, my_index) = subgroup_members(self.rank, self.size, ranks)?;
        let parent = &self.comm;
        parent.state()?;
        // Groups partition the ranks, so the smallest member names a group; the parent rank
        // orders members as the sorted list does. A group of one needs no communicator.
        let color = if members.len() == 1 {
            SPLIT_NOCOLOR
        } else {
            members[0] as c_int
        };
        let mut raw = std::ptr::null_mut();
        // The child sets up its own buffers and connections. (Sharing the parent's would need
        // `splitShare` on the parent at its creation, and then no collective of the parent
        // may run while the child's do: not tried on a GPU yet.)
        let mut cfg = config(parent.blocking);
        let deadline = Instant::now() + parent.timeout;
        {
            let _calls = lock(&parent.calls);
            // SAFETY: a live parent, a valid out-pointer and config.
            let status = unsafe {
                sys::ncclCommSplit(parent.raw, color, self.rank as c_int, &mut raw, &mut cfg)
            };
            parent.complete("ncclCommSplit", status, deadline)?;
        }
        if raw.is_null() {
            // NCCL makes no communicator for SPLIT_NOCOLOR only: a larger group without one
            // would train alone while its peers wait for it.
            if members.len() == 1 {
                return Ok(Box::new(SingleProcess));
            }
            return Err(CommError::Nccl(format!(
                "ncclCommSplit returned no communicator for the group of ranks {members:?}"
            )));
        }
        let label = format!("the group of ranks {members:?}");
        let options = CommOptions {
            timeout: parent.timeout,
            nccl_blocking: parent.blocking,
        };
        let child = Comm::wrap(raw, label, parent.device, &options)?;
        let mut count = 0;
        let status = {
            let _calls = lock(&child.calls);
            child.settle("ncclCommSplit", deadline)?;
            // SAFETY: a live, settled communicator.
            unsafe { sys::ncclCommCount(child.raw, &mut count) }
        };
        if status != sys::ncclResult_t::ncclSuccess {
            return Err(nccl_error("ncclCommCount", status));
        }
        if count as usize != members.len() {
            return Err(CommError::Invalid(format!(
                "subgroup {ranks:?}: NCCL formed a group of {count}; every member must pass the same ranks"
            )));
        }
        Ok(Box::new(NcclCommunicator {
            comm: child,
            rank: my_index,
            size: members.len(),
        }))
    }

    fn finish(&self) -> Result<(), CommError> {
        self.comm.finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rank_zero_makes_an_id_and_joining_without_a_gpu_is_an_error_not_a_crash() {
        let id = new_unique_id().unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(id.len(), UNIQUE_ID_BYTES);
        let options = CommOptions {
            timeout: Duration::from_secs(5),
            ..CommOptions::default()
        };
        let made = NcclCommunicator::new(&id, 0, 1, &options);
        if tch::Cuda::is_available() {
            made.unwrap_or_else(|e| panic!("a one-rank communicator on the GPU: {e}"));
        } else {
            let err = made.err().expect("no GPU: no communicator");
            eprintln!("{err}");
        }
    }
}
