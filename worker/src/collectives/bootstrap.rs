//! Building a communicator in two steps around the rendezvous: [`prepare`] before it (the CPU
//! backend binds its listener so the address can go into the registration; NCCL rank 0 makes
//! the unique id), [`Prepared::connect`] after it, with every rank's [`StartInfo`].

use super::cpu::{CpuCommunicator, Member};
use super::nccl::{self, NcclCommunicator};
use super::{CommError, Communicator, SingleProcess};
use shardrun_protocol::config::DeviceKind;
use shardrun_protocol::messages::StartInfo;
use std::net::TcpListener;
use std::time::Duration;

/// Knobs of the communicators; the defaults suit training jobs.
#[derive(Debug, Clone)]
pub struct CommOptions {
    /// A collective that moves no byte for this long fails (names the rank it waits on), and
    /// so does connecting to the peers. Dead peers are normally noticed at once (their
    /// sockets close); this bounds the rest, e.g. a peer stuck outside collectives.
    pub timeout: Duration,
}

impl Default for CommOptions {
    fn default() -> Self {
        CommOptions {
            timeout: Duration::from_secs(300),
        }
    }
}

/// What a rank has ready before the rendezvous.
#[derive(Debug)]
pub struct Prepared {
    /// `host:port` of this rank's CPU collective listener (goes into the registration).
    pub collective_addr: Option<String>,
    /// NCCL unique id (rank 0 of a GPU run; goes into the registration).
    pub nccl_unique_id: Option<Vec<u8>>,
    device: DeviceKind,
    rank: usize,
    world_size: usize,
    listener: Option<TcpListener>,
    options: CommOptions,
}

/// Before rendezvous: a CPU rank of a multi-rank job binds its collective listener on
/// `bind_host` (an ephemeral port); NCCL rank 0 makes the unique id.
pub fn prepare(
    device: DeviceKind,
    rank: usize,
    world_size: usize,
    bind_host: &str,
) -> Result<Prepared, CommError> {
    if world_size == 0 || rank >= world_size {
        return Err(CommError::Invalid(format!(
            "rank {rank} in a world of {world_size}"
        )));
    }
    let mut prepared = Prepared {
        collective_addr: None,
        nccl_unique_id: None,
        device,
        rank,
        world_size,
        listener: None,
        options: CommOptions::default(),
    };
    match device {
        DeviceKind::Cpu if world_size > 1 => {
            let (listener, addr) = super::cpu::transport::bind(bind_host)?;
            prepared.listener = Some(listener);
            prepared.collective_addr = Some(addr);
        }
        DeviceKind::Cpu => {}
        DeviceKind::Cuda if rank == 0 => prepared.nccl_unique_id = Some(nccl::new_unique_id()?),
        DeviceKind::Cuda => {}
    }
    Ok(prepared)
}

impl Prepared {
    pub fn with_options(mut self, options: CommOptions) -> Self {
        self.options = options;
        self
    }

    /// After rendezvous: connect to the peers named in `start` (collective on all ranks).
    /// `rank` must be the rank given to [`prepare`].
    pub fn connect(
        self,
        start: &StartInfo,
        rank: usize,
    ) -> Result<Box<dyn Communicator>, CommError> {
        if rank != self.rank || start.world_size as usize != self.world_size {
            return Err(CommError::Invalid(format!(
                "prepared as rank {} of {}, connecting as rank {rank} of {}",
                self.rank, self.world_size, start.world_size
            )));
        }
        if start.peers.len() != self.world_size
            || start
                .peers
                .iter()
                .enumerate()
                .any(|(i, p)| p.rank as usize != i)
        {
            return Err(CommError::Invalid(format!(
                "the start message lists {} peers for a world of {}, not one per rank in order",
                start.peers.len(),
                self.world_size
            )));
        }
        match self.device {
            DeviceKind::Cpu if self.world_size == 1 => Ok(Box::new(SingleProcess)),
            DeviceKind::Cpu => {
                let members = start
                    .peers
                    .iter()
                    .map(|p| {
                        let addr = p.collective_addr.clone().ok_or_else(|| {
                            CommError::Invalid(format!(
                                "rank {} registered no collective address (a CPU run needs one \
                                 per rank)",
                                p.rank
                            ))
                        })?;
                        Ok(Member {
                            rank: p.rank as usize,
                            addr,
                        })
                    })
                    .collect::<Result<Vec<_>, CommError>>()?;
                let listener = self
                    .listener
                    .ok_or_else(|| CommError::Invalid("prepared without a listener".to_string()))?;
                Ok(Box::new(CpuCommunicator::connect(
                    listener,
                    members,
                    rank,
                    self.options,
                )?))
            }
            DeviceKind::Cuda => {
                let id = start.nccl_unique_id.as_deref().ok_or_else(|| {
                    CommError::Invalid(
                        "the start message has no NCCL unique id (rank 0 of a GPU run sends \
                         one at registration)"
                            .to_string(),
                    )
                })?;
                NcclCommunicator::new(id, rank, self.world_size)
            }
        }
    }
}
