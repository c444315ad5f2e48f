//! Deadlines for NCCL work: every live communicator is registered here, with its collectives
//! in flight (completion event, what, when issued).
//!
//! * [`wait_all`]: the host waits for every collective issued so far, polling events and
//!   NCCL's asynchronous error; past the deadline the communicator is aborted and the wait
//!   fails naming the collective. Code that reads a device value on the host calls it first,
//!   so a dead peer gives an error instead of a read blocked forever.
//! * A watchdog thread does the same in the background for a rank blocked where no host wait
//!   covers it (inside libtorch): it reports the failure and ends the process (see
//!   [`crate::fail_fast`]), which also frees the peers.

use super::{Comm, CommError};
use crate::cuda::CudaEvent;
use std::sync::{Arc, Mutex, Once, Weak};
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

fn live() -> Vec<Arc<Comm>> {
    let mut all = LIVE.lock().unwrap_or_else(|e| e.into_inner());
    all.retain(|c| c.strong_count() > 0);
    all.iter().filter_map(Weak::upgrade).collect()
}

pub(super) fn register(comm: &Arc<Comm>) {
    LIVE.lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(Arc::downgrade(comm));
    static WATCHDOG: Once = Once::new();
    let device = comm.device;
    WATCHDOG.call_once(|| {
        let _ = std::thread::Builder::new()
            .name("nccl-watchdog".into())
            .spawn(move || watchdog(device));
    });
}

/// Waits on the host until every NCCL collective issued so far has completed, with each
/// communicator's deadline. Returns at once when no NCCL communicator exists (CPU runs).
pub fn wait_all() -> Result<(), CommError> {
    for comm in live() {
        comm.wait_idle()?;
    }
    Ok(())
}

fn watchdog(device: usize) {
    // Event queries work from any thread; the device is set for anything CUDA does here.
    let _ = crate::cuda::set_device(device);
    loop {
        std::thread::sleep(WATCH_EVERY);
        for comm in live() {
            // Finished, or aborted by a host wait that reports the error itself.
            if comm.is_closed() {
                continue;
            }
            let problem = match comm.state() {
                Err(e) => Some(e.to_string()),
                Ok(_) => comm.reap().err().map(|e| e.to_string()).or_else(|| {
                    comm.overdue(Instant::now()).map(|(what, secs)| {
                        format!(
                            "NCCL {what} on {} has not completed after {secs} s (a peer died \
                             or hangs, or the network failed)",
                            comm.label
                        )
                    })
                }),
            };
            if let Some(problem) = problem {
                crate::fail_fast::fail(&problem);
            }
        }
    }
}

impl Comm {
    /// Finished or aborted: nothing more to watch.
    fn is_closed(&self) -> bool {
        *self.life.lock().unwrap_or_else(|e| e.into_inner()) != super::Life::Live
    }
}
