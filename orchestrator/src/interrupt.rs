//! Ctrl-C (SIGINT), a closed terminal (SIGHUP) or SIGTERM during a command that writes
//! something and ends (`prepare`, `export`): what it had begun writing is removed, and it
//! says so before it ends as the signal would (128 + its number); during `sweep`, it says
//! what stands and how to finish ([`note_on_stop`]). By the signals' default
//! action it would end at once, without a word, leaving a hidden half-written folder (as big
//! as the model, for an export) until the next run to the same place.

use crate::job_controller::stop_signal::{self, StopSignal};
use futures::future::select_all;
use std::sync::atomic::{AtomicBool, Ordering};
use tokio::signal::unix::{signal, SignalKind};

/// Set once a stop signal came: the process ends through [`on_stop`]'s thread.
static STOPPING: AtomicBool = AtomicBool::new(false);

/// Never returns once a stop signal came, so that the signal's ending (its message, its exit
/// status) is the process's, not the error of a write whose folder the stop removed.
pub fn wait_if_stopping() {
    while STOPPING.load(Ordering::SeqCst) {
        std::thread::park();
    }
}

/// From now on a stop signal runs `abandon` (which removes what was begun and says what it
/// removed, if anything), says that `doing` stopped, and ends the process. A SIGHUP ignored
/// from the start (`nohup`) stays ignored.
pub fn on_stop(
    doing: &'static str,
    abandon: impl FnOnce() -> Option<String> + Send + 'static,
) -> std::io::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    // Registered here, before returning, so that no signal falls before the watch.
    let mut streams = Vec::new();
    {
        let _entered = runtime.enter();
        for stop in stop_signal::handled() {
            streams.push((stop, signal(SignalKind::from_raw(stop.number()))?));
        }
    }
    std::thread::Builder::new()
        .name("stop-signals".into())
        .spawn(move || {
            let stop: StopSignal = runtime.block_on(async move {
                let waits = streams.iter_mut().map(|(stop, stream)| {
                    Box::pin(async move {
                        stream.recv().await;
                        *stop
                    })
                });
                select_all(waits).await.0
            });
            STOPPING.store(true, Ordering::SeqCst);
            let removed = abandon();
            errln!(
                "shardrun: {stop}: {doing} stopped{}",
                removed.map(|r| format!("; {r}")).unwrap_or_default()
            );
            std::process::exit(stop.exit_code());
        })?;
    Ok(())
}

/// Said once, in the signal handler: the note of each stop signal, made beforehand.
static NOTES: std::sync::OnceLock<Vec<(libc::c_int, Vec<u8>)>> = std::sync::OnceLock::new();

/// For a command that may end anywhere and is picked up where it ended (`sweep`, whose
/// journal says what it left): a stop signal ends it at once, as by default (no later step
/// of the command runs, such as handling the failure of a child the same Ctrl-C ended), after
/// a line saying that `doing` stopped and `note`. A SIGHUP ignored from the start stays
/// ignored.
pub fn note_on_stop(doing: &str, note: &str) {
    let notes = stop_signal::handled()
        .map(|stop| {
            let line = format!("\nshardrun: {stop}: {doing} stopped; {note}\n");
            (stop.number(), line.into_bytes())
        })
        .collect();
    if NOTES.set(notes).is_err() {
        return;
    }
    for (signal, _) in NOTES.get().into_iter().flatten() {
        // SAFETY: a handler that only writes a buffer made above and raises the signal again;
        // SA_RESETHAND makes that second delivery the default action.
        unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = say_and_end as extern "C" fn(libc::c_int) as usize;
            action.sa_flags = libc::SA_RESETHAND;
            libc::sigemptyset(&mut action.sa_mask);
            libc::sigaction(*signal, &action, std::ptr::null_mut());
        }
    }
}

extern "C" fn say_and_end(signal: libc::c_int) {
    let note = NOTES
        .get()
        .and_then(|notes| notes.iter().find(|(s, _)| *s == signal));
    // SAFETY: write(2) and raise(3) are async-signal-safe; the note lives as long as the
    // process. The raised signal is delivered as this handler returns, by default: the
    // process ends by it.
    unsafe {
        if let Some((_, line)) = note {
            libc::write(libc::STDERR_FILENO, line.as_ptr().cast(), line.len());
        }
        libc::raise(signal);
    }
}

/// The folders a stop removed, for its message: `a, b`.
pub fn listed(paths: &[std::path::PathBuf]) -> String {
    let shown: Vec<String> = paths.iter().map(|p| p.display().to_string()).collect();
    shown.join(", ")
}
