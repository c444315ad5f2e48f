//! NCCL over InfiniBand (or RoCE) registers its buffers with the network card, which locks
//! them in memory. Slurm gives a job the limits of the shell that submitted it by default
//! (`PropagateResourceLimits`), and a login node's locked-memory limit is often 64 KiB: the
//! first collective between nodes then fails inside NCCL ("ibv_reg_mr failed"). The soft
//! limit is raised to the hard one here; a hard limit that stays low is said up front.

/// Locked memory NCCL's network transport needs, at the least (its buffers per peer and
/// channel come to hundreds of MiB on a large job; sites set it unlimited).
const NEEDED_BYTES: u64 = 1 << 30;

fn current() -> Option<libc::rlimit> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: plain syscall with a valid, exclusively borrowed struct.
    (unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut limit) } == 0).then_some(limit)
}

/// Raises the soft locked-memory limit to the hard one; a warning saying what to do when
/// the limit then stays below what NCCL needs between nodes.
pub fn raise() -> Option<String> {
    let mut limit = current()?;
    if limit.rlim_cur != limit.rlim_max {
        limit.rlim_cur = limit.rlim_max;
        // SAFETY: plain syscall with a valid struct; raising the soft limit up to the hard
        // one needs no privilege.
        unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &limit) };
    }
    too_low(current()?.rlim_cur)
}

/// What to do when a locked-memory limit of `now` bytes is below what NCCL needs.
fn too_low(now: u64) -> Option<String> {
    (now != libc::RLIM_INFINITY && now < NEEDED_BYTES).then(|| {
        format!(
            "the locked-memory limit is {} KiB (ulimit -l): NCCL over InfiniBand needs it \
             unlimited and may fail at the first collective between nodes; add \
             `--propagate=NONE` to `resources.extra_sbatch` (the nodes' own limits apply), or \
             ask the site to set `PropagateResourceLimitsExcept=MEMLOCK`",
            now / 1024
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_soft_limit_becomes_the_hard_one_and_a_low_limit_is_said() {
        let before = current().unwrap();
        let warning = raise();
        let after = current().unwrap();
        assert_eq!(after.rlim_cur, before.rlim_max);
        assert_eq!(warning, too_low(after.rlim_cur));
    }

    #[test]
    fn a_login_nodes_limit_is_said_with_what_to_change_and_unlimited_is_not() {
        let said = too_low(64 << 10).expect("64 KiB is too low");
        assert!(
            said.starts_with("the locked-memory limit is 64 KiB (ulimit -l)")
                && said.contains("`--propagate=NONE` to `resources.extra_sbatch`"),
            "{said}"
        );
        assert_eq!(too_low(libc::RLIM_INFINITY), None);
        assert_eq!(too_low(NEEDED_BYTES), None);
    }
}
