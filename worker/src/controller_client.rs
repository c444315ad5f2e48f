//! The worker's side of the controller: handshake, registration, waiting for the start
//! signal, then a [`Reporter`] over the same TCP connection, a heartbeat thread, and a reader
//! thread that turns [`ToWorker::Preempt`], [`ToWorker::CheckpointAndStop`] and
//! [`ToWorker::Shutdown`] (and a lost
//! connection) into requests on the process's [`stop`] switch, which the training loop acts
//! on at its next step boundary. The reader never exits the process itself: see [`stop`].
//!
//! Every report is one frame written with a single blocking `write_all` under a lock, so when
//! `log` returns the line is in the kernel's socket buffer: a crash right after loses nothing.
//! After the rendezvous the socket coalesces small frames (Nagle); with the controller's
//! threads at `SCHED_BATCH` (so a wake-up does not preempt the writer) a log line costs ~2 us
//! instead of ~12 us (`cargo bench -p shardrun-e2e --bench ingest`).

use crate::report::Reporter;
use crate::stop::{self, StopReason, StopRequest};
use shardrun_protocol::connection::{encode_frame, BlockingConnection, ConnectionError};
use shardrun_protocol::env;
use shardrun_protocol::messages::{
    EvalMetrics, FromWorker, LogLevel, LogLine, Registration, Role, StartInfo, StepMetrics,
    ToWorker, TrainSummary,
};
use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("{var} is not set: the worker is started by `shardrun run` or the job's controller, which set it")]
    MissingEnv { var: &'static str },
    #[error("cannot read the job secret from {path} ({source}); is the run directory readable from this node?")]
    Secret {
        path: String,
        source: std::io::Error,
    },
    #[error("cannot reach the shardrun controller at {addr} after {secs} s: {source}. Is the controller still running (see the run's train.log), and is {addr} reachable from this node?")]
    Unreachable {
        addr: String,
        secs: u64,
        source: ConnectionError,
    },
    #[error("the shardrun controller at {addr} refused this worker: {reason}")]
    Rejected { addr: String, reason: String },
    #[error("the controller at {addr} stopped the job before it started: {reason}")]
    Stopped { addr: String, reason: String },
    #[error("lost the connection to the controller at {addr} during the rendezvous: {source}")]
    Rendezvous {
        addr: String,
        source: ConnectionError,
    },
}

#[derive(Debug, Clone)]
pub struct ClientOptions {
    /// Keep retrying to connect for this long (the controller may still be starting).
    pub connect_timeout: Duration,
    pub heartbeat_interval: Duration,
}

impl ClientOptions {
    /// Defaults, with the connect timeout from [`env::CONNECT_TIMEOUT`] when set.
    pub fn from_env() -> Self {
        let mut opts = ClientOptions::default();
        if let Some(secs) = std::env::var(env::CONNECT_TIMEOUT)
            .ok()
            .and_then(|s| s.trim().parse::<f64>().ok())
        {
            opts.connect_timeout = Duration::from_secs_f64(secs.max(0.0));
        }
        opts
    }
}

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions {
            connect_timeout: Duration::from_secs(30),
            heartbeat_interval: Duration::from_secs(2),
        }
    }
}

/// Where the controller is and the secret to present, from the controller's variables.
pub fn endpoint_from_env() -> Result<(String, String), ClientError> {
    let addr = std::env::var(env::CONTROLLER_ADDR).map_err(|_| ClientError::MissingEnv {
        var: env::CONTROLLER_ADDR,
    })?;
    if let Ok(secret) = std::env::var(env::SECRET) {
        return Ok((addr, secret));
    }
    let path = std::env::var(env::SECRET_FILE).map_err(|_| ClientError::MissingEnv {
        var: env::SECRET_FILE,
    })?;
    let secret = std::fs::read_to_string(&path).map_err(|source| ClientError::Secret {
        path: path.clone(),
        source,
    })?;
    Ok((addr, secret.trim().to_string()))
}

pub struct ControllerClient {
    rank: u64,
    addr: String,
    conn: Mutex<BlockingConnection>,
    /// Optimizer steps done, sent with every heartbeat.
    steps_done: AtomicU64,
}

/// Connects, registers and waits until the whole world has registered. Returns the reporter
/// and what the collectives need. Starts the heartbeat and reader threads.
pub fn connect(
    addr: &str,
    secret: &str,
    registration: Registration,
    opts: &ClientOptions,
) -> Result<(Arc<ControllerClient>, StartInfo), ClientError> {
    let mut conn = connect_with_retry(addr, secret, opts.connect_timeout)?;
    let rank = registration.rank;
    tracing::debug!(
        controller = addr,
        collective_addr = registration.collective_addr.as_deref().unwrap_or("-"),
        device = registration.device,
        "registering"
    );
    let (host, pid, device) = (
        registration.host.clone(),
        registration.pid,
        registration.device.clone(),
    );
    let lost = |source| ClientError::Rendezvous {
        addr: addr.to_string(),
        source,
    };
    conn.send(&FromWorker::Register(registration))
        .map_err(lost)?;
    let start = loop {
        match conn.recv::<ToWorker>().map_err(lost)? {
            ToWorker::Start(info) => {
                tracing::debug!(
                    world_size = info.world_size,
                    peers = ?info
                        .peers
                        .iter()
                        .map(|p| p.collective_addr.as_deref().unwrap_or("-"))
                        .collect::<Vec<_>>(),
                    "the controller started the job"
                );
                break info;
            }
            // Nothing has trained yet: nothing to checkpoint.
            ToWorker::Shutdown { reason } | ToWorker::CheckpointAndStop { reason } => {
                return Err(ClientError::Stopped {
                    addr: addr.to_string(),
                    reason,
                })
            }
            ToWorker::Preempt => {}
        }
    };
    // From here on the worker mostly streams reports: let the kernel batch them, so a log
    // call usually costs a copy into the socket buffer instead of a trip through the network
    // stack. Lines reach the controller within the delayed-ACK time (< 0.2 s), and still
    // survive a crash: the kernel sends what is queued when the process dies.
    conn.set_nodelay(false).map_err(lost)?;
    let reader = conn.try_clone().map_err(lost)?;
    let client = Arc::new(ControllerClient {
        rank,
        addr: addr.to_string(),
        conn: Mutex::new(conn),
        steps_done: AtomicU64::new(0),
    });
    spawn_reader(client.clone(), reader);
    spawn_heartbeat(Arc::downgrade(&client), opts.heartbeat_interval);
    client.log(
        LogLevel::Info,
        &format!(
            "rank {rank} of {} joined on {host} (pid {pid}, {device})",
            start.world_size
        ),
    );
    Ok((client, start))
}

fn connect_with_retry(
    addr: &str,
    secret: &str,
    timeout: Duration,
) -> Result<BlockingConnection, ClientError> {
    let deadline = Instant::now() + timeout;
    let mut wait = Duration::from_millis(50);
    let mut attempt = 0u32;
    loop {
        attempt += 1;
        let left = deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(100));
        // A Ctrl-C heard while waiting for the controller's handshake reply ends the wait.
        let stopped = || matches!(stop::process().requested(), Some(StopRequest::Stop(_)));
        match BlockingConnection::connect_unless(
            addr,
            Role::Worker,
            secret,
            left.min(Duration::from_secs(10)),
            stopped,
        ) {
            Ok(conn) => {
                tracing::debug!(controller = addr, attempt, "connected to the controller");
                return Ok(conn);
            }
            Err(ConnectionError::Rejected(reason)) => {
                return Err(ClientError::Rejected {
                    addr: addr.to_string(),
                    reason,
                })
            }
            // A Ctrl-C while the controller is still starting: give up now.
            Err(_) if matches!(stop::process().requested(), Some(StopRequest::Stop(_))) => {
                return Err(ClientError::Stopped {
                    addr: addr.to_string(),
                    reason: "asked to stop while connecting".into(),
                })
            }
            Err(source) if Instant::now() >= deadline => {
                return Err(ClientError::Unreachable {
                    addr: addr.to_string(),
                    secs: timeout.as_secs(),
                    source,
                })
            }
            Err(error) => {
                tracing::debug!(controller = addr, attempt, %error, retry_in = ?wait, "cannot reach the controller yet");
                std::thread::sleep(wait);
                wait = (wait * 2).min(Duration::from_secs(1));
            }
        }
    }
}

fn spawn_reader(client: Arc<ControllerClient>, mut reader: BlockingConnection) {
    let span = tracing::Span::current();
    let _ = std::thread::Builder::new()
        .name("controller-reader".into())
        .spawn(move || {
            let _span = span.enter();
            loop {
                match reader.recv::<ToWorker>() {
                    Ok(ToWorker::Preempt) => {
                        tracing::debug!("the controller asks to checkpoint and stop (preemption)");
                        stop::process().controller_preempts()
                    }
                    Ok(ToWorker::CheckpointAndStop { reason }) => {
                        tracing::debug!(reason, "the controller asks to checkpoint, then stop");
                        stop::process()
                            .request_checkpoint_then_stop(StopReason::Controller { reason });
                    }
                    Ok(ToWorker::Start(_)) => {}
                    Ok(ToWorker::Shutdown { reason }) => {
                        tracing::debug!(reason, "the controller asks to stop");
                        // A rank that cannot reach the step boundary (blocked in a collective
                        // with a dead peer) is killed by the controller after its grace period.
                        stop::process().request_stop(StopReason::Controller { reason });
                    }
                    Err(e) => {
                        tracing::debug!(error = %e, "lost the controller");
                        // Without its controller the job cannot finish; do not train on as an orphan.
                        let _ = writeln!(
                        std::io::stderr(),
                        "shardrun-worker: rank {}: lost the controller at {} ({e}); stopping at \
                         the next step boundary",
                        client.rank,
                        client.addr
                    );
                        stop::process()
                            .request_stop(StopReason::LostController { why: e.to_string() });
                        return;
                    }
                }
            }
        });
}

fn spawn_heartbeat(client: std::sync::Weak<ControllerClient>, every: Duration) {
    let _ = std::thread::Builder::new()
        .name("controller-heartbeat".into())
        .spawn(move || loop {
            std::thread::sleep(every);
            let Some(client) = client.upgrade() else {
                return;
            };
            if crate::fail_fast::failing() {
                return;
            }
            let step = client.steps_done.load(Ordering::Relaxed);
            let beat = FromWorker::Heartbeat {
                step,
                work: crate::progress::work(),
                collectives: crate::progress::collectives(),
            };
            if client.send(&beat).is_err() {
                return;
            }
        });
}

impl ControllerClient {
    pub fn rank(&self) -> u64 {
        self.rank
    }

    fn send(&self, msg: &FromWorker) -> Result<(), ConnectionError> {
        let frame = encode_frame(msg)?;
        let mut conn = self.conn.lock().unwrap_or_else(|e| e.into_inner());
        conn.send_frame(&frame)
    }

    /// Sends, or says on stderr (which the controller also captures) what could not be sent;
    /// true when sent.
    fn send_or_stderr(&self, msg: &FromWorker) -> bool {
        match self.send(msg) {
            Ok(()) => true,
            Err(e) => {
                let _ = writeln!(
                    std::io::stderr(),
                    "shardrun-worker: rank {}: cannot reach the controller at {} ({e}): {msg:?}",
                    self.rank,
                    self.addr
                );
                false
            }
        }
    }

    /// The last message of a clean exit.
    pub fn finished(&self, preempted: bool) {
        let _ = self.send_or_stderr(&FromWorker::Finished { preempted });
    }

    /// The last message before exiting on request at a step boundary.
    pub fn stopped(&self, step: u64, reason: &StopReason) {
        let _ = self.send_or_stderr(&FromWorker::Stopped {
            step,
            reason: reason.clone(),
        });
    }

    /// The last message before exiting with an error, naming the peer rank it follows from
    /// if any; true when the controller has it (and logs it: the rank need not print it
    /// again).
    pub fn failed(&self, error: &str, because_of: Option<usize>) -> bool {
        self.send_or_stderr(&FromWorker::Failed {
            error: error.to_string(),
            because_of: because_of.map(|rank| rank as u64),
        })
    }
}

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

impl Reporter for ControllerClient {
    fn log(&self, level: LogLevel, text: &str) {
        let line = LogLine {
            level,
            time: unix_now(),
            text: text.to_string(),
        };
        let _ = self.send_or_stderr(&FromWorker::Log(line));
    }

    fn metrics(&self, metrics: &StepMetrics) {
        let _ = self.send_or_stderr(&FromWorker::Metrics(metrics.clone()));
    }

    fn checkpoint_saved(&self, step: u64, path: &str) {
        let _ = self.send_or_stderr(&FromWorker::CheckpointSaved {
            step,
            path: path.to_string(),
        });
    }

    fn summary(&self, summary: &TrainSummary) {
        let _ = self.send_or_stderr(&FromWorker::Summary(summary.clone()));
    }

    fn eval(&self, metrics: &EvalMetrics) {
        let _ = self.send_or_stderr(&FromWorker::Eval(metrics.clone()));
    }

    fn resumed(&self, step: u64, path: &str) {
        let _ = self.send_or_stderr(&FromWorker::Resumed {
            step,
            path: path.to_string(),
        });
    }

    fn preempt_requested(&self) -> bool {
        stop::process().requested() == Some(StopRequest::Preempt)
    }

    fn step_done(&self, step: u64) {
        self.steps_done.store(step, Ordering::Relaxed);
    }

    fn data_described(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unreachable_controller_is_named() {
        // A port nobody listens on: bind, note it, close.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let addr = format!("127.0.0.1:{port}");
        let reg = Registration {
            rank: 0,
            local_rank: 0,
            world_size: 1,
            host: "h".into(),
            pid: 1,
            device: "cpu".into(),
            config_hash: "x".into(),
            collective_addr: None,
            nccl_unique_id: None,
            device_error: None,
        };
        let opts = ClientOptions {
            connect_timeout: Duration::from_millis(300),
            ..Default::default()
        };
        let err = connect(&addr, "s", reg, &opts)
            .err()
            .expect("must fail")
            .to_string();
        assert!(err.contains(&addr), "{err}");
        assert!(
            err.contains("cannot reach the shardrun controller"),
            "{err}"
        );
    }
}
