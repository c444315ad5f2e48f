//! The controller shares the batch host's cores with the ranks it serves. Its threads run as
//! `SCHED_BATCH`: a log line that wakes the controller no longer preempts the rank that wrote
//! it (the wake-up waits for the next scheduling point, a few ms at most), so a rank that logs
//! heavily pays for copying its lines into the socket, not for the controller's work on them
//! (100 lines per 20 ms step: +4.0% step time before, +0.2-0.5% after, medians). Children
//! inherit the policy (`SCHED_RESET_ON_FORK` only resets real-time ones), so the launcher
//! gives workers and `srun` the normal policy back with [`restore_normal`] between fork and
//! exec.

fn set_policy(policy: libc::c_int) {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: plain syscall on the calling thread with a valid parameter struct.
    unsafe {
        libc::sched_setscheduler(0, policy, &param);
    }
}

/// Puts the calling thread in `SCHED_BATCH`. Best effort: a refusal only costs speed.
pub fn yield_to_training() {
    set_policy(libc::SCHED_BATCH);
}

/// Back to `SCHED_OTHER`. Async-signal-safe (one syscall): callable between fork and exec.
pub fn restore_normal() {
    set_policy(libc::SCHED_OTHER);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calling_thread_becomes_batch_and_restored_children_do_not() {
        use std::os::unix::process::CommandExt;
        std::thread::spawn(|| {
            yield_to_training();
            // SAFETY: plain syscall on this thread.
            let policy = unsafe { libc::sched_getscheduler(0) };
            assert_eq!(policy, libc::SCHED_BATCH, "policy {policy:#x}");
            let child_policy = |restore: bool| {
                let mut cmd = std::process::Command::new("sh");
                cmd.args(["-c", "grep -m1 '^policy' /proc/self/sched"]);
                if restore {
                    // SAFETY: restore_normal is async-signal-safe.
                    unsafe {
                        cmd.pre_exec(|| {
                            restore_normal();
                            Ok(())
                        });
                    }
                }
                let out = cmd.output().expect("sh runs");
                let text = String::from_utf8_lossy(&out.stdout).to_string();
                text.rsplit(':').next().unwrap_or("").trim().to_string()
            };
            assert_eq!(child_policy(false), "3", "inherited without the reset");
            assert_eq!(child_policy(true), "0", "normal again after the reset");
        })
        .join()
        .unwrap();
    }
}
