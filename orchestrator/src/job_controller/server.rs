//! The TCP endpoint: accepts connections, runs the handshake, and moves each worker's
//! messages to the writer (logs, metrics) or the event loop (registration, finish, failure).
//! Strangers are bounded: at most [`MAX_PENDING_HANDSHAKES`] unauthenticated connections at
//! once, each allowed a few KiB for a few seconds (see `shardrun_protocol::connection`).

use super::collective_lag::CollectiveCounts;
use super::job::{ConnId, Event};
use super::progress_watch::{Beat, JobActivity, RankProgress};
use super::writer::Record;
use futures::FutureExt;
use shardrun_protocol::connection::{self, ConnectionError};
use shardrun_protocol::messages::{FromWorker, LogLevel, LogLine, Role, ToWorker};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, Semaphore};
use tokio::task::AbortHandle;
use tracing::Instrument;

pub const MAX_PENDING_HANDSHAKES: usize = 256;
/// Longer log lines are cut here (a frame may be up to 1 MiB; the queue holds thousands).
pub const MAX_LOG_LINE: usize = 64 * 1024;
/// Log lines of one connection handed to the writer at once, at most.
const MAX_BATCH: usize = 256;
/// A rank that entered fewer collectives than others, and none for this long, when another
/// rank fails is named as the one they waited for (a healthy rank enters several a second).
const LAG_STILL_FOR: Duration = Duration::from_secs(10);

fn truncate_line(mut line: LogLine) -> LogLine {
    if line.text.len() > MAX_LOG_LINE {
        let mut cut = MAX_LOG_LINE;
        while !line.text.is_char_boundary(cut) {
            cut -= 1;
        }
        let dropped = line.text.len() - cut;
        line.text.truncate(cut);
        line.text.push_str(&format!(
            " [... {dropped} more bytes cut by the controller]"
        ));
    }
    line
}

/// What the server tells the event loop.
pub enum ServerEvent {
    /// A worker passed the handshake and registered; `to_worker` reaches it, `abort` drops it.
    Connected {
        conn: ConnId,
        to_worker: mpsc::UnboundedSender<ToWorker>,
        abort: AbortHandle,
    },
    Job(Event),
    /// A connection that is not part of the job was refused.
    Rejected {
        peer: SocketAddr,
        reason: String,
    },
}

#[derive(Debug, Clone)]
pub struct ServerOptions {
    pub secret: String,
    pub handshake_timeout: Duration,
    /// A worker silent for this long is considered hung.
    pub heartbeat_timeout: Duration,
    /// A worker whose heartbeats carry the same step and work count for this long (after its
    /// first step), while no other worker moved either, is not making progress; `None`:
    /// never judged.
    pub progress_timeout: Option<Duration>,
    /// Every rank's count of collectives entered, as its heartbeats say (shared with the
    /// event loop, which reads it when ranks are slow to stop).
    pub counts: CollectiveCounts,
}

pub async fn serve(
    listener: TcpListener,
    opts: ServerOptions,
    events: mpsc::UnboundedSender<ServerEvent>,
    records: mpsc::Sender<Record>,
) {
    let pending = Arc::new(Semaphore::new(MAX_PENDING_HANDSHAKES));
    let watch = Watch {
        heartbeat_timeout: opts.heartbeat_timeout,
        progress_timeout: opts.progress_timeout,
        activity: JobActivity::new(std::time::Instant::now()),
        counts: opts.counts.clone(),
    };
    let mut next_conn: ConnId = 0;
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            // Out of file descriptors and the like: wait a little rather than spin.
            Err(_) => {
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        tracing::debug!(%peer, "connection accepted");
        let Ok(permit) = pending.clone().try_acquire_owned() else {
            let reason = "too many connections in the handshake at once".to_string();
            let _ = events.send(ServerEvent::Rejected { peer, reason });
            continue;
        };
        next_conn += 1;
        let conn = next_conn;
        let (opts, events, records) = (opts.clone(), events.clone(), records.clone());
        let watch = watch.clone();
        tokio::spawn(
            async move {
                let _ = stream.set_nodelay(true);
                let accepted = connection::accept::<FromWorker, ToWorker>(
                    stream,
                    &opts.secret,
                    opts.handshake_timeout,
                )
                .await;
                let (role, mut rx, mut tx) = match accepted {
                    Ok(halves) => halves,
                    Err(e) => {
                        let _ = events.send(ServerEvent::Rejected {
                            peer,
                            reason: e.to_string(),
                        });
                        return;
                    }
                };
                if role != Role::Worker {
                    let reason = "client connections are not served by this controller".to_string();
                    let _ = events.send(ServerEvent::Rejected { peer, reason });
                    return;
                }
                let registration =
                    match tokio::time::timeout(opts.handshake_timeout, rx.recv()).await {
                        Ok(Ok(Some(FromWorker::Register(reg)))) => reg,
                        _ => {
                            let reason = "a worker must register first".to_string();
                            let _ = events.send(ServerEvent::Rejected { peer, reason });
                            return;
                        }
                    };
                drop(permit);
                tracing::debug!(
                    %peer,
                    conn,
                    rank = registration.rank,
                    host = registration.host,
                    pid = registration.pid,
                    device = registration.device,
                    collective_addr = registration.collective_addr.as_deref().unwrap_or("-"),
                    "rank registered"
                );
                let rank = registration.rank;
                let (to_worker, mut outbox) = mpsc::unbounded_channel::<ToWorker>();
                let events_r = events.clone();
                let (sent_start, start) = tokio::sync::watch::channel(false);
                tokio::spawn(async move {
                    while let Some(msg) = outbox.recv().await {
                        let is_start = matches!(msg, ToWorker::Start(_));
                        if tx.send(&msg).await.is_err() {
                            break;
                        }
                        if is_start {
                            let _ = sent_start.send(true);
                        }
                    }
                });
                // The reader starts only after the registration is queued, so the event loop
                // never sees a message of a connection before the connection itself.
                let (go, started) = tokio::sync::oneshot::channel::<()>();
                let reader = tokio::spawn(async move {
                    if started.await.is_ok() {
                        read_worker(conn, rank, rx, start, watch, events_r, records).await;
                    }
                });
                let _ = events.send(ServerEvent::Connected {
                    conn,
                    to_worker,
                    abort: reader.abort_handle(),
                });
                let _ = events.send(ServerEvent::Job(Event::Registered { conn, registration }));
                let _ = go.send(());
            }
            .in_current_span(),
        );
    }
}

/// How much later than its deadline a heartbeat wait may end before the controller takes
/// it that it was not running itself (stopped, or starved of CPU) rather than the rank silent.
const PAUSE_TOLERANCE: Duration = Duration::from_secs(2);

/// What every connection's reader judges its rank's heartbeats by, and shares with the
/// others.
#[derive(Clone)]
struct Watch {
    heartbeat_timeout: Duration,
    progress_timeout: Option<Duration>,
    activity: JobActivity,
    counts: CollectiveCounts,
}

/// Reads one rank's messages until its connection ends. Its heartbeats are judged from the
/// moment the job's start was sent to it (`start`): before, a registered rank waits in
/// silence for the others, and the rendezvous timeout judges the job.
async fn read_worker(
    conn: ConnId,
    rank: u64,
    mut rx: connection::AsyncReceiver<FromWorker>,
    mut start: tokio::sync::watch::Receiver<bool>,
    watch: Watch,
    events: mpsc::UnboundedSender<ServerEvent>,
    records: mpsc::Sender<Record>,
) {
    let Watch {
        heartbeat_timeout,
        progress_timeout,
        activity,
        counts,
    } = watch;
    let job = |e: Event| {
        let _ = events.send(ServerEvent::Job(e));
    };
    let mut heartbeat_reported = false;
    let mut paused_since_last_message = false;
    let mut started = false;
    let mut progress = RankProgress::default();
    // A message read while collecting a batch of log lines, handled next.
    let mut carried = None;
    loop {
        let next = if let Some(next) = carried.take() {
            next
        } else if heartbeat_reported {
            rx.recv().await
        } else if !started {
            tokio::select! {
                next = rx.recv() => next,
                // Sent (or the sender gone with its connection): judge from now on.
                _ = start.wait_for(|&sent| sent) => {
                    started = true;
                    continue;
                }
            }
        } else {
            let waiting = std::time::Instant::now();
            match tokio::time::timeout(heartbeat_timeout, rx.recv()).await {
                Ok(next) => {
                    paused_since_last_message = false;
                    next
                }
                Err(_)
                    if !paused_since_last_message
                        && waiting.elapsed() > heartbeat_timeout + PAUSE_TOLERANCE =>
                {
                    // Woken long past the deadline: this process was stopped (Ctrl-Z,
                    // SIGSTOP) while the rank's heartbeats queued in its socket, and the
                    // timer fired before they were seen. Judge the rank from now on, once:
                    // a controller late every time (starved) still finds a silent rank.
                    paused_since_last_message = true;
                    continue;
                }
                Err(_) => {
                    // Keep reading afterwards: the rank may still say why it hung.
                    heartbeat_reported = true;
                    job(Event::HeartbeatLost { conn });
                    continue;
                }
            }
        };
        let msg = match next {
            Ok(Some(msg)) => msg,
            Ok(None) => return job(Event::Disconnected { conn, error: None }),
            Err(ConnectionError::Io(e)) if e.kind() == std::io::ErrorKind::ConnectionReset => {
                return job(Event::Disconnected { conn, error: None })
            }
            Err(e) => {
                return job(Event::Disconnected {
                    conn,
                    error: Some(e.to_string()),
                })
            }
        };
        let record = match msg {
            FromWorker::Log(line) => {
                // Take every line already received in one go: one queue operation for many
                // lines keeps ingest fast when ranks log heavily.
                let mut lines = vec![truncate_line(line)];
                while lines.len() < MAX_BATCH {
                    match rx.recv().now_or_never() {
                        Some(Ok(Some(FromWorker::Log(line)))) => lines.push(truncate_line(line)),
                        Some(other) => {
                            carried = Some(other);
                            break;
                        }
                        None => break,
                    }
                }
                Record::Logs { rank, lines }
            }
            FromWorker::Metrics(m) => {
                // A logged step is progress too, and may come before the next heartbeat.
                job(Event::Progress { conn, step: m.step });
                Record::Metrics(m)
            }
            FromWorker::Eval(e) => Record::Eval(e),
            FromWorker::Heartbeat {
                step,
                work,
                collectives,
            } => {
                let now = std::time::Instant::now();
                counts.record(rank, collectives, now);
                match progress.beat((step, work), now, progress_timeout, &activity) {
                    Beat::Advanced => job(Event::Progress { conn, step }),
                    Beat::Stalled(secs) => {
                        // The whole job stood still for the progress timeout already.
                        let lag = counts.lag(now, Duration::ZERO);
                        job(Event::Stalled {
                            conn,
                            step,
                            secs,
                            lag,
                        })
                    }
                    Beat::Worked | Beat::Same => {}
                }
                continue;
            }
            FromWorker::Register(_) => continue,
            FromWorker::CheckpointSaved { step, path } => Record::Checkpoint { rank, step, path },
            FromWorker::Resumed { step, path } => Record::Resumed { rank, step, path },
            FromWorker::Summary(summary) => Record::Summary { rank, summary },
            FromWorker::Finished { preempted } => {
                job(Event::Finished { conn, preempted });
                continue;
            }
            FromWorker::Stopped { step, reason } => {
                job(Event::Stopped { conn, step, reason });
                continue;
            }
            FromWorker::Failed { error, because_of } => {
                let line = LogLine {
                    level: LogLevel::Error,
                    time: super::clock::now(),
                    text: error.clone(),
                };
                // The line first, so it is on disk before the failure is reported.
                let _ = records
                    .send(Record::Logs {
                        rank,
                        lines: vec![truncate_line(line)],
                    })
                    .await;
                let lag = counts.lag(std::time::Instant::now(), LAG_STILL_FOR);
                job(Event::WorkerFailed {
                    conn,
                    error,
                    lag,
                    because_of,
                });
                continue;
            }
        };
        if records.send(record).await.is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_lines_are_cut_on_a_char_boundary() {
        let text = "é".repeat(MAX_LOG_LINE); // 2 bytes each
        let line = truncate_line(LogLine {
            level: LogLevel::Info,
            time: 0.0,
            text,
        });
        assert!(line.text.len() < MAX_LOG_LINE + 64);
        assert!(line.text.ends_with("more bytes cut by the controller]"));
        let short = truncate_line(LogLine {
            level: LogLevel::Info,
            time: 0.0,
            text: "ok".into(),
        });
        assert_eq!(short.text, "ok");
    }
}
