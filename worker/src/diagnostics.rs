//! A rank's diagnostics for whoever debugs a job: `tracing` events and spans (rendezvous
//! addresses, communicator set-up, collectives, checkpoint phases, stops), shown only when
//! `RUST_LOG` asks for them. Under a controller they go to `<run dir>/logs/rank-N.debug.log`
//! (train.log and the console carry the rank's own lines, not these), written by the rank
//! itself so that a rank that never reaches the controller still says what it tried. A
//! standalone rank writes them to stderr.
//!
//! Without `RUST_LOG` no subscriber is installed: every event and span of the hot path is
//! then one relaxed load of the global level and a branch.

use shardrun_protocol::env;
use std::path::PathBuf;
use tracing_subscriber::EnvFilter;

/// Where this rank's diagnostics go when enabled.
pub fn destination(rank: u64) -> Option<PathBuf> {
    std::env::var_os(env::CONTROLLER_ADDR)?;
    let run_dir = std::env::var_os(env::RUN_DIR)?;
    Some(env::rank_debug_log(std::path::Path::new(&run_dir), rank))
}

/// Installs the subscriber `RUST_LOG` asks for, if any. A filter that does not parse, or a
/// debug log that cannot be opened, is said once on stderr; training goes on without.
pub fn init(rank: u64) {
    let Ok(spec) = std::env::var("RUST_LOG") else {
        return;
    };
    if spec.trim().is_empty() {
        return;
    }
    let filter = match EnvFilter::try_new(&spec) {
        Ok(filter) => filter,
        Err(e) => {
            eprintln!(
                "shardrun-worker: RUST_LOG={spec:?} is not a filter ({e}); diagnostics are off"
            );
            return;
        }
    };
    if filter.max_level_hint() == Some(tracing::level_filters::LevelFilter::OFF) {
        return;
    }
    let builder = tracing_subscriber::fmt().with_env_filter(filter);
    let _ = match destination(rank) {
        Some(path) => {
            let opened = path
                .parent()
                .map_or(Ok(()), std::fs::create_dir_all)
                .and_then(|()| {
                    std::fs::OpenOptions::new()
                        .create(true)
                        .append(true)
                        .open(&path)
                });
            match opened {
                // Unbuffered: each event is one write, so a rank killed right after loses
                // nothing it said.
                Ok(file) => builder
                    .with_writer(std::sync::Mutex::new(file))
                    .with_ansi(false)
                    .try_init(),
                Err(e) => {
                    eprintln!(
                        "shardrun-worker: cannot open {} ({e}); diagnostics are off",
                        path.display()
                    );
                    return;
                }
            }
        }
        None => builder
            .with_writer(std::io::stderr)
            .with_ansi(false)
            .try_init(),
    };
}
