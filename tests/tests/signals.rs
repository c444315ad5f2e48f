//! Signals to the controller: SIGTERM/SIGINT shut the workers down cleanly (none left);
//! SIGUSR2 asks every rank to checkpoint and stop (preemption).

use shardrun_e2e::jobs::*;
use shardrun_e2e::*;
use std::time::Duration;

/// A run that would train for minutes, its stdout piped for [`finish`].
fn start_long_job(dir: &TestDir, name: &str) -> (GroupChild, std::path::PathBuf) {
    start_long_run(dir, name, |cmd| {
        cmd.stdout(std::process::Stdio::piped());
    })
}

const DEADLINE: Duration = Duration::from_secs(20);

#[test]
fn sigterm_cancels_the_job_and_leaves_no_process() {
    for signal in [libc::SIGTERM, libc::SIGINT] {
        let dir = TestDir::new("cancel");
        let (mut job, run) = start_long_job(&dir, "cancel");
        unsafe { libc::kill(job.child.id() as i32, signal) };
        let (status, stdout) = finish(&mut job, &run, DEADLINE);
        assert_eq!(status.code(), Some(128 + signal), "{stdout}");
        assert_eq!(result_json(&run)["status"], "cancelled");
        // The spec has no `checkpoint:` section: a cancel leaves nothing to resume from.
        assert!(
            stdout.contains("its spec saves no checkpoints (it has no `checkpoint:` section), so running it again starts over at step 1"),
            "{stdout}"
        );
        assert!(!stdout.contains("run the same command again"), "{stdout}");
        // Each rank stops at a step boundary and says why, in one line.
        let name = if signal == libc::SIGTERM {
            "SIGTERM"
        } else {
            "SIGINT"
        };
        assert_each_rank_stopped_once(&run, 2, name);
        assert_no_process_left(&run, Duration::ZERO);
    }
}

#[test]
fn sigusr2_preempts_every_rank_at_a_step_boundary() {
    let dir = TestDir::new("preempt");
    let (mut job, run) = start_long_job(&dir, "preempt");
    unsafe { libc::kill(job.child.id() as i32, libc::SIGUSR2) };
    let (status, stdout) = finish(&mut job, &run, DEADLINE);
    assert!(status.success(), "{stdout}");
    assert!(
        stdout.contains("run the same command again to resume"),
        "{stdout}"
    );
    assert_eq!(result_json(&run)["status"], "preempted");
    let log = std::fs::read_to_string(run.join("train.log")).unwrap();
    for rank in 0..2 {
        assert!(
            log.contains(&format!("[rank {rank}] preempted at step")),
            "{log}"
        );
    }
}

/// Ranks in a step longer than anyone would wait (simulated: 60 s per step).
fn start_slow_job(dir: &TestDir, name: &str, args: &[&str]) -> (GroupChild, std::path::PathBuf) {
    let spec = dir.write("slow.yaml", &tiny_mlp_spec(name, 100, 2));
    let envs = [
        ("SHARDRUN_WORKER_BIN", simrank()),
        ("SIMRANK_STEP_MS", "60000".to_string()),
    ];
    let mut all = vec!["--nproc", "2"];
    all.extend_from_slice(args);
    let (job, run) = spawn_local_run(dir, &spec, &all, &envs, |_| {});
    wait_for("both ranks' first step", Duration::from_secs(30), || {
        (metric_steps(&run, 0).len() == 1 && metric_steps(&run, 1).len() == 1).then_some(())
    })
    .unwrap();
    (job, run)
}

#[test]
fn a_second_ctrl_c_kills_the_ranks_at_once() {
    let dir = TestDir::new("second-ctrl-c");
    let (mut job, run) = start_slow_job(&dir, "twice", &[]);
    let pid = job.child.id() as i32;
    unsafe { libc::kill(pid, libc::SIGINT) };
    // The first one is acknowledged; the ranks are still in their step.
    wait_for_file(&run.join("train.log"), Duration::from_secs(10), |log| {
        log.contains("received SIGINT")
    })
    .unwrap();
    assert!(job.child.try_wait().unwrap().is_none());
    unsafe { libc::kill(pid, libc::SIGINT) };
    let (status, stdout) = finish(&mut job, &run, DEADLINE);
    assert_eq!(status.code(), Some(130), "{stdout}");
    assert!(
        stdout.contains("SIGINT again: killing the workers now"),
        "{stdout}"
    );
    for rank in 0..2 {
        assert!(
            stdout.contains(&format!("rank {rank} on "))
                && stdout.contains("did not stop in time: killing it"),
            "each rank killed is named: {stdout}"
        );
    }
    assert_eq!(result_json(&run)["status"], "cancelled");
    assert_no_process_left(&run, Duration::ZERO);
}

#[test]
fn ranks_that_cannot_reach_a_step_boundary_are_killed_after_the_stop_timeout() {
    let dir = TestDir::new("stop-timeout");
    let (mut job, run) = start_slow_job(&dir, "stuck", &["--stop-timeout", "2"]);
    unsafe { libc::kill(job.child.id() as i32, libc::SIGTERM) };
    let (status, stdout) = finish(&mut job, &run, DEADLINE);
    assert_eq!(status.code(), Some(143), "{stdout}");
    let log = std::fs::read_to_string(run.join("train.log")).unwrap();
    for rank in 0..2 {
        assert_eq!(
            log.lines()
                .filter(|l| l.contains(&format!("rank {rank} on "))
                    && l.ends_with("did not stop in time: killing it"))
                .count(),
            1,
            "{log}"
        );
    }
    assert_no_process_left(&run, Duration::ZERO);
}
