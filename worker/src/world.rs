//! Joining the job's world without a controller: prepare the collectives, register through
//! the torchrun-style rendezvous ([`crate::rendezvous`], `MASTER_ADDR`/`MASTER_PORT`), and
//! connect with the [`StartInfo`] it returns (the same message a controller sends).

use crate::collectives::cpu::transport::listen_host;
use crate::collectives::{prepare, CommError, Comms};
use crate::rendezvous::{self, RendezvousError, Standalone};
use shardrun_protocol::config::TrainConfig;
use shardrun_protocol::messages::{Registration, StartInfo};
use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum WorldError {
    #[error(transparent)]
    Rendezvous(#[from] RendezvousError),
    #[error(transparent)]
    Comm(#[from] CommError),
    #[error("rank {rank} of {world_size} has no way to find its peers: set MASTER_ADDR and MASTER_PORT, or run under `shardrun`")]
    NoRendezvous { rank: u64, world_size: u64 },
}

/// How long ranks wait for each other at the rendezvous.
const RENDEZVOUS_TIMEOUT: Duration = Duration::from_secs(120);

/// The communicators of this rank: through `MASTER_ADDR`/`MASTER_PORT` when set, else this
/// process alone (world size 1). `device` describes this rank's device for the registration.
pub fn standalone(
    config: &TrainConfig,
    rank: u64,
    local_rank: u64,
    world_size: u64,
    device: &str,
) -> Result<Comms, WorldError> {
    let Some(master) = Standalone::from_env(RENDEZVOUS_TIMEOUT)? else {
        if world_size > 1 {
            return Err(WorldError::NoRendezvous { rank, world_size });
        }
        let prepared = prepare(config.device, 0, 1, "127.0.0.1")?;
        let start = StartInfo {
            world_size: 1,
            peers: Vec::new(),
            nccl_unique_id: None,
        };
        return Ok(prepared.connect(&single_peer(start, local_rank), 0)?);
    };
    let bind_host = listen_host(&master.master_addr);
    let prepared = prepare(config.device, rank as usize, world_size as usize, bind_host)?;
    let me = Registration {
        rank,
        local_rank,
        world_size,
        host: bind_host.to_string(),
        pid: std::process::id(),
        device: device.to_string(),
        config_hash: config.config_hash(),
        collective_addr: prepared.collective_addr.clone(),
        nccl_unique_id: prepared.nccl_unique_id.clone(),
        device_error: None,
    };
    let start = rendezvous::rendezvous(&master, me)?;
    Ok(prepared.connect(&start, rank as usize)?)
}

fn single_peer(mut start: StartInfo, local_rank: u64) -> StartInfo {
    start.peers = vec![shardrun_protocol::messages::PeerInfo {
        rank: 0,
        local_rank,
        host: "127.0.0.1".into(),
        collective_addr: None,
    }];
    start
}
