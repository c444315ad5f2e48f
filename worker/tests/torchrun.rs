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

/// A rank waiting in the rendezvous stops at SIGTERM (a launcher giving up on the job after
/// another rank failed), saying so, rather than waiting out the rendezvous timeout while the
/// launcher waits for it: rank 0 serving alone; a rank finding no rank 0; a rank whose
/// MASTER_PORT a silent program holds (within the 10 s a handshake may take); a rank
/// registered with rank 0 and waiting for the start while a third rank never comes.
#[test]
fn a_rank_waiting_for_its_peers_stops_at_sigterm() {
    let dir = temp_dir();
    let config_path = |world: u64| {
        write_config(
            dir.path(),
            &format!("alone-{world}"),
            &config(tiny_transformer(), ShardingStrategy::FullShard, world),
        )
    };
    let rank = |rank: &str, world: u64, port: u16| {
        Command::new(WORKER)
            .arg("--config")
            .arg(config_path(world))
            .env("RANK", rank)
            .env("WORLD_SIZE", world.to_string())
            .env("LOCAL_RANK", rank)
            .env("MASTER_ADDR", "127.0.0.1")
            .env("MASTER_PORT", port.to_string())
            .env("RUST_LOG", "shardrun_worker::rendezvous=debug")
            .env_remove("SHARDRUN_CONTROLLER")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap()
    };
    let secs = std::time::Duration::from_secs;

    // Rank 0 serving, and rank 1 with no rank 0 to reach.
    for which in ["0", "1"] {
        let child = rank(which, 2, free_port());
        stops_at_sigterm(child, &format!("rank {which} alone"), secs(30), None);
    }

    // Rank 1 whose MASTER_PORT a program holds that accepts and never answers.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = silent.local_addr().unwrap().port();
    let child = rank("1", 2, port);
    silent.set_nonblocking(true).unwrap();
    let deadline = std::time::Instant::now() + secs(60);
    let held = loop {
        match silent.accept() {
            Ok((stream, _)) => break stream,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                assert!(
                    std::time::Instant::now() < deadline,
                    "rank 1 never connected"
                );
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            Err(e) => panic!("{e}"),
        }
    };
    stops_at_sigterm(child, "rank 1 before a silent program", secs(8), None);
    drop(held);

    // Rank 1 registered with rank 0, both waiting for a rank 2 that never comes.
    let port = free_port();
    let mut rank0 = rank("0", 3, port);
    let child = rank("1", 3, port);
    stops_at_sigterm(
        child,
        "rank 1 registered",
        secs(30),
        Some(&|line: &str| line.contains("rendezvous: connected to rank 0")),
    );
    let _ = rank0.kill();
    let _ = rank0.wait();
}

/// SIGTERMs `child` once it catches SIGTERM (and has written a stderr line `ready` takes, if
/// given), and checks that it stops within `within`, saying it was stopped while waiting for
/// the others.
fn stops_at_sigterm(
    mut child: std::process::Child,
    what: &str,
    within: std::time::Duration,
    ready: Option<&dyn Fn(&str) -> bool>,
) {
    use std::io::BufRead;
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
            "{what}: never got ready"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    // Its stderr, line by line, until the line asked for; the rest kept for the verdict.
    let mut stderr = std::io::BufReader::new(child.stderr.take().unwrap());
    let mut said = String::new();
    while let Some(ready) = ready {
        let mut line = String::new();
        let read = stderr.read_line(&mut line).unwrap();
        said.push_str(&line);
        assert!(read > 0, "{what}: ended before it was ready: {said}");
        if ready(&line) {
            break;
        }
    }
    unsafe { libc::kill(pid as i32, libc::SIGTERM) };
    let (done, exited) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut rest = String::new();
        let _ = std::io::Read::read_to_string(&mut stderr, &mut rest);
        let _ = done.send((child.wait(), rest));
    });
    let (status, rest) = exited.recv_timeout(within).unwrap_or_else(|_| {
        unsafe { libc::kill(pid as i32, libc::SIGKILL) };
        panic!("{what}: did not stop within {within:?} of SIGTERM: {said}")
    });
    said.push_str(&rest);
    assert!(!status.unwrap().success(), "{what}: {said}");
    assert!(
        said.contains("stopped by SIGTERM while waiting for the other ranks"),
        "{what}: {said}"
    );
}
