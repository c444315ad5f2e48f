//! The preemption warning and the time limit on the real Slurm: the batch shell gets USR2
//! from `--signal=B:USR2@<seconds>` before the limit, a job that runs past its limit is
//! reported as TIMEOUT (not FAILED), and the controller says the notice was the time limit's.
//! Takes 1–2 minutes: Slurm's time limit is in minutes.

use shardrun_e2e::*;
use std::time::Duration;

#[test]
fn usr2_arrives_before_the_limit_and_the_job_ends_as_timeout() {
    let cluster = SlurmCluster::start().expect("start the local Slurm cluster");
    let dir = TestDir::new("timeout");
    // `wait` returns early when the trapped USR2 arrives; `|| true` keeps `set -e` calm.
    let spec = dir.write(
        "job.yaml",
        "name: overtime\nresources:\n  time: \"1\"\n  setup:\n    - trap 'echo \"got USR2\"' USR2\n    - sleep 170 & wait $! || true\n    - sleep 170 & wait $! || true\n    - exit 0\npreemption:\n  signal_seconds: 30\n  requeue: false\ntraining:\n  model: { kind: mlp, input_dim: 4, hidden_dim: 8, output_dim: 4 }\n  steps: 1\n  total_batch_size: 4\n  batch_size_per_device: 4\n",
    );
    let job_id = cluster
        .submit(dir.path(), &[&spec.to_string_lossy()])
        .job_id;
    let run = dir.join("runs/overtime");
    let script = std::fs::read_to_string(run.join("job.sbatch")).unwrap();
    assert!(
        script.contains("#SBATCH --signal=B:USR2@30") && script.contains("#SBATCH --no-requeue")
    );

    wait_for_file(
        &run.join(format!("overtime-{job_id}.out")),
        Duration::from_secs(120),
        |t| t.contains("got USR2"),
    )
    .unwrap();
    let state = wait_for("the job to end", Duration::from_secs(180), || {
        let out = cluster
            .shardrun(dir.path(), &["status", "--json", &run.to_string_lossy()])
            .ok()?;
        states(&stdout_of(&out))
            .into_iter()
            .map(|(_, s)| s)
            .find(|s| s != "SUBMITTED" && s != "RUNNING")
    })
    .unwrap();
    assert_eq!(state, "TIMEOUT");
}

#[test]
fn the_time_limit_notice_is_named_as_such_and_the_run_checkpoints() {
    let cluster = SlurmCluster::start().expect("start the local Slurm cluster");
    let dir = TestDir::new("timeout-notice");
    // A minute's limit, the notice 45 s before it: more steps than the minute trains.
    let spec = dir.write(
        "job.yaml",
        "name: limit\nresources:\n  time: \"1\"\n  cpus_per_task: 1\npreemption:\n  signal_seconds: 45\n  requeue: false\ntraining:\n  model: { kind: mlp, input_dim: 16, hidden_dim: 32, output_dim: 16 }\n  steps: 100000000\n  log_every: 10000\n  total_batch_size: 4\n  batch_size_per_device: 4\n",
    );
    cluster.submit(dir.path(), &[&spec.to_string_lossy()]);
    let run = dir.join("runs/limit");
    let log = || std::fs::read_to_string(run.join("train.log")).unwrap_or_default();
    wait_for_file(&run.join("result.json"), Duration::from_secs(150), |t| {
        !t.is_empty()
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", log()));
    let log = log();
    assert!(
        log.contains("the job's time limit is near (SIGUSR2)")
            && !log.contains("preemption notice"),
        "{log}"
    );
    let result = shardrun_e2e::jobs::result_json(&run);
    assert_eq!(
        (&result["status"], &result["notice"]),
        (&"preempted".into(), &"time_limit".into()),
        "{result}\n{log}"
    );
    let message = result["message"].as_str().unwrap_or_default();
    assert!(
        message.starts_with("the run stopped before its time limit after step "),
        "{result}"
    );
}
