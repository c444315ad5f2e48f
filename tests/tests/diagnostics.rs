//! Diagnostics through the real binaries: with `RUST_LOG=debug` every rank writes its
//! rendezvous and checkpoint events to `logs/rank-N.debug.log` and the controller its own to
//! stderr, none of it in train.log; `-vv` does the same without `RUST_LOG`; without either,
//! nothing is written and the logs people read are as before.

use shardrun_e2e::jobs::*;
use shardrun_e2e::*;
use std::path::Path;
use std::time::Duration;

/// Two ranks, a checkpoint every 3 steps, 6 steps.
fn spec(dir: &TestDir, name: &str) -> std::path::PathBuf {
    let mut text = tiny_mlp_spec(name, 6, 2);
    text.push_str("  checkpoint: { interval_steps: 3, keep: 3 }\n");
    dir.write(&format!("{name}.yaml"), &text)
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// What every rank's debug log must show, and the controller's stderr: the rendezvous
/// (addresses bound, advertised, connected), the communicators, checkpoint phases.
const RANK_EVENTS: &[&str] = &[
    "collective listener bound=",
    "connected to the controller controller=",
    "registering controller=",
    "connecting the ring",
    "ring connected",
    "communicators ready",
    "checkpoint save begins",
    "checkpoint write file=",
    "checkpoint fsync file=",
];
/// Rank 0 commits each checkpoint.
const RANK0_EVENTS: &[&str] = &["checkpoint verify", "checkpoint rename from="];

#[test]
fn rust_log_debug_puts_each_ranks_rendezvous_and_checkpoint_events_in_its_debug_log_only() {
    let dir = TestDir::new("diagnostics");
    let spec = spec(&dir, "diag");
    let envs = [(
        "RUST_LOG",
        "debug,shardrun_worker::collectives=trace".to_string(),
    )];
    let (out, run) = run_local(
        &dir,
        &spec,
        &["--nproc", "2", "--no-progress"],
        &envs,
        Duration::from_secs(120),
    );
    let stderr = stderr_of(&out);
    assert!(out.status.success(), "{}\n{stderr}", stdout_of(&out));

    let train_log = read(&run.join("train.log"));
    let mut people_read = train_log.clone() + &stdout_of(&out);
    for rank in 0..2u64 {
        people_read.push_str(&read(&run.join(format!("logs/rank-{rank}.log"))));
        let debug = read(&run.join(format!("logs/rank-{rank}.debug.log")));
        let expected = RANK_EVENTS
            .iter()
            .chain(if rank == 0 { RANK0_EVENTS } else { &[] });
        for event in expected {
            assert!(
                debug.contains(event),
                "rank {rank}'s debug log lacks {event:?}:\n{debug}"
            );
        }
        // Every line names its rank and job; the checkpoint's lines its step too.
        let span = format!("rank{{rank={rank} job=\"diag\"");
        assert!(
            debug.lines().all(|l| l.contains(&span)),
            "a line of rank {rank} without its span:\n{debug}"
        );
        assert!(
            debug.contains("checkpoint{step=3 reason=Interval}"),
            "{debug}"
        );
        // Collectives at trace level with their sizes: issued inside a numbered step, and
        // done (with the time they took) on the communicator's thread.
        assert!(
            debug.lines().any(|l| l.contains("step{step=2}")
                && l.contains("collective issued collective=\"all-gather\" bytes=")),
            "{debug}"
        );
        assert!(
            debug.contains("collective done collective=\"reduce-scatter\" bytes="),
            "{debug}"
        );
        // The controller's side of the rendezvous names this rank and where it listens.
        let registered = stderr
            .lines()
            .find(|l| l.contains("rank registered") && l.contains(&format!(" rank={rank} ")))
            .unwrap_or_else(|| panic!("the controller did not log rank {rank}:\n{stderr}"));
        assert!(
            registered.contains("collective_addr=\"127.0.0.1:"),
            "{registered}"
        );
    }
    for event in RANK_EVENTS.iter().chain(RANK0_EVENTS) {
        assert!(
            !people_read.contains(event),
            "{event:?} leaked into train.log, a rank's log or stdout"
        );
    }
    for level in ["DEBUG", "TRACE"] {
        assert!(
            !people_read.contains(level),
            "{level} in the logs people read"
        );
    }
    assert!(stderr.contains("listening for the ranks"), "{stderr}");
}

#[test]
fn dash_vv_turns_diagnostics_on_and_their_absence_changes_nothing() {
    let dir = TestDir::new("diagnostics-v");
    let spec = spec(&dir, "quiet");
    // No RUST_LOG, no -v: no debug log, no diagnostics on stderr.
    let (mut cmd, run) = local_run_command(&dir, &spec, &["--nproc", "2", "--no-progress"], &[]);
    cmd.env_remove("RUST_LOG");
    let out = run_with_deadline(&mut cmd, Duration::from_secs(120)).unwrap();
    assert!(out.status.success(), "{}", stderr_of(&out));
    let logs: Vec<String> = std::fs::read_dir(run.join("logs"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        logs.iter().all(|f| !f.ends_with(".debug.log")),
        "debug logs written without RUST_LOG: {logs:?}"
    );
    let stderr = stderr_of(&out);
    for level in [" TRACE ", " DEBUG ", " INFO ", " WARN "] {
        assert!(
            !stderr.contains(level),
            "diagnostics on stderr by default:\n{stderr}"
        );
    }

    // -vv on `shardrun` reaches the ranks (it sets RUST_LOG for them).
    let verbose = dir.join("verbose");
    let mut cmd = std::process::Command::new(shardrun());
    cmd.current_dir(dir.path())
        .args(["-vv", "run"])
        .arg(&spec)
        .arg("--run-dir")
        .arg(&verbose)
        .args(["--nproc", "2", "--no-progress"])
        .env_remove("RUST_LOG");
    let out = run_with_deadline(&mut cmd, Duration::from_secs(120)).unwrap();
    assert!(out.status.success(), "{}", stderr_of(&out));
    for rank in 0..2 {
        let debug = read(&verbose.join(format!("logs/rank-{rank}.debug.log")));
        assert!(debug.contains("ring connected"), "{debug}");
        assert!(
            !debug.contains("TRACE"),
            "-vv is debug, not trace:\n{debug}"
        );
    }
    assert!(stderr_of(&out).contains("DEBUG"), "{}", stderr_of(&out));
}
