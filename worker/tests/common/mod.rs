//! Running the real `shardrun-worker` binary: N rank processes over real sockets
//! (torchrun-style `MASTER_ADDR`/`MASTER_PORT` rendezvous), plus the single-process reference.

#![allow(dead_code)]

use shardrun_protocol::config::*;
use shardrun_protocol::messages::{EvalMetrics, StepMetrics};
use shardrun_worker::params_file::{self, NamedValues};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

pub const WORKER: &str = env!("CARGO_BIN_EXE_shardrun-worker");

/// A transformer whose unit sizes (root 830, block 1290 elements) divide by neither 3 nor 4.
pub fn tiny_transformer() -> ModelConfig {
    ModelConfig::Transformer {
        vocab_size: 37,
        dim: 10,
        n_layers: 2,
        n_heads: 2,
        max_seq_len: 7,
    }
}

/// 20 fp32 steps on a global batch of 12 samples (divisible by 1, 2, 3 and 4 ranks).
pub fn config(model: ModelConfig, strategy: ShardingStrategy, world: u64) -> TrainConfig {
    let seq_len = 7;
    TrainConfig {
        name: "equivalence".into(),
        model,
        data: DataConfig::Synthetic { seq_len },
        steps: 20,
        seed: 7,
        batch: BatchPlan {
            total_batch_size: 12,
            batch_size_per_device: 12 / world,
            world_size: world,
            grad_accum_steps: 1,
        },
        optimizer: OptimizerConfig {
            lr: 3e-3,
            beta1: 0.9,
            beta2: 0.95,
            eps: 1e-8,
            weight_decay: 0.1,
            grad_clip: Some(1.0),
            no_weight_decay: default_no_weight_decay(),
        },
        schedule: LrSchedule {
            warmup_steps: 3,
            decay: LrDecay::Cosine,
            min_lr_ratio: 0.1,
        },
        fsdp: FsdpConfig {
            strategy,
            wrap: WrapPolicy::Block,
            mixed_precision: MixedPrecision {
                param_dtype: DType::F32,
                reduce_dtype: DType::F32,
                buffer_dtype: DType::F32,
            },
            activation_checkpointing: false,
            prefetch: true,
            max_gathers_in_flight: 2,
            shard_group_size: (strategy == ShardingStrategy::HybridShard).then_some(2),
            // Several chunks of the loss a micro-batch, the last one short: the reference
            // and PyTorch compute it whole.
            loss_chunk_tokens: Some(5),
        },
        checkpoint: CheckpointConfig {
            dir: None,
            interval_steps: None,
            interval_minutes: None,
            keep: 1,
            format: CheckpointFormat::Sharded,
            resume: false,
            from: None,
        },
        device: DeviceKind::Cpu,
        threads_per_rank: 1,
        log_every: 1,
        on_divergence: Default::default(),
    }
}

/// What a run left behind.
pub struct RunResult {
    pub losses: Vec<f64>,
    pub metrics: Vec<StepMetrics>,
    /// Evaluations on the validation data, when the data has some.
    pub evals: Vec<EvalMetrics>,
    pub params: BTreeMap<String, NamedValues>,
}

/// A port for rank 0 to listen on, free now and not about to be taken. A port `bind(0)`
/// found free is one of the kernel's ephemeral ports, which every outgoing connection also
/// draws from: between the check and rank 0's listen, a connection of a test running
/// beside this one could take it ("Address already in use"). So: ports below the ephemeral
/// range, a different start per test process, none handed out twice by this one.
pub fn free_port() -> u16 {
    static HANDED_OUT: AtomicU32 = AtomicU32::new(0);
    let ephemeral_low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse::<u32>().ok())
        .unwrap_or(32_768);
    let (low, high) = (10_000, ephemeral_low.min(32_768));
    if high <= low + 1000 {
        // An ephemeral range reaching this low leaves no quiet ports: take the kernel's.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a port");
        return listener.local_addr().expect("local addr").port();
    }
    let span = high - low;
    let start = std::process::id().wrapping_mul(7919) % span;
    loop {
        let n = HANDED_OUT.fetch_add(1, Ordering::Relaxed);
        assert!(n < span, "no free port in {low}..{high}");
        let port = (low + (start + n) % span) as u16;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
}

fn wait_all(mut children: Vec<(u64, Child)>, dir: &Path) {
    let deadline = Instant::now() + Duration::from_secs(240);
    while !children.is_empty() {
        let mut failed = None;
        children.retain_mut(|(rank, child)| match child.try_wait() {
            Ok(Some(status)) => {
                if !status.success() {
                    failed = Some((*rank, status));
                }
                false
            }
            Ok(None) => true,
            Err(e) => panic!("waiting for rank {rank}: {e}"),
        });
        if let Some((rank, status)) = failed {
            for (_, child) in &mut children {
                let _ = child.kill();
                let _ = child.wait();
            }
            let log =
                std::fs::read_to_string(dir.join(format!("rank{rank}.log"))).unwrap_or_default();
            panic!("rank {rank} exited with {status}:\n{log}");
        }
        if Instant::now() > deadline {
            for (_, child) in &mut children {
                let _ = child.kill();
                let _ = child.wait();
            }
            panic!("ranks still running after 240 s in {}", dir.display());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

pub fn write_config(dir: &Path, name: &str, config: &TrainConfig) -> PathBuf {
    let path = dir.join(format!("{name}.json"));
    std::fs::write(
        &path,
        serde_json::to_string_pretty(config).expect("config serializes"),
    )
    .expect("write config");
    path
}

fn read_result(metrics: &Path, params: &Path) -> RunResult {
    let text = std::fs::read_to_string(metrics).expect("metrics file");
    let (evals, steps): (Vec<&str>, Vec<&str>) =
        text.lines().partition(|l| l.contains("\"eval_loss\""));
    let metrics: Vec<StepMetrics> = steps
        .iter()
        .map(|l| serde_json::from_str(l).expect("metrics line parses"))
        .collect();
    RunResult {
        losses: metrics.iter().map(|m| m.loss).collect(),
        params: params_file::read(params).expect("params file"),
        evals: evals
            .iter()
            .map(|l| serde_json::from_str(l).expect("eval line parses"))
            .collect(),
        metrics,
    }
}

/// Trains `config` on `config.batch.world_size` rank processes.
pub fn run_sharded(dir: &Path, name: &str, config: &TrainConfig) -> RunResult {
    run_sharded_with_env(dir, name, config, &[])
}

/// [`run_sharded`] with extra environment variables for every rank.
pub fn run_sharded_with_env(
    dir: &Path,
    name: &str,
    config: &TrainConfig,
    env: &[(&str, &str)],
) -> RunResult {
    let children = spawn_sharded(dir, name, config, env);
    wait_all(children, dir);
    read_result(
        &dir.join(format!("{name}.metrics.jsonl")),
        &dir.join(format!("{name}.safetensors")),
    )
}

/// Starts `config.batch.world_size` rank processes (rank 0 writes
/// `<name>.metrics.jsonl`, the final weights go to `<name>.safetensors`).
pub fn spawn_sharded(
    dir: &Path,
    name: &str,
    config: &TrainConfig,
    env: &[(&str, &str)],
) -> Vec<(u64, Child)> {
    let config_path = write_config(dir, name, config);
    let port = free_port();
    let world = config.batch.world_size;
    let (metrics, params) = (
        dir.join(format!("{name}.metrics.jsonl")),
        dir.join(format!("{name}.safetensors")),
    );
    (0..world)
        .map(|rank| {
            let log = std::fs::File::create(dir.join(format!("rank{rank}.log"))).expect("log file");
            let mut cmd = Command::new(WORKER);
            cmd.arg("--config")
                .arg(&config_path)
                .arg("--dump-params")
                .arg(&params)
                .env("RANK", rank.to_string())
                .env("WORLD_SIZE", world.to_string())
                .env("LOCAL_RANK", rank.to_string())
                .env("MASTER_ADDR", "127.0.0.1")
                .env("MASTER_PORT", port.to_string())
                .envs(env.iter().copied())
                .env_remove("SHARDRUN_CONTROLLER")
                .stdout(Stdio::null())
                .stderr(log);
            if rank == 0 {
                cmd.arg("--metrics-file").arg(&metrics);
            }
            (rank, cmd.spawn().expect("spawn shardrun-worker"))
        })
        .collect()
}

/// Trains `config` unsharded in one process (`--reference`).
pub fn run_reference(dir: &Path, name: &str, config: &TrainConfig) -> RunResult {
    let config_path = write_config(dir, name, config);
    let (metrics, params) = (
        dir.join(format!("{name}.metrics.jsonl")),
        dir.join(format!("{name}.safetensors")),
    );
    let log = std::fs::File::create(dir.join(format!("{name}.log"))).expect("log file");
    let child = Command::new(WORKER)
        .arg("--config")
        .arg(&config_path)
        .arg("--reference")
        .arg("--metrics-file")
        .arg(&metrics)
        .arg("--dump-params")
        .arg(&params)
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("spawn reference");
    wait_all(vec![(0, child)], dir);
    read_result(&metrics, &params)
}

/// Largest relative difference: losses and gradient norms step by step, and every parameter
/// as `max |a - b| / max |b|` over its elements. A NaN or an infinity on either side is never
/// a small difference: it panics, naming the step or the parameter. The gradient norms see
/// what the parameters cannot: AdamW's update is the same for gradients all scaled alike.
pub fn max_relative_difference(a: &RunResult, b: &RunResult) -> (f64, String) {
    assert_eq!(
        a.losses.len(),
        b.losses.len(),
        "same number of logged steps"
    );
    let mut worst = (0.0f64, String::new());
    for (step, (x, y)) in a.losses.iter().zip(&b.losses).enumerate() {
        assert!(
            x.is_finite() && y.is_finite(),
            "loss at step {} is not finite: {x} vs {y}",
            step + 1
        );
        let d = (x - y).abs() / y.abs().max(1e-12);
        if d > worst.0 {
            worst = (d, format!("loss at step {}: {x} vs {y}", step + 1));
        }
    }
    assert_eq!(
        a.metrics.len(),
        b.metrics.len(),
        "same number of step records"
    );
    for (x, y) in a.metrics.iter().zip(&b.metrics) {
        let (step, x, y) = (x.step, x.grad_norm, y.grad_norm);
        assert!(
            x.is_finite() && y.is_finite(),
            "gradient norm at step {step} is not finite: {x} vs {y}"
        );
        let d = (x - y).abs() / y.abs().max(1e-12);
        if d > worst.0 {
            worst = (d, format!("gradient norm at step {step}: {x} vs {y}"));
        }
    }
    assert_eq!(
        a.params.keys().collect::<Vec<_>>(),
        b.params.keys().collect::<Vec<_>>(),
        "same parameter names"
    );
    for (name, pa) in &a.params {
        let pb = &b.params[name];
        assert_eq!(pa.shape, pb.shape, "shape of {name}");
        let mut scale = 1e-12f64;
        let mut diff = 0.0f64;
        for (i, (x, y)) in pa.values.iter().zip(&pb.values).enumerate() {
            assert!(
                x.is_finite() && y.is_finite(),
                "parameter {name} element {i} is not finite: {x} vs {y}"
            );
            scale = scale.max(f64::from(y.abs()));
            diff = diff.max(f64::from((x - y).abs()));
        }
        if diff / scale > worst.0 {
            worst = (diff / scale, format!("parameter {name}"));
        }
    }
    worst
}

pub fn temp_dir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("shardrun-equivalence")
        .tempdir()
        .expect("temp dir")
}

/// Runs `f` as every rank of a `world`-rank CPU job inside this process, one thread per rank,
/// over real sockets (the same `prepare` / `connect` a worker process goes through).
pub fn ranks_in_threads<T: Send>(
    world: usize,
    f: impl Fn(usize, shardrun_worker::collectives::Comms) -> T + Sync,
) -> Vec<T> {
    use shardrun_protocol::messages::{PeerInfo, StartInfo};
    use shardrun_worker::collectives::prepare;
    let prepared: Vec<_> = (0..world)
        .map(|r| prepare(DeviceKind::Cpu, r, world, "127.0.0.1").expect("prepare"))
        .collect();
    let start = StartInfo {
        world_size: world as u64,
        peers: prepared
            .iter()
            .enumerate()
            .map(|(r, p)| PeerInfo {
                rank: r as u64,
                local_rank: r as u64,
                host: "127.0.0.1".into(),
                collective_addr: p.collective_addr.clone(),
            })
            .collect(),
        nccl_unique_id: None,
    };
    let (start, f) = (&start, &f);
    std::thread::scope(|scope| {
        let handles: Vec<_> = prepared
            .into_iter()
            .enumerate()
            .map(|(rank, p)| scope.spawn(move || f(rank, p.connect(start, rank).expect("connect"))))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("rank thread"))
            .collect()
    })
}

/// A reporter that keeps the metrics records (in-process runs).
#[derive(Default)]
pub struct Recorder(pub std::sync::Mutex<Vec<StepMetrics>>);

impl shardrun_worker::report::Reporter for Recorder {
    fn log(&self, _: shardrun_protocol::messages::LogLevel, _: &str) {}
    fn metrics(&self, m: &StepMetrics) {
        self.0.lock().unwrap().push(m.clone());
    }
    fn checkpoint_saved(&self, _: u64, _: &str) {}
    fn summary(&self, _: &shardrun_protocol::messages::TrainSummary) {}
    fn preempt_requested(&self) -> bool {
        false
    }
}

/// A copy of the folder `from` at `to`, sub-folders included (a checkpoint to resume from
/// elsewhere).
pub fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}
