//! Fail fast: a rank that hits an error, panics, or finds a collective past its deadline tells
//! the controller why and leaves at once, without collective teardown.
//!
//! Its peers may be blocked inside a collective with it. A clean teardown (`ncclCommDestroy`,
//! which NCCL documents as collective; joining threads; destructors that synchronise the
//! GPU) would wait for them and hang the whole job until its time limit. Exiting instead
//! closes this rank's sockets and GPU context; the controller, told of the failure, stops the
//! other ranks.
//!
//! `main` installs the reporter (the controller connection) and the panic hook; tch panics
//! on CUDA out-of-memory, so panics are failures like any other.

use std::io::Write;
use std::sync::OnceLock;

/// Exit status of a rank that failed.
pub const EXIT_FAILED: i32 = 1;

/// Reports an error, with the peer rank it follows from where one is known.
type Report = Box<dyn Fn(&str, Option<usize>) + Send + Sync>;

static REPORTER: OnceLock<Report> = OnceLock::new();

/// Where failures are reported before exiting (the controller); the first call wins.
pub fn report_to(report: impl Fn(&str, Option<usize>) + Send + Sync + 'static) {
    let _ = REPORTER.set(Box::new(report));
}

/// Panics anywhere in the process (any thread) report and exit instead of unwinding into
/// destructors that may wait on peers.
pub fn install_panic_hook() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        default(info);
        let what = info
            .payload()
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| info.payload().downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "a panic without a message".to_string());
        let at = info
            .location()
            .map(|l| format!(" at {}:{}", l.file(), l.line()))
            .unwrap_or_default();
        let thread = std::thread::current();
        let name = thread.name().unwrap_or("unnamed");
        fail(&format!("panicked in thread {name}: {what}{at}"));
    }));
}

/// Reports `error` (to the controller when one is connected, and on stderr) and ends the
/// process now: no destructor, no atexit handler runs.
pub fn fail(error: &str) -> ! {
    fail_because_of(error, None)
}

/// [`fail`] for an error that follows from peer rank `peer`'s (it closed the connection,
/// aborted the collective, or never joined it): the controller then blames that rank when
/// its own report comes, whichever arrives first.
pub fn fail_because_of(error: &str, peer: Option<usize>) -> ! {
    let mut stderr = std::io::stderr().lock();
    let _ = writeln!(stderr, "shardrun-worker: error: {error}");
    let _ = stderr.flush();
    if let Some(report) = REPORTER.get() {
        report(error, peer);
    }
    // SAFETY: _exit ends the process immediately; what was written to sockets and pipes
    // is delivered by the kernel.
    unsafe { libc::_exit(EXIT_FAILED) }
}
