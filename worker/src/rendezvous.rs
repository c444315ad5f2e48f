//! Standalone rendezvous for launches without the shardrun controller (tests, torchrun):
//! rank 0 listens on `MASTER_ADDR:MASTER_PORT`, every rank sends its [`Registration`], and
//! rank 0 answers everyone with the complete [`StartInfo`] (or the reason it refuses).
//!
//! Frames are a 4-byte big-endian length then JSON, as on the controller connection.

use serde::{Deserialize, Serialize};
use shardrun_protocol::messages::{PeerInfo, Registration, StartInfo};
use std::io::{self, Read, Write};
use std::net::{TcpListener, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

const MAGIC: &str = "shardrun-rendezvous";
const VERSION: u32 = 1;
const MAX_FRAME_BYTES: usize = 16 << 20;

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
    #[error("could not reach rank 0 at {master} within {secs} s ({last}): is rank 0 running?")]
    Unreachable {
        master: String,
        secs: u64,
        last: String,
    },
    #[error("rank 0 refused this rank: {0}")]
    Rejected(String),
    #[error("rendezvous with {peer}: {what}")]
    Io { peer: String, what: String },
}

/// Where rank 0 listens, and how long everyone waits.
#[derive(Debug, Clone)]
pub struct Standalone {
    pub master_addr: String,
    pub master_port: u16,
    pub timeout: Duration,
}

impl Standalone {
    /// From torchrun's `MASTER_ADDR` / `MASTER_PORT`; `None` when `MASTER_ADDR` is unset.
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
        let master_port = port.trim().parse().map_err(|_| {
            RendezvousError::Config(format!("MASTER_PORT={port:?} is not a port number"))
        })?;
        Ok(Some(Standalone {
            master_addr,
            master_port,
            timeout,
        }))
    }

    fn master(&self) -> String {
        format!("{}:{}", self.master_addr, self.master_port)
    }
}

#[derive(Debug, Serialize, Deserialize)]
struct Frame {
    magic: String,
    version: u32,
    message: Message,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
enum Message {
    Register(Registration),
    Start(StartInfo),
    Rejected { reason: String },
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

fn serve(config: &Standalone, me: Registration) -> Result<StartInfo, RendezvousError> {
    let master = config.master();
    // Listen on every interface, like torchrun: MASTER_ADDR is how the others reach us.
    let listener = TcpListener::bind(("0.0.0.0", config.master_port))
        .and_then(|l| l.set_nonblocking(true).map(|()| l))
        .map_err(|e| RendezvousError::Io {
            peer: master.clone(),
            what: format!("rank 0 cannot listen on port {}: {e}", config.master_port),
        })?;
    tracing::debug!(bound = %format!("0.0.0.0:{}", config.master_port), advertised = master, "rendezvous: rank 0 serves");
    let world = me.world_size as usize;
    let mut registered: Vec<Option<(Registration, Option<TcpStream>)>> =
        (0..world).map(|_| None).collect();
    registered[0] = Some((me, None));
    let deadline = Instant::now() + config.timeout;
    while registered.iter().any(Option::is_none) {
        let mut stream = match listener.accept() {
            Ok((stream, _)) => stream,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                if Instant::now() >= deadline {
                    let missing = (0..world as u64)
                        .filter(|&r| registered[r as usize].is_none())
                        .collect();
                    let error = RendezvousError::Missing {
                        secs: config.timeout.as_secs(),
                        missing,
                        world_size: world as u64,
                        master,
                    };
                    reject_all(&mut registered, &error.to_string());
                    return Err(error);
                }
                std::thread::sleep(Duration::from_millis(10));
                continue;
            }
            Err(e) => {
                return Err(RendezvousError::Io {
                    peer: master,
                    what: format!("accept: {e}"),
                })
            }
        };
        // Connections that do not speak the protocol (scanners, stale jobs) are dropped.
        let Ok(Message::Register(reg)) = read_frame(&mut stream, Duration::from_secs(10)) else {
            continue;
        };
        let first = registered[0].as_ref().map(|(r, _)| r.clone());
        let problem = match first {
            _ if reg.world_size as usize != world => Some(format!(
                "rank {} says the world size is {}, rank 0 says {world}",
                reg.rank, reg.world_size
            )),
            _ if reg.rank as usize >= world => Some(format!("rank {} is outside a world of {world}", reg.rank)),
            _ if registered[reg.rank as usize].is_some() => {
                Some(format!("rank {} registered twice (two processes with one RANK?)", reg.rank))
            }
            Some(first) if first.config_hash != reg.config_hash => Some(format!(
                "rank {} loaded config {} but rank 0 loaded {}: start every rank with the same config",
                reg.rank, reg.config_hash, first.config_hash
            )),
            _ => None,
        };
        if let Some(reason) = problem {
            let _ = write_frame(
                &mut stream,
                &Message::Rejected {
                    reason: reason.clone(),
                },
            );
            reject_all(&mut registered, &reason);
            return Err(RendezvousError::Rejected(reason));
        }
        tracing::debug!(
            rank = reg.rank,
            host = reg.host,
            collective_addr = reg.collective_addr.as_deref().unwrap_or("-"),
            "rendezvous: rank registered"
        );
        let rank = reg.rank as usize;
        registered[rank] = Some((reg, Some(stream)));
    }
    let regs: Vec<(Registration, Option<TcpStream>)> = registered.into_iter().flatten().collect();
    let start = StartInfo {
        world_size: world as u64,
        peers: regs
            .iter()
            .map(|(r, _)| PeerInfo {
                rank: r.rank,
                local_rank: r.local_rank,
                host: r.host.clone(),
                collective_addr: r.collective_addr.clone(),
            })
            .collect(),
        nccl_unique_id: regs[0].0.nccl_unique_id.clone(),
    };
    for (reg, stream) in regs {
        if let Some(mut stream) = stream {
            write_frame(&mut stream, &Message::Start(start.clone())).map_err(|what| {
                RendezvousError::Io {
                    peer: format!("rank {} ({})", reg.rank, reg.host),
                    what,
                }
            })?;
        }
    }
    Ok(start)
}

fn reject_all(registered: &mut [Option<(Registration, Option<TcpStream>)>], reason: &str) {
    for (_, stream) in registered.iter_mut().flatten() {
        if let Some(stream) = stream {
            let _ = write_frame(
                stream,
                &Message::Rejected {
                    reason: reason.to_string(),
                },
            );
        }
    }
}

fn join(config: &Standalone, me: Registration) -> Result<StartInfo, RendezvousError> {
    let master = config.master();
    let deadline = Instant::now() + config.timeout;
    let mut last = String::from("no attempt");
    let mut attempt = 0u64;
    let mut stream = loop {
        attempt += 1;
        let addrs = master.to_socket_addrs().map_err(|e| {
            RendezvousError::Config(format!("MASTER_ADDR {master} does not resolve: {e}"))
        })?;
        let connected = addrs.into_iter().find_map(|a| {
            TcpStream::connect_timeout(&a, Duration::from_secs(2))
                .map_err(|e| last = e.to_string())
                .ok()
        });
        if let Some(stream) = connected {
            tracing::debug!(master, attempt, "rendezvous: connected to rank 0");
            break stream;
        }
        if attempt == 1 || attempt.is_multiple_of(50) {
            tracing::debug!(
                master,
                attempt,
                error = last,
                "rendezvous: rank 0 not reachable yet; retrying"
            );
        }
        if Instant::now() >= deadline {
            return Err(RendezvousError::Unreachable {
                master,
                secs: config.timeout.as_secs(),
                last,
            });
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    write_frame(&mut stream, &Message::Register(me)).map_err(|what| RendezvousError::Io {
        peer: master.clone(),
        what,
    })?;
    // Rank 0 answers once everyone is there: wait for as long as the rendezvous may take.
    let left = deadline.saturating_duration_since(Instant::now()) + Duration::from_secs(5);
    match read_frame(&mut stream, left) {
        Ok(Message::Start(start)) => Ok(start),
        Ok(Message::Rejected { reason }) => Err(RendezvousError::Rejected(reason)),
        Ok(Message::Register(_)) => Err(RendezvousError::Io {
            peer: master,
            what: "rank 0 answered with a registration".into(),
        }),
        Err(what) => Err(RendezvousError::Io { peer: master, what }),
    }
}

fn write_frame(stream: &mut TcpStream, message: &Message) -> Result<(), String> {
    let frame = Frame {
        magic: MAGIC.into(),
        version: VERSION,
        message: message.clone(),
    };
    let body = serde_json::to_vec(&frame).map_err(|e| format!("encoding: {e}"))?;
    let mut bytes = (body.len() as u32).to_be_bytes().to_vec();
    bytes.extend_from_slice(&body);
    stream
        .set_nonblocking(false)
        .and_then(|()| stream.set_write_timeout(Some(Duration::from_secs(10))))
        .and_then(|()| stream.write_all(&bytes))
        .map_err(|e| format!("sending: {e}"))
}

fn read_frame(stream: &mut TcpStream, timeout: Duration) -> Result<Message, String> {
    stream
        .set_nonblocking(false)
        .and_then(|()| stream.set_read_timeout(Some(timeout.max(Duration::from_millis(1)))))
        .map_err(|e| format!("socket: {e}"))?;
    let mut len = [0u8; 4];
    stream
        .read_exact(&mut len)
        .map_err(|e| format!("reading: {e}"))?;
    let len = u32::from_be_bytes(len) as usize;
    if len > MAX_FRAME_BYTES {
        return Err(format!(
            "a {len}-byte frame is over the {MAX_FRAME_BYTES}-byte limit"
        ));
    }
    let mut body = vec![0u8; len];
    stream
        .read_exact(&mut body)
        .map_err(|e| format!("reading: {e}"))?;
    let frame: Frame =
        serde_json::from_slice(&body).map_err(|e| format!("not a rendezvous frame: {e}"))?;
    if frame.magic != MAGIC || frame.version != VERSION {
        return Err(format!(
            "unexpected protocol {} v{}",
            frame.magic, frame.version
        ));
    }
    Ok(frame.message)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn registration(rank: u64, world_size: u64, hash: &str) -> Registration {
        Registration {
            rank,
            local_rank: rank,
            world_size,
            host: "127.0.0.1".into(),
            pid: 1,
            device: "cpu".into(),
            config_hash: hash.into(),
            collective_addr: Some(format!("127.0.0.1:{}", 4000 + rank)),
            nccl_unique_id: (rank == 0).then(|| vec![7; 128]),
            device_error: None,
        }
    }

    fn config(timeout_ms: u64) -> Standalone {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        Standalone {
            master_addr: "127.0.0.1".into(),
            master_port: port,
            timeout: Duration::from_millis(timeout_ms),
        }
    }

    #[test]
    fn every_rank_gets_the_same_start_info() {
        let config = config(20_000);
        let handles: Vec<_> = (0..3)
            .map(|r| {
                let config = config.clone();
                std::thread::spawn(move || rendezvous(&config, registration(r, 3, "h")))
            })
            .collect();
        let starts: Vec<StartInfo> = handles
            .into_iter()
            .map(|h| h.join().unwrap().unwrap())
            .collect();
        assert!(starts.iter().all(|s| s == &starts[0]));
        assert_eq!(
            starts[0].peers[2].collective_addr.as_deref(),
            Some("127.0.0.1:4002")
        );
        assert_eq!(starts[0].nccl_unique_id, Some(vec![7; 128]));
    }

    #[test]
    fn timeout_names_the_missing_ranks() {
        let config = config(1_500);
        let c = config.clone();
        let one = std::thread::spawn(move || rendezvous(&c, registration(1, 4, "h")));
        let err = rendezvous(&config, registration(0, 4, "h")).unwrap_err();
        assert!(err.to_string().contains("[2, 3]"), "{err}");
        assert!(matches!(
            one.join().unwrap(),
            Err(RendezvousError::Rejected(_))
        ));
    }

    #[test]
    fn a_different_config_is_refused() {
        let config = config(20_000);
        let c = config.clone();
        let one = std::thread::spawn(move || rendezvous(&c, registration(1, 2, "other")));
        let err = rendezvous(&config, registration(0, 2, "h")).unwrap_err();
        assert!(err.to_string().contains("same config"), "{err}");
        assert!(matches!(
            one.join().unwrap(),
            Err(RendezvousError::Rejected(_))
        ));
    }
}
