//! Ranks launched by PyTorch's own launcher, torchrun (`python -m torch.distributed.run`),
//! whose agent holds `MASTER_PORT` with its store: they find each other and train to the same
//! losses and parameters as ranks started by hand with the same variables.

mod common;
mod hf_common;

use common::*;
use hf_common::python;
use shardrun_protocol::config::ShardingStrategy;
use shardrun_protocol::messages::StepMetrics;
use std::process::Command;

#[test]
fn ranks_launched_by_torchrun_train_as_ranks_started_by_hand() {
    let dir = temp_dir();
    let config = config(tiny_transformer(), ShardingStrategy::FullShard, 2);
    let by_hand = run_sharded(dir.path(), "by-hand", &config);

    let config_path = write_config(dir.path(), "torchrun", &config);
    let (metrics, params) = (
        dir.path().join("torchrun.metrics.jsonl"),
        dir.path().join("torchrun.safetensors"),
    );
    let out = Command::new(python())
        .args(["-m", "torch.distributed.run", "--nproc-per-node", "2"])
        .arg(format!("--master-port={}", free_port()))
        // Rank 0 alone writes the metrics, as when started by hand.
        .args(["--no-python", "bash", "-c"])
        .arg(r#"if [ "$RANK" = 0 ]; then exec "$@" --metrics-file "$METRICS"; else exec "$@"; fi"#)
        .args(["rank", WORKER, "--config"])
        .arg(&config_path)
        .arg("--dump-params")
        .arg(&params)
        .env("METRICS", &metrics)
        .env_remove("SHARDRUN_CONTROLLER")
        .output()
        .expect("the venv's python runs torchrun");
    assert!(
        out.status.success(),
        "torchrun failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );

    let metrics: Vec<StepMetrics> = std::fs::read_to_string(&metrics)
        .unwrap()
        .lines()
        .filter(|l| !l.contains("\"eval_loss\""))
        .map(|l| serde_json::from_str::<StepMetrics>(l).unwrap())
        .collect();
    let launched = RunResult {
        losses: metrics.iter().map(|m| m.loss).collect(),
        params: shardrun_worker::params_file::read(&params).unwrap(),
        evals: Vec::new(),
        metrics,
    };
    let (worst, what) = max_relative_difference(&launched, &by_hand);
    assert!(worst <= 1e-6, "{what} differs by {worst:e} (relative)");
}

/// A rank waiting in the rendezvous for peers that will not come (a launcher giving up on
/// the job after another rank failed) stops at SIGTERM, saying so, rather than waiting out
/// the rendezvous timeout while the launcher waits for it: rank 0 serving, and a rank joining.
#[test]
fn a_rank_waiting_for_its_peers_stops_at_sigterm() {
    let dir = temp_dir();
    let config_path = write_config(
        dir.path(),
        "alone",
        &config(tiny_transformer(), ShardingStrategy::FullShard, 2),
    );
    for rank in ["0", "1"] {
        let child = Command::new(WORKER)
            .arg("--config")
            .arg(&config_path)
            .env("RANK", rank)
            .env("WORLD_SIZE", "2")
            .env("LOCAL_RANK", rank)
            .env("MASTER_ADDR", "127.0.0.1")
            .env("MASTER_PORT", free_port().to_string())
            .env_remove("SHARDRUN_CONTROLLER")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let pid = child.id();
        // Its handlers are in place once the kernel says it catches SIGTERM.
        let catches_sigterm = || {
            let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
            let mask = status.lines().find_map(|l| l.strip_prefix("SigCgt:"))?;
            let mask = u64::from_str_radix(mask.trim(), 16).ok()?;
            (mask & (1 << (libc::SIGTERM - 1)) != 0).then_some(())
        };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while catches_sigterm().is_none() {
            assert!(
                std::time::Instant::now() < deadline,
                "rank {rank} never got ready"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        unsafe { libc::kill(pid as i32, libc::SIGTERM) };
        // Well inside the 120 s the rendezvous would wait.
        let (done, exited) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = done.send(child.wait_with_output());
        });
        let out = exited
            .recv_timeout(std::time::Duration::from_secs(30))
            .unwrap_or_else(|_| {
                unsafe { libc::kill(pid as i32, libc::SIGKILL) };
                panic!("rank {rank} did not stop at SIGTERM")
            })
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "rank {rank}: {stderr}");
        assert!(
            stderr.contains("stopped by SIGTERM while waiting for the other ranks"),
            "rank {rank}: {stderr}"
        );
    }
}
