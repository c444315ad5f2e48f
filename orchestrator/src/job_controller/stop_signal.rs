//! The signals that cancel a job, as its controller receives them: SIGTERM (`scancel`,
//! `shardrun cancel`), SIGINT (Ctrl-C) and SIGHUP (a closed terminal or ssh session).

use shardrun_protocol::messages::signal_name;
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopSignal {
    Hangup,
    Interrupt,
    Terminate,
}

impl StopSignal {
    pub const ALL: [StopSignal; 3] = [
        StopSignal::Hangup,
        StopSignal::Interrupt,
        StopSignal::Terminate,
    ];

    pub fn number(self) -> i32 {
        match self {
            StopSignal::Hangup => libc::SIGHUP,
            StopSignal::Interrupt => libc::SIGINT,
            StopSignal::Terminate => libc::SIGTERM,
        }
    }

    /// `"SIGHUP"`, `"SIGINT"`, `"SIGTERM"`.
    pub fn name(self) -> &'static str {
        signal_name(self.number()).unwrap_or("signal")
    }

    /// The stop signal with this number (one a rank says stopped it), if it is one.
    pub fn from_number(number: i32) -> Option<StopSignal> {
        StopSignal::ALL.into_iter().find(|s| s.number() == number)
    }

    /// The exit status of a job it cancelled, as shells report a process it ended:
    /// 128 + its number.
    pub fn exit_code(self) -> i32 {
        128 + self.number()
    }

    /// Whether the same signal once more kills the ranks at once. A hangup comes more than
    /// once (from the kernel, then from the shell) and nobody is left to mean it twice.
    pub fn again_kills(self) -> bool {
        self != StopSignal::Hangup
    }
}

/// The stop signals a controller acts on: all three, except a SIGHUP ignored from the start
/// (`nohup`): that run was meant to outlive its terminal.
pub fn handled() -> impl Iterator<Item = StopSignal> {
    StopSignal::ALL
        .into_iter()
        .filter(|&s| s != StopSignal::Hangup || !ignored(s.number()))
}

/// Whether `signal` is ignored by this process (as `nohup` leaves SIGHUP).
fn ignored(signal: i32) -> bool {
    // SAFETY: a query only (no new action); `old` is written by the kernel.
    unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        libc::sigaction(signal, std::ptr::null(), &mut old) == 0
            && old.sa_sigaction == libc::SIG_IGN
    }
}

/// A preemption notice (SIGUSR2) that came before the event loop ran: it acts on it once it
/// does (the ranks are stopped at their first step boundary, as a running job's would be).
static EARLY_PREEMPTION: AtomicBool = AtomicBool::new(false);

/// Whether a preemption notice came before the event loop ran (once).
pub fn take_early_preemption() -> bool {
    EARLY_PREEMPTION.swap(false, Ordering::SeqCst)
}

/// While it lives, a stop signal ends the process at once, after `on_stop` has recorded
/// why: for the time before any rank starts (preparing the data), when there is nothing to
/// stop at a step boundary and the default action would end the process without a word. A
/// preemption notice (SIGUSR2, whose default action would end the process too) is kept for
/// the event loop.
pub struct ExitOnStop {
    runtime: Option<tokio::runtime::Runtime>,
}

impl ExitOnStop {
    pub fn install(on_stop: impl Fn(StopSignal) + Send + Sync + 'static) -> std::io::Result<Self> {
        use tokio::signal::unix::{signal, SignalKind};
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("stop-signals")
            .enable_all()
            .build()?;
        let on_stop = std::sync::Arc::new(on_stop);
        let _entered = runtime.enter();
        for stop in handled() {
            let mut stream = signal(SignalKind::from_raw(stop.number()))?;
            let on_stop = on_stop.clone();
            runtime.spawn(async move {
                if stream.recv().await.is_some() {
                    on_stop(stop);
                    std::process::exit(stop.exit_code());
                }
            });
        }
        let mut preemption = signal(SignalKind::user_defined2())?;
        runtime.spawn(async move {
            if preemption.recv().await.is_some() {
                EARLY_PREEMPTION.store(true, Ordering::SeqCst);
                outln!(
                    "shardrun: preemption notice (SIGUSR2) while the data is prepared: the \
                     ranks are stopped as soon as they start"
                );
            }
        });
        drop(_entered);
        Ok(ExitOnStop {
            runtime: Some(runtime),
        })
    }
}

impl Drop for ExitOnStop {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

impl fmt::Display for StopSignal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_numbers_and_exit_codes_are_the_shells() {
        let seen: Vec<_> = StopSignal::ALL
            .iter()
            .map(|s| (s.name(), s.number(), s.exit_code()))
            .collect();
        assert_eq!(
            seen,
            [("SIGHUP", 1, 129), ("SIGINT", 2, 130), ("SIGTERM", 15, 143)]
        );
        for signal in StopSignal::ALL {
            assert_eq!(StopSignal::from_number(signal.number()), Some(signal));
        }
        assert_eq!(StopSignal::from_number(libc::SIGKILL), None);
    }
}
