//! Standalone rendezvous for launches without the shardrun controller (tests, torchrun):
//! rank 0 listens on `MASTER_ADDR:MASTER_PORT`, every rank registers, and rank 0 answers
//! everyone with the complete [`StartInfo`] (or says why it stopped).
//!
//! Rank 0 speaks to the other ranks exactly as the controller speaks to workers: the frames
//! and the handshake of [`shardrun_protocol::connection`] (role [`Role::Worker`]), then
//! [`FromWorker::Register`], answered by [`ToWorker::Start`] or [`ToWorker::Shutdown`]; and
//! it judges registrations with the controller's [`Roster`]. Only the server differs: this
//! one blocks in rank 0 before training, which has nothing else to serve, while the
//! controller's runs in its event loop next to logs, metrics and heartbeats.
//!
//! The secret every rank presents in its hello is [`env::SECRET`] (`SHARDRUN_SECRET`), the
//! same value on every rank, or none when it is unset: like torchrun, a launch without the
//! controller trusts the network unless given a secret. Either way a connection that does
//! not complete the handshake is refused and the rendezvous goes on without it.

use shardrun_protocol::connection::{self, BlockingConnection, ConnectionError, HANDSHAKE_TIMEOUT};
use shardrun_protocol::env;
use shardrun_protocol::messages::{FromWorker, Registration, Role, StartInfo, ToWorker};
use shardrun_protocol::rendezvous::{Refusal, Roster};
use std::collections::BTreeMap;
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

/// Connections in the handshake at once, at most; more are dropped until some finish (a rank
/// among them retries).
const MAX_PENDING_HANDSHAKES: usize = 256;

#[derive(Debug, thiserror::Error)]
pub enum RendezvousError {
    #[error("{0}")]
    Config(String),
    #[error(
        "rendezvous timed out after {secs} s: rank(s) {missing:?} of {world_size} never registered \
         with rank 0 at {master} (did they start, with the same MASTER_ADDR/MASTER_PORT?)"
    )]
    Missing {
        secs: u64,
        missing: Vec<u64>,
        world_size: u64,
        master: String,
    },
    #[error(
        "could not reach rank 0 at {master} within {secs} s (last try: {last}): is rank 0 running?"
    )]
    Unreachable {
        master: String,
        secs: u64,
        last: String,
    },
    /// Something listens on MASTER_PORT that does not answer as a rank 0 of shardrun.
    #[error(
        "no rank 0 answered at {master} within {secs} s, and the last try reached a program that \
         is not one ({last}): is another program listening on MASTER_PORT? Give the job a free \
         port"
    )]
    NotRankZero {
        master: String,
        secs: u64,
        last: String,
    },
    /// Rank 0 refused this rank's hello (another secret, another build).
    #[error("rank 0 at {master} refused this rank: {reason}")]
    Refused { master: String, reason: String },
    /// Rank 0 stopped the rendezvous for everyone; the reason names the culprit.
    #[error("rank 0 stopped the rendezvous: {0}")]
    Rejected(String),
    /// A stop (SIGTERM from the launcher, Ctrl-C) while waiting: nothing has trained yet.
    #[error("stopped by {0} while waiting for the other ranks")]
    Stopped(String),
    #[error("rendezvous with {peer}: {what}")]
    Io { peer: String, what: String },
}

/// Where rank 0 listens, what the ranks present, and how long everyone waits.
#[derive(Debug, Clone)]
pub struct Standalone {
    pub master_addr: String,
    pub master_port: u16,
    /// The secret of the hello; empty when [`env::SECRET`] is unset.
    pub secret: String,
    pub timeout: Duration,
}

impl Standalone {
    /// From torchrun's `MASTER_ADDR` / `MASTER_PORT` and [`env::SECRET`]; `None` when
    /// `MASTER_ADDR` is unset. Under torchrun itself (`TORCHELASTIC_USE_AGENT_STORE=True`)
    /// its agent's store holds `MASTER_PORT`, so rank 0 serves on the port after it.
    pub fn from_env(timeout: Duration) -> Result<Option<Standalone>, RendezvousError> {
        Self::from_lookup(|k| std::env::var(k).ok(), timeout)
    }

    pub fn from_lookup(
        get: impl Fn(&str) -> Option<String>,
        timeout: Duration,
    ) -> Result<Option<Standalone>, RendezvousError> {
        let Some(master_addr) = get("MASTER_ADDR") else {
            return Ok(None);
        };
        let port = get("MASTER_PORT").ok_or_else(|| {
            RendezvousError::Config("MASTER_ADDR is set but MASTER_PORT is not: set both".into())
        })?;
        let master_port: u16 = port.trim().parse().map_err(|_| {
            RendezvousError::Config(format!("MASTER_PORT={port:?} is not a port number"))
        })?;
        let agent_holds_it = get("TORCHELASTIC_USE_AGENT_STORE")
            .is_some_and(|v| v.trim().eq_ignore_ascii_case("true"));
        let master_port = if agent_holds_it {
            master_port.checked_add(1).ok_or_else(|| {
                RendezvousError::Config(format!(
                    "MASTER_PORT={master_port}: torchrun's store holds it and no port follows \
                     it; give torchrun a lower --master-port"
                ))
            })?
        } else {
            master_port
        };
        Ok(Some(Standalone {
            master_addr,
            master_port,
            secret: get(env::SECRET).unwrap_or_default(),
            timeout,
        }))
    }

    fn master(&self) -> String {
        format!("{}:{}", self.master_addr, self.master_port)
    }
}

/// Runs the rendezvous as `me.rank`; every rank of the job calls it.
pub fn rendezvous(config: &Standalone, me: Registration) -> Result<StartInfo, RendezvousError> {
    if me.world_size == 0 || me.rank >= me.world_size {
        return Err(RendezvousError::Config(format!(
            "rank {} is not a rank of a world of {}",
            me.rank, me.world_size
        )));
    }
    if me.rank == 0 {
        serve(config, me)
    } else {
        join(config, me)
    }
}

/// A rank that passed the handshake and registered, or a connection that did not.
enum Arrival {
    Registered(Registration, BlockingConnection),
    Refused { peer: SocketAddr, reason: String },
    ListenerFailed(std::io::Error),
}

fn serve(config: &Standalone, me: Registration) -> Result<StartInfo, RendezvousError> {
    // Listen on every interface, like torchrun: MASTER_ADDR is how the others reach us.
    let listener =
        TcpListener::bind(("0.0.0.0", config.master_port)).map_err(|e| RendezvousError::Io {
            peer: config.master(),
            what: format!("rank 0 cannot listen on port {}: {e}", config.master_port),
        })?;
    tracing::debug!(bound = %format!("0.0.0.0:{}", config.master_port), advertised = config.master(), "rendezvous: rank 0 serves");
    serve_on(listener, config, me)
}

/// Rank 0 on `listener`: the world is rank 0's world size and config hash; the first
/// inconsistent registration stops the rendezvous for everyone, as it fails a controller's
/// job.
fn serve_on(
    listener: TcpListener,
    config: &Standalone,
    me: Registration,
) -> Result<StartInfo, RendezvousError> {
    let master = config.master();
    let mut roster = Roster::new(me.world_size, me.config_hash.clone());
    roster
        .admit(me)
        .map_err(|refusal| RendezvousError::Config(refusal.to_string()))?;
    let (arrivals, arrived) = mpsc::channel();
    let _acceptor = Acceptor::spawn(listener, config.secret.clone(), arrivals).map_err(|what| {
        RendezvousError::Io {
            peer: master.clone(),
            what,
        }
    })?;
    let mut ranks: BTreeMap<u64, BlockingConnection> = BTreeMap::new();
    let deadline = Instant::now() + config.timeout;
    let start = loop {
        if let Some(start) = roster.start_info() {
            break start;
        }
        if let Some(why) = stop_requested() {
            let error = RendezvousError::Stopped(why);
            stop_all(&mut ranks, &error.to_string());
            return Err(error);
        }
        let left = deadline.saturating_duration_since(Instant::now());
        let arrival = match arrived.recv_timeout(left.min(STOP_POLL)) {
            Ok(arrival) => arrival,
            Err(mpsc::RecvTimeoutError::Timeout) if !left.is_zero() => continue,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                let error = RendezvousError::Missing {
                    secs: config.timeout.as_secs(),
                    missing: roster.missing(),
                    world_size: roster.world_size(),
                    master,
                };
                stop_all(&mut ranks, &error.to_string());
                return Err(error);
            }
            // The acceptor only ends after saying why (or when dropped below).
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                return Err(RendezvousError::Io {
                    peer: master,
                    what: "rank 0's listener stopped".into(),
                })
            }
        };
        match arrival {
            Arrival::Registered(reg, mut conn) => {
                let (rank, host, pid) = (reg.rank, reg.host.clone(), reg.pid);
                let collective_addr = reg.collective_addr.clone();
                if let Err(refusal) = roster.admit(reg) {
                    let reason = cannot_join(rank, &host, pid, &refusal);
                    let _ = conn.send(&ToWorker::Shutdown {
                        reason: reason.clone(),
                    });
                    stop_all(&mut ranks, &reason);
                    return Err(RendezvousError::Rejected(reason));
                }
                tracing::debug!(
                    rank,
                    host,
                    collective_addr = collective_addr.as_deref().unwrap_or("-"),
                    "rendezvous: rank registered"
                );
                ranks.insert(rank, conn);
            }
            Arrival::Refused { peer, reason } => {
                tracing::warn!(%peer, reason, "rendezvous: refused a connection");
            }
            Arrival::ListenerFailed(e) => {
                let what = format!("accept: {e}");
                stop_all(&mut ranks, &format!("rank 0's listener failed ({what})"));
                return Err(RendezvousError::Io { peer: master, what });
            }
        }
    };
    for (rank, mut conn) in ranks {
        conn.send(&ToWorker::Start(start.clone()))
            .map_err(|e| RendezvousError::Io {
                peer: roster.get(rank).map_or(format!("rank {rank}"), |r| {
                    format!("rank {rank} ({})", r.host)
                }),
                what: format!("sending the start: {e}"),
            })?;
    }
    Ok(start)
}

/// The controller's words for a refused registration (`Failure::describe`).
fn cannot_join(rank: u64, host: &str, pid: u32, refusal: &Refusal) -> String {
    format!("rank {rank} on {host} (pid {pid}) cannot join this job: {refusal}")
}

/// Tells every registered rank that the rendezvous is over, and why.
fn stop_all(ranks: &mut BTreeMap<u64, BlockingConnection>, reason: &str) {
    for conn in ranks.values_mut() {
        let _ = conn.send(&ToWorker::Shutdown {
            reason: reason.to_string(),
        });
    }
}

/// Accepts connections on rank 0's listener and runs each handshake on a thread of its own,
/// so a stranger that sends nothing delays no rank. Dropping it closes the listener.
struct Acceptor {
    stop: Arc<AtomicBool>,
    wake: SocketAddr,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Acceptor {
    fn spawn(
        listener: TcpListener,
        secret: String,
        arrivals: mpsc::Sender<Arrival>,
    ) -> Result<Acceptor, String> {
        let port = listener.local_addr().map_err(|e| e.to_string())?.port();
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = stop.clone();
        let pending = Arc::new(AtomicUsize::new(0));
        let thread = std::thread::Builder::new()
            .name("rendezvous-accept".into())
            .spawn(move || loop {
                let accepted = listener.accept();
                if stopping.load(Ordering::Acquire) {
                    return;
                }
                let (stream, peer) = match accepted {
                    Ok(accepted) => accepted,
                    Err(e) => {
                        let _ = arrivals.send(Arrival::ListenerFailed(e));
                        return;
                    }
                };
                if pending.fetch_add(1, Ordering::AcqRel) >= MAX_PENDING_HANDSHAKES {
                    pending.fetch_sub(1, Ordering::AcqRel);
                    continue;
                }
                let (secret, arrivals, done) = (secret.clone(), arrivals.clone(), pending.clone());
                let spawned = std::thread::Builder::new()
                    .name("rendezvous-hello".into())
                    .spawn(move || {
                        let arrival = match registration(stream, &secret) {
                            Ok((reg, conn)) => Arrival::Registered(reg, conn),
                            Err(e) => Arrival::Refused {
                                peer,
                                reason: e.to_string(),
                            },
                        };
                        done.fetch_sub(1, Ordering::AcqRel);
                        let _ = arrivals.send(arrival);
                    });
                // Out of threads: this connection is dropped (a rank retries).
                if spawned.is_err() {
                    pending.fetch_sub(1, Ordering::AcqRel);
                }
            })
            .map_err(|e| format!("cannot start the rendezvous listener: {e}"))?;
        Ok(Acceptor {
            stop,
            wake: SocketAddr::from(([127, 0, 0, 1], port)),
            thread: Some(thread),
        })
    }
}

impl Drop for Acceptor {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        // The accept loop blocks in accept(): one connection of our own wakes it up.
        let woke = TcpStream::connect_timeout(&self.wake, Duration::from_secs(1)).is_ok();
        if let Some(thread) = self.thread.take().filter(|_| woke) {
            let _ = thread.join();
        }
    }
}

/// The handshake and the registration that must follow it, both within the handshake
/// timeout, as the controller demands.
fn registration(
    stream: TcpStream,
    secret: &str,
) -> Result<(Registration, BlockingConnection), ConnectionError> {
    let (role, mut conn) = connection::accept_blocking(stream, secret, HANDSHAKE_TIMEOUT)?;
    if role != Role::Worker {
        return Err(ConnectionError::Rejected(
            "only ranks connect to the rendezvous".into(),
        ));
    }
    conn.set_read_timeout(Some(HANDSHAKE_TIMEOUT))?;
    match conn.recv::<FromWorker>()? {
        FromWorker::Register(reg) => {
            conn.set_read_timeout(None)?;
            Ok((reg, conn))
        }
        _ => Err(ConnectionError::Malformed(
            "a rank must register first".into(),
        )),
    }
}

/// How often a rank waiting in the rendezvous looks for a stop: a launcher that gives up on
/// the job (torchrun when another rank failed) sends SIGTERM and waits only so long.
const STOP_POLL: Duration = Duration::from_millis(200);

/// The stop this process was asked for, in words, if any: the signal handlers only record it.
fn stop_requested() -> Option<String> {
    crate::stop::process()
        .requested()
        .map(|request| match request {
            crate::stop::StopRequest::Stop(reason) => reason.to_string(),
            crate::stop::StopRequest::Preempt => "a preemption notice".to_string(),
        })
}

/// Every rank but 0: reach rank 0 (it may still be starting), register, wait for the start.
fn join(config: &Standalone, me: Registration) -> Result<StartInfo, RendezvousError> {
    let master = config.master();
    master.to_socket_addrs().map_err(|e| {
        RendezvousError::Config(format!("MASTER_ADDR {master} does not resolve: {e}"))
    })?;
    let deadline = Instant::now() + config.timeout;
    let mut attempt = 0u64;
    let mut conn = loop {
        attempt += 1;
        let left = deadline.saturating_duration_since(Instant::now());
        let wait = left.clamp(Duration::from_millis(100), HANDSHAKE_TIMEOUT);
        let last = match BlockingConnection::connect_unless(
            &master,
            Role::Worker,
            &config.secret,
            wait,
            || stop_requested().is_some(),
        ) {
            Ok(conn) => {
                tracing::debug!(master, attempt, "rendezvous: connected to rank 0");
                break conn;
            }
            Err(ConnectionError::Rejected(reason)) => {
                return Err(RendezvousError::Refused { master, reason })
            }
            Err(e) => e,
        };
        if let Some(why) = stop_requested() {
            return Err(RendezvousError::Stopped(why));
        }
        if attempt == 1 || attempt.is_multiple_of(50) {
            tracing::debug!(
                master,
                attempt,
                error = %last,
                "rendezvous: rank 0 not reachable yet; retrying"
            );
        }
        if Instant::now() >= deadline {
            let secs = config.timeout.as_secs();
            return Err(match last {
                ConnectionError::NoHandshake(_) => RendezvousError::NotRankZero {
                    master,
                    secs,
                    last: last.to_string(),
                },
                _ => RendezvousError::Unreachable {
                    master,
                    secs,
                    last: last.to_string(),
                },
            });
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let io = |e: ConnectionError| RendezvousError::Io {
        peer: master.clone(),
        what: e.to_string(),
    };
    conn.send(&FromWorker::Register(me)).map_err(io)?;
    // Rank 0 answers once everyone is there: wait for as long as the rendezvous may take,
    // heeding a stop (the launcher gives up on the job) meanwhile.
    let answer_by = deadline + Duration::from_secs(5);
    loop {
        match conn.readable_before(answer_by, || stop_requested().is_some()) {
            Err(ConnectionError::Stopped) => {
                let why = stop_requested().unwrap_or_default();
                return Err(RendezvousError::Stopped(why));
            }
            waited => waited.map_err(io)?,
        }
        // A message has begun: rank 0 writes each whole at once, so the rest comes at once
        // unless rank 0 broke mid-message.
        let message = match conn.recv_unless(HANDSHAKE_TIMEOUT, || stop_requested().is_some()) {
            Err(ConnectionError::Stopped) => {
                let why = stop_requested().unwrap_or_default();
                return Err(RendezvousError::Stopped(why));
            }
            received => received.map_err(io)?,
        };
        match message {
            ToWorker::Start(start) => return Ok(start),
            ToWorker::Shutdown { reason } | ToWorker::CheckpointAndStop { reason } => {
                return Err(RendezvousError::Rejected(reason))
            }
            ToWorker::Preempt => {}
        }
    }
}

#[cfg(test)]
mod tests;
