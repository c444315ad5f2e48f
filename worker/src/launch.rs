//! Who this process is in the job. Precedence: the controller's explicit variables
//! (`SHARDRUN_RANK`, ...), then Slurm's (`SLURM_PROCID`, `SLURM_NTASKS`, `SLURM_LOCALID`),
//! then torchrun's (`RANK`, `WORLD_SIZE`, `LOCAL_RANK`), else a single process. Under
//! torchrun (`TORCHELASTIC_RUN_ID` set) torchrun's come before Slurm's: `srun torchrun`
//! starts several workers per Slurm task, and each inherits the task's Slurm rank.

use anyhow::{bail, Context, Result};
use shardrun_protocol::env;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RankEnv {
    pub rank: u64,
    pub world_size: u64,
    pub local_rank: u64,
    /// Which launcher's variables were used, for log lines.
    pub source: RankSource,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RankSource {
    Controller,
    Slurm,
    Torchrun,
    SingleProcess,
}

impl RankEnv {
    pub fn from_env() -> Result<RankEnv> {
        Self::from_lookup(|name| std::env::var(name).ok())
    }

    /// Testable core of [`RankEnv::from_env`].
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<RankEnv> {
        let controller = (
            RankSource::Controller,
            env::RANK,
            env::WORLD_SIZE,
            env::LOCAL_RANK,
        );
        let slurm = (
            RankSource::Slurm,
            "SLURM_PROCID",
            "SLURM_NTASKS",
            "SLURM_LOCALID",
        );
        let torchrun = (RankSource::Torchrun, "RANK", "WORLD_SIZE", "LOCAL_RANK");
        let sets = if get("TORCHELASTIC_RUN_ID").is_some() {
            [controller, torchrun, slurm]
        } else {
            [controller, slurm, torchrun]
        };
        for (source, rank_var, world_var, local_var) in sets {
            let Some(rank) = get(rank_var) else { continue };
            let parse = |var: &str, value: Option<String>| -> Result<Option<u64>> {
                value
                    .map(|v| {
                        v.trim()
                            .parse::<u64>()
                            .with_context(|| format!("{var}={v:?} is not a non-negative integer"))
                    })
                    .transpose()
            };
            let rank = parse(rank_var, Some(rank))?.unwrap_or(0);
            let Some(world_size) = parse(world_var, get(world_var))? else {
                bail!("{rank_var} is set but {world_var} is not: set both (or neither)");
            };
            let local_rank = parse(local_var, get(local_var))?.unwrap_or(rank);
            if world_size == 0 || rank >= world_size {
                bail!("{rank_var}={rank} is not a rank of a world of {world_var}={world_size}");
            }
            return Ok(RankEnv {
                rank,
                world_size,
                local_rank,
                source,
            });
        }
        Ok(RankEnv {
            rank: 0,
            world_size: 1,
            local_rank: 0,
            source: RankSource::SingleProcess,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn lookup(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| map.get(k).cloned()
    }

    #[test]
    fn controller_variables_win_over_slurm() {
        let env = RankEnv::from_lookup(lookup(&[
            ("SHARDRUN_RANK", "1"),
            ("SHARDRUN_WORLD_SIZE", "2"),
            ("SLURM_PROCID", "0"),
            ("SLURM_NTASKS", "4"),
        ]))
        .unwrap();
        assert_eq!(
            (env.rank, env.world_size, env.source),
            (1, 2, RankSource::Controller)
        );
    }

    #[test]
    fn slurm_then_torchrun_then_single() {
        let slurm = RankEnv::from_lookup(lookup(&[
            ("SLURM_PROCID", "3"),
            ("SLURM_NTASKS", "4"),
            ("SLURM_LOCALID", "1"),
        ]))
        .unwrap();
        assert_eq!(
            (slurm.rank, slurm.local_rank, slurm.source),
            (3, 1, RankSource::Slurm)
        );
        let torchrun = RankEnv::from_lookup(lookup(&[("RANK", "1"), ("WORLD_SIZE", "2")])).unwrap();
        assert_eq!((torchrun.rank, torchrun.local_rank), (1, 1));
        let single = RankEnv::from_lookup(lookup(&[])).unwrap();
        assert_eq!((single.rank, single.world_size), (0, 1));
    }

    #[test]
    fn torchrun_inside_a_slurm_task_wins_over_the_task_it_inherited() {
        // `srun --ntasks-per-node=1 torchrun --nproc-per-node=4`: the second node's third
        // worker inherits the task's SLURM_PROCID=1, SLURM_LOCALID=0.
        let env = RankEnv::from_lookup(lookup(&[
            ("SLURM_PROCID", "1"),
            ("SLURM_NTASKS", "2"),
            ("SLURM_LOCALID", "0"),
            ("TORCHELASTIC_RUN_ID", "job"),
            ("RANK", "6"),
            ("WORLD_SIZE", "8"),
            ("LOCAL_RANK", "2"),
        ]))
        .unwrap();
        assert_eq!(
            (env.rank, env.world_size, env.local_rank, env.source),
            (6, 8, 2, RankSource::Torchrun)
        );
    }

    #[test]
    fn inconsistent_values_are_errors() {
        assert!(RankEnv::from_lookup(lookup(&[("RANK", "2"), ("WORLD_SIZE", "2")])).is_err());
        assert!(RankEnv::from_lookup(lookup(&[("RANK", "x"), ("WORLD_SIZE", "2")])).is_err());
        assert!(RankEnv::from_lookup(lookup(&[("RANK", "0")])).is_err());
    }
}
