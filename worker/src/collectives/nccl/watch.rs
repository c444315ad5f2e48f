//! Deadlines for NCCL work: every live communicator is registered here, with its collectives
//! in flight (completion event, what, when issued).
//!
//! * [`wait_all`]: the host waits for every collective issued so far, polling events and
//!   NCCL's asynchronous error; past the deadline the communicator is aborted and the wait
//!   fails naming the collective. Code that reads a device value on the host calls it first,
//!   so a dead peer gives an error instead of a read blocked forever.
//! * A watchdog thread does the same in the background for a rank blocked where no host wait
//!   covers it (inside libtorch): it reports the failure and ends the process (see
//!   [`crate::fail_fast`]), which also frees the peers. NCCL allows one thread at a time on a
//!   communicator, so the watchdog queries one only while the training thread is not using
//!   it, and otherwise judges it by host time alone.
//! * A monitor thread, which makes no CUDA or NCCL call, ends the process when the watchdog
//!   itself stops coming round (stuck in a CUDA call behind a hung device): the case
//!   PyTorch's NCCL heartbeat monitor is for.

use super::{Comm, CommError};
use crate::cuda::CudaEvent;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Once, OnceLock, Weak};
use std::time::{Duration, Instant};
use tch::Tensor;

/// One collective in flight.
pub(crate) struct Pending {
    pub(super) event: Arc<CudaEvent>,
    pub(super) what: &'static str,
    pub(super) issued: Instant,
    /// Buffers of a work dropped without waiting, freed once the event completed.
    pub(super) keep: Vec<Tensor>,
}

/// How often the watchdog looks.
const WATCH_EVERY: Duration = Duration::from_millis(500);

static LIVE: Mutex<Vec<Weak<Comm>>> = Mutex::new(Vec::new());

/// When the watchdog last came round, in milliseconds since [`origin`].
static WATCHDOG_ROUND: AtomicU64 = AtomicU64::new(0);
/// The longest deadline of any communicator registered, in milliseconds: what the monitor
/// allows the watchdog (kept here so the monitor holds no communicator: dropping the last
/// handle would abort it, an NCCL call).
static LONGEST_DEADLINE_MS: AtomicU64 = AtomicU64::new(0);

fn origin() -> Instant {
    static ORIGIN: OnceLock<Instant> = OnceLock::new();
    *ORIGIN.get_or_init(Instant::now)
}

fn millis_since_origin() -> u64 {
    origin().elapsed().as_millis() as u64
}

fn live() -> Vec<Arc<Comm>> {
    let mut all = LIVE.lock().unwrap_or_else(|e| e.into_inner());
    all.retain(|c| c.strong_count() > 0);
    all.iter().filter_map(Weak::upgrade).collect()
}

pub(super) fn register(comm: &Arc<Comm>) {
    LIVE.lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(Arc::downgrade(comm));
    LONGEST_DEADLINE_MS.fetch_max(comm.timeout.as_millis() as u64, Ordering::Relaxed);
    static WATCHDOG: Once = Once::new();
    let device = comm.device;
    WATCHDOG.call_once(|| {
        WATCHDOG_ROUND.store(millis_since_origin(), Ordering::Relaxed);
        let _ = std::thread::Builder::new()
            .name("nccl-watchdog".into())
            .spawn(move || watchdog(device));
        let _ = std::thread::Builder::new()
            .name("nccl-watchdog-monitor".into())
            .spawn(monitor);
    });
}

/// Waits on the host until every NCCL collective issued so far has completed, with each
/// communicator's deadline. Returns at once when no NCCL communicator exists (CPU runs).
pub fn wait_all() -> Result<(), CommError> {
    // A communicator finished at the clean end has nothing in flight, and one aborted has
    // had its error reported by whoever aborted it.
    for comm in live().into_iter().filter(|comm| !comm.is_closed()) {
        comm.wait_idle()?;
    }
    Ok(())
}

fn watchdog(device: usize) {
    // Event queries work from any thread; the device is set for anything CUDA does here.
    let _ = crate::cuda::set_device(device);
    loop {
        std::thread::sleep(WATCH_EVERY);
        WATCHDOG_ROUND.store(millis_since_origin(), Ordering::Relaxed);
        for comm in live() {
            // Finished, or aborted by a host wait that reports the error itself.
            if comm.is_closed() {
                continue;
            }
            let overdue = || {
                comm.overdue(Instant::now()).map(|(what, secs)| {
                    format!(
                        "NCCL {what} on {} has not completed after {secs} s (a peer died or \
                         hangs, or the network failed)",
                        comm.label
                    )
                })
            };
            let problem = match comm.calls.try_lock() {
                Ok(_calls) => comm.query_state().err().map(|e| e.to_string()),
                Err(std::sync::TryLockError::Poisoned(_calls)) => {
                    comm.query_state().err().map(|e| e.to_string())
                }
                // In use by the training thread (which has deadlines of its own there).
                Err(std::sync::TryLockError::WouldBlock) => None,
            };
            // Completed collectives leave the queue (event queries, no NCCL call) before the
            // oldest is judged by host time.
            let problem = problem
                .or_else(|| comm.reap().err().map(|e| e.to_string()))
                .or_else(overdue);
            // Closed meanwhile (a clean finish, or an abort whose caller reports why).
            if let Some(problem) = problem.filter(|_| !comm.is_closed()) {
                crate::fail_fast::fail(&problem);
            }
        }
    }
}

/// Ends the process when the watchdog has not come round for longer than the longest
/// collective deadline.
fn monitor() {
    let mut woke = Instant::now();
    loop {
        std::thread::sleep(WATCH_EVERY);
        let slept = woke.elapsed();
        woke = Instant::now();
        if slept > 4 * WATCH_EVERY {
            // The process was stopped (a suspended Slurm job, SIGSTOP): the watchdog was
            // too. Give it a round from now rather than judge it by the pause.
            WATCHDOG_ROUND.store(millis_since_origin(), Ordering::Relaxed);
            continue;
        }
        let limit = Duration::from_millis(LONGEST_DEADLINE_MS.load(Ordering::Relaxed));
        let since = millis_since_origin().saturating_sub(WATCHDOG_ROUND.load(Ordering::Relaxed));
        if Duration::from_millis(since) > limit + WATCH_EVERY {
            crate::fail_fast::fail(&format!(
                "the NCCL watchdog has been stuck for {} s in a CUDA call (the GPU or its \
                 driver hangs?)",
                since / 1000
            ));
        }
    }
}

impl Comm {
    /// Finished or aborted: nothing more to watch.
    fn is_closed(&self) -> bool {
        *self.life.lock().unwrap_or_else(|e| e.into_inner()) != super::Life::Live
    }
}
