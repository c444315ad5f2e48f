//! The signals a job's controller acts on: those that cancel the job, SIGTERM (`scancel`,
//! `shardrun cancel`), SIGINT (Ctrl-C) and SIGHUP (a closed terminal or ssh session), and the
//! preemption notice, SIGUSR2.

use shardrun_protocol::messages::signal_name;
use std::fmt;
use std::sync::{Arc, Mutex};
use tokio::sync::mpsc;

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

/// Set by the batch script when a preemption notice (SIGUSR2) came during its set-up lines.
pub const NOTICE_IN_SETUP: &str = "SHARDRUN_NOTICE_IN_SETUP";

/// A signal the controller acts on: a stop (cancel) or a preemption notice (SIGUSR2, as Slurm
/// sends `signal_seconds` before the time limit or a preemption).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ControllerSignal {
    Stop(StopSignal),
    Preempt,
}

/// What is done with a signal: before the ranks are launched (the data is prepared), a stop
/// ends the process at once and a preemption notice is remembered; once the event loop has
/// taken the signals, each goes to it.
enum Route {
    BeforeLaunch {
        on_stop: Box<dyn Fn(StopSignal) + Send>,
        preempted: bool,
    },
    EventLoop(mpsc::UnboundedSender<ControllerSignal>),
}

/// The controller's signal handlers, installed once on its runtime for the whole life of the
/// process, so that no signal falls between two sets of handlers (tokio drops a signal that
/// no stream is waiting for). Stop signals and SIGUSR2 would otherwise end the process by
/// their default action, without a word.
pub struct Signals {
    route: Arc<Mutex<Route>>,
}

/// The signals as the event loop gets them.
pub struct HandedOver {
    pub signals: mpsc::UnboundedReceiver<ControllerSignal>,
    /// A preemption notice came before the event loop took the signals.
    pub preempted_before_launch: bool,
}

impl Signals {
    /// Installs the handlers on `runtime`. Until [`Signals::hand_over`], a stop signal calls
    /// `on_stop` (which records why) and ends the process with the signal's exit code: there
    /// is no rank to stop at a step boundary yet.
    pub fn install(
        runtime: &tokio::runtime::Runtime,
        on_stop: impl Fn(StopSignal) + Send + 'static,
    ) -> std::io::Result<Signals> {
        use tokio::signal::unix::{signal, SignalKind};
        let route = Arc::new(Mutex::new(Route::BeforeLaunch {
            on_stop: Box::new(on_stop),
            // The batch script's set-up lines took a notice that came before this process.
            preempted: std::env::var_os(NOTICE_IN_SETUP).is_some(),
        }));
        let _entered = runtime.enter();
        let kinds = handled()
            .map(|s| (s.number(), ControllerSignal::Stop(s)))
            .chain([(libc::SIGUSR2, ControllerSignal::Preempt)]);
        for (number, what) in kinds {
            let mut stream = signal(SignalKind::from_raw(number))?;
            let route = route.clone();
            runtime.spawn(async move {
                while stream.recv().await.is_some() {
                    let mut route = route.lock().unwrap_or_else(|e| e.into_inner());
                    match (&mut *route, what) {
                        (Route::BeforeLaunch { on_stop, .. }, ControllerSignal::Stop(stop)) => {
                            on_stop(stop);
                            std::process::exit(stop.exit_code());
                        }
                        (Route::BeforeLaunch { preempted, .. }, ControllerSignal::Preempt) => {
                            if !*preempted {
                                *preempted = true;
                                outln!(
                                    "shardrun: SIGUSR2 (a preemption or time-limit notice) while the data is \
                                     prepared: no rank will be started"
                                );
                            }
                        }
                        (Route::EventLoop(events), _) => {
                            if events.send(what).is_err() {
                                return;
                            }
                        }
                    }
                }
            });
        }
        Ok(Signals { route })
    }

    /// From now on every signal goes to the returned receiver; says whether a preemption
    /// notice came before.
    pub fn hand_over(self) -> HandedOver {
        let (sender, signals) = mpsc::unbounded_channel();
        let mut route = self.route.lock().unwrap_or_else(|e| e.into_inner());
        let before = std::mem::replace(&mut *route, Route::EventLoop(sender));
        HandedOver {
            signals,
            preempted_before_launch: matches!(
                before,
                Route::BeforeLaunch {
                    preempted: true,
                    ..
                }
            ),
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
