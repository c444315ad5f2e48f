//! NCCL settings reach every rank: the spec's `resources.env` and the `NCCL_*` variables of
//! the shell that started the job, the spec winning where both set one. Read from the running
//! workers' own environments (`/proc/<pid>/environ`).

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
