//! The bookkeeping of a rendezvous: which ranks registered, whether a registration can
//! belong to the job, who is still missing, and the [`StartInfo`] everyone gets once the
//! world is complete. [`Roster`] does no I/O and keeps no clock.
//!
//! Two servers use it. The controller's `JobMachine` (inside its tokio event loop, where a
//! registration is one event among logs, metrics, heartbeats and process exits) and rank 0
//! of a launch without the controller (a blocking listener that has nothing else to do until
//! training starts). They share the wire ([`crate::connection`]) and these decisions; what
//! differs is only what waits for the next registration, so the servers stay separate.

use crate::messages::{PeerInfo, Registration, StartInfo};
use std::collections::BTreeMap;

/// Why a registration cannot join the job. Each text completes "rank R on HOST (pid P)
/// cannot join this job: ".
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("it was started with world size {got} but the job has {world_size}")]
    WorldSize { got: u64, world_size: u64 },
    #[error("rank {rank} is not a rank of a world of {world_size}")]
    OutOfRange { rank: u64, world_size: u64 },
    #[error(
        "its config hash {got} differs from the job's {expected} (a different train_config.json?)"
    )]
    ConfigHash { got: String, expected: String },
    #[error(
        "rank {rank} already registered from {host} pid {pid} (two processes with one rank: \
         check the launcher's rank variable: SHARDRUN_RANK, SLURM_PROCID, or RANK under torchrun)"
    )]
    Duplicate { rank: u64, host: String, pid: u32 },
}

/// The registrations of one job's ranks, checked against its world size and config hash.
#[derive(Debug, Clone)]
pub struct Roster {
    world_size: u64,
    config_hash: String,
    ranks: BTreeMap<u64, Registration>,
}

impl Roster {
    pub fn new(world_size: u64, config_hash: impl Into<String>) -> Roster {
        Roster {
            world_size,
            config_hash: config_hash.into(),
            ranks: BTreeMap::new(),
        }
    }

    pub fn world_size(&self) -> u64 {
        self.world_size
    }

    /// Adds `registration`, or says why it cannot belong to this job (and leaves the roster
    /// as it was).
    pub fn admit(&mut self, registration: Registration) -> Result<(), Refusal> {
        let reg = &registration;
        if reg.world_size != self.world_size {
            return Err(Refusal::WorldSize {
                got: reg.world_size,
                world_size: self.world_size,
            });
        }
        if reg.rank >= self.world_size {
            return Err(Refusal::OutOfRange {
                rank: reg.rank,
                world_size: self.world_size,
            });
        }
        if reg.config_hash != self.config_hash {
            return Err(Refusal::ConfigHash {
                got: reg.config_hash.clone(),
                expected: self.config_hash.clone(),
            });
        }
        if let Some(other) = self.ranks.get(&reg.rank) {
            return Err(Refusal::Duplicate {
                rank: reg.rank,
                host: other.host.clone(),
                pid: other.pid,
            });
        }
        self.ranks.insert(registration.rank, registration);
        Ok(())
    }

    pub fn get(&self, rank: u64) -> Option<&Registration> {
        self.ranks.get(&rank)
    }

    /// Every registration so far, by rank.
    pub fn registrations(&self) -> impl Iterator<Item = &Registration> {
        self.ranks.values()
    }

    /// The ranks that have not registered, in order.
    pub fn missing(&self) -> Vec<u64> {
        (0..self.world_size)
            .filter(|rank| !self.ranks.contains_key(rank))
            .collect()
    }

    pub fn is_complete(&self) -> bool {
        self.ranks.len() as u64 == self.world_size
    }

    /// What every rank is told once all registered (`None` before): every peer by rank, and
    /// rank 0's NCCL unique id.
    pub fn start_info(&self) -> Option<StartInfo> {
        if !self.is_complete() {
            return None;
        }
        let peers = self
            .ranks
            .values()
            .map(|r| PeerInfo {
                rank: r.rank,
                local_rank: r.local_rank,
                host: r.host.clone(),
                collective_addr: r.collective_addr.clone(),
            })
            .collect();
        Some(StartInfo {
            world_size: self.world_size,
            peers,
            nccl_unique_id: self.ranks.get(&0).and_then(|r| r.nccl_unique_id.clone()),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reg(rank: u64) -> Registration {
        Registration {
            rank,
            local_rank: rank % 2,
            world_size: 3,
            host: format!("node{}", rank / 2),
            pid: 100 + rank as u32,
            device: "cpu".into(),
            device_error: None,
            config_hash: "abc".into(),
            collective_addr: Some(format!("node{}:90{rank}", rank / 2)),
            nccl_unique_id: (rank == 0).then(|| vec![7; 128]),
        }
    }

    #[test]
    fn a_complete_roster_gives_every_peer_in_rank_order_and_rank_0s_nccl_id() {
        let mut roster = Roster::new(3, "abc");
        for rank in [2, 0] {
            roster.admit(reg(rank)).unwrap();
        }
        assert_eq!(roster.missing(), vec![1]);
        assert!(!roster.is_complete());
        assert_eq!(
            roster.start_info(),
            None,
            "nothing to start before all registered"
        );
        roster.admit(reg(1)).unwrap();
        assert!(roster.is_complete() && roster.missing().is_empty());
        let start = roster.start_info().unwrap();
        assert_eq!(start.world_size, 3);
        assert_eq!(
            start.peers,
            (0..3)
                .map(|rank| PeerInfo {
                    rank,
                    local_rank: rank % 2,
                    host: format!("node{}", rank / 2),
                    collective_addr: Some(format!("node{}:90{rank}", rank / 2)),
                })
                .collect::<Vec<_>>()
        );
        assert_eq!(start.nccl_unique_id, Some(vec![7; 128]));
        // Everyone is told the same thing, whoever asks and whenever.
        assert_eq!(roster.start_info(), Some(start));
    }

    #[test]
    fn a_second_registration_of_a_rank_is_refused_naming_the_first() {
        let mut roster = Roster::new(3, "abc");
        roster.admit(reg(1)).unwrap();
        let again = Registration {
            host: "node9".into(),
            pid: 999,
            ..reg(1)
        };
        let refusal = roster.admit(again).unwrap_err();
        assert_eq!(
            refusal.to_string(),
            "rank 1 already registered from node0 pid 101 (two processes with one rank: check \
             the launcher's rank variable: SHARDRUN_RANK, SLURM_PROCID, or RANK under torchrun)"
        );
        assert_eq!(roster.get(1).unwrap().pid, 101, "the first one stays");
    }

    #[test]
    fn a_rank_outside_the_world_is_refused() {
        let mut roster = Roster::new(3, "abc");
        let refusal = roster.admit(reg(3)).unwrap_err();
        assert_eq!(
            refusal,
            Refusal::OutOfRange {
                rank: 3,
                world_size: 3
            }
        );
        assert_eq!(refusal.to_string(), "rank 3 is not a rank of a world of 3");
        assert_eq!(roster.missing(), vec![0, 1, 2]);
    }

    #[test]
    fn another_world_size_is_refused_before_the_rank_is_judged() {
        let mut roster = Roster::new(3, "abc");
        let other = Registration {
            world_size: 8,
            ..reg(5)
        };
        assert_eq!(
            roster.admit(other).unwrap_err().to_string(),
            "it was started with world size 8 but the job has 3"
        );
    }

    #[test]
    fn another_config_hash_is_refused() {
        let mut roster = Roster::new(3, "abc");
        let other = Registration {
            config_hash: "zzz".into(),
            ..reg(2)
        };
        assert_eq!(
            roster.admit(other).unwrap_err().to_string(),
            "its config hash zzz differs from the job's abc (a different train_config.json?)"
        );
        assert_eq!(roster.registrations().count(), 0);
    }
}
