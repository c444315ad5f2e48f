//! A local run (`shardrun run`) as the machine around it treats it: its output piped into
//! `head`; and the other commands printing into a pipe nobody reads.
//!
//! Needs the binaries built: `cargo build --release -p shardrun -p shardrun-worker`.

use shardrun_e2e::jobs::*;
use shardrun_e2e::*;
use std::io::BufRead;
use std::path::Path;
use std::process::{Command, ExitStatus, Stdio};
use std::time::Duration;

const DEADLINE: Duration = Duration::from_secs(60);

fn wait_for_exit(job: &mut GroupChild, run: &Path) -> ExitStatus {
    wait_for("the run to end", DEADLINE, || {
        job.child.try_wait().ok().flatten()
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", all_logs(run)))
}

#[test]
fn a_run_piped_into_head_trains_to_the_end_and_other_commands_end_quietly() {
    let dir = TestDir::new("closed-pipe");
    let spec = dir.write("short.yaml", &tiny_mlp_spec("short", 100, 2));
    // A second of training after the first lines, so most of its output comes after `head`
    // has gone.
    let envs = [
        ("SHARDRUN_WORKER_BIN", simrank()),
        ("SIMRANK_STEP_MS", "10".to_string()),
    ];
    let (mut cmd, run) = local_run_command(&dir, &spec, &["--nproc", "2"], &envs);
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut job = GroupChild::spawn(&mut cmd).unwrap();
    // `| head -3`: three lines read, then the pipe closed.
    let mut stdout = std::io::BufReader::new(job.child.stdout.take().unwrap());
    for _ in 0..3 {
        let mut line = String::new();
        stdout.read_line(&mut line).unwrap();
    }
    drop(stdout);
    let mut stderr = job.child.stderr.take().unwrap();
    let errors = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = std::io::Read::read_to_string(&mut stderr, &mut text);
        text
    });
    let status = wait_for_exit(&mut job, &run);
    let stderr = errors.join().unwrap();
    assert_no_panic(&stderr, "the run's stderr");
    assert!(status.success(), "{status:?}: {stderr}");
    assert_eq!(result_json(&run)["status"], "succeeded");

    // Each command into a pipe whose reader is gone: no output, no panic, status 0.
    let run_arg = run.display().to_string();
    let spec_arg = spec.display().to_string();
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
