//! `shardrun-metrics-rank`: a simulated rank that only reports metrics, for measuring what
//! the controller writes for big worlds. It speaks the real protocol (handshake,
//! registration, the start message, one metrics record per step, the finish) like
//! `shardrun-simrank`, but links no libtorch: `shardrun-simrank` holds ~180 MB of libtorch's
//! own memory per process, so 512 of them do not fit on one machine; 512 of these do.
//!
//! Every record carries every field a GPU rank sends, with full-precision values that move
//! from step to step (a real step time measured per rank, loss and learning-rate curves),
//! so the bytes written are those of a real job.
//!
//! ```text
//! SHARDRUN_WORKER_BIN=shardrun-metrics-rank METRICS_RANK_STEPS=1000 METRICS_RANK_STEP_MS=20 shardrun run job.yaml --nproc 512
//! ```

use shardrun_protocol::connection::BlockingConnection;
use shardrun_protocol::messages::{FromWorker, Registration, Role, StepMetrics, ToWorker};
use shardrun_protocol::{env, TrainConfig};
use std::time::{Duration, Instant};

fn var(name: &str) -> Result<String, String> {
    std::env::var(name).map_err(|_| format!("{name} is not set: start this under `shardrun run`"))
}

fn number(name: &str, default: u64) -> Result<u64, String> {
    match std::env::var(name) {
        Ok(v) => v
            .trim()
            .parse()
            .map_err(|_| format!("{name}={v:?} is not a whole number")),
        Err(_) => Ok(default),
    }
}

fn run() -> Result<(), String> {
    let rank = number(env::RANK, 0)?;
    let world_size = number(env::WORLD_SIZE, 1)?;
    let config_path = var(env::CONFIG_FILE)?;
    let config: TrainConfig = serde_json::from_str(
        &std::fs::read_to_string(&config_path).map_err(|e| format!("{config_path}: {e}"))?,
    )
    .map_err(|e| format!("{config_path}: {e}"))?;
    let steps = number("METRICS_RANK_STEPS", config.steps)?;
    let step_ms = number("METRICS_RANK_STEP_MS", 0)?;
    let addr = var(env::CONTROLLER_ADDR)?;
    let secret = match std::env::var(env::SECRET) {
        Ok(secret) => secret,
        Err(_) => {
            let path = var(env::SECRET_FILE)?;
            std::fs::read_to_string(&path)
                .map_err(|e| format!("{path}: {e}"))?
                .trim()
                .to_string()
        }
    };
    let fail = |e: shardrun_protocol::connection::ConnectionError| e.to_string();
    // Hundreds of processes start at once: the controller may take a while to accept.
    let started = Instant::now();
    let mut conn = loop {
        match BlockingConnection::connect(&addr, Role::Worker, &secret, Duration::from_secs(30)) {
            Ok(conn) => break conn,
            Err(e) if started.elapsed() > Duration::from_secs(120) => return Err(fail(e)),
            Err(_) => std::thread::sleep(Duration::from_millis(200)),
        }
    };
    conn.send(&FromWorker::Register(Registration {
        rank,
        local_rank: rank,
        world_size,
        host: shardrun_protocol::host::hostname(),
        pid: std::process::id(),
        device: "cuda:0 (simulated)".into(),
        device_error: None,
        config_hash: config.config_hash(),
        collective_addr: None,
        nccl_unique_id: None,
    }))
    .map_err(fail)?;
    loop {
        match conn.recv::<ToWorker>().map_err(fail)? {
            ToWorker::Start(_) => break,
            ToWorker::Shutdown { reason } | ToWorker::CheckpointAndStop { reason } => {
                return Err(format!("stopped before the start: {reason}"))
            }
            ToWorker::Preempt => {}
        }
    }
    let tokens_per_step = config.tokens_per_step() as f64;
    let mut last = Instant::now();
    for step in 1..=steps {
        if step_ms > 0 {
            std::thread::sleep(Duration::from_millis(step_ms));
        }
        let now = Instant::now();
        let step_time = now.duration_since(last).as_secs_f64();
        last = now;
        let s = step as f64;
        let progress = s / steps.max(1) as f64;
        conn.send(&FromWorker::Metrics(StepMetrics {
            rank,
            step,
            loss: 2.0 + 8.0 / s.sqrt() + 0.01 * s.sin(),
            lr: 3e-4 * 0.5 * (1.0 + (std::f64::consts::PI * progress).cos()),
            grad_norm: 1.0 / (1.0 + 1e-3 * s) + 0.05 * (0.7 * s).cos(),
            step_time_s: step_time,
            tokens_per_s: tokens_per_step / step_time,
            trained_tokens_per_s: Some(0.8 * tokens_per_step / step_time),
            mfu: Some(0.4 + 0.01 * (s * 0.3).sin()),
            model_state_bytes: 13_421_772_800 + rank * 4096,
            peak_memory_bytes: 61_203_283_968 + (rank * 7919 + step * 104_729) % 1_000_000_007,
            rss_before_model_bytes: None,
            loss_blew_up: false,
            peak_reserved_bytes: Some(68_719_476_736 + rank * 2_097_152),
            device_used_bytes: Some(74_088_185_856 + rank * 1_048_576),
            device_total_bytes: Some(85_520_809_984),
            loss_scale: Some(65536.0),
            epoch: None,
            data_time_s: None,
            // As GPU ranks report: no busy time.
            busy_time_s: None,
        }))
        .map_err(fail)?;
    }
    conn.send(&FromWorker::Finished { preempted: false })
        .map_err(fail)
}

fn main() {
    if let Err(e) = run() {
        eprintln!("shardrun-metrics-rank: {e}");
        std::process::exit(1);
    }
}
