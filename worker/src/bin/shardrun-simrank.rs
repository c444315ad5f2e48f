//! `shardrun-simrank`: a simulated rank that speaks the real controller protocol but trains
//! nothing. It registers like `shardrun-worker`, then sends log lines and metrics as fast as
//! asked. Used by the controller's end-to-end tests (deterministic deaths, hostile traffic)
//! and by the ingest benchmark (many ranks logging flat out).
//!
//! ```text
//! shardrun-simrank [--steps N] [--lines-per-step L] [--step-ms MS] [--die-rank R --die-at-step K]
//!                  [--late-rank R [--late-ms MS]] [--raw]
//! ```
//! Every option can also come from a `SIMRANK_*` variable (the controller passes the
//! environment, not arguments). Rank, world size and the controller come from the same
//! variables as the real worker; the steps default to the config's.

use anyhow::{Context, Result};
use clap::Parser;
use shardrun_protocol::messages::{LogLevel, Registration, StepMetrics};
use shardrun_protocol::{env, TrainConfig};
use shardrun_worker::controller_client::{self, ClientOptions};
use shardrun_worker::launch::RankEnv;
use shardrun_worker::report::Reporter;
use shardrun_worker::stop::{self, StopRequest};
use std::time::{Duration, Instant};

#[derive(Debug, Parser)]
struct Args {
    #[arg(long, env = "SIMRANK_STEPS")]
    steps: Option<u64>,
    #[arg(long, env = "SIMRANK_LINES_PER_STEP", default_value_t = 1)]
    lines_per_step: u64,
    /// Sleep this long per step (0: as fast as possible).
    #[arg(long, env = "SIMRANK_STEP_MS", default_value_t = 0)]
    step_ms: u64,
    /// This rank SIGKILLs itself right after logging its lines of step `die_at_step`.
    #[arg(long, env = "SIMRANK_DIE_RANK")]
    die_rank: Option<u64>,
    #[arg(long, env = "SIMRANK_DIE_AT_STEP", default_value_t = 1)]
    die_at_step: u64,
    /// Busy computation per step (a stand-in for a training step, to measure what logging
    /// costs it).
    #[arg(long, env = "SIMRANK_COMPUTE_MS", default_value_t = 0)]
    compute_ms: u64,
    /// Print one raw line on stdout per step too (raw output capture).
    #[arg(long, env = "SIMRANK_RAW")]
    raw: bool,
    /// This rank registers only after `late_ms` (a rank slow to load its libraries); without
    /// `late_ms` it never does and waits, alive, until it is killed (one stuck before the
    /// rendezvous, as on a hung file system).
    #[arg(long, env = "SIMRANK_LATE_RANK")]
    late_rank: Option<u64>,
    #[arg(long, env = "SIMRANK_LATE_MS")]
    late_ms: Option<u64>,
}

fn main() {
    match run() {
        Ok(0) => {}
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("shardrun-simrank: error: {e:#}");
            std::process::exit(1);
        }
    }
}

/// Runs; `Ok` with the exit status (0 unless stopped on request, like the real worker).
fn run() -> Result<i32> {
    let args = Args::parse();
    stop::install_signal_handlers(stop::Sigterm::Stop)?;
    let rank_env = RankEnv::from_env()?;
    let config_path = std::env::var(env::CONFIG_FILE).context("SHARDRUN_CONFIG is not set")?;
    let config: TrainConfig = serde_json::from_str(
        &std::fs::read_to_string(&config_path)
            .with_context(|| format!("cannot read {config_path}"))?,
    )?;
    let (addr, secret) = controller_client::endpoint_from_env()?;
    if args.late_rank == Some(rank_env.rank) {
        match args.late_ms {
            Some(ms) => std::thread::sleep(Duration::from_millis(ms)),
            None => loop {
                std::thread::park();
            },
        }
    }
    let registration = Registration {
        rank: rank_env.rank,
        local_rank: rank_env.local_rank,
        world_size: rank_env.world_size,
        host: shardrun_protocol::host::hostname(),
        pid: std::process::id(),
        device: "cpu".into(),
        config_hash: config.config_hash(),
        collective_addr: None,
        nccl_unique_id: None,
        device_error: None,
    };
    let (client, start) =
        controller_client::connect(&addr, &secret, registration, &ClientOptions::from_env())?;
    client.log(
        LogLevel::Info,
        &format!("simulated rank started in a world of {}", start.world_size),
    );
    let began = Instant::now();
    let mut lines = 0u64;
    let steps = args.steps.unwrap_or(config.steps);
    let mut step_time = 0.0;
    let mut in_log_calls = 0.0;
    for step in 1..=steps {
        let step_began = Instant::now();
        if args.compute_ms > 0 {
            busy(Duration::from_millis(args.compute_ms));
        }
        let logging_began = Instant::now();
        for i in 0..args.lines_per_step {
            client.log(
                LogLevel::Info,
                &format!("rank {} step {step} line {i}", rank_env.rank),
            );
            lines += 1;
        }
        in_log_calls += logging_began.elapsed().as_secs_f64();
        if args.raw {
            println!("raw stdout of rank {} at step {step}", rank_env.rank);
        }
        step_time += step_began.elapsed().as_secs_f64();
        client.metrics(&StepMetrics {
            rank: rank_env.rank,
            step,
            loss: 10.0 / step as f64,
            lr: 1e-3,
            grad_norm: 1.0,
            step_time_s: args.step_ms as f64 / 1000.0,
            tokens_per_s: 1000.0,
            model_state_bytes: 0,
            peak_memory_bytes: 0,
            ..Default::default()
        });
        if args.die_rank == Some(rank_env.rank) && step == args.die_at_step {
            // SAFETY: plain syscall on our own pid.
            unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
        }
        // Stop requests act at the step boundary, as in the trainer (one rank: no agreement).
        match stop::process().requested() {
            None => {}
            Some(StopRequest::Preempt) => {
                // Nothing to checkpoint; a cancel that asked for one first still stops.
                let wait = Duration::from_secs(2);
                if let Some(cause) = stop::process().stop_after_checkpoint(wait) {
                    client.log(
                        LogLevel::Warn,
                        &format!("stopping after step {step}: {cause}"),
                    );
                    client.stopped(step, &cause);
                    return Ok(cause.exit_code());
                }
                client.log(LogLevel::Info, &format!("preempted at step {step}"));
                client.finished(true);
                return Ok(0);
            }
            Some(StopRequest::Stop(cause)) => {
                client.log(
                    LogLevel::Warn,
                    &format!("stopping after step {step}: {cause}"),
                );
                client.stopped(step, &cause);
                return Ok(cause.exit_code());
            }
        }
        if args.step_ms > 0 {
            std::thread::sleep(Duration::from_millis(args.step_ms));
        }
    }
    let secs = began.elapsed().as_secs_f64();
    client.log(
        LogLevel::Info,
        &format!(
            "sent {lines} lines in {secs:.3} s ({:.0} lines/s); mean step time {:.3} ms; \
             {:.2} us per log call",
            lines as f64 / secs,
            step_time / steps.max(1) as f64 * 1000.0,
            in_log_calls / lines.max(1) as f64 * 1e6
        ),
    );
    client.finished(false);
    Ok(0)
}

/// Spins (does not sleep) for `d`, like a compute-bound step.
fn busy(d: Duration) {
    let until = Instant::now() + d;
    let mut x = 0u64;
    while Instant::now() < until {
        for i in 0..1000u64 {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(i);
        }
        std::hint::black_box(x);
    }
}
