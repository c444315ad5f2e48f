//! A real-Slurm 2-task job: `shardrun submit` → sbatch → `shardrun controller` → `srun` with
//! one task per rank. Both ranks' lines reach train.log, every step reaches metrics.jsonl,
//! the plot draws, and the job COMPLETES.

use shardrun_e2e::jobs::*;
use shardrun_e2e::*;
use std::process::Command;
use std::time::Duration;

#[test]
fn two_task_slurm_job_logs_both_ranks_and_completes() {
    let cluster = SlurmCluster::start().expect("start the local Slurm cluster");
    let dir = TestDir::new("slurm-run");
    let steps = 5;
    let spec = dir.write("tiny.yaml", &tiny_mlp_spec("srun2", steps, 2));
    let job_id = cluster
        .submit(dir.path(), &[&spec.to_string_lossy()])
        .job_id;
    let run = dir.join("runs/srun2");
    let result = wait_for_file(&run.join("result.json"), Duration::from_secs(300), |t| {
        t.ends_with('}')
    });
    let slurm_out =
        std::fs::read_to_string(run.join(format!("srun2-{job_id}.out"))).unwrap_or_default();
    let slurm_err =
        std::fs::read_to_string(run.join(format!("srun2-{job_id}.err"))).unwrap_or_default();
    let result =
        result.unwrap_or_else(|e| panic!("{e}\nstdout:\n{slurm_out}\nstderr:\n{slurm_err}"));
    assert!(
        result.contains("\"succeeded\""),
        "{result}\nstdout:\n{slurm_out}\nstderr:\n{slurm_err}"
    );

    let log = std::fs::read_to_string(run.join("train.log")).unwrap();
    for rank in 0..2 {
        assert!(
            log.contains(&format!("[rank {rank}] rank {rank} of 2 joined")),
            "{log}"
        );
    }
    assert_eq!(metric_steps(&run, 0), (1..=steps).collect::<Vec<_>>());
    // Ranks on other nodes must reach the controller: under Slurm it listens on every
    // interface and advertises the batch host's name, never a loopback address.
    let addr = std::fs::read_to_string(run.join("controller.addr")).unwrap();
    let (host, port) = addr
        .trim()
        .rsplit_once(':')
        .expect("controller.addr is host:port");
    assert_eq!(host, hostname(), "{addr}");
    assert!(port.parse::<u16>().is_ok(), "{addr}");
    assert!(!host.starts_with("127.") && host != "::1", "{addr}");
    // The Slurm output file is the controller's stdout: human-readable, rank 0 by default.
    assert!(slurm_out.contains("training finished"), "{slurm_out}");
    assert!(slurm_out.contains("[rank 0]"), "{slurm_out}");

    let plot = run_with_deadline(
        Command::new(shardrun()).arg("plot").arg(&run),
        Duration::from_secs(30),
    )
    .unwrap();
    assert!(plot.status.success(), "{}", stderr_of(&plot));
    assert!(run.join("metrics.svg").is_file());
}
