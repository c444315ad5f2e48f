//! Ctrl-C (SIGINT), a closed terminal (SIGHUP) or SIGTERM during a command that writes
//! something and ends (`prepare`, `export`): what it had begun writing is removed, and it
//! says so before it ends as the signal would (128 + its number). By the signals' default
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

/// The folders a stop removed, for its message: `a, b`.
pub fn listed(paths: &[std::path::PathBuf]) -> String {
    let shown: Vec<String> = paths.iter().map(|p| p.display().to_string()).collect();
    shown.join(", ")
}
