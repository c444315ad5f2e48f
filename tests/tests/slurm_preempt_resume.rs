//! Preemption end to end on the real Slurm with the real worker: a training job signalled
//! with `scancel --signal=USR2 --batch` checkpoints at an agreed step boundary, requeues
//! itself, and the requeued job resumes from that checkpoint and finishes the remaining
//! steps with exactly the losses of an uninterrupted local run of the same spec. The spec
//! has no `checkpoint:` block (no periodic saves): the preemption checkpoint is written to
//! the run directory and resumed from all the same.
//!
//! Needs the worker built: `cargo build --release -p shardrun -p shardrun-worker`.

use shardrun_e2e::jobs::*;
use shardrun_e2e::*;
use std::path::Path;
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
        .filter_map(|v| Some((v["step"].as_u64()?, v["loss"].as_f64()?)))
        .collect()
}

#[test]
fn usr2_checkpoints_requeues_and_resumes_with_uninterrupted_losses() {
    let cluster = SlurmCluster::start().expect("start the local Slurm cluster");
    let dir = TestDir::new("slurm-preempt-resume");
    let spec = dir.write("resume.yaml", &spec());

    // The uninterrupted run, locally: the losses to reproduce.
    let (out, reference_run) = run_local(
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
    let reference = losses(&reference_run);
    assert_each_step_once(&reference, "the uninterrupted run");

    let out = cluster
        .shardrun(dir.path(), &["submit", &spec.to_string_lossy()])
        .unwrap();
    assert!(out.status.success(), "submit failed: {}", stderr_of(&out));
    let job_id = submitted_job_id(&stdout_of(&out)).expect("job id printed");
    let run = dir.join("runs/resume");
    let log = || std::fs::read_to_string(run.join("train.log")).unwrap_or_default();

    wait_for(
        "the first attempt to train",
        Duration::from_secs(120),
        || (metric_steps(&run, 0).len() >= 50).then_some(()),
    )
    .unwrap_or_else(|e| panic!("{e}\n{}", log()));
    let mut signal = cluster.command("scancel");
    signal.args(["--signal=USR2", "--batch", &job_id]);
    let out = run_with_deadline(&mut signal, Duration::from_secs(30)).unwrap();
    assert!(out.status.success(), "{}", stderr_of(&out));

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
    let interrupted = losses(&run);
    assert_each_step_once(&interrupted, "the preempted and requeued run");
    for ((step, got), (_, expected)) in interrupted.iter().zip(&reference) {
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
