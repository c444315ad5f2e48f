//! A rank SIGKILLed at a random step: the job ends quickly, non-zero, naming the rank; no
//! process is left; every line the rank wrote before dying is in train.log.
//! (The deadlines are generous hang detectors, not performance assertions.)

use shardrun_e2e::jobs::*;
use shardrun_e2e::*;
use std::time::{Duration, Instant};

/// A cheap random number without a dependency: the clock's nanoseconds.
fn random_below(n: u64) -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    u64::from(nanos) % n
}

/// `shardrun run` of the tiny MLP for `steps` on `ranks` simulated ranks in `dir`, with
/// `envs` (the simulated ranks' settings and the controller's).
fn run_simulated(
    dir: &TestDir,
    steps: u64,
    ranks: u64,
    envs: &[(&str, String)],
    deadline: Duration,
) -> (std::process::Output, std::path::PathBuf) {
    let spec = dir.write("tiny.yaml", &tiny_mlp_spec("simulated", steps, ranks));
    let envs: Vec<(&str, String)> = [("SHARDRUN_WORKER_BIN", simrank())]
        .into_iter()
        .chain(envs.iter().cloned())
        .collect();
    run_local(
        dir,
        &spec,
        &["--nproc", &ranks.to_string()],
        &envs,
        deadline,
    )
}

#[test]
fn killed_rank_loses_no_line_and_fails_the_job() {
    let dir = TestDir::new("kill-sim");
    let ranks = 3;
    let victim = random_below(ranks);
    let die_at = 2 + random_below(15);
    let lines = 200;
    let envs = [
        ("SIMRANK_LINES_PER_STEP", lines.to_string()),
        ("SIMRANK_STEP_MS", "20".to_string()),
        ("SIMRANK_DIE_RANK", victim.to_string()),
        ("SIMRANK_DIE_AT_STEP", die_at.to_string()),
    ];
    let (out, run) = run_simulated(&dir, 400, ranks, &envs, Duration::from_secs(60));
    let stdout = stdout_of(&out);
    assert_eq!(out.status.code(), Some(1), "{stdout}{}", stderr_of(&out));
    assert!(stdout.contains(&format!("rank {victim} on")), "{stdout}");
    let stderr = stderr_of(&out);
    assert!(
        stderr.contains(&format!("rank {victim} on")) && stderr.contains("signal 9 (SIGKILL)"),
        "{stderr}"
    );

    let result = result_json(&run);
    assert_eq!(
        (result["status"].as_str(), result["rank"].as_u64()),
        (Some("failed"), Some(victim))
    );
    assert_eq!(result["exit"]["signal"], 9);
    assert!(!result["last_lines"].as_array().unwrap().is_empty());

    let log = std::fs::read_to_string(run.join("train.log")).unwrap();
    for step in 1..=die_at {
        for i in 0..lines {
            let line = format!("[rank {victim}] rank {victim} step {step} line {i}\n");
            assert!(log.contains(&line), "missing: {line}");
        }
    }
    assert_no_process_left(&run, Duration::from_secs(5));
}

#[test]
fn sigkill_from_outside_stops_a_training_job_within_seconds() {
    let dir = TestDir::new("kill-train");
    let victim = random_below(2);
    let kill_after = 3 + random_below(20);
    let spec = dir.write("tiny.yaml", &tiny_mlp_spec("killtrain", 100_000, 2));
    let (mut job, run) = spawn_local_run(&dir, &spec, &["--nproc", "2"], &[], |_| {});
    wait_for(
        "training to reach the chosen step",
        Duration::from_secs(60),
        || (metric_steps(&run, 0).len() as u64 >= kill_after).then_some(()),
    )
    .unwrap();
    let pid = worker_pid(&run, victim).expect("the victim's pid");
    unsafe { libc::kill(pid, libc::SIGKILL) };
    let killed = Instant::now();
    let status = wait_for(
        "the job to end after the kill",
        Duration::from_secs(10),
        || job.child.try_wait().ok().flatten(),
    )
    .unwrap_or_else(|e| panic!("{e}: the controller hangs after rank {victim} was killed"));
    assert!(killed.elapsed() < Duration::from_secs(10));
    assert_eq!(status.code(), Some(1));
    let result = result_json(&run);
    assert_eq!(result["rank"].as_u64(), Some(victim), "{result}");
    assert!(
        result["message"].as_str().unwrap().contains("SIGKILL"),
        "{result}"
    );
    assert_no_process_left(&run, Duration::from_secs(5));
    // Rank 0 logs every step: the ones it reported are contiguous, none lost in the crash.
    let log = std::fs::read_to_string(run.join("train.log")).unwrap();
    let logged: Vec<u64> = log
        .lines()
        .filter(|l| l.contains("[rank 0] step "))
        .filter_map(|l| {
            l.split("[rank 0] step ")
                .nth(1)?
                .split('/')
                .next()?
                .parse()
                .ok()
        })
        .collect();
    assert!(!logged.is_empty());
    assert_eq!(logged, (1..=logged.len() as u64).collect::<Vec<_>>());
    // How far it got is in result.json, as the controller knew it.
    let last_step = result["last_step"].as_u64().expect("a last step");
    assert!(
        (1..=logged.len() as u64).contains(&last_step),
        "{result}: rank 0 logged {} steps",
        logged.len()
    );
}

/// A rank whose process lives but never registers (stuck before the rendezvous): the job
/// fails once the rendezvous timeout, set here through the controller's environment as a
/// Slurm job's set-up line would, has passed, naming the rank, the limit and how to raise
/// it; the rank is killed.
#[test]
fn a_rank_that_never_registers_fails_the_job_at_the_rendezvous_timeout() {
    let dir = TestDir::new("silent-rank");
    let envs = [
        ("SIMRANK_LATE_RANK", "2".to_string()),
        ("SHARDRUN_RENDEZVOUS_TIMEOUT", "5".to_string()),
    ];
    let (out, run) = run_simulated(&dir, 400, 3, &envs, Duration::from_secs(60));
    let stderr = stderr_of(&out);
    assert_eq!(out.status.code(), Some(1), "{}{stderr}", stdout_of(&out));
    assert!(
        // On a loaded machine other ranks may be late too: rank 2 is last in the list.
        stderr.contains("2 never registered within 5 s")
            && stderr.contains("export SHARDRUN_RENDEZVOUS_TIMEOUT=SECS"),
        "{stderr}"
    );
    assert_eq!(result_json(&run)["status"], "failed");
    assert_no_process_left(&run, Duration::from_secs(5));
}

/// Ranks that register early wait in silence for a late one (its node slow to load
/// libtorch): their silence before the start is not a lost heartbeat, however much longer
/// than the heartbeat timeout it lasts; the rendezvous timeout judges it, and the job runs.
#[test]
fn ranks_waiting_for_a_late_rank_are_not_judged_by_their_heartbeats() {
    let dir = TestDir::new("late-rank");
    let envs = [
        ("SIMRANK_LATE_RANK", "1".to_string()),
        ("SIMRANK_LATE_MS", "12000".to_string()),
        ("SHARDRUN_HEARTBEAT_TIMEOUT", "5".to_string()),
    ];
    let (out, run) = run_simulated(&dir, 3, 2, &envs, Duration::from_secs(90));
    assert!(
        out.status.success(),
        "{}{}",
        stdout_of(&out),
        stderr_of(&out)
    );
    assert_eq!(result_json(&run)["status"], "succeeded");
    assert_eq!(metric_steps(&run, 1), [1, 2, 3]);
}
