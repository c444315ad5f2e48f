//! Joining the job's world without a controller: torchrun-style rendezvous on
//! `MASTER_ADDR:MASTER_PORT`. Rank 0 listens there, every other rank connects and sends its
//! [`PeerInfo`] as one JSON line, rank 0 answers everyone with the [`StartInfo`] (the same
//! message the controller sends), and the collectives are built from it exactly as in a
//! controller-run job.

use crate::collectives::{prepare, Communicator, Prepared};
use shardrun_protocol::config::DeviceKind;
use shardrun_protocol::messages::{PeerInfo, StartInfo};
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

#[derive(Debug, thiserror::Error)]
pub enum WorldError {
    #[error("rendezvous on {addr}: {what}")]
    Rendezvous { addr: String, what: String },
    #[error(transparent)]
    Comm(#[from] crate::collectives::CommError),
}

/// How long ranks wait for each other at the rendezvous.
const RENDEZVOUS_TIMEOUT: Duration = Duration::from_secs(120);

/// Builds the world communicator of `rank` in a job of `world_size` ranks through the
/// rendezvous at `master_addr:master_port`.
pub fn standalone(
    device: DeviceKind,
    rank: u64,
    local_rank: u64,
    world_size: u64,
    master_addr: &str,
    master_port: u16,
) -> Result<Box<dyn Communicator>, WorldError> {
    let loopback = matches!(master_addr, "127.0.0.1" | "localhost" | "::1");
    let bind_host = if loopback { "127.0.0.1" } else { "0.0.0.0" };
    let prepared = prepare(device, rank as usize, world_size as usize, bind_host)?;
    let me = PeerInfo {
        rank,
        local_rank,
        host: bind_host.to_string(),
        collective_addr: prepared.collective_addr.clone(),
    };
    let start = if world_size == 1 {
        StartInfo {
            world_size,
            peers: vec![me],
            nccl_unique_id: prepared.nccl_unique_id.clone(),
        }
    } else if rank == 0 {
        serve(&prepared, me, world_size, master_addr, master_port)?
    } else {
        join(me, master_addr, master_port)?
    };
    Ok(prepared.connect(&start, rank as usize)?)
}

fn rendezvous_error(addr: &str, what: impl std::fmt::Display) -> WorldError {
    WorldError::Rendezvous {
        addr: addr.to_string(),
        what: what.to_string(),
    }
}

fn serve(
    prepared: &Prepared,
    me: PeerInfo,
    world_size: u64,
    host: &str,
    port: u16,
) -> Result<StartInfo, WorldError> {
    let addr = format!("{host}:{port}");
    let err = |what: String| rendezvous_error(&addr, what);
    let listener = TcpListener::bind(("0.0.0.0", port))
        .map_err(|e| err(format!("rank 0 cannot listen: {e} (is MASTER_PORT free?)")))?;
    listener
        .set_nonblocking(true)
        .map_err(|e| err(e.to_string()))?;
    let deadline = Instant::now() + RENDEZVOUS_TIMEOUT;
    let mut peers: Vec<Option<PeerInfo>> = (0..world_size).map(|_| None).collect();
    peers[0] = Some(me);
    let mut streams = Vec::new();
    while streams.len() + 1 < world_size as usize {
        match listener.accept() {
            Ok((stream, _)) => {
                stream
                    .set_nonblocking(false)
                    .map_err(|e| err(e.to_string()))?;
                stream
                    .set_read_timeout(Some(RENDEZVOUS_TIMEOUT))
                    .map_err(|e| err(e.to_string()))?;
                let mut line = String::new();
                BufReader::new(&stream)
                    .read_line(&mut line)
                    .map_err(|e| err(format!("reading a peer: {e}")))?;
                let peer: PeerInfo = serde_json::from_str(&line).map_err(|e| {
                    err(format!(
                        "a peer sent something that is not a rank's registration: {e}"
                    ))
                })?;
                let slot = peers.get_mut(peer.rank as usize).ok_or_else(|| {
                    err(format!(
                        "rank {} is outside a world of {world_size}",
                        peer.rank
                    ))
                })?;
                if slot.replace(peer.clone()).is_some() {
                    return Err(err(format!(
                        "rank {} registered twice: check RANK of every process",
                        peer.rank
                    )));
                }
                streams.push(stream);
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if Instant::now() > deadline {
                    let missing: Vec<usize> =
                        (0..peers.len()).filter(|&r| peers[r].is_none()).collect();
                    return Err(err(format!(
                        "ranks {missing:?} did not join within {} s",
                        RENDEZVOUS_TIMEOUT.as_secs()
                    )));
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(e) => return Err(err(format!("accept: {e}"))),
        }
    }
    let start = StartInfo {
        world_size,
        peers: peers.into_iter().flatten().collect(),
        nccl_unique_id: prepared.nccl_unique_id.clone(),
    };
    let line = serde_json::to_string(&start).map_err(|e| err(e.to_string()))? + "\n";
    for mut stream in streams {
        stream
            .write_all(line.as_bytes())
            .map_err(|e| err(format!("answering a peer: {e}")))?;
    }
    Ok(start)
}

fn join(me: PeerInfo, host: &str, port: u16) -> Result<StartInfo, WorldError> {
    let addr = format!("{host}:{port}");
    let err = |what: String| rendezvous_error(&addr, what);
    let deadline = Instant::now() + RENDEZVOUS_TIMEOUT;
    // Rank 0 may not be listening yet: retry until the deadline.
    let mut stream = loop {
        match TcpStream::connect((host, port)) {
            Ok(stream) => break stream,
            Err(e) if Instant::now() > deadline => {
                return Err(err(format!(
                    "rank 0 never answered: {e} (check MASTER_ADDR/MASTER_PORT)"
                )))
            }
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    };
    let line = serde_json::to_string(&me).map_err(|e| err(e.to_string()))? + "\n";
    stream
        .write_all(line.as_bytes())
        .map_err(|e| err(format!("registering: {e}")))?;
    stream
        .set_read_timeout(Some(RENDEZVOUS_TIMEOUT))
        .map_err(|e| err(e.to_string()))?;
    let mut answer = String::new();
    BufReader::new(&stream)
        .read_line(&mut answer)
        .map_err(|e| err(format!("waiting for the world: {e}")))?;
    serde_json::from_str(&answer)
        .map_err(|e| err(format!("rank 0's answer is not a start message: {e}")))
}
