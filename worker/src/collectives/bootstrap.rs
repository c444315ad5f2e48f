//! Building a job's communicators in two steps around the rendezvous: [`prepare`] before it
//! (the control ring binds its listener so the address can go into the registration; NCCL
//! rank 0 makes the unique id), [`PendingComms::connect`] after it, with every rank's
//! [`StartInfo`].

use super::counted::Counted;
use super::cpu::{CpuCommunicator, Member};
use super::nccl::{self, NcclCommunicator};
use super::{CommError, Communicator, SingleProcess};
use shardrun_protocol::config::DeviceKind;
use shardrun_protocol::messages::StartInfo;
use std::net::TcpListener;
use std::time::Duration;

/// Environment variable of the collective timeout, in seconds.
pub const TIMEOUT_VARIABLE: &str = "SHARDRUN_COLLECTIVE_TIMEOUT";

/// Environment variable that makes NCCL's communicators blocking (`1`), as PyTorch's are by
/// default (its `TORCH_NCCL_USE_COMM_NONBLOCKING` is off).
pub const NCCL_BLOCKING_VARIABLE: &str = "SHARDRUN_NCCL_BLOCKING";

/// Knobs of the communicators; the defaults suit training jobs.
#[derive(Debug, Clone)]
pub struct CommOptions {
    /// A collective that moves no byte for this long fails (names the rank it waits on), and
    /// so does connecting to the peers. Dead peers are normally noticed at once (their
    /// sockets close); this bounds the rest, e.g. a peer stuck outside collectives, or one
    /// still loading a large model from slow storage when the others start the first
    /// all-gather.
    pub timeout: Duration,
    /// NCCL communicators that block in their calls instead of returning `ncclInProgress`:
    /// a fallback for a cluster whose NCCL misbehaves in non-blocking mode. Joining,
    /// splitting and a collective's first connection to its peers (NCCL connects lazily)
    /// then wait inside NCCL without the timeout: a peer that never comes is caught by the
    /// controller's rendezvous and progress timeouts instead.
    pub nccl_blocking: bool,
}

impl Default for CommOptions {
    /// 600 s, PyTorch's default for NCCL process groups; non-blocking NCCL communicators, so
    /// that joining them has the timeout too.
    fn default() -> Self {
        CommOptions {
            timeout: Duration::from_secs(600),
            nccl_blocking: false,
        }
    }
}

impl CommOptions {
    /// The defaults, with the timeout of `SHARDRUN_COLLECTIVE_TIMEOUT` and the NCCL mode of
    /// `SHARDRUN_NCCL_BLOCKING` when they are set.
    pub fn from_env() -> Result<CommOptions, CommError> {
        CommOptions::with_settings(
            std::env::var(TIMEOUT_VARIABLE).ok().as_deref(),
            std::env::var(NCCL_BLOCKING_VARIABLE).ok().as_deref(),
        )
    }

    fn with_settings(
        seconds: Option<&str>,
        blocking: Option<&str>,
    ) -> Result<CommOptions, CommError> {
        let mut options = CommOptions::default();
        if let Some(text) = seconds.map(str::trim).filter(|t| !t.is_empty()) {
            options.timeout = match text.parse::<u64>() {
                Ok(secs) if secs > 0 => Duration::from_secs(secs),
                _ => {
                    return Err(CommError::Invalid(format!(
                        "{TIMEOUT_VARIABLE}={text}: the collective timeout is a whole number \
                         of seconds above 0 (default 600)"
                    )))
                }
            };
        }
        if let Some(text) = blocking.map(str::trim).filter(|t| !t.is_empty()) {
            options.nccl_blocking = match text {
                "1" => true,
                "0" => false,
                _ => {
                    return Err(CommError::Invalid(format!(
                        "{NCCL_BLOCKING_VARIABLE}={text}: write 1 (blocking NCCL \
                         communicators) or 0 (non-blocking, the default)"
                    )))
                }
            };
        }
        Ok(options)
    }
}

/// A job's two communicators.
pub struct Comms {
    /// Control values and CPU tensors: always the CPU ring (or this process alone).
    pub control: Box<dyn Communicator>,
    /// The FSDP engine's tensors: NCCL on GPUs, a second CPU ring on CPUs, this process
    /// alone at world size 1. Wrap it in a [`super::DataPlane`] (the process groups do).
    pub data: Box<dyn Communicator>,
}

impl Comms {
    /// This process alone, on any device: no communicator at all.
    pub fn single_process() -> Comms {
        Comms {
            control: Box::new(SingleProcess),
            data: Box::new(SingleProcess),
        }
    }
}

/// What a rank has ready before the rendezvous.
#[derive(Debug)]
pub struct PendingComms {
    /// `host:port` of this rank's control ring listener (goes into the registration).
    pub collective_addr: Option<String>,
    /// NCCL unique id (rank 0 of a GPU run; goes into the registration).
    pub nccl_unique_id: Option<Vec<u8>>,
    device: DeviceKind,
    rank: usize,
    world_size: usize,
    listener: Option<TcpListener>,
    options: CommOptions,
}

/// Before rendezvous: every rank of a multi-rank job binds its control ring listener on
/// `bind_host` (an ephemeral port); rank 0 of a multi-rank GPU job makes the NCCL unique id
/// (loading NCCL, so a missing library fails here, before anyone waits).
pub fn prepare(
    device: DeviceKind,
    rank: usize,
    world_size: usize,
    bind_host: &str,
) -> Result<PendingComms, CommError> {
    if world_size == 0 || rank >= world_size {
        return Err(CommError::Invalid(format!(
            "rank {rank} in a world of {world_size}"
        )));
    }
    let mut prepared = PendingComms {
        collective_addr: None,
        nccl_unique_id: None,
        device,
        rank,
        world_size,
        listener: None,
        options: CommOptions::from_env()?,
    };
    if world_size > 1 {
        let (listener, addr) = super::cpu::transport::bind(bind_host)?;
        prepared.listener = Some(listener);
        prepared.collective_addr = Some(addr);
        if device == DeviceKind::Cuda && rank == 0 {
            prepared.nccl_unique_id = Some(nccl::new_unique_id()?);
            tracing::debug!("made the NCCL unique id");
        }
    }
    Ok(prepared)
}

impl PendingComms {
    pub fn with_options(mut self, options: CommOptions) -> Self {
        self.options = options;
        self
    }

    /// After rendezvous: connect to the peers named in `start` (collective on all ranks).
    /// `rank` must be the rank given to [`prepare`]. On a GPU the current CUDA device must be
    /// this rank's already (NCCL binds its communicator to it).
    pub fn connect(self, start: &StartInfo, rank: usize) -> Result<Comms, CommError> {
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
        if self.world_size == 1 {
            return Ok(Comms::single_process());
        }
        let members = start
            .peers
            .iter()
            .map(|p| {
                let addr = p.collective_addr.clone().ok_or_else(|| {
                    CommError::Invalid(format!(
                        "rank {} registered no collective address (every rank of a multi-rank \
                         job has a control ring listener)",
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
        tracing::debug!(world_size = self.world_size, device = ?self.device, "building the communicators");
        let control: Box<dyn Communicator> = Box::new(CpuCommunicator::connect(
            listener,
            members,
            rank,
            self.options.clone(),
        )?);
        let data = match self.device {
            // A second ring, so the engine's traffic and the control values never queue
            // behind each other (as NCCL and the control ring do not on GPUs).
            DeviceKind::Cpu => {
                let all: Vec<usize> = (0..self.world_size).collect();
                control.new_subgroup(&all)?
            }
            DeviceKind::Cuda => {
                let id = start.nccl_unique_id.as_deref().ok_or_else(|| {
                    CommError::Invalid(
                        "the start message has no NCCL unique id (rank 0 of a GPU run sends \
                         one at registration)"
                            .to_string(),
                    )
                })?;
                Box::new(NcclCommunicator::new(
                    id,
                    rank,
                    self.world_size,
                    &self.options,
                )?)
            }
        };
        tracing::debug!(
            "communicators ready: control on the CPU ring, data on {}",
            match self.device {
                DeviceKind::Cpu => "a second CPU ring",
                DeviceKind::Cuda => "NCCL",
            }
        );
        Ok(Comms {
            control: Counted::wrap(control),
            data: Counted::wrap(data),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_collective_timeout_is_600_s_unless_the_environment_says_otherwise() {
        let timeout = |setting| CommOptions::with_settings(setting, None).map(|o| o.timeout);
        assert_eq!(timeout(None).unwrap(), Duration::from_secs(600));
        assert_eq!(timeout(Some(" ")).unwrap(), Duration::from_secs(600));
        assert_eq!(timeout(Some("1200")).unwrap(), Duration::from_secs(1200));
        for bad in ["0", "-5", "10m", "1.5"] {
            let err = timeout(Some(bad)).unwrap_err().to_string();
            assert!(
                err.contains(&format!("SHARDRUN_COLLECTIVE_TIMEOUT={bad}: the collective timeout is a whole number of seconds above 0")),
                "{err}"
            );
        }
    }

    #[test]
    fn nccl_communicators_are_non_blocking_unless_the_environment_says_otherwise() {
        let blocking = |setting| CommOptions::with_settings(None, setting).map(|o| o.nccl_blocking);
        assert!(!blocking(None).unwrap());
        assert!(!blocking(Some("0")).unwrap());
        assert!(blocking(Some(" 1")).unwrap());
        let err = blocking(Some("yes")).unwrap_err().to_string();
        assert!(
            err.contains("SHARDRUN_NCCL_BLOCKING=yes: write 1 (blocking NCCL communicators) or 0"),
            "{err}"
        );
    }
}
