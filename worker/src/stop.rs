//! Stopping a rank cleanly. A stop is asked for by a signal to this process (SIGINT,
//! SIGTERM), by the controller (the job was cancelled, another rank failed, preemption), or
//! by losing the controller. Asking only raises a flag in the process's [`StopSwitch`]: the
//! training loop reads it at the next step boundary, where the ranks agree with one
//! all-reduce, so every rank stops after the same step, and the main thread returns and
//! exits normally.
//!
//! Nothing here exits the process. An exit from another thread while the main thread is
//! inside libtorch runs libtorch's static destructors under it, which is how an interrupted
//! run used to end with every rank panicking ("Invalid (backend, op) pair") and a backtrace.
//! The one exception is a second SIGINT, which terminates at once (the default action), as
//! a second Ctrl-C does under torchrun. SIGTERM never does: Slurm sends it more than once
//! (to the task, and again through srun) and escalates to SIGKILL by itself.
//!
//! A rank that is a task of a Slurm job step reads SIGTERM as Slurm's notice
//! ([`Sigterm::Checkpoint`]): a preempted job's tasks get it at the start of the partition's
//! grace time, the batch script (the controller) does not, and the job is then killed. The
//! ranks checkpoint at the next step boundary and stop as preempted, and the controller
//! requeues the job, as for SIGUSR2. When the whole job is cancelled (`scancel`), the
//! controller gets SIGTERM too and asks the ranks for the same checkpoint
//! ([`StopSwitch::request_checkpoint_then_stop`]), then a stop: whichever of the two SIGTERMs
//! reaches a rank first, the job ends cancelled at the step of a checkpoint it wrote.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::Duration;

pub use shardrun_protocol::messages::{StopReason, EXIT_STOPPED};

/// What the training loop is asked to do at its next step boundary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StopRequest {
    /// Checkpoint, then stop (Slurm's time limit or preemption ahead).
    Preempt,
    /// Stop without a checkpoint: the run resumes from its last one.
    Stop(StopReason),
}

impl StopRequest {
    /// A number the ranks reduce with `max` to agree: a stop outranks a preemption (a stop
    /// asks for no checkpoint; a cancel under Slurm that wants one asks as a preemption
    /// does, [`StopSwitch::request_checkpoint_then_stop`]), both outrank carrying on.
    pub fn code(request: Option<&StopRequest>) -> f64 {
        match request {
            None => 0.0,
            Some(StopRequest::Preempt) => 1.0,
            Some(StopRequest::Stop(_)) => 2.0,
        }
    }

    /// The agreed request from the reduced code; `own` is this rank's request, which gives
    /// the cause when it is the one that won.
    pub fn agreed(code: f64, own: Option<StopRequest>) -> Option<StopRequest> {
        if code >= 2.0 {
            Some(match own {
                Some(StopRequest::Stop(cause)) => StopRequest::Stop(cause),
                _ => StopRequest::Stop(StopReason::Peer),
            })
        } else if code >= 1.0 {
            Some(StopRequest::Preempt)
        } else {
            None
        }
    }
}

/// The flags a stop request raises. Cheap to read: the training loop reads it every step.
#[derive(Debug, Default)]
pub struct StopSwitch {
    preempt: AtomicBool,
    /// The signal that asked for the preemption (0: the controller did); written by the
    /// signal handler.
    preempt_signal: AtomicUsize,
    /// The first stop signal's number (0: none); written by the signal handler.
    signal: Arc<AtomicUsize>,
    asked: Mutex<Asked>,
    /// Notified when `asked` changes.
    asked_changed: Condvar,
}

/// What the controller (or a lost connection) asked, besides signals.
#[derive(Debug, Default)]
struct Asked {
    /// A stop at the next step boundary, without a checkpoint.
    stop: Option<StopReason>,
    /// A stop right after the checkpoint that a preemption writes.
    after_checkpoint: Option<StopReason>,
    /// The controller took the job's notice for a preemption (a SIGUSR2, or Slurm requeueing
    /// the job): Slurm's SIGTERM to this rank is not a cancel's, and no word of one comes.
    preempted: bool,
}

impl StopSwitch {
    pub fn new() -> StopSwitch {
        StopSwitch::default()
    }

    /// The controller's preemption request ([`shardrun_protocol::ToWorker::Preempt`]): a
    /// checkpoint and a stop, and the word that the job is preempted, not cancelled.
    pub fn controller_preempts(&self) {
        let mut asked = self.asked();
        asked.preempted = true;
        self.preempt.store(true, Ordering::SeqCst);
        self.asked_changed.notify_all();
    }

    /// The signal that asked this rank to checkpoint and stop, when one did.
    pub fn preempt_signal(&self) -> Option<i32> {
        match self.preempt_signal.load(Ordering::SeqCst) {
            0 => None,
            signal => Some(signal as i32),
        }
    }

    /// Asks for a stop; the first cause asked for is the one reported.
    pub fn request_stop(&self, cause: StopReason) {
        if let StopReason::Signal { signal } = cause {
            let _ = self.signal.compare_exchange(
                0,
                signal as usize,
                Ordering::SeqCst,
                Ordering::SeqCst,
            );
            return;
        }
        let mut asked = self.asked();
        asked.stop.get_or_insert(cause);
        self.asked_changed.notify_all();
    }

    /// Asks for a checkpoint at the next step boundary, as a preemption does, and for a stop
    /// for `cause` once it is written ([`StopSwitch::stop_after_checkpoint`]).
    pub fn request_checkpoint_then_stop(&self, cause: StopReason) {
        let mut asked = self.asked();
        asked.after_checkpoint.get_or_insert(cause);
        self.preempt.store(true, Ordering::SeqCst);
        self.asked_changed.notify_all();
    }

    /// Why this rank stops after the checkpoint it wrote for a preemption, rather than
    /// ending as preempted: the controller asked for the checkpoint and then a stop, or asked
    /// for a stop while Slurm's SIGTERM had asked for the checkpoint (then waiting up to
    /// `timeout` for the controller's word, usually in flight). `None`: a preemption.
    pub fn stop_after_checkpoint(&self, timeout: Duration) -> Option<StopReason> {
        let asked = self.asked();
        // Only Slurm's SIGTERM may be a cancel's; a SIGUSR2 is a notice.
        if self.preempt_signal() != Some(libc::SIGTERM) {
            return asked.after_checkpoint.clone();
        }
        let (asked, _) = self
            .asked_changed
            .wait_timeout_while(asked, timeout, |a| {
                a.stop.is_none() && a.after_checkpoint.is_none() && !a.preempted
            })
            .unwrap_or_else(|e| e.into_inner());
        asked
            .after_checkpoint
            .clone()
            .or_else(|| asked.stop.clone())
    }

    /// The stop the controller asked for after the checkpoint, if it has yet.
    pub fn asked_after_checkpoint(&self) -> Option<StopReason> {
        self.asked().after_checkpoint.clone()
    }

    fn asked(&self) -> std::sync::MutexGuard<'_, Asked> {
        self.asked.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// This rank's own stop cause, waiting up to `timeout` for one to arrive. When the ranks
    /// agree to stop because another rank was asked, the controller's request to this rank
    /// (it asks every rank) is usually still in flight: waiting for it lets each rank say why
    /// in its own words. A signal to one rank alone never arrives here: then `None`.
    pub fn wait_for_cause(&self, timeout: Duration) -> Option<StopReason> {
        if let Some(StopRequest::Stop(cause)) = self.requested() {
            return Some(cause);
        }
        let (asked, _) = self
            .asked_changed
            .wait_timeout_while(self.asked(), timeout, |a| a.stop.is_none())
            .unwrap_or_else(|e| e.into_inner());
        asked.stop.clone()
    }

    /// The strongest request so far: a stop (a signal first), else a preemption.
    pub fn requested(&self) -> Option<StopRequest> {
        match self.signal.load(Ordering::SeqCst) {
            0 => {}
            signal => {
                return Some(StopRequest::Stop(StopReason::Signal {
                    signal: signal as i32,
                }))
            }
        }
        if let Some(cause) = self.asked().stop.clone() {
            return Some(StopRequest::Stop(cause));
        }
        self.preempt
            .load(Ordering::SeqCst)
            .then_some(StopRequest::Preempt)
    }
}

/// The switch of this process, shared by the signal handlers, the controller client and the
/// training loop.
pub fn process() -> &'static StopSwitch {
    static SWITCH: OnceLock<StopSwitch> = OnceLock::new();
    SWITCH.get_or_init(StopSwitch::new)
}

/// What SIGTERM asks of this rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sigterm {
    /// Stop with the other ranks at the next step boundary (local and torchrun-style runs).
    Stop,
    /// Checkpoint at the next step boundary, then stop as preempted: the rank is a task of a
    /// Slurm job step, where SIGTERM is Slurm's notice of preemption or of the job's end.
    Checkpoint,
}

impl Sigterm {
    /// From the environment: srun gives its tasks `SLURM_STEP_ID`.
    pub fn from_env() -> Sigterm {
        Sigterm::for_step_id(std::env::var("SLURM_STEP_ID").ok().as_deref())
    }

    fn for_step_id(step_id: Option<&str>) -> Sigterm {
        match step_id {
            Some(id) if !id.trim().is_empty() => Sigterm::Checkpoint,
            _ => Sigterm::Stop,
        }
    }
}

/// SIGINT asks [`process`]'s switch for a stop, and so does SIGTERM unless it asks for a
/// checkpoint first ([`Sigterm`]); a second SIGINT terminates.
pub fn install_signal_handlers(sigterm: Sigterm) -> std::io::Result<()> {
    let switch = process();
    // SIGUSR2 is the job's `--signal` notice; `scancel --signal=USR2` without `--batch` sends
    // it to the ranks rather than to the batch script.
    let notices = match sigterm {
        Sigterm::Checkpoint => &[libc::SIGTERM, libc::SIGUSR2][..],
        Sigterm::Stop => &[libc::SIGUSR2][..],
    };
    for &signal in notices {
        // SAFETY: the action is two atomic stores, which are async-signal-safe.
        unsafe {
            signal_hook::low_level::register(signal, move || {
                switch
                    .preempt_signal
                    .store(signal as usize, Ordering::SeqCst);
                switch.preempt.store(true, Ordering::SeqCst);
            })?;
        }
    }
    let first = switch.signal.clone();
    let stopping = match sigterm {
        Sigterm::Stop => &[libc::SIGINT, libc::SIGTERM][..],
        Sigterm::Checkpoint => &[libc::SIGINT][..],
    };
    for &signal in stopping {
        let first = first.clone();
        // SAFETY: the action is one atomic compare-exchange, which is async-signal-safe.
        unsafe {
            signal_hook::low_level::register(signal, move || {
                let _ =
                    first.compare_exchange(0, signal as usize, Ordering::SeqCst, Ordering::SeqCst);
            })?;
        }
    }
    // Registered before the flag is set below, so it sees the state before this SIGINT.
    let interrupted = Arc::new(AtomicBool::new(false));
    signal_hook::flag::register_conditional_default(libc::SIGINT, interrupted.clone())?;
    signal_hook::flag::register(libc::SIGINT, interrupted)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stop_outranks_a_preemption_and_the_first_cause_is_kept() {
        let switch = StopSwitch::new();
        assert_eq!(switch.requested(), None);
        switch.controller_preempts();
        assert_eq!(switch.requested(), Some(StopRequest::Preempt));
        switch.request_stop(StopReason::Controller {
            reason: "the job was cancelled".into(),
        });
        switch.request_stop(StopReason::LostController {
            why: "reset".into(),
        });
        assert_eq!(
            switch.requested(),
            Some(StopRequest::Stop(StopReason::Controller {
                reason: "the job was cancelled".into()
            }))
        );
        switch.request_stop(StopReason::Signal {
            signal: libc::SIGTERM,
        });
        switch.request_stop(StopReason::Signal {
            signal: libc::SIGINT,
        });
        assert_eq!(
            switch.requested(),
            Some(StopRequest::Stop(StopReason::Signal {
                signal: libc::SIGTERM
            }))
        );
    }

    #[test]
    fn sigterm_asks_a_slurm_task_for_a_checkpoint_and_anyone_else_for_a_stop() {
        assert_eq!(Sigterm::for_step_id(Some("0")), Sigterm::Checkpoint);
        assert_eq!(Sigterm::for_step_id(Some("3")), Sigterm::Checkpoint);
        assert_eq!(Sigterm::for_step_id(None), Sigterm::Stop);
        assert_eq!(Sigterm::for_step_id(Some("")), Sigterm::Stop);
    }

    #[test]
    fn a_cause_arriving_from_another_thread_ends_the_wait() {
        let switch = Arc::new(StopSwitch::new());
        assert_eq!(switch.wait_for_cause(Duration::from_millis(10)), None);
        let from_reader = switch.clone();
        let reader = std::thread::spawn(move || {
            from_reader.request_stop(StopReason::Controller {
                reason: "rank 1 failed".into(),
            })
        });
        assert_eq!(
            switch.wait_for_cause(Duration::from_secs(600)),
            Some(StopReason::Controller {
                reason: "rank 1 failed".into()
            })
        );
        reader.join().unwrap();
    }

    #[test]
    fn the_controllers_preemption_ends_the_wait_for_a_cancels_word() {
        // Slurm's SIGTERM asked for the checkpoint; the controller, told by Slurm that the
        // job is requeued, says it is a preemption: no cancel is coming, so no wait for one.
        let switch = Arc::new(StopSwitch::new());
        switch
            .preempt_signal
            .store(libc::SIGTERM as usize, Ordering::SeqCst);
        let from_reader = switch.clone();
        let reader = std::thread::spawn(move || from_reader.controller_preempts());
        // Without the controller's word the wait would run its whole timeout.
        let timeout = Duration::from_secs(30);
        let waited = std::time::Instant::now();
        assert_eq!(switch.stop_after_checkpoint(timeout), None);
        assert!(waited.elapsed() < timeout);
        assert_eq!(switch.requested(), Some(StopRequest::Preempt));
        reader.join().unwrap();
    }

    #[test]
    fn a_cancel_that_asks_for_a_checkpoint_first_does_not_outrank_it() {
        let cancelled = StopReason::Controller {
            reason: "the job was cancelled (SIGTERM)".into(),
        };
        let switch = StopSwitch::new();
        assert_eq!(switch.stop_after_checkpoint(Duration::from_secs(600)), None);
        // A SIGUSR2 to the rank is a notice: nothing to wait for.
        switch
            .preempt_signal
            .store(libc::SIGUSR2 as usize, Ordering::SeqCst);
        assert_eq!(switch.stop_after_checkpoint(Duration::from_secs(600)), None);
        switch.request_checkpoint_then_stop(cancelled.clone());
        // The ranks agree on a checkpoint, not on a stop without one.
        assert_eq!(switch.requested(), Some(StopRequest::Preempt));
        assert_eq!(
            switch.stop_after_checkpoint(Duration::from_secs(600)),
            Some(cancelled.clone())
        );

        // Slurm's SIGTERM to the rank asked for the checkpoint first: the controller's word,
        // arriving while it is written, turns the preemption into the cancel it was.
        let switch = Arc::new(StopSwitch::new());
        switch
            .preempt_signal
            .store(libc::SIGTERM as usize, Ordering::SeqCst);
        // As the signal handler raises it.
        switch.preempt.store(true, Ordering::SeqCst);
        assert_eq!(
            switch.stop_after_checkpoint(Duration::from_millis(10)),
            None
        );
        let from_reader = switch.clone();
        let reader = {
            let cancelled = cancelled.clone();
            std::thread::spawn(move || from_reader.request_checkpoint_then_stop(cancelled))
        };
        assert_eq!(
            switch.stop_after_checkpoint(Duration::from_secs(600)),
            Some(cancelled)
        );
        reader.join().unwrap();
    }

    #[test]
    fn ranks_agree_on_the_strongest_request() {
        let preempt = Some(StopRequest::Preempt);
        assert_eq!(
            StopRequest::agreed(2.0, preempt.clone()),
            Some(StopRequest::Stop(StopReason::Peer))
        );
        assert_eq!(StopRequest::agreed(1.0, None), preempt);
        assert_eq!(StopRequest::agreed(0.0, None), None);
        let own = StopRequest::Stop(StopReason::Signal {
            signal: libc::SIGINT,
        });
        assert_eq!(StopRequest::agreed(2.0, Some(own.clone())), Some(own));
        assert_eq!(
            StopReason::Signal {
                signal: libc::SIGINT
            }
            .exit_code(),
            130
        );
        assert_eq!(
            StopReason::Signal {
                signal: libc::SIGTERM
            }
            .exit_code(),
            143
        );
        assert_eq!(StopReason::Peer.exit_code(), EXIT_STOPPED);
    }
}
