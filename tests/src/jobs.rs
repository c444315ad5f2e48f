//! Helpers for the controller's end-to-end tests: tiny job specs, local runs, and looking at
//! the processes of a run from the outside (`/proc`).

use crate::{binary, run_with_deadline, shardrun, wait_for, GroupChild, TestDir};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Output, Stdio};
use std::time::Duration;

/// A two-layer MLP small enough that a step takes milliseconds on CPU.
pub fn tiny_mlp_spec(name: &str, steps: u64, ranks: u64) -> String {
    let per_device = 4;
    format!(
        "name: {name}\nresources:\n  tasks_per_node: {ranks}\n  cpus_per_task: 1\n  time: \"00:05:00\"\n\
         training:\n  model: {{ kind: mlp, input_dim: 16, hidden_dim: 32, output_dim: 16 }}\n  \
         steps: {steps}\n  total_batch_size: {}\n  batch_size_per_device: {per_device}\n",
        per_device * ranks
    )
}

/// `shardrun run <spec> --run-dir <dir>/run ...` with extra arguments and environment.
pub fn local_run_command(
    dir: &TestDir,
    spec: &Path,
    args: &[&str],
    envs: &[(&str, String)],
) -> (Command, PathBuf) {
    let run = dir.join("run");
    let mut cmd = Command::new(shardrun());
    cmd.current_dir(dir.path())
        .arg("run")
        .arg(spec)
        .arg("--run-dir")
        .arg(&run)
        .args(args)
        .envs(envs.iter().map(|(k, v)| (*k, v.as_str())));
    (cmd, run)
}

pub fn run_local(
    dir: &TestDir,
    spec: &Path,
    args: &[&str],
    envs: &[(&str, String)],
    deadline: Duration,
) -> (Output, PathBuf) {
    let (mut cmd, run) = local_run_command(dir, spec, args, envs);
    let out = run_with_deadline(&mut cmd, deadline).expect("shardrun run finished in time");
    (out, run)
}

/// [`local_run_command`] spawned in its own process group, its stdout and stderr piped
/// unless `adjust`, which gets the command first, sets them otherwise.
pub fn spawn_local_run(
    dir: &TestDir,
    spec: &Path,
    args: &[&str],
    envs: &[(&str, String)],
    adjust: impl FnOnce(&mut Command),
) -> (GroupChild, PathBuf) {
    let (mut cmd, run) = local_run_command(dir, spec, args, envs);
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    adjust(&mut cmd);
    (GroupChild::spawn(&mut cmd).unwrap(), run)
}

/// `steps` steps of `step_ms` each on 2 simulated ranks (the spec `<name>.yaml`), spawned
/// as [`spawn_local_run`] does, with `args` after `--nproc 2`.
pub fn spawn_simulated_run(
    dir: &TestDir,
    name: &str,
    steps: u64,
    step_ms: u64,
    args: &[&str],
) -> (GroupChild, PathBuf) {
    let spec = dir.write(&format!("{name}.yaml"), &tiny_mlp_spec(name, steps, 2));
    let envs = [
        ("SHARDRUN_WORKER_BIN", simrank()),
        ("SIMRANK_STEP_MS", step_ms.to_string()),
    ];
    let mut all = vec!["--nproc", "2"];
    all.extend_from_slice(args);
    spawn_local_run(dir, &spec, &all, &envs, |_| {})
}

/// A run that would train for minutes (`long.yaml`: 100,000 steps of 10 ms on 2 simulated
/// ranks), once both ranks are training. Its stdout is dropped and its stderr piped unless
/// `adjust`, which gets the command first (its output, its signals), sets them otherwise.
pub fn start_long_run(
    dir: &TestDir,
    name: &str,
    adjust: impl FnOnce(&mut Command),
) -> (GroupChild, PathBuf) {
    let spec = dir.write("long.yaml", &tiny_mlp_spec(name, 100_000, 2));
    let envs = [
        ("SHARDRUN_WORKER_BIN", simrank()),
        ("SIMRANK_STEP_MS", "10".to_string()),
    ];
    let (job, run) = spawn_local_run(dir, &spec, &["--nproc", "2"], &envs, |cmd| {
        cmd.stdout(Stdio::null());
        adjust(cmd);
    });
    wait_for("both ranks to be training", Duration::from_secs(60), || {
        (metric_steps(&run, 0).len() >= 3 && metric_steps(&run, 1).len() >= 3).then_some(())
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", all_logs(&run)));
    (job, run)
}

/// Waits until rank 0 of the run at `run` has logged `steps` steps (`what` they are for the
/// message); past `deadline`, the test fails with the run's logs.
pub fn wait_for_steps(run: &Path, steps: usize, what: &str, deadline: Duration) {
    wait_for(what, deadline, || {
        (metric_steps(run, 0).len() >= steps).then_some(())
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", all_logs(run)));
}

/// The exit status of a spawned run once it has ended; past `deadline`, the test fails with
/// the run's logs.
pub fn wait_for_exit(job: &mut GroupChild, run: &Path, deadline: Duration) -> ExitStatus {
    wait_for("the run to end", deadline, || {
        job.child.try_wait().ok().flatten()
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", all_logs(run)))
}

/// [`wait_for_exit`], then everything the run wrote to its piped stdout. Its pipes are
/// read while it runs, so a run that writes more than a pipe holds does not block on them.
pub fn finish(job: &mut GroupChild, run: &Path, deadline: Duration) -> (ExitStatus, String) {
    assert!(job.child.stdout.is_some(), "the run's stdout is piped");
    let pipes = crate::PipeReader::start(&mut job.child);
    let status = wait_for_exit(job, run, deadline);
    let (stdout, _) = pipes.join();
    (status, String::from_utf8_lossy(&stdout).into_owned())
}

/// Pids of a run's live processes (its ranks carry `SHARDRUN_RUN_DIR=<run>`).
pub fn run_processes(run: &Path) -> Vec<i32> {
    processes_with_env("SHARDRUN_RUN_DIR", &run.display().to_string())
        .into_iter()
        .map(|(pid, _)| pid)
        .collect()
}

/// No process of the run is left within `deadline` (`Duration::ZERO`: none is left now).
pub fn assert_no_process_left(run: &Path, deadline: Duration) {
    let gone = wait_for("the run's processes to be gone", deadline, || {
        run_processes(run).is_empty().then_some(())
    });
    assert!(
        gone.is_ok(),
        "processes of {} left: {:?}",
        run.display(),
        run_processes(run)
    );
}

/// The simulated rank binary (speaks the real protocol, trains nothing).
pub fn simrank() -> String {
    binary("shardrun-simrank").display().to_string()
}

/// Pids of live processes whose environment has `key=value` (workers carry
/// `SHARDRUN_RUN_DIR=<run>`), so a test can find a run's ranks or prove none is left.
pub fn processes_with_env(key: &str, value: &str) -> Vec<(i32, Vec<(String, String)>)> {
    let mut found = Vec::new();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return found;
    };
    for entry in entries.flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(raw) = std::fs::read(entry.path().join("environ")) else {
            continue;
        };
        // Zombies keep no environment; only running processes count.
        let vars: Vec<(String, String)> = raw
            .split(|&b| b == 0)
            .filter_map(|kv| {
                let kv = String::from_utf8_lossy(kv);
                kv.split_once('=')
                    .map(|(k, v)| (k.to_string(), v.to_string()))
            })
            .collect();
        if vars.iter().any(|(k, v)| k == key && v == value) {
            found.push((pid, vars));
        }
    }
    found
}

/// The rank's pid among a run's live workers.
pub fn worker_pid(run: &Path, rank: u64) -> Option<i32> {
    processes_with_env("SHARDRUN_RUN_DIR", &run.display().to_string())
        .into_iter()
        .find(|(_, vars)| {
            vars.iter()
                .any(|(k, v)| k == "SHARDRUN_RANK" && *v == rank.to_string())
        })
        .map(|(pid, _)| pid)
}

/// Resident memory of a process in KiB (`VmRSS`).
pub fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// The steps `rank` reported, in the order they reached its `logs/rank-N.metrics.jsonl`.
pub fn metric_steps(run: &Path, rank: u64) -> Vec<u64> {
    std::fs::read_to_string(run.join(format!("logs/rank-{rank}.metrics.jsonl")))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["rank"].as_u64() == Some(rank))
        .filter_map(|v| v["step"].as_u64())
        .collect()
}

/// The step records of a run's metrics.jsonl (one per logged step, every rank folded in),
/// in file order: a step replayed after a resume appears again.
pub fn step_records(run: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(run.join("metrics.jsonl"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v.get("step_time_max_s").is_some())
        .collect()
}

pub fn result_json(run: &Path) -> serde_json::Value {
    let text = std::fs::read_to_string(run.join("result.json")).expect("result.json written");
    serde_json::from_str(&text).expect("result.json is JSON")
}

/// The loss per step from a run's metrics.jsonl (see [`step_values`]).
pub fn losses(run: &Path) -> std::collections::BTreeMap<u64, f64> {
    step_values(run, "loss")
}

/// One field (`"loss"`, `"lr"`) per step from a run's metrics.jsonl. A resumed run logs again
/// the steps after its checkpoint: the later record of a step wins, as `shardrun plot` reads
/// them. A value written as `null` (JSON has no NaN or inf) is NaN, so comparisons fail on it.
pub fn step_values(run: &Path, field: &str) -> std::collections::BTreeMap<u64, f64> {
    step_records(run)
        .iter()
        .filter_map(|v| {
            let value = match v.get(field)? {
                serde_json::Value::Null => f64::NAN,
                value => value.as_f64()?,
            };
            Some((v["step"].as_u64()?, value))
        })
        .collect()
}

/// Every step of `reference` has the same loss in `got` (within `tolerance`, relative to
/// losses above 1), and `got` has no other step. NaN or inf anywhere fails.
pub fn assert_same_losses(
    got: &std::collections::BTreeMap<u64, f64>,
    reference: &std::collections::BTreeMap<u64, f64>,
    tolerance: f64,
    what: &str,
) {
    assert!(
        !reference.is_empty(),
        "{what}: the reference run logged no step"
    );
    assert_eq!(
        got.keys().collect::<Vec<_>>(),
        reference.keys().collect::<Vec<_>>(),
        "{what}: the steps logged differ from the uninterrupted run's"
    );
    for (step, expected) in reference {
        let loss = got[step];
        assert!(
            expected.is_finite() && (loss - expected).abs() <= tolerance * expected.abs().max(1.0),
            "{what}: step {step}: loss {loss} vs uninterrupted {expected}"
        );
    }
}

/// The text of a run's logs: train.log and every logs/rank-N.log.
pub fn all_logs(run: &Path) -> String {
    let mut text = std::fs::read_to_string(run.join("train.log")).unwrap_or_default();
    if let Ok(entries) = std::fs::read_dir(run.join("logs")) {
        for entry in entries.flatten() {
            text.push_str(&std::fs::read_to_string(entry.path()).unwrap_or_default());
        }
    }
    text
}

/// Each of `ranks` logged in train.log one line saying it stopped at a step boundary, for
/// the cancel by `signal` (`SIGTERM`, ...).
pub fn assert_each_rank_stopped_once(run: &Path, ranks: u64, signal: &str) {
    let log = std::fs::read_to_string(run.join("train.log")).expect("train.log written");
    for rank in 0..ranks {
        let stops: Vec<&str> = log
            .lines()
            .filter(|l| l.contains(&format!("[rank {rank}] warning: stopping after step ")))
            .collect();
        assert_eq!(stops.len(), 1, "{log}");
        assert!(
            stops[0].ends_with(&format!("the job was cancelled ({signal})")),
            "{log}"
        );
    }
}

/// No Rust panic and no backtrace in `text` (a clean stop prints neither).
pub fn assert_no_panic(text: &str, what: &str) {
    for bad in ["panicked", "backtrace", "RUST_BACKTRACE"] {
        assert!(!text.contains(bad), "{what} contains {bad:?}:\n{text}");
    }
}

/// Signal every live `shardrun-worker` of a run (e.g. SIGSTOP to hold them at a known
/// point); the controller and srun, which carry the same variable under Slurm, are left
/// alone. Returns how many were signalled.
pub fn signal_workers(run: &Path, signal: i32) -> usize {
    let workers: Vec<i32> = processes_with_env("SHARDRUN_RUN_DIR", &run.display().to_string())
        .into_iter()
        .map(|(pid, _)| pid)
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .is_ok_and(|comm| comm.trim() == "shardrun-worker")
        })
        .collect();
    for pid in &workers {
        // SAFETY: plain syscall on a pid just read from /proc.
        unsafe { libc::kill(*pid, signal) };
    }
    workers.len()
}

/// Whether `run` holds a checkpoint of any step yet (`checkpoints/step-N/`). Any will do for
/// a test that waits for training to be under way: with `keep`, the first one may already
/// be rotated out on a fast machine by the time it is looked for.
pub fn has_checkpoint(run: &Path) -> bool {
    std::fs::read_dir(run.join("checkpoints"))
        .into_iter()
        .flatten()
        .flatten()
        .any(|entry| {
            // A committed one: `step-N.partial/` is still being written.
            let name = entry.file_name().to_string_lossy().into_owned();
            name.starts_with("step-") && !name.contains('.')
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finish_reads_more_than_a_pipe_holds_while_the_run_goes_on() {
        let mut cmd = Command::new("sh");
        cmd.args(["-c", "head -c 300000 /dev/zero | tr '\\000' x"])
            .stdout(Stdio::piped());
        let mut job = GroupChild::spawn(&mut cmd).unwrap();
        let (status, stdout) = finish(&mut job, Path::new("/nonexistent"), Duration::from_secs(30));
        assert!(status.success());
        assert_eq!(stdout.len(), 300_000);
        assert!(stdout.bytes().all(|b| b == b'x'));
    }
}
