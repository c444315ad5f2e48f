//! Diagnostics for whoever debugs a job (a rendezvous that hangs, a slow checkpoint, a rank
//! that falls behind): `tracing` events and spans, written to stderr when `RUST_LOG` asks
//! for them (`RUST_LOG=debug`, `RUST_LOG=shardrun=trace`, ...) or `-v` (info), `-vv`
//! (debug), `-vvv` (trace). Without either nothing is installed and nothing is shown: the
//! lines people read (train.log, the console) are not these.
//!
//! `-v` sets `RUST_LOG` for everything this command starts too (the ranks of `shardrun run`,
//! the job `shardrun submit` hands to sbatch), so one flag turns on every process's
//! diagnostics; under a controller each rank writes its own to `logs/rank-N.debug.log`.

use tracing_subscriber::EnvFilter;

/// The `RUST_LOG` filter `-v` given `count` times stands for.
pub fn verbosity_filter(count: u8) -> Option<&'static str> {
    match count {
        0 => None,
        1 => Some("info"),
        2 => Some("debug"),
        _ => Some("trace"),
    }
}

/// Installs the stderr subscriber if `-v` or `RUST_LOG` asks for one; `-v` wins over
/// `RUST_LOG`. Call first thing in `main`, while the process has one thread (it may set
/// `RUST_LOG` for the children).
pub fn init(verbose: u8) {
    if let Some(filter) = verbosity_filter(verbose) {
        // Single-threaded still: nothing reads the environment concurrently.
        std::env::set_var("RUST_LOG", filter);
    }
    let Some(filter) = filter_from_env() else {
        return;
    };
    use std::io::IsTerminal;
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .try_init();
}

/// `RUST_LOG` as a filter; `None` when it is unset, empty, or turns everything off. A
/// filter that does not parse is said once on stderr and ignored.
fn filter_from_env() -> Option<EnvFilter> {
    let spec = std::env::var("RUST_LOG").ok()?;
    if spec.trim().is_empty() {
        return None;
    }
    match EnvFilter::try_new(&spec) {
        Ok(filter) => (filter.max_level_hint() != Some(tracing::level_filters::LevelFilter::OFF))
            .then_some(filter),
        Err(e) => {
            errln!("shardrun: RUST_LOG={spec:?} is not a filter ({e}); diagnostics are off");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_v_shows_more() {
        assert_eq!(verbosity_filter(0), None);
        assert_eq!(verbosity_filter(1), Some("info"));
        assert_eq!(verbosity_filter(2), Some("debug"));
        assert_eq!(verbosity_filter(5), Some("trace"));
    }
}
