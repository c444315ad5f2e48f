//! The controller of a big job holds up to five descriptors per rank (its connection, its
//! log and metrics files, and in local mode its stdout and stderr pipes): 2,500 at 512
//! ranks, past the usual soft limit of 1,024 open files.
//! The hard limit is what the site allows; the soft one is only a default, raised here to
//! the hard one when the job needs more, as servers commonly do.

/// Descriptors the controller needs for a job of `world_size` ranks.
pub fn needed(world_size: u64) -> u64 {
    5 * world_size + 64
}

fn current() -> Option<libc::rlimit> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: plain syscall with a valid, exclusively borrowed struct.
    (unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } == 0).then_some(limit)
}

/// Makes at least `needed` open files possible if the hard limit allows; otherwise returns
/// a warning for the log saying what to do.
pub fn ensure(needed: u64) -> Option<String> {
    let mut limit = current()?;
    if limit.rlim_cur >= needed {
        return None;
    }
    let soft = limit.rlim_cur;
    limit.rlim_cur = limit.rlim_max;
    // SAFETY: plain syscall with a valid struct.
    let raised = unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) } == 0;
    let now = if raised { limit.rlim_max } else { soft };
    tracing::debug!(before = soft, now, needed, "limit on open files");
    (now < needed).then(|| {
        format!(
            "this job needs about {needed} open files in the controller but the limit is \
             {now} (ulimit -n); ranks may fail to connect: raise the hard limit (`ulimit -Hn`) \
             or ask the site to"
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_soft_limit_is_raised_only_when_needed() {
        let before = current().unwrap();
        assert_eq!(ensure(1), None);
        assert_eq!(
            current().unwrap().rlim_cur,
            before.rlim_cur,
            "enough already"
        );
        let warning = ensure(before.rlim_cur + 1);
        let after = current().unwrap();
        assert_eq!(after.rlim_cur, after.rlim_max);
        assert_eq!(warning.is_some(), before.rlim_max == before.rlim_cur);
        if after.rlim_max != libc::RLIM_INFINITY {
            let beyond = ensure(after.rlim_max + 1).expect("a warning");
            assert!(beyond.contains("ulimit -Hn"), "{beyond}");
        }
    }
}
