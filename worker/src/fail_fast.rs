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
use std::sync::atomic::{AtomicBool, Ordering};
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
///
/// The controller is told first, and only then is the default message (with a backtrace
/// under `RUST_BACKTRACE`) printed, except out of memory: printing a backtrace then can
/// itself fail to allocate, and Rust's allocation-failure handler waits for the backtrace
/// lock the printer holds, for ever, while the heartbeat thread would go on saying all is
/// well. The heartbeat stops either way.
pub fn install_panic_hook() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        FAILING.store(true, Ordering::SeqCst);
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
        let oom = out_of_memory(&what);
        let fix = match oom {
            true => format!("\n  fix: {OUT_OF_MEMORY_FIX}"),
            false => String::new(),
        };
        let error = format!("panicked in thread {name}: {}{at}{fix}", readable(&what));
        report(&error, None);
        // Out of memory, the backtrace says nothing the message does not, and printing it
        // is what can hang.
        if !oom {
            default(info);
        }
        exit_failed()
    }));
}

/// libtorch's words for an allocation that failed: CUDA's caching allocator, and the CPU
/// allocator's `DefaultCPUAllocator: can't allocate memory`.
fn out_of_memory(message: &str) -> bool {
    let lower = message.to_ascii_lowercase();
    lower.contains("out of memory") || lower.contains("can't allocate memory")
}

/// What to change when a rank runs out of memory.
const OUT_OF_MEMORY_FIX: &str = "a smaller training.batch_size_per_device (gradient \
    accumulation grows to keep total_batch_size), training.fsdp.activation_checkpointing: \
    true, a shorter training.data.seq_len, or more ranks to shard over; `shardrun plan` \
    estimates the peak per rank";

/// A panic's message as people should read it: a libtorch error as `libtorch: <what it
/// said>`, without the `unwrap()` around it and its C++ frames (dozens of lines), and out of
/// memory named as such.
pub fn readable(message: &str) -> String {
    // tch's errors come through `unwrap()`'s Debug formatting, their line breaks written
    // as `\n`: the frames are cut where they start, and the breaks before them with them.
    let end = ["Exception raised from", "frame #0"]
        .iter()
        .filter_map(|marker| message.find(marker))
        .min()
        .unwrap_or(message.len());
    let mut text = message[..end].trim_end();
    while let Some(shorter) = text.strip_suffix("\\n") {
        text = shorter.trim_end();
    }
    let text = text
        .strip_prefix("called `Result::unwrap()` on an `Err` value: ")
        .unwrap_or(text);
    let text = match text.strip_prefix("Torch(\"") {
        Some(said) => format!("libtorch: {}", said.trim_end_matches("\")")),
        None => text.to_string(),
    };
    match out_of_memory(&text) {
        true => format!("out of memory: {text}"),
        false => text,
    }
}

static FAILING: AtomicBool = AtomicBool::new(false);

/// A failure is being reported: the heartbeat stops, so that a rank that cannot finish
/// leaving (a deadlock out of memory) is found by its silence.
pub fn failing() -> bool {
    FAILING.load(Ordering::SeqCst)
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
    FAILING.store(true, Ordering::SeqCst);
    report(error, peer);
    exit_failed()
}

/// Says `error` on stderr and to the controller when one is connected.
fn report(error: &str, peer: Option<usize>) {
    let mut stderr = std::io::stderr().lock();
    let _ = writeln!(stderr, "shardrun-worker: error: {error}");
    let _ = stderr.flush();
    drop(stderr);
    if let Some(report) = REPORTER.get() {
        report(error, peer);
    }
}

fn exit_failed() -> ! {
    // SAFETY: _exit ends the process immediately; what was written to sockets and pipes
    // is delivered by the kernel.
    unsafe { libc::_exit(EXIT_FAILED) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn libtorch_errors_lose_their_cpp_frames_and_out_of_memory_is_named() {
        let cpu = "called `Result::unwrap()` on an `Err` value: Torch(\"[enforce fail at \
                   alloc_cpu.cpp:127] data. DefaultCPUAllocator: can't allocate memory: you \
                   tried to allocate 5795635 bytes. Error code 12 (Cannot allocate memory)\\n\
                   frame #0: c10::ThrowEnforceNotMet(char const*, int) + 0x73 (0x7f in \
                   libc10.so)\\nframe #1: c10::alloc_cpu(unsigned long) + 0x3b0\")";
        assert_eq!(
            readable(cpu),
            "out of memory: libtorch: [enforce fail at alloc_cpu.cpp:127] data. \
             DefaultCPUAllocator: can't allocate memory: you tried to allocate 5795635 bytes. \
             Error code 12 (Cannot allocate memory)"
        );
        let cuda = "called `Result::unwrap()` on an `Err` value: Torch(\"CUDA out of memory. \
                    Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.11 GiB of \
                    which 1.20 GiB is free.\\nException raised from malloc at \
                    CUDACachingAllocator.cpp:1135 (most recent call first):\\nframe #0: \
                    c10::Error::Error\")";
        assert_eq!(
            readable(cuda),
            "out of memory: libtorch: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 \
             has a total capacity of 79.11 GiB of which 1.20 GiB is free."
        );
        let shapes = "Torch(\"mat1 and mat2 shapes cannot be multiplied (4x16 and 32x16)\n\
                      Exception raised from meta at Linear.cpp:12\")";
        assert_eq!(
            readable(shapes),
            "libtorch: mat1 and mat2 shapes cannot be multiplied (4x16 and 32x16)"
        );
        let short = "called `Result::unwrap()` on an `Err` value: Torch(\"invalid device\")";
        assert_eq!(readable(short), "libtorch: invalid device");
        assert_eq!(readable("index out of range"), "index out of range");
    }
}
