//! A local run (`shardrun run`) as the machine around it treats it: its controller killed
//! outright, its terminal closed, its output piped into `head`, stopped from another shell
//! with `shardrun cancel`, its run directory no longer taking its logs; and the other
//! commands printing into a pipe nobody reads.
//!
//! Needs the binaries built: `cargo build --release -p shardrun -p shardrun-worker`.

use shardrun_e2e::jobs::*;
use shardrun_e2e::*;
use std::io::BufRead;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

const DEADLINE: Duration = Duration::from_secs(60);

/// `shardrun <args>` to completion; (exit status, stdout, stderr).
fn shardrun_cmd(args: &[&str]) -> (Option<i32>, String, String) {
    let out = shardrun_in(Path::new("."), args, DEADLINE);
    (out.status.code(), stdout_of(&out), stderr_of(&out))
}

/// The [`start_long_run`] command again, to 5 steps; (its output, its stdout).
fn run_long_again_briefly(dir: &TestDir) -> (std::process::Output, String) {
    let envs = [("SHARDRUN_WORKER_BIN", simrank())];
    let (out, _) = run_local(
        dir,
        &dir.join("long.yaml"),
        &["--nproc", "2", "--set", "training.steps=5"],
        &envs,
        DEADLINE,
    );
    let stdout = stdout_of(&out);
    (out, stdout)
}

#[test]
fn a_run_whose_controller_was_killed_shows_as_died_and_the_same_command_resumes_it() {
    let dir = TestDir::new("died");
    let (mut job, run) = start_long_run(&dir, "died", |_| {});
    let controller = job.child.id();
    // The controller alone, as the OOM killer does; its ranks die with it.
    unsafe { libc::kill(controller as i32, libc::SIGKILL) };
    wait_for_exit(&mut job, &run, DEADLINE);
    assert_no_process_left(&run, DEADLINE);
    let run_arg = run.display().to_string();

    let (code, stdout, stderr) = shardrun_cmd(&["status", "--json", &run_arg]);
    assert_eq!(code, Some(0), "{stderr}");
    let runs = status_runs(&stdout);
    assert_eq!(runs[0]["state"], "DIED", "{stdout}");
    let detail = runs[0]["detail"].as_str().unwrap_or_default();
    assert!(
        detail.starts_with(&format!("its controller (pid {controller} on ")),
        "{detail}"
    );
    // What running it again does: from the newest committed checkpoint, or from the start.
    let newest = std::fs::read_dir(run.join("checkpoints"))
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter_map(|name| name.strip_prefix("step-")?.parse::<u64>().ok())
        .max();
    let again = match newest {
        Some(step) => format!("resumes it from step {step}"),
        None => "starts it over (it has no checkpoint)".to_string(),
    };
    assert!(detail.ends_with(&again), "{detail}");
    let (_, table, _) = shardrun_cmd(&["status", &run_arg]);
    // A run without Slurm: no note names a Slurm command its state did not come from.
    assert!(
        table.contains("DIED") && !table.contains("squeue"),
        "{table}"
    );

    let (code, stdout, stderr) = shardrun_cmd(&["metrics", "--json", &run_arg]);
    assert_eq!(code, Some(0), "{stderr}");
    let metrics: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(metrics["runs"][0]["status"], "died", "{stdout}");
    let (_, table, _) = shardrun_cmd(&["metrics", &run_arg]);
    assert!(table.contains(" died "), "{table}");
    // Several paths make one table, as for `status`.
    let (code, stdout, stderr) = shardrun_cmd(&["metrics", "--json", &run_arg, &run_arg]);
    assert_eq!(code, Some(0), "{stderr}");
    let both: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(both["runs"].as_array().map(Vec::len), Some(2), "{stdout}");

    // The same command again, to a few steps: it says why it starts again, and finishes.
    let (out, stdout) = run_long_again_briefly(&dir);
    assert!(out.status.success(), "{stdout}{}", stderr_of(&out));
    let headline = stdout.lines().next().unwrap_or_default();
    assert!(
        headline.contains("stopped without recording how (its controller was killed"),
        "{headline}"
    );
    let (_, stdout, _) = shardrun_cmd(&["status", "--json", &run_arg]);
    assert_eq!(status_runs(&stdout)[0]["state"], "COMPLETED", "{stdout}");
}

#[test]
fn a_killed_run_is_not_described_by_the_attempt_before_it() {
    let dir = TestDir::new("stale-reason");
    // The first attempt is cancelled: its manifest records why.
    let (mut job, run) = start_long_run(&dir, "stale-reason", |_| {});
    unsafe { libc::kill(job.child.id() as i32, libc::SIGINT) };
    wait_for_exit(&mut job, &run, DEADLINE);
    // The second is killed outright while it trains: it records nothing.
    let (mut job, _) = start_long_run(&dir, "stale-reason", |_| {});
    wait_for("the second attempt's ranks", DEADLINE, || {
        (!run.join("result.json").exists() && run_processes(&run).len() >= 2).then_some(())
    })
    .unwrap();
    unsafe { libc::kill(job.child.id() as i32, libc::SIGKILL) };
    wait_for_exit(&mut job, &run, DEADLINE);
    assert_no_process_left(&run, DEADLINE);

    let (_, stdout) = run_long_again_briefly(&dir);
    let headline = stdout.lines().next().unwrap_or_default();
    assert!(
        headline.contains("stopped without recording how (its controller was killed"),
        "{headline}"
    );
    assert!(!headline.contains("cancelled by SIGINT"), "{headline}");
}

#[test]
fn a_controller_that_fails_before_its_result_leaves_its_reason_for_status() {
    let dir = TestDir::new("controller-error");
    let (mut job, run) = start_long_run(&dir, "controller-error", |_| {});
    unsafe { libc::kill(job.child.id() as i32, libc::SIGINT) };
    wait_for_exit(&mut job, &run, DEADLINE);
    // The next controller cannot open the ranks' log folder: a file stands in its place.
    std::fs::remove_dir_all(run.join("logs")).unwrap();
    std::fs::write(run.join("logs"), "not a folder\n").unwrap();

    let spec = dir.join("long.yaml");
    let envs = [("SHARDRUN_WORKER_BIN", simrank())];
    let (out, _) = run_local(&dir, &spec, &["--nproc", "2"], &envs, DEADLINE);
    let stderr = stderr_of(&out);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("cannot open the logs in"), "{stderr}");

    let run_arg = run.display().to_string();
    let (code, stdout, stderr) = shardrun_cmd(&["status", "--json", &run_arg]);
    assert_eq!(code, Some(0), "{stderr}");
    let runs = status_runs(&stdout);
    assert_eq!(runs[0]["state"], "FAILED", "{stdout}");
    let detail = runs[0]["detail"].as_str().unwrap_or_default();
    assert!(detail.contains("cannot open the logs in"), "{detail}");
}

#[test]
fn a_run_whose_result_cannot_be_written_still_says_how_it_ended_and_why_it_is_not_recorded() {
    let dir = TestDir::new("result-unwritable");
    let (mut job, run) = spawn_simulated_run(&dir, "result-unwritable", 20, 100, &[]);
    wait_for("the first step", DEADLINE, || {
        (!metric_steps(&run, 0).is_empty()).then_some(())
    })
    .unwrap();
    // What a full disk or a read-only mount does to the last write, without either: a
    // folder that holds a file cannot be replaced by a rename.
    std::fs::create_dir_all(run.join("result.json/in-the-way")).unwrap();
    let status = wait_for_exit(&mut job, &run, DEADLINE);
    let (mut stdout, mut stderr) = (String::new(), String::new());
    std::io::Read::read_to_string(&mut job.child.stdout.take().unwrap(), &mut stdout).unwrap();
    std::io::Read::read_to_string(&mut job.child.stderr.take().unwrap(), &mut stderr).unwrap();
    // How it ended, as ever; then what is not on disk and what to do.
    assert!(status.success(), "{stdout}{stderr}");
    assert!(stdout.contains("shardrun: training finished"), "{stdout}");
    assert!(
        stderr.contains("warning: the run's end is not recorded (cannot write "),
        "{stderr}"
    );
    assert!(
        stderr.contains("fix: free space in (or make writable) "),
        "{stderr}"
    );
    assert!(!stderr.contains("the job controller failed"), "{stderr}");
    // The manifest could be written: status tells it finished.
    let run_arg = run.display().to_string();
    let (code, stdout, stderr) = shardrun_cmd(&["status", "--json", &run_arg]);
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(status_runs(&stdout)[0]["state"], "COMPLETED", "{stdout}");
    assert_eq!(metric_steps(&run, 0).last(), Some(&20));
}

#[test]
fn a_run_whose_logs_stop_being_written_checkpoints_and_stops_and_the_same_command_resumes_it() {
    let dir = TestDir::new("logs-unwritable");
    let spec = dir.write(
        "full.yaml",
        &format!(
            "{}  checkpoint: {{ interval_steps: 1000 }}\n",
            tiny_mlp_spec("logs-unwritable", 3000, 2)
        ),
    );
    // No file of the job (the controller's or the ranks') may grow past 40 KiB: metrics.jsonl
    // stops taking records after about a hundred steps, while the tiny model's checkpoint
    // still fits.
    let (mut cmd, run) = local_run_command(&dir, &spec, &["--nproc", "2"], &[]);
    let out = run_with_files_capped(&mut cmd, 40 * 1024);
    let (stdout, stderr) = (stdout_of(&out), stderr_of(&out));
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stdout.contains(
            "cannot write the run directory's logs (File too large (os error 27); is the disk \
             full?): the ranks checkpoint at their next step boundary and stop"
        ),
        "{stdout}"
    );
    assert!(
        stderr.contains(
            "error: job failed: the job stopped: its run directory cannot be written (File too \
             large (os error 27))"
        ),
        "{stderr}"
    );
    let saved = std::fs::read_to_string(run.join("checkpoints/latest")).expect(&stderr);
    let step: u64 = saved.trim().trim_start_matches("step-").parse().unwrap();
    assert!((1..1000).contains(&step), "{saved}");
    assert!(
        stderr.contains(&format!(
            "the run stopped after step {step}; its newest checkpoint is step {step}"
        )),
        "{stderr}"
    );

    // With room again the same command resumes from that checkpoint, to the end.
    let (out, _) = run_local(&dir, &spec, &["--nproc", "2"], &[], DEADLINE);
    let stdout = stdout_of(&out);
    assert!(out.status.success(), "{}", stderr_of(&out));
    assert!(
        stdout.contains(&format!("from its checkpoint of step {step}")),
        "{stdout}"
    );
    assert_eq!(metric_steps(&run, 0).last(), Some(&3000));
}

#[test]
fn a_run_whose_controller_died_after_its_last_checkpoint_is_finished_for_status_too() {
    let dir = TestDir::new("died-finished");
    let spec = dir.write("tiny.yaml", &tiny_mlp_spec("died-finished", 4, 2));
    let (out, run) = run_local(&dir, &spec, &["--nproc", "2"], &[], DEADLINE);
    assert!(out.status.success(), "{}", stderr_of(&out));
    // What a controller SIGKILLed right after the final checkpoint leaves: a manifest saying
    // RUNNING, no result.
    std::fs::remove_file(run.join("result.json")).unwrap();
    let manifest = std::fs::read_to_string(run.join("manifest.json")).unwrap();
    let running = manifest.replace("\"COMPLETED\"", "\"RUNNING\"");
    assert_ne!(running, manifest);
    std::fs::write(run.join("manifest.json"), running).unwrap();
    let run_arg = run.display().to_string();
    let state = || status_runs(&shardrun_cmd(&["status", "--json", &run_arg]).1)[0].clone();
    assert_eq!(state()["state"], "DIED");

    let (out, _) = run_local(&dir, &spec, &["--nproc", "2"], &[], DEADLINE);
    assert!(out.status.success(), "{}", stderr_of(&out));
    assert!(
        stdout_of(&out).contains("is finished: it trained all 4 steps; nothing to do"),
        "{}",
        stdout_of(&out)
    );
    let status = state();
    assert_eq!(status["state"], "COMPLETED", "{status}");
    assert!(
        status["detail"]
            .as_str()
            .unwrap_or_default()
            .starts_with("trained all 4 steps, its last checkpoint step 4; its controller ended"),
        "{status}"
    );
}

/// A finished run whose final checkpoint is damaged names the one it would continue from and
/// the damaged one it passes over.
#[test]
fn a_finished_run_names_a_damaged_final_checkpoint() {
    let dir = TestDir::new("finished-damaged");
    let spec = dir.write(
        "tiny.yaml",
        &format!(
            "{}  checkpoint: {{ interval_steps: 2 }}\n",
            tiny_mlp_spec("finished-damaged", 4, 2)
        ),
    );
    let (out, run) = run_local(&dir, &spec, &["--nproc", "2"], &[], DEADLINE);
    assert!(out.status.success(), "{}", stderr_of(&out));
    let shard = run.join("checkpoints/step-4/rank-1-of-2.safetensors");
    let size = std::fs::metadata(&shard).unwrap().len();
    std::fs::File::options()
        .write(true)
        .open(&shard)
        .unwrap()
        .set_len(size / 2)
        .unwrap();

    let (out, _) = run_local(&dir, &spec, &["--nproc", "2"], &[], DEADLINE);
    let said = stdout_of(&out);
    assert!(out.status.success(), "{said}{}", stderr_of(&out));
    assert!(
        said.contains("is finished: it trained all 4 steps"),
        "{said}"
    );
    assert!(said.contains("step-2 (step 2)"), "{said}");
    assert!(
        said.contains("\n  passed over: the newer step-4, damaged: "),
        "{said}"
    );
}

/// The commands a finished run suggests work pasted into a shell as they are, in a run
/// directory whose name a shell would split.
#[test]
fn suggested_commands_paste_into_a_shell_with_a_space_and_a_quote_in_the_path() {
    let dir = TestDir::new("pasteable");
    let spec = dir.write("tiny.yaml", &tiny_mlp_spec("pasteable", 3, 2));
    let run = dir.join("it's a run");
    let mut cmd = Command::new(shardrun());
    cmd.current_dir(dir.path())
        .arg("run")
        .arg(&spec)
        .arg("--run-dir")
        .arg(&run)
        .args(["--nproc", "2"])
        .env("SHARDRUN_WORKER_BIN", simrank());
    let out = run_with_deadline(&mut cmd, DEADLINE).unwrap();
    let stdout = stdout_of(&out);
    assert!(out.status.success(), "{}", stderr_of(&out));
    let plot = stdout
        .lines()
        .find_map(|l| l.trim().strip_prefix("plot: "))
        .unwrap_or_else(|| panic!("no plot line: {stdout}"));
    assert!(plot.contains("'\\''"), "{plot}");
    let pasted = Command::new("sh")
        .arg("-c")
        .arg(plot.replacen("shardrun", &shardrun().display().to_string(), 1))
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(pasted.status.success(), "{plot}: {}", stderr_of(&pasted));
    assert!(run.join("metrics.svg").is_file());
}

#[test]
fn a_save_cut_short_for_space_is_removed_when_the_job_ends() {
    let dir = TestDir::new("save-cut-short");
    // 25,000 parameters: each rank's shard is larger than the files may grow.
    let spec = dir.write(
        "wide.yaml",
        &format!(
            "{}  checkpoint: {{ interval_steps: 4 }}\n",
            tiny_mlp_spec("save-cut-short", 8, 2).replace("hidden_dim: 32", "hidden_dim: 768")
        ),
    );
    let (mut cmd, run) = local_run_command(&dir, &spec, &["--nproc", "2"], &[]);
    let out = run_with_files_capped(&mut cmd, 40 * 1024);
    let (stdout, stderr) = (stdout_of(&out), stderr_of(&out));
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("File too large (os error 27)"), "{stderr}");
    let partial = run.join("checkpoints/step-4.partial");
    assert!(
        stdout.contains(&format!(
            "removed {}, left by a save that did not finish",
            partial.display()
        )),
        "{stdout}"
    );
    assert!(!partial.exists());
}

/// Runs `cmd` to its end with no file it (or a process it starts) writes allowed past
/// `bytes`: what a disk filling up does, without filling one. Writes past it fail with
/// EFBIG ("File too large") instead of a signal.
fn run_with_files_capped(cmd: &mut Command, bytes: u64) -> std::process::Output {
    // SAFETY: async-signal-safe calls only, between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
            let limit = libc::rlimit {
                rlim_cur: bytes,
                rlim_max: bytes,
            };
            match libc::setrlimit(libc::RLIMIT_FSIZE, &limit) {
                0 => Ok(()),
                _ => Err(std::io::Error::last_os_error()),
            }
        });
    }
    run_with_deadline(cmd, DEADLINE).expect("the run ended in time")
}

#[test]
fn a_checkpoint_folder_that_cannot_be_made_stops_the_run_before_it_trains() {
    let dir = TestDir::new("checkpoint-folder");
    // A folder the plan cannot tell is wrong: below the run directory's own job.yaml.
    let spec = dir.write(
        "tiny.yaml",
        &format!(
            "{}  checkpoint: {{ dir: job.yaml/checkpoints, interval_steps: 2 }}\n",
            tiny_mlp_spec("checkpoint-folder", 4, 1)
        ),
    );
    let (out, run) = run_local(&dir, &spec, &[], &[], DEADLINE);
    let stderr = stderr_of(&out);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "cannot create the checkpoint folder {} (`checkpoint.dir`): Not a directory",
            run.join("job.yaml/checkpoints").display()
        )),
        "{stderr}"
    );
    // Not a step trained for nothing, so the corrected spec starts the run over.
    assert!(!run.join("metrics.jsonl").exists() || metric_steps(&run, 0).is_empty());
    std::fs::write(&spec, tiny_mlp_spec("checkpoint-folder", 4, 1)).unwrap();
    let (out, _) = run_local(&dir, &spec, &[], &[], DEADLINE);
    assert!(out.status.success(), "{}", stderr_of(&out));
    assert_eq!(metric_steps(&run, 0), [1, 2, 3, 4]);
}

#[test]
fn logs_follow_started_before_the_run_waits_for_it_and_prints_its_whole_log() {
    let dir = TestDir::new("follow-early");
    let spec = dir.write("tiny.yaml", &tiny_mlp_spec("follow-early", 3, 1));
    let run = dir.join("run");
    let mut follow = Command::new(shardrun());
    follow
        .args(["logs", "-f", "--until-done"])
        .arg(&run)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut follower = GroupChild::spawn(&mut follow).unwrap();
    // The run starts once the follower has said that it waits for it.
    let mut stderr = std::io::BufReader::new(follower.child.stderr.take().unwrap());
    let mut waiting = String::new();
    stderr.read_line(&mut waiting).unwrap();
    assert!(
        waiting.starts_with(&format!("waiting for {} to appear", run.display())),
        "{waiting}"
    );
    let output = PipeReader::start(&mut follower.child);
    let (out, _) = run_local(&dir, &spec, &[], &[], DEADLINE);
    assert!(out.status.success(), "{}", stderr_of(&out));
    let status = wait_for("the follower to end with the run", DEADLINE, || {
        follower.child.try_wait().ok().flatten()
    })
    .unwrap();
    let (stdout, _) = output.join();
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut stderr, &mut rest).unwrap();
    assert!(status.success(), "{rest}");
    assert_eq!(
        String::from_utf8_lossy(&stdout),
        std::fs::read_to_string(run.join("train.log")).unwrap()
    );
}

#[test]
fn a_hangup_stops_the_run_at_a_step_boundary_and_writes_its_result() {
    let dir = TestDir::new("sighup");
    // As with a closed terminal, nobody reads the run's output.
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let (mut job, run) = start_long_run(&dir, "hangup", |cmd| unsafe {
        cmd.stdout(writer);
        // A run started from a terminal: hangups not ignored, whatever this test process
        // inherited (a test runner started under nohup passes them on ignored).
        cmd.pre_exec(|| {
            libc::signal(libc::SIGHUP, libc::SIG_DFL);
            Ok(())
        });
    });
    // The kernel's hangup, then the shell's: the second must not kill the ranks.
    for _ in 0..2 {
        unsafe { libc::kill(job.child.id() as i32, libc::SIGHUP) };
    }
    let status = wait_for_exit(&mut job, &run, DEADLINE);
    assert_eq!(
        status.code(),
        Some(128 + libc::SIGHUP),
        "{}",
        all_logs(&run)
    );
    let result = result_json(&run);
    assert_eq!(result["status"], "cancelled");
    assert_eq!(result["by"], "SIGHUP");
    assert_each_rank_stopped_once(&run, 2, "SIGHUP");
    let log = std::fs::read_to_string(run.join("train.log")).unwrap();
    assert!(!log.contains("killing"), "{log}");
    assert_no_process_left(&run, DEADLINE);
}

#[test]
fn a_run_started_under_nohup_ignores_hangups() {
    let dir = TestDir::new("nohup");
    let (mut job, run) = start_long_run(&dir, "nohup", |cmd| unsafe {
        cmd.pre_exec(|| {
            libc::signal(libc::SIGHUP, libc::SIG_IGN);
            Ok(())
        });
    });
    let pid = job.child.id() as i32;
    unsafe { libc::kill(pid, libc::SIGHUP) };
    // Ignored at once by the kernel; the SIGTERM after it is what stops the run.
    unsafe { libc::kill(pid, libc::SIGTERM) };
    let status = wait_for_exit(&mut job, &run, DEADLINE);
    assert_eq!(
        status.code(),
        Some(128 + libc::SIGTERM),
        "{}",
        all_logs(&run)
    );
    assert_eq!(result_json(&run)["by"], "SIGTERM");
    assert_no_process_left(&run, DEADLINE);
}

#[test]
fn cancel_stops_a_local_run_through_its_controller() {
    let dir = TestDir::new("cancel-local");
    let (mut job, run) = start_long_run(&dir, "cancel", |_| {});
    let (code, stdout, stderr) = shardrun_cmd(&["cancel", &run.display().to_string()]);
    assert_eq!(code, Some(0), "{stdout}{stderr}");
    assert!(
        stdout.contains(&format!(
            "Sent SIGTERM to the controller of {} (pid {})",
            run.display(),
            job.child.id()
        )),
        "{stdout}"
    );
    let status = wait_for_exit(&mut job, &run, DEADLINE);
    assert_eq!(status.code(), Some(128 + libc::SIGTERM));
    assert_eq!(result_json(&run)["status"], "cancelled");
    assert_no_process_left(&run, DEADLINE);
    // Nothing runs it any more.
    let (code, stdout, _) = shardrun_cmd(&["cancel", &run.display().to_string()]);
    assert_eq!(code, Some(0));
    assert!(stdout.starts_with("Nothing to cancel"), "{stdout}");
}

#[test]
fn force_refuses_to_delete_a_run_its_controller_is_running() {
    let dir = TestDir::new("force-live");
    let (mut job, run) = start_long_run(&dir, "force-live", |_| {});
    let run_arg = run.display().to_string();
    let envs = [("SHARDRUN_WORKER_BIN", simrank())];
    let (out, _) = run_local(
        &dir,
        &dir.join("long.yaml"),
        &["--nproc", "2", "--force", "--set", "training.steps=3"],
        &envs,
        DEADLINE,
    );
    let stderr = stderr_of(&out);
    assert_eq!(out.status.code(), Some(1), "{}{stderr}", stdout_of(&out));
    assert!(
        stderr.contains(&format!(
            "{run_arg} is still running: its controller is running (pid {} on ",
            job.child.id()
        )) && stderr.contains(&format!(
            "`shardrun cancel {run_arg}`, or Ctrl-C where it runs"
        )),
        "{stderr}"
    );
    // Nothing was lost: the run goes on training in its directory, and stops as any run.
    let logged = metric_steps(&run, 0).len();
    wait_for("the run to log more steps", DEADLINE, || {
        (metric_steps(&run, 0).len() > logged).then_some(())
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", all_logs(&run)));
    assert_eq!(metric_steps(&run, 0)[..3], [1, 2, 3]);
    let (code, stdout, stderr) = shardrun_cmd(&["cancel", &run_arg]);
    assert_eq!(code, Some(0), "{stdout}{stderr}");
    let status = wait_for_exit(&mut job, &run, DEADLINE);
    assert_eq!(status.code(), Some(128 + libc::SIGTERM));
    assert_eq!(result_json(&run)["status"], "cancelled");
    assert_no_process_left(&run, DEADLINE);
}

#[test]
fn a_run_piped_into_head_trains_to_the_end_and_other_commands_end_quietly() {
    let dir = TestDir::new("closed-pipe");
    // A second of training after the first lines, so most of its output comes after `head`
    // has gone.
    let (mut job, run) = spawn_simulated_run(&dir, "short", 100, 10, &[]);
    // `| head -3`: three lines read, then the pipe closed.
    let mut stdout = std::io::BufReader::new(job.child.stdout.take().unwrap());
    for _ in 0..3 {
        let mut line = String::new();
        stdout.read_line(&mut line).unwrap();
    }
    drop(stdout);
    let errors = PipeReader::start(&mut job.child);
    let status = wait_for_exit(&mut job, &run, DEADLINE);
    let stderr = String::from_utf8_lossy(&errors.join().1).into_owned();
    assert_no_panic(&stderr, "the run's stderr");
    assert!(status.success(), "{status:?}: {stderr}");
    assert_eq!(result_json(&run)["status"], "succeeded");

    // Each command into a pipe whose reader is gone: no output, no panic, status 0.
    let run_arg = run.display().to_string();
    let spec_arg = dir.join("short.yaml").display().to_string();
    let commands: [&[&str]; 9] = [
        &["status", &run_arg],
        &["status", "--json", &run_arg],
        &["metrics", &run_arg],
        &["metrics", "--json", &run_arg],
        &["logs", &run_arg],
        &["logs", "-f", &run_arg],
        &["plan", &spec_arg],
        &["render", &spec_arg],
        &["completions", "bash"],
    ];
    for args in commands {
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        let mut cmd = Command::new(shardrun());
        cmd.args(args)
            .current_dir(dir.path())
            .stdin(Stdio::null())
            .stdout(writer)
            .stderr(Stdio::piped());
        let mut child = GroupChild::spawn(&mut cmd).unwrap();
        let status = wait_for(
            &format!("`shardrun {}` to end", args.join(" ")),
            DEADLINE,
            || child.child.try_wait().ok().flatten(),
        )
        .unwrap();
        let mut stderr = String::new();
        std::io::Read::read_to_string(&mut child.child.stderr.take().unwrap(), &mut stderr)
            .unwrap();
        assert_eq!(
            (status.code(), stderr.as_str()),
            (Some(0), ""),
            "shardrun {}",
            args.join(" ")
        );
    }
}

#[test]
fn a_finished_run_started_again_by_slurm_starts_no_rank() {
    // `scontrol requeue` of a job that completed runs its batch script again: the controller
    // sees the run has trained every step and ends at once, without `srun`.
    let dir = TestDir::new("finished-again");
    let spec = dir.write("job.yaml", &tiny_mlp_spec("finished", 5, 2));
    let (out, run) = run_local(&dir, &spec, &[], &[], DEADLINE);
    assert!(out.status.success(), "{}", stderr_of(&out));
    let log_before = std::fs::read_to_string(run.join("train.log")).unwrap();

    let run_arg = run.display().to_string();
    let mut controller = Command::new(shardrun());
    controller
        .args(["controller", "--run-dir", &run_arg])
        .env("SLURM_JOB_ID", "4242")
        // No cluster to start ranks on: `srun` would fail.
        .env_remove("SLURM_CONF");
    let out = run_with_deadline(&mut controller, DEADLINE).unwrap();
    let stdout = stdout_of(&out);
    assert!(out.status.success(), "{stdout}{}", stderr_of(&out));
    assert!(
        stdout.contains("already trained its 5 steps") && stdout.contains("nothing to train"),
        "{stdout}"
    );
    assert_eq!(
        std::fs::read_to_string(run.join("train.log")).unwrap(),
        log_before,
        "nothing ran"
    );
    let (code, stdout, stderr) = shardrun_cmd(&["status", "--json", &run_arg]);
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(status_runs(&stdout)[0]["state"], "COMPLETED", "{stdout}");
}
