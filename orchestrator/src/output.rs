//! What the commands print, through [`outln!`](crate::outln) and [`errln!`](crate::errln)
//! rather than `println!` and `eprintln!`, which panic when the stream is gone:
//! `shardrun run job.yaml | head -3` would end with a backtrace after training, and a
//! terminal closed under a run would end its controller at the next line it prints.
//!
//! A write that fails closes the stream for the rest of the process: nothing more is
//! printed to it, and loops that only print (`logs -f`) ask [`stdout_closed`] and end. A
//! command goes on with its work (a submission still records its job id). A closed pipe is
//! how a reader says it has read enough, so it ends the output quietly, as it does for
//! other Unix tools; any other failure (a full disk under `> file`) is [`stdout_failure`],
//! which `main` reports. SIGPIPE stays ignored: killing the process on it would kill a
//! run's controller mid-training.

use std::fmt;
use std::io::{self, Write};
use std::sync::OnceLock;

/// The first error writing to stdout; stdout is closed once it is set.
static STDOUT_ERROR: OnceLock<io::Error> = OnceLock::new();
/// Set once writing to stderr failed.
static STDERR_CLOSED: OnceLock<()> = OnceLock::new();

/// Writes to stdout and flushes, unless stdout is closed; a failure closes it.
pub fn write_stdout(args: fmt::Arguments<'_>) {
    if stdout_closed() {
        return;
    }
    let mut out = io::stdout().lock();
    if let Err(e) = out.write_fmt(args).and_then(|()| out.flush()) {
        let _ = STDOUT_ERROR.set(e);
    }
}

/// Bytes as they are (a log file's contents), as [`write_stdout`].
pub fn write_stdout_bytes(bytes: &[u8]) {
    if stdout_closed() {
        return;
    }
    let mut out = io::stdout().lock();
    if let Err(e) = out.write_all(bytes).and_then(|()| out.flush()) {
        let _ = STDOUT_ERROR.set(e);
    }
}

/// Writes to stderr unless a write to it failed before.
pub fn write_stderr(args: fmt::Arguments<'_>) {
    if STDERR_CLOSED.get().is_some() {
        return;
    }
    if io::stderr().lock().write_fmt(args).is_err() {
        let _ = STDERR_CLOSED.set(());
    }
}

/// Whether a write to stdout failed: nothing more reaches it.
pub fn stdout_closed() -> bool {
    STDOUT_ERROR.get().is_some()
}

/// The error stdout was closed by, unless it was a reader closing the pipe.
pub fn stdout_failure() -> Option<&'static io::Error> {
    STDOUT_ERROR
        .get()
        .filter(|e| e.kind() != io::ErrorKind::BrokenPipe)
}

/// `println!` that never panics (see [`crate::output`]).
#[macro_export]
macro_rules! outln {
    () => {
        $crate::output::write_stdout(format_args!("\n"))
    };
    ($($arg:tt)*) => {
        $crate::output::write_stdout(format_args!("{}\n", format_args!($($arg)*)))
    };
}

/// `print!` that never panics (see [`crate::output`]).
#[macro_export]
macro_rules! out {
    ($($arg:tt)*) => {
        $crate::output::write_stdout(format_args!($($arg)*))
    };
}

/// `eprintln!` that never panics (see [`crate::output`]).
#[macro_export]
macro_rules! errln {
    ($($arg:tt)*) => {
        $crate::output::write_stderr(format_args!("{}\n", format_args!($($arg)*)))
    };
}

/// `path` as one word of a command people paste into a shell (`shardrun plot '/runs/my
/// run'`): quoted when it holds anything a shell would split or expand.
pub fn pasteable(path: &std::path::Path) -> String {
    crate::sbatch::shell_quote(&path.to_string_lossy())
}

/// `items` as a sentence lists them, `last` joining the last two: `1, 2 or 4`, `its 1st
/// and 3rd`.
pub fn listed<T: std::fmt::Display>(items: &[T], last: &str) -> String {
    let words: Vec<String> = items.iter().map(T::to_string).collect();
    match words.split_last() {
        Some((final_word, rest)) if !rest.is_empty() => {
            format!("{} {last} {final_word}", rest.join(", "))
        }
        _ => words.concat(),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_path_a_shell_would_split_is_quoted_and_a_plain_one_is_not() {
        use std::path::Path;
        assert_eq!(super::pasteable(Path::new("/runs/demo-1")), "/runs/demo-1");
        assert_eq!(
            super::pasteable(Path::new("/runs/it's a run")),
            r"'/runs/it'\''s a run'"
        );
    }
}
