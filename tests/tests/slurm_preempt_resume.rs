//! Preemption end to end on the real Slurm with the real worker, two ways: a training job
//! signalled with `scancel --signal=USR2 --batch` (the time limit's warning), and one
//! preempted by a job of a higher partition (Slurm sends its tasks SIGTERM at the start of
//! the grace time). Either checkpoints at an agreed step boundary, requeues itself, and the
//! requeued job resumes from that checkpoint and finishes the remaining steps with exactly
//! the losses of an uninterrupted local run of the same spec. The spec has no `checkpoint:`
//! block (no periodic saves): the preemption checkpoint is written to the run directory and
//! resumed from all the same.
//!
//! Needs the worker built: `cargo build --release -p shardrun -p shardrun-worker`.

use shardrun_e2e::jobs::*;
use shardrun_e2e::*;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

const STEPS: u64 = 3000;

/// An MLP big enough that 3,000 steps take tens of seconds on 2 CPU ranks (so the signal
/// lands mid-run), without a `checkpoint:` block: the preemption checkpoint is the only one
/// written before the end.
fn spec() -> String {
    format!(
        "name: resume\nresources:\n  tasks_per_node: 2\n  cpus_per_task: 1\n  time: \"00:10:00\"\n\
         training:\n  model: {{ kind: mlp, input_dim: 256, hidden_dim: 1024, output_dim: 256 }}\n  \
         steps: {STEPS}\n  total_batch_size: 64\n  batch_size_per_device: 32\n"
    )
}

/// The (step, loss) records in the order they were logged, every one of them: a step
/// replayed after the requeue shows up twice.
fn losses(run: &Path) -> Vec<(u64, f64)> {
    step_records(run)
        .iter()
        .filter_map(|v| {
            // JSON has no NaN: a diverged loss is null, which must fail the comparisons.
            let loss = v["loss"].as_f64().unwrap_or(f64::NAN);
            Some((v["step"].as_u64()?, loss))
        })
        .collect()
}

/// The uninterrupted run's losses, computed locally once for both tests.
fn reference() -> &'static [(u64, f64)] {
    static REFERENCE: OnceLock<Vec<(u64, f64)>> = OnceLock::new();
    REFERENCE.get_or_init(|| {
        let dir = TestDir::new("slurm-preempt-reference");
        let spec = dir.write("resume.yaml", &spec());
        let (out, run) = run_local(
            &dir,
            &spec,
            &["--no-progress"],
            &[],
            Duration::from_secs(600),
        );
        assert!(
            out.status.success(),
            "reference run failed: {}",
            stderr_of(&out)
        );
        let reference = losses(&run);
        assert_each_step_once(&reference, "the uninterrupted run");
        reference
    })
}

#[test]
fn usr2_checkpoints_requeues_and_resumes_with_uninterrupted_losses() {
    let cluster = SlurmCluster::start().expect("start the local Slurm cluster");
    let dir = TestDir::new("slurm-preempt-resume");
    let reference = reference();
    let (job_id, run) = submit_and_train_a_while(&cluster, &dir);

    let mut signal = cluster.command("scancel");
    signal.args(["--signal=USR2", "--batch", &job_id]);
    let out = run_with_deadline(&mut signal, Duration::from_secs(30)).unwrap();
    assert!(out.status.success(), "{}", stderr_of(&out));

    let log = requeued_and_finished(&run);
    assert_resumed_with_uninterrupted_losses(&run, &log, reference);
    // Its end says it came through a requeue.
    let run_arg = run.to_string_lossy().into_owned();
    let mut said = serde_json::Value::Null;
    wait_for("status to say COMPLETED", Duration::from_secs(120), || {
        let out = cluster
            .shardrun(dir.path(), &["status", "--json", &run_arg])
            .ok()?;
        said = status_runs(&stdout_of(&out)).first()?.clone();
        (said["state"] == "COMPLETED").then_some(())
    })
    .unwrap_or_else(|e| panic!("{e}: {said}"));
    assert_eq!(said["requeues"], 1, "{said}");
    assert_eq!(said["requeued_by_slurm"], 0, "{said}");
    assert!(
        said["detail"].as_str().unwrap().ends_with(
            "training finished; its jobs were requeued 1 time(s) after a preemption notice"
        ),
        "{said}"
    );
    // Both attempts append to one error file, each from a line of its own (`shardrun status`
    // reads a dead controller's last words after the last one).
    let err = std::fs::read_to_string(run.join(format!("resume-{job_id}.err"))).unwrap();
    let host = hostname();
    let starts: Vec<&str> = err
        .lines()
        .filter(|l| l.starts_with("shardrun: start of job "))
        .collect();
    assert_eq!(
        starts,
        [
            format!("shardrun: start of job {job_id} on {host}, attempt 1"),
            format!("shardrun: start of job {job_id} on {host}, attempt 2"),
        ],
        "{err}"
    );
}

#[test]
fn a_job_preempted_by_a_higher_partition_checkpoints_in_its_grace_time_and_resumes() {
    // Partitions `debug` (the default: preemptable, requeued, 120 s of grace) and `urgent`.
    let cluster = SlurmCluster::start_named("preemption").expect("start the preemption cluster");
    let dir = TestDir::new("slurm-preemption");
    let reference = reference();
    let (_, run) = submit_and_train_a_while(&cluster, &dir);

    // A job of the higher partition that needs the whole node preempts the training job.
    let mut urgent = cluster.command("sbatch");
    urgent.current_dir(dir.path()).args([
        "--partition=urgent",
        "--exclusive",
        "--time=1",
        "--output=/dev/null",
        "--wrap=true",
    ]);
    let out = run_with_deadline(&mut urgent, Duration::from_secs(30)).unwrap();
    assert!(out.status.success(), "{}", stderr_of(&out));

    let log = requeued_and_finished(&run);
    assert!(
        log.contains(
            "SIGTERM from Slurm (a preemption, a cancel or the job's end): checkpointing after step"
        ),
        "the ranks take the grace time's SIGTERM as a preemption:\n{log}"
    );
    assert_resumed_with_uninterrupted_losses(&run, &log, reference);
}

/// Submits the spec and waits until the job has trained 50 steps; returns its Slurm job id
/// and run directory.
fn submit_and_train_a_while(cluster: &SlurmCluster, dir: &TestDir) -> (String, PathBuf) {
    let spec = dir.write("resume.yaml", &spec());
    let job_id = cluster
        .submit(dir.path(), &[&spec.to_string_lossy()])
        .job_id;
    let run = dir.join("runs/resume");
    wait_for_steps(
        &run,
        50,
        "the first attempt to train",
        Duration::from_secs(120),
    );
    (job_id, run)
}

/// Waits for the controller to requeue the job once and for the requeued job to succeed;
/// returns the run's log.
fn requeued_and_finished(run: &Path) -> String {
    let log = || std::fs::read_to_string(run.join("train.log")).unwrap_or_default();
    wait_for_file(&run.join("requeue_count"), Duration::from_secs(120), |t| {
        t.trim() == "1"
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", log()));
    // Slurm holds a requeued job back before it runs again (seen: up to ~3 min here).
    wait_for_file(&run.join("result.json"), Duration::from_secs(600), |t| {
        t.contains("\"succeeded\"")
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", log()));
    let log = log();
    assert!(log.contains("requeueing Slurm job"), "{log}");
    log
}

/// The requeued job resumed right after the preemption checkpoint, and every step ran once
/// with the uninterrupted run's loss.
fn assert_resumed_with_uninterrupted_losses(run: &Path, log: &str, reference: &[(u64, f64)]) {
    let preempted_at = log
        .lines()
        .find_map(|l| {
            let rest = l.split("resumed from checkpoint ").nth(1)?;
            rest.split("(step ")
                .nth(1)?
                .split(',')
                .next()?
                .trim()
                .parse::<u64>()
                .ok()
        })
        .unwrap_or_else(|| panic!("the requeued job says where it resumed from:\n{log}"));
    assert!(
        preempted_at > 0 && preempted_at < STEPS,
        "preempted mid-run, at step {preempted_at}"
    );

    // The preemption checkpoint went to the run directory (no `checkpoint:` block), and the
    // requeued job started right after it.
    assert!(
        log.contains(&format!(
            "the run was preempted after step {preempted_at}; its newest checkpoint is step \
             {preempted_at} ({}/checkpoints/step-{preempted_at})",
            run.display()
        )),
        "{log}"
    );
    // Every step ran exactly once across the two attempts, and each loss is the
    // uninterrupted run's (same arithmetic on CPU: equal up to 1e-6 relative).
    let interrupted = losses(run);
    assert_each_step_once(&interrupted, "the preempted and requeued run");
    for ((step, got), (_, expected)) in interrupted.iter().zip(reference) {
        assert!(
            (got - expected).abs() <= 1e-6 * expected.abs().max(1.0),
            "step {step} (preempted after {preempted_at}): loss {got} vs uninterrupted {expected}"
        );
    }
}

/// Steps 1..=STEPS, each exactly once and in order: none lost, none replayed.
fn assert_each_step_once(records: &[(u64, f64)], what: &str) {
    let steps: Vec<u64> = records.iter().map(|(step, _)| *step).collect();
    let expected: Vec<u64> = (1..=STEPS).collect();
    if steps != expected {
        let mut seen = std::collections::BTreeMap::<u64, usize>::new();
        for step in &steps {
            *seen.entry(*step).or_default() += 1;
        }
        let twice: Vec<_> = seen
            .iter()
            .filter(|(_, n)| **n > 1)
            .map(|(s, _)| s)
            .collect();
        let missing: Vec<_> = expected.iter().filter(|s| !seen.contains_key(s)).collect();
        panic!(
            "{what}: {} records; steps logged more than once: {twice:?}; missing: {missing:?}",
            steps.len()
        );
    }
}
