//! How the process ends: the exit statuses scripts can rely on, and the error types a
//! command attaches to choose one. Below both the command line (`cli`) and the commands, so
//! that commands depend on it and not on the command line.

/// Exit statuses scripts can rely on (docs/cli.md): 0 success; [`EXIT_FAILURE`] for any
/// error said on stderr (a failed job included); [`EXIT_USAGE`] for a command line clap
/// refuses; [`EXIT_NO_RUN`] when the path given holds no run directory; 130 and 143 for a
/// job cancelled by SIGINT or SIGTERM (`run`, `controller`).
pub const EXIT_FAILURE: i32 = 1;
pub const EXIT_USAGE: i32 = 2;
pub const EXIT_NO_RUN: i32 = 4;

/// Exit status for an error: a command may attach [`ExitCode`] to say which (the controller
/// exits with the failed rank's status class); everything else is [`EXIT_FAILURE`].
pub fn exit_code(err: &anyhow::Error) -> i32 {
    if let Some(said) = err.downcast_ref::<AlreadySaid>() {
        return said.0;
    }
    err.downcast_ref::<ExitCode>()
        .map(|c| c.0)
        .unwrap_or(EXIT_FAILURE)
}

/// Attach with `anyhow::Error::new(ExitCode(n)).context(...)` to choose the exit status.
#[derive(Debug, thiserror::Error)]
#[error("exit code {0}")]
pub struct ExitCode(pub i32);

/// An ending already told to the user (a cancelled job's controller said how it stopped):
/// the process exits with this status and prints nothing more.
#[derive(Debug, thiserror::Error)]
#[error("exit code {0}")]
pub struct AlreadySaid(pub i32);

/// Whether `main` should print the error (not when [`AlreadySaid`]).
pub fn should_print(err: &anyhow::Error) -> bool {
    err.downcast_ref::<AlreadySaid>().is_none()
}

/// The error as people read it: the message, then each cause that does not repeat what was
/// already said (a `thiserror` message often includes its source), leaving out the
/// [`ExitCode`] and [`AlreadySaid`] markers, which choose the status and say nothing.
pub fn message(err: &anyhow::Error) -> String {
    shardrun_protocol::error_text::join_causes(
        err.chain()
            .filter(|cause| !cause.is::<ExitCode>() && !cause.is::<AlreadySaid>()),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("cannot listen on {addr}: {source}")]
    struct Bind {
        addr: String,
        source: std::io::Error,
    }

    #[test]
    fn causes_are_said_once_and_exit_markers_not_at_all() {
        let bind = Bind {
            addr: "0.0.0.0:29400".into(),
            source: std::io::Error::new(std::io::ErrorKind::AddrInUse, "address in use"),
        };
        let err = anyhow::Error::new(bind).context("the job controller failed");
        assert_eq!(
            message(&err),
            "the job controller failed: cannot listen on 0.0.0.0:29400: address in use"
        );
        let err = anyhow::Error::new(ExitCode(EXIT_NO_RUN)).context("no run directories at x");
        assert_eq!(message(&err), "no run directories at x");
        assert_eq!(exit_code(&err), EXIT_NO_RUN);
        let err = anyhow::anyhow!("outer").context("context");
        assert_eq!(message(&err), "context: outer");
    }
}
