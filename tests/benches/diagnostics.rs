//! `cargo bench -p shardrun-e2e --bench diagnostics`: what the diagnostics cost a training
//! step. The demo job (the README's transformer, FULL_SHARD on 2 CPU ranks) runs with
//! `RUST_LOG` unset (no subscriber: every event and span is a disabled check), `info`
//! (spans per step are built, few events), `debug` and `trace` (every collective written to
//! the ranks' debug logs), alternated over several rounds; the figure per case is the median
//! step time (the job's slowest rank, after the first 10 steps), and the median of the
//! rounds.
//!
//! Needs the release binaries: `cargo build --release --workspace --bins`.

use shardrun_e2e::jobs::*;
use shardrun_e2e::*;
use std::time::Duration;

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// Median step time (s) of one run of the demo job with `RUST_LOG` as given.
fn step_time(rust_log: Option<&str>, steps: u64) -> f64 {
    let dir = TestDir::new("bench-diagnostics");
    let spec = repo_root().join("examples/demo.yaml");
    let steps_arg = format!("training.steps={steps}");
    let (mut cmd, run) = local_run_command(
        &dir,
        &spec,
        &["--echo", "none", "--no-progress", "--set", &steps_arg],
        &[],
    );
    match rust_log {
        Some(filter) => cmd.env("RUST_LOG", filter),
        None => cmd.env_remove("RUST_LOG"),
    };
    let out = run_with_deadline(&mut cmd, Duration::from_secs(600)).expect("the demo ran");
    assert!(out.status.success(), "{}", stderr_of(&out));
    let times: Vec<f64> = step_records(&run)
        .iter()
        .filter(|r| r["step"].as_u64().unwrap_or(0) > 10)
        .filter_map(|r| r["step_time_max_s"].as_f64())
        .collect();
    assert!(!times.is_empty(), "no step records in {}", run.display());
    median(times)
}

fn main() {
    let steps = env_or("DIAGNOSTICS_STEPS", 300);
    let rounds = env_or("DIAGNOSTICS_ROUNDS", 3) as usize;
    let cases: [(&str, Option<&str>); 4] = [
        ("RUST_LOG unset", None),
        ("RUST_LOG=info", Some("info")),
        ("RUST_LOG=debug", Some("debug")),
        ("RUST_LOG=trace", Some("trace")),
    ];
    let mut runs: Vec<Vec<f64>> = vec![Vec::new(); cases.len()];
    for _ in 0..rounds.max(1) {
        for (i, (_, filter)) in cases.iter().enumerate() {
            runs[i].push(step_time(*filter, steps));
        }
    }
    let base = median(runs[0].clone());
    println!("demo job (examples/demo.yaml, 2 CPU ranks), {steps} steps, median of {rounds} alternated rounds:");
    for (i, (name, _)) in cases.iter().enumerate() {
        let t = median(runs[i].clone());
        let all: Vec<String> = runs[i]
            .iter()
            .map(|t| format!("{:.2}", t * 1000.0))
            .collect();
        println!(
            "  {name:<15} {:.2} ms/step ({:+.1}% vs unset; rounds: {} ms)",
            t * 1000.0,
            (t / base - 1.0) * 100.0,
            all.join(", ")
        );
    }
}
