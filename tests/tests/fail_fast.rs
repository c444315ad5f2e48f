//! A rank that fails with an error or a panic (not a kill) in the middle of training, while
//! the other ranks are already inside the step's collectives waiting for it: the job ends
//! within seconds, the controller names that rank and its error, and no process is left. A
//! rank that hangs instead (heartbeats going on) ends the job after the progress timeout.
//! The failure is injected with `SHARDRUN_INJECT_FAILURE` into the real worker; the job would
//! otherwise train for 100,000 steps. (The deadline is a hang detector, not a timing claim.)
//! A worker binary that cannot be executed at all ends the job the same way, at once.

use shardrun_e2e::jobs::*;
use shardrun_e2e::*;
use std::time::{Duration, Instant};

fn fails_fast(name: &str, injected: &str, victim: u64, expected: &str) {
    let dir = TestDir::new(name);
    let ranks = 3;
    let spec = dir.write("tiny.yaml", &tiny_mlp_spec(name, 100_000, ranks));
    let started = Instant::now();
    let (out, run) = run_local(
        &dir,
        &spec,
        &["--nproc", &ranks.to_string()],
        &[("SHARDRUN_INJECT_FAILURE", injected.to_string())],
        Duration::from_secs(120),
    );
    let took = started.elapsed();
    let stdout = stdout_of(&out);
    assert_eq!(out.status.code(), Some(1), "{stdout}{}", stderr_of(&out));
    let result = result_json(&run);
    assert_eq!(
        (result["status"].as_str(), result["rank"].as_u64()),
        (Some("failed"), Some(victim)),
        "{result}"
    );
    let message = result["message"].as_str().unwrap_or_default();
    assert!(
        message.contains(&format!("rank {victim} on")) && message.contains(expected),
        "{message}"
    );
    // The others were cut off by the controller, not left to find out on their own; the
    // failure is said once as it happens, in the log, and once at the end, as the error.
    let stderr = stderr_of(&out);
    assert!(
        stderr.starts_with(&format!(
            "error: job failed: {message}\nlast lines of rank {victim}:\n"
        )),
        "{stderr}"
    );
    assert_eq!(stderr.matches(message).count(), 1, "{stderr}");
    assert_eq!(stdout.matches(message).count(), 1, "{stdout}");
    assert!(!stdout.contains("job failed"), "{stdout}");
    // Where it stopped and how to go on end the report, and are the run's state in status.
    let resume = " and has no checkpoint: once the cause is fixed, run the same command again \
                  to start it over";
    let last = stderr.trim_end().lines().last().unwrap_or_default();
    assert!(
        last.starts_with("the run stopped after step ") && last.ends_with(resume),
        "{stderr}"
    );
    let status = shardrun_in(
        dir.path(),
        &["status", "--json", &run.display().to_string()],
        Duration::from_secs(30),
    );
    let detail = status_runs(&stdout_of(&status))[0]["detail"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert_eq!(detail, format!("{message}; {last}"));
    let log = std::fs::read_to_string(run.join("train.log")).unwrap();
    // Following its log to its end prints the whole log, then fails as the run did, saying
    // so: `logs -f --until-done run && next-step` stops there.
    let follow = shardrun_in(
        dir.path(),
        &["logs", "-f", "--until-done", &run.display().to_string()],
        Duration::from_secs(30),
    );
    assert_eq!(stdout_of(&follow), log);
    assert_eq!(
        (follow.status.code(), stderr_of(&follow)),
        (
            Some(1),
            format!("{} ended (FAILED): {detail}\n", run.display())
        )
    );
    assert_eq!(
        log.matches(message).count(),
        2,
        "as it happened, and in the report: {log}"
    );
    assert_no_process_left(&run, Duration::from_secs(5));
    // Steps before the failure were trained and logged (the failure was mid-training).
    assert!(metric_steps(&run, 0).len() >= 2, "{stdout}");
    eprintln!(
        "{name}: job ended {:.1} s after it started",
        took.as_secs_f64()
    );
}

#[test]
fn a_rank_returning_an_error_mid_training_ends_the_job_naming_it() {
    fails_fast(
        "fail-error",
        "1:3",
        1,
        "failed: injected failure of rank 1 at step 3",
    );
}

#[test]
fn a_rank_panicking_mid_training_ends_the_job_naming_the_panic() {
    fails_fast(
        "fail-panic",
        "2:4:panic",
        2,
        "panicked in thread main: injected failure of rank 2 at step 4",
    );
}

#[test]
fn a_rank_that_hangs_while_heartbeating_ends_the_job_after_the_progress_timeout() {
    // Rank 1 blocks for good at the start of step 3 (its heartbeats go on); ranks 0 and 2
    // wait for it in step 3's first collective. No rank moves, so the job is judged stuck,
    // and the heartbeats' collective counts tell which rank the others wait for.
    let name = "fail-hang";
    let dir = TestDir::new(name);
    let ranks = 3;
    let spec = dir.write("tiny.yaml", &tiny_mlp_spec(name, 100_000, ranks));
    let (out, run) = run_local(
        &dir,
        &spec,
        &["--nproc", &ranks.to_string(), "--progress-timeout", "3"],
        &[("SHARDRUN_INJECT_FAILURE", "1:3:hang".to_string())],
        Duration::from_secs(120),
    );
    let stdout = stdout_of(&out);
    assert_eq!(out.status.code(), Some(1), "{stdout}{}", stderr_of(&out));
    let result = result_json(&run);
    assert_eq!(
        (result["status"].as_str(), result["rank"].as_u64()),
        (Some("failed"), Some(1)),
        "{result}"
    );
    let message = result["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("made no progress for")
            && message.contains("still at step 2")
            && message.contains("--progress-timeout")
            && message.contains("while the other ranks entered")
            && message.contains("they wait for it"),
        "{message}"
    );
    // Counts of ranks that all ran the same steps: the others entered more than rank 1.
    let lag = &result["lag"];
    assert_eq!(lag["ranks"], serde_json::json!([1]), "{result}");
    assert!(
        lag["others_entered"][0].as_u64() > lag["entered"].as_u64(),
        "{result}"
    );
    // The hung rank ignores requests to stop; the controller kills it.
    assert_no_process_left(&run, Duration::from_secs(5));
    assert_eq!(metric_steps(&run, 0), vec![1, 2], "{stdout}");
}

#[test]
fn a_worker_binary_that_cannot_be_executed_ends_the_job_at_once_naming_it() {
    let name = "no-worker";
    let dir = TestDir::new(name);
    let spec = dir.write("tiny.yaml", &tiny_mlp_spec(name, 100_000, 2));
    let missing = dir.join("no-such-worker").display().to_string();
    let (out, run) = run_local(
        &dir,
        &spec,
        &["--nproc", "2"],
        &[("SHARDRUN_WORKER_BIN", missing.clone())],
        Duration::from_secs(60),
    );
    let (stdout, stderr) = (stdout_of(&out), stderr_of(&out));
    assert_eq!(out.status.code(), Some(1), "{stdout}{stderr}");
    // What could not be started, and what to do about it.
    assert!(
        stderr.contains(&format!(
            "rank 0 could not be started: cannot execute the worker binary {missing} \
             (SHARDRUN_WORKER_BIN): No such file or directory"
        )) && stderr.contains("point SHARDRUN_WORKER_BIN at a built shardrun-worker"),
        "{stderr}"
    );
    let result = result_json(&run);
    assert_eq!(
        (result["status"].as_str(), result["cause"]["kind"].as_str()),
        (Some("failed"), Some("launch")),
        "{result}"
    );
    let status = shardrun_in(
        dir.path(),
        &["status", "--json", &run.display().to_string()],
        Duration::from_secs(60),
    );
    let runs = status_runs(&stdout_of(&status));
    assert_eq!(runs[0]["state"], "FAILED", "{runs:?}");
    assert_no_process_left(&run, Duration::from_secs(5));
}

/// A rank that runs out of memory in libtorch (here an activation of 32 GB under a 6 GB
/// address-space limit on the workers alone) ends the job at once, also with
/// `RUST_BACKTRACE=1`, whose backtrace printing could hang a process out of memory: the
/// error says "out of memory" and what to change, without libtorch's C++ frames.
#[test]
fn a_rank_out_of_memory_ends_the_job_at_once_saying_what_to_change() {
    let name = "fail-oom";
    let dir = TestDir::new(name);
    let spec = tiny_mlp_spec(name, 5, 2)
        .replace("hidden_dim: 32", "hidden_dim: 4096")
        .replace("total_batch_size: 8", "total_batch_size: 4000000")
        .replace("batch_size_per_device: 4", "batch_size_per_device: 2000000");
    let spec = dir.write("oom.yaml", &spec);
    let limited = dir.write(
        "limited-worker.sh",
        &format!(
            "#!/bin/bash\nulimit -v 6000000\nexport OMP_NUM_THREADS=1\nexec {} \"$@\"\n",
            binary("shardrun-worker").display()
        ),
    );
    std::fs::set_permissions(
        &limited,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let (out, run) = run_local(
        &dir,
        &spec,
        &["--nproc", "2"],
        &[
            ("SHARDRUN_WORKER_BIN", limited.display().to_string()),
            ("RUST_BACKTRACE", "1".to_string()),
        ],
        Duration::from_secs(120),
    );
    let (stdout, stderr) = (stdout_of(&out), stderr_of(&out));
    assert_eq!(out.status.code(), Some(1), "{stdout}{stderr}");
    let result = result_json(&run);
    let message = result["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("panicked in thread main: out of memory: libtorch: ")
            && message.contains("can't allocate memory")
            && message.contains("fix: a smaller training.batch_size_per_device")
            && !message.contains("frame #"),
        "{message}"
    );
    assert_no_process_left(&run, Duration::from_secs(5));
}

/// A rank stopped with SIGSTOP (as Ctrl-Z stops one) sends no heartbeat: after the heartbeat
/// timeout the job ends naming it, and says its process is stopped rather than hung.
#[test]
fn a_stopped_rank_ends_the_job_after_the_heartbeat_timeout_saying_it_is_stopped() {
    let name = "fail-stopped";
    let dir = TestDir::new(name);
    let spec = dir.write("tiny.yaml", &tiny_mlp_spec(name, 100_000, 2));
    let (mut job, run) = spawn_local_run(
        &dir,
        &spec,
        &["--nproc", "2", "--heartbeat-timeout", "3"],
        &[],
        |_| {},
    );
    wait_for("two steps", Duration::from_secs(60), || {
        (metric_steps(&run, 1).len() >= 2).then_some(())
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", all_logs(&run)));
    let rank_1 = processes_with_env("SHARDRUN_RUN_DIR", &run.display().to_string())
        .into_iter()
        .find(|(_, vars)| vars.iter().any(|(k, v)| k == "SHARDRUN_RANK" && v == "1"))
        .map(|(pid, _)| pid)
        .expect("rank 1's process");
    unsafe { libc::kill(rank_1, libc::SIGSTOP) };
    let status = wait_for_exit(&mut job, &run, Duration::from_secs(120));
    assert_eq!(status.code(), Some(1), "{}", all_logs(&run));
    let result = result_json(&run);
    let message = result["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("rank 1 on")
            && message.contains(&format!("(pid {rank_1})"))
            && message.contains("stopped sending heartbeats: its process is stopped"),
        "{result}"
    );
    assert_eq!(result["cause"]["stopped"], true, "{result}");
    assert_no_process_left(&run, Duration::from_secs(5));
}
