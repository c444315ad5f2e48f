//! The full path on the real Slurm: `shardrun submit` of a tiny MLP, the sbatch script
//! starts `shardrun controller`, which launches the workers with srun; the job COMPLETES
//! and leaves its log and metrics in the run directory.
//!
//! Needs the worker built too: `cargo build --release -p shardrun -p shardrun-worker`.

use shardrun_e2e::*;
use std::time::Duration;

#[test]
fn tiny_mlp_trains_to_completion_under_slurm() {
    let cluster = SlurmCluster::start().expect("start the local Slurm cluster");
    let dir = TestDir::new("slurm-train");
    let spec = dir.write(
        "mlp.yaml",
        "name: tiny\nresources:\n  tasks_per_node: 2\n  cpus_per_task: 1\n  time: \"00:05:00\"\ntraining:\n  model: { kind: mlp, input_dim: 16, hidden_dim: 32, output_dim: 16 }\n  steps: 5\n  total_batch_size: 16\n  batch_size_per_device: 4\n",
    );
    let job_id = cluster
        .submit(dir.path(), &[&spec.to_string_lossy()])
        .job_id;
    let run = dir.join("runs/tiny");
    let state = wait_for("the training job to end", Duration::from_secs(300), || {
        let out = cluster
            .shardrun(dir.path(), &["status", "--json", &run.to_string_lossy()])
            .ok()?;
        states(&stdout_of(&out))
            .into_iter()
            .map(|(_, s)| s)
            .find(|s| !matches!(s.as_str(), "SUBMITTED" | "RUNNING" | "CREATED"))
    })
    .unwrap();
    let slurm_out =
        std::fs::read_to_string(run.join(format!("tiny-{job_id}.out"))).unwrap_or_default();
    let slurm_err =
        std::fs::read_to_string(run.join(format!("tiny-{job_id}.err"))).unwrap_or_default();
    assert_eq!(
        state, "COMPLETED",
        "stdout:\n{slurm_out}\nstderr:\n{slurm_err}"
    );
    // Every step once, each rank's too, with a finite loss; train.log has the ranks' lines.
    let losses = shardrun_e2e::jobs::losses(&run);
    assert_eq!(losses.keys().copied().collect::<Vec<_>>(), [1, 2, 3, 4, 5]);
    assert!(losses.values().all(|l| l.is_finite()), "{losses:?}");
    for rank in 0..2 {
        assert_eq!(
            shardrun_e2e::jobs::metric_steps(&run, rank),
            [1, 2, 3, 4, 5]
        );
    }
    let log = std::fs::read_to_string(run.join("train.log")).expect("train.log written");
    assert!(
        log.contains("[rank 0]") && log.contains("[rank 1]"),
        "{log}"
    );
}
