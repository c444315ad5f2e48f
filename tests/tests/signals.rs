//! Signals to the controller: SIGTERM/SIGINT shut the workers down cleanly (none left);
//! SIGUSR2 asks every rank to checkpoint and stop (preemption). SIGTERM/SIGINT to one real
//! rank alone stops every rank at the same step boundary, and the job ends cancelled by it.

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

/// A notice right after an interval checkpoint (here one every step) stops the ranks without
/// saving that step again: the time before the kill is not spent on a copy of it.
#[test]
fn a_notice_right_after_an_interval_checkpoint_does_not_save_that_step_again() {
    let dir = TestDir::new("preempt-after-save");
    let spec = dir.write(
        "job.yaml",
        &real_ranks_spec("after-save", 100_000)
            .replace("interval_steps: 20, keep: 2", "interval_steps: 1, keep: 2"),
    );
    let (mut job, run) = spawn_local_run(&dir, &spec, &["--no-progress"], &[], |_| {});
    wait_for("the first checkpoint", Duration::from_secs(120), || {
        has_checkpoint(&run).then_some(())
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", all_logs(&run)));
    unsafe { libc::kill(job.child.id() as i32, libc::SIGUSR2) };
    let (status, stdout) = finish(&mut job, &run, Duration::from_secs(60));
    assert!(status.success(), "{stdout}");
    let result = result_json(&run);
    assert_eq!(result["status"], "preempted", "{result}");
    let step = result["checkpoint"]["step"].as_u64().expect("a checkpoint");
    assert_eq!(result["last_step"].as_u64(), Some(step), "{result}");
    let log = std::fs::read_to_string(run.join("train.log")).unwrap();
    for rank in 0..2 {
        assert!(
            log.lines()
                .any(|l| l.contains(&format!("[rank {rank}] warning: "))
                    && l.ends_with(&format!(
                        "stopping after step {step}, whose checkpoint is saved already"
                    ))),
            "{log}"
        );
    }
    assert!(!log.contains("preemption checkpoint of step"), "{log}");
    let events = std::fs::read_to_string(run.join("events.jsonl")).unwrap();
    let saves_of_step = events
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|e| e["event"] == "checkpoint" && e["step"] == step)
        .count();
    assert_eq!(saves_of_step, 1, "{events}");
}

/// Ranks in a step longer than anyone would wait (simulated: 60 s per step).
fn start_slow_job(dir: &TestDir, name: &str, args: &[&str]) -> (GroupChild, std::path::PathBuf) {
    start_simulated_job(dir, name, 100, 60_000, args)
}

/// Two simulated ranks of `steps` steps of `step_ms` each, once both logged their first.
fn start_simulated_job(
    dir: &TestDir,
    name: &str,
    steps: u64,
    step_ms: u64,
    args: &[&str],
) -> (GroupChild, std::path::PathBuf) {
    let (job, run) = spawn_simulated_run(dir, name, steps, step_ms, args);
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
    // Each rank killed is named once, with the second signal as the reason: no timeout ran
    // out.
    for rank in 0..2 {
        assert_eq!(
            stdout
                .lines()
                .filter(|l| l.contains(&format!("rank {rank} on "))
                    && l.ends_with("has not stopped yet: killing it now (SIGINT again)"))
                .count(),
            1,
            "{stdout}"
        );
    }
    assert!(!stdout.contains("did not stop in time"), "{stdout}");
    // Killed in their second step: the run stands after the first.
    assert!(
        stdout.contains("the run was cancelled by SIGINT after step 1;"),
        "{stdout}"
    );
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

#[test]
fn a_rank_that_never_reaches_the_step_boundary_is_named_while_the_others_wait() {
    // Rank 1 blocks for good at the start of step 3; ranks 0 and 2 wait for it in step 3's
    // first collective. Cancelled then, none reaches a boundary: 10 s on, the controller
    // names the rank the others wait for, before the stop timeout kills them (under Slurm,
    // before the time limit's SIGKILL).
    let dir = TestDir::new("stop-overdue");
    let spec = dir.write("tiny.yaml", &tiny_mlp_spec("overdue", 100_000, 3));
    let envs = [("SHARDRUN_INJECT_FAILURE", "1:3:hang".to_string())];
    let (mut job, run) = spawn_local_run(
        &dir,
        &spec,
        &["--nproc", "3", "--stop-timeout", "15"],
        &envs,
        |cmd| {
            cmd.stdout(std::process::Stdio::piped());
        },
    );
    wait_for("every rank's second step", Duration::from_secs(60), || {
        (0..3)
            .all(|rank| metric_steps(&run, rank) == [1, 2])
            .then_some(())
    })
    .unwrap();
    unsafe { libc::kill(job.child.id() as i32, libc::SIGTERM) };
    let (status, stdout) = finish(&mut job, &run, Duration::from_secs(60));
    assert_eq!(status.code(), Some(143), "{stdout}");
    let log = std::fs::read_to_string(run.join("train.log")).unwrap();
    let named = log
        .lines()
        .find(|l| l.contains("10 s after they were asked to stop"))
        .unwrap_or_else(|| panic!("no report 10 s on:\n{log}"));
    assert!(
        named.contains("have not yet reached a step boundary (ranks 0-2 at step 2")
            && named.contains("; rank 1 entered ")
            && named.contains("the others wait for it (logs/rank-1.log)"),
        "{named}"
    );
    assert_no_process_left(&run, Duration::ZERO);
}

/// Real workers on a small MLP: milliseconds per step, a checkpoint every 20 steps.
fn real_ranks_spec(name: &str, steps: u64) -> String {
    format!(
        "name: {name}\nresources: {{ tasks_per_node: 2, cpus_per_task: 1, time: \"00:10:00\" }}\n\
         training:\n  model: {{ kind: mlp, input_dim: 64, hidden_dim: 256, output_dim: 64 }}\n  \
         steps: {steps}\n  total_batch_size: 16\n  batch_size_per_device: 8\n  \
         checkpoint: {{ interval_steps: 20, keep: 2 }}\n"
    )
}

/// The step a rank's `stopping after step N: <why>` line in train.log names, checking that
/// the rank wrote exactly one such line and that it gives `why`.
fn stopped_after(log: &str, rank: u64, why: &str) -> u64 {
    let prefix = format!("[rank {rank}] warning: stopping after step ");
    let stops: Vec<&str> = log
        .lines()
        .filter_map(|l| l.split_once(&prefix).map(|(_, rest)| rest))
        .collect();
    assert_eq!(
        stops.len(),
        1,
        "rank {rank} says once that it stopped:\n{log}"
    );
    let (step, said) = stops[0].split_once(": ").expect("step: why");
    assert_eq!(said, why, "rank {rank} says why it stopped:\n{log}");
    step.parse().expect("a step number")
}

/// `signal` to the worker of `rank` alone, once the run has a checkpoint: both ranks stop
/// after the same step, the job ends cancelled by that signal to that rank within the hang
/// detector's deadline, nothing is left running, and the same command again resumes from the
/// newest checkpoint and trains to the end.
fn signal_to_one_rank_cancels_the_job(signal: i32, name: &str, rank: u64) {
    const STEPS: u64 = 300;
    let deadline = Duration::from_secs(300);
    let dir = TestDir::new(&format!("one-rank-{}", name.to_lowercase()));
    let spec = dir.write("job.yaml", &real_ranks_spec("one-rank", STEPS));
    let (mut job, run) = spawn_local_run(&dir, &spec, &["--no-progress"], &[], |_| {});
    let pipes = PipeReader::start(&mut job.child);
    wait_for("the first checkpoint", deadline, || {
        has_checkpoint(&run).then_some(())
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", all_logs(&run)));
    // Held, so that the signal lands mid-run however loaded the machine is.
    assert_eq!(signal_workers(&run, libc::SIGSTOP), 2, "both ranks held");
    let victim = worker_pid(&run, rank).expect("the signalled rank's pid");
    unsafe { libc::kill(victim, signal) };
    signal_workers(&run, libc::SIGCONT);
    // A hang detector: a stop takes a step, and the other rank waits 2 s for a cause of its own.
    let status = wait_for_exit(&mut job, &run, Duration::from_secs(60));
    let (stdout, stderr) = pipes.join();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&stdout).into_owned(),
        String::from_utf8_lossy(&stderr).into_owned(),
    );
    let output = format!("{stdout}{stderr}");
    assert_eq!(status.code(), Some(128 + signal), "{output}");
    assert_no_process_left(&run, Duration::ZERO);
    assert!(
        !stderr.contains("error:"),
        "a stop is not an error: {stderr}"
    );
    assert_no_panic(&output, "the stopped run's output");

    // The signalled rank names the signal, the other says a peer was asked, same step.
    let log = std::fs::read_to_string(run.join("train.log")).unwrap();
    let step = stopped_after(&log, rank, name);
    assert_eq!(
        stopped_after(&log, 1 - rank, "another rank was asked to stop"),
        step,
        "{log}"
    );
    assert!(step < STEPS, "stopped mid-run: {log}");

    let result = result_json(&run);
    assert_eq!(result["status"], "cancelled", "{result}");
    assert_eq!(result["by"], format!("{name} to rank {rank}"), "{result}");
    assert_eq!(result["step"], step, "{result}");
    assert_eq!(result["exit_code"], 128 + signal, "{result}");
    let checkpoint = result["checkpoint"]["step"].as_u64().expect("a checkpoint");
    assert!(
        checkpoint >= 20 && checkpoint <= step && checkpoint.is_multiple_of(20),
        "{result}"
    );
    let ended = format!("was cancelled by {name} to rank {rank} after step {step}");
    let last = stdout.lines().last().unwrap_or_default();
    assert!(
        last.contains(&ended)
            && last.contains(&format!("its newest checkpoint is step {checkpoint} "))
            && last.contains("run the same command again to resume"),
        "{stdout}"
    );

    // The same command again resumes after the newest checkpoint and trains to the end.
    let steps_before = metric_steps(&run, 0).len();
    let (second, _) = run_local(&dir, &spec, &["--no-progress"], &[], deadline);
    let again = stdout_of(&second);
    assert!(second.status.success(), "{again}{}", stderr_of(&second));
    let headline = again.lines().next().unwrap_or_default();
    assert!(
        headline.starts_with(&format!(
            "resuming {} at step {} from its checkpoint of step {checkpoint} (",
            run.display(),
            checkpoint + 1
        )) && headline.contains(&ended),
        "{headline}"
    );
    let after = metric_steps(&run, 0)[steps_before..].to_vec();
    assert_eq!(after, (checkpoint + 1..=STEPS).collect::<Vec<_>>());
    assert_no_process_left(&run, Duration::ZERO);
}

#[test]
fn sigterm_to_rank_1_alone_stops_every_rank_and_names_it() {
    signal_to_one_rank_cancels_the_job(libc::SIGTERM, "SIGTERM", 1);
}

#[test]
fn sigint_to_rank_0_alone_stops_every_rank_and_names_it() {
    signal_to_one_rank_cancels_the_job(libc::SIGINT, "SIGINT", 0);
}

/// Ctrl-Z on `shardrun run` (SIGTSTP, or SIGSTOP) stops the controller alone: the ranks
/// train on, and their heartbeats wait in its sockets. Longer than the heartbeat timeout,
/// then `fg`: the controller reads them, and the job goes on.
#[test]
fn a_controller_stopped_longer_than_the_heartbeat_timeout_fails_no_rank() {
    let dir = TestDir::new("controller-paused");
    let (mut job, run) =
        start_simulated_job(&dir, "paused", 30, 200, &["--heartbeat-timeout", "2"]);
    let pid = job.child.id() as i32;
    unsafe { libc::kill(pid, libc::SIGSTOP) };
    // The stop itself is what is tested: three heartbeat timeouts.
    std::thread::sleep(Duration::from_secs(6));
    unsafe { libc::kill(pid, libc::SIGCONT) };
    let (status, stdout) = finish(&mut job, &run, Duration::from_secs(60));
    assert!(status.success(), "{stdout}");
    assert!(!stdout.contains("stopped sending heartbeats"), "{stdout}");
    assert_eq!(result_json(&run)["status"], "succeeded");
    assert_eq!(metric_steps(&run, 0).last(), Some(&30));
}

/// Ctrl-C while the ranks are still starting: the ones that register afterwards are told
/// the job stops and end quietly; the run ends cancelled with the controller's one line, not
/// every rank's "lost the connection to the controller". The ranks start only once the
/// controller has taken the signal (a wrapper holds them back until the test lets them go).
#[test]
fn ctrl_c_while_the_ranks_start_ends_the_run_without_an_error_from_each_rank() {
    use std::os::unix::fs::PermissionsExt;
    let dir = TestDir::new("ctrl-c-at-start");
    let spec = dir.write("starting.yaml", &real_ranks_spec("starting", 1000));
    let go = dir.join("go");
    let wrapper = dir.write(
        "held-worker",
        &format!(
            "#!/bin/sh\nwhile [ ! -e {go:?} ]; do sleep 0.05; done\nexec {:?} \"$@\"\n",
            binary("shardrun-worker")
        ),
    );
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).unwrap();
    let envs = [("SHARDRUN_WORKER_BIN", wrapper.display().to_string())];
    // Ranks not yet running get `--grace` seconds before a SIGTERM: long enough that they
    // register (about a second) and are told to stop, which is what is tested.
    let started = std::time::Instant::now();
    let (mut job, run) = spawn_local_run(
        &dir,
        &spec,
        &["--nproc", "2", "--grace", "60"],
        &envs,
        |cmd| {
            // A debug log would print the registrations' fields, `device_error` among them.
            cmd.env_remove("RUST_LOG");
        },
    );
    wait_for_file(&run.join("controller.addr"), DEADLINE, |t| {
        t.ends_with('\n')
    })
    .unwrap();
    // SAFETY: a signal to the controller this test started.
    unsafe { libc::kill(job.child.id() as i32, libc::SIGINT) };
    wait_for_file(&run.join("train.log"), DEADLINE, |t| {
        t.contains("received SIGINT")
    })
    .unwrap();
    std::fs::write(&go, "").unwrap();
    let pipes = PipeReader::start(&mut job.child);
    let status = wait_for_exit(&mut job, &run, Duration::from_secs(60));
    let (stdout, stderr) = pipes.join();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&stdout),
        String::from_utf8_lossy(&stderr)
    );
    assert_eq!(status.code(), Some(130), "{said}");
    assert!(
        started.elapsed() < Duration::from_secs(50),
        "the ranks ended by the SIGTERM after the grace, not by being told to stop"
    );
    assert_eq!(result_json(&run)["status"], "cancelled", "{said}");
    assert!(said.contains("the run was cancelled by SIGINT"), "{said}");
    let log = all_logs(&run);
    for text in [&said, &log] {
        assert!(
            !text.contains("error") && !text.contains("lost the connection"),
            "a rank said more than the controller:\n{text}"
        );
    }
    assert_no_process_left(&run, Duration::ZERO);
}
