//! NCCL settings reach every rank: the spec's `resources.env` and the `NCCL_*` variables of
//! the shell that started the job, the spec winning where both set one, and the job's own
//! environment on the compute node (its set-up lines) winning over the shell. Read from the
//! running workers' own environments (`/proc/<pid>/environ`).

use shardrun_e2e::jobs::*;
use shardrun_e2e::*;
use std::time::Duration;

#[test]
fn spec_env_and_submitting_nccl_variables_reach_every_rank() {
    let dir = TestDir::new("rank-env");
    let spec = tiny_mlp_spec("rankenv", 100_000, 2).replace(
        "resources:\n",
        "resources:\n  env: { NCCL_DEBUG: WARN, NCCL_IB_DISABLE: \"1\" }\n",
    );
    let spec = dir.write("tiny.yaml", &spec);
    let envs = [
        ("NCCL_DEBUG", "INFO".to_string()),
        ("NCCL_SOCKET_IFNAME", "lo".to_string()),
    ];
    let (mut job, run) = spawn_local_run(&dir, &spec, &["--nproc", "2"], &envs, |cmd| {
        cmd.stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null());
    });
    wait_for("the first step", Duration::from_secs(60), || {
        (!metric_steps(&run, 0).is_empty()).then_some(())
    })
    .unwrap();
    let ranks = processes_with_env("SHARDRUN_RUN_DIR", &run.display().to_string());
    job.kill_group();
    assert_eq!(ranks.len(), 2, "two worker processes");
    for (pid, vars) in ranks {
        let get = |k: &str| vars.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
        assert_eq!(get("NCCL_DEBUG"), Some("WARN"), "pid {pid}: the spec wins");
        assert_eq!(get("NCCL_IB_DISABLE"), Some("1"), "pid {pid}");
        assert_eq!(get("NCCL_SOCKET_IFNAME"), Some("lo"), "pid {pid}");
    }
    let log = std::fs::read_to_string(run.join("train.log")).unwrap();
    assert!(
        log.contains(
            "environment of every rank: NCCL_DEBUG=WARN NCCL_IB_DISABLE=1 NCCL_SOCKET_IFNAME=lo"
        ),
        "{log}"
    );
}

/// On the real Slurm, submitted with `--export=NONE` (as sites set by default), so the
/// submitting shell's environment does not reach the job: its `NCCL_*` still reach every
/// rank, except one the job's set-up line sets otherwise, which keeps the job's value (a
/// `module load` on the compute node knows that node), and train.log says so.
#[test]
fn on_slurm_the_shells_nccl_variables_reach_the_ranks_unless_the_jobs_set_up_sets_them() {
    let cluster = SlurmCluster::start().expect("start the local Slurm cluster");
    let dir = TestDir::new("rank-env-slurm");
    let spec = tiny_mlp_spec("rankenvslurm", 100_000, 2).replace(
        "resources:\n",
        "resources:\n  extra_sbatch: [\"--export=NONE\"]\n  \
         setup: [\"export NCCL_SOCKET_IFNAME=lo\"]\n  env: { NCCL_DEBUG: WARN }\n",
    );
    let spec = dir.write("tiny.yaml", &spec);
    let shell = [
        ("NCCL_DEBUG", "INFO".to_string()),
        ("NCCL_IB_HCA", "mlx5_0".to_string()),
        ("NCCL_SOCKET_IFNAME", "eth9".to_string()),
    ];
    let job_id = cluster
        .submit_with_env(dir.path(), &[&spec.to_string_lossy()], &shell)
        .job_id;
    let run = dir.join("runs/rankenvslurm");
    let first_step = wait_for("the first step", Duration::from_secs(120), || {
        (!metric_steps(&run, 0).is_empty()).then_some(())
    });
    let workers: Vec<_> = processes_with_env("SHARDRUN_RUN_DIR", &run.display().to_string())
        .into_iter()
        .filter(|(pid, _)| {
            std::fs::read_link(format!("/proc/{pid}/exe"))
                .is_ok_and(|exe| exe.ends_with("shardrun-worker"))
        })
        .collect();
    let cancel = cluster.command("scancel").arg(&job_id).output().unwrap();
    assert!(cancel.status.success(), "{cancel:?}");
    let log = std::fs::read_to_string(run.join("train.log")).unwrap_or_default();
    first_step.unwrap_or_else(|e| panic!("{e}\n{log}"));
    assert_eq!(workers.len(), 2, "two worker processes\n{log}");
    for (pid, vars) in workers {
        let get = |k: &str| vars.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
        assert_eq!(get("NCCL_DEBUG"), Some("WARN"), "pid {pid}: the spec wins");
        assert_eq!(get("NCCL_IB_HCA"), Some("mlx5_0"), "pid {pid}: the shell's");
        assert_eq!(
            get("NCCL_SOCKET_IFNAME"),
            Some("lo"),
            "pid {pid}: the job's set-up wins over the shell"
        );
    }
    for line in [
        "environment of every rank: NCCL_DEBUG=WARN NCCL_IB_HCA=mlx5_0\n",
        "NCCL_SOCKET_IFNAME stays lo as the job's environment sets it (its set-up lines or \
         modules), not eth9 as the submitting shell had it",
    ] {
        assert!(log.contains(line), "{line}\n{log}");
    }
    cluster.wait_until_gone(&job_id, Duration::from_secs(120));
}
