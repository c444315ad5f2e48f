//! What the memory features promise, measured on the real worker processes: activation
//! checkpointing lowers the peak memory of an activation-heavy run (numbers are covered by
//! `equivalence.rs`), and sharding divides the model state by the number of ranks.

mod common;

use common::*;
use shardrun_protocol::config::*;

/// Small weights, big activations: 2 blocks of dim 64 over 64 × 256 tokens per rank, so the
/// attention and MLP activations each block keeps for backward are far larger than the model.
fn activation_heavy(world: u64) -> TrainConfig {
    let mut cfg = config(
        ModelConfig::Transformer {
            vocab_size: 512,
            dim: 64,
            n_layers: 4,
            n_heads: 4,
            max_seq_len: 256,
        },
        ShardingStrategy::FullShard,
        world,
    );
    cfg.data = DataConfig::Synthetic { seq_len: 256 };
    cfg.steps = 3;
    cfg.batch.total_batch_size = 64 * world;
    cfg.batch.batch_size_per_device = 64;
    cfg
}

fn peak(run: &RunResult) -> u64 {
    run.metrics
        .iter()
        .map(|m| m.peak_memory_bytes)
        .max()
        .unwrap_or(0)
}

#[test]
fn activation_checkpointing_lowers_peak_memory() {
    let dir = temp_dir();
    let plain = run_sharded(dir.path(), "plain", &activation_heavy(1));
    let mut cfg = activation_heavy(1);
    cfg.fsdp.activation_checkpointing = true;
    let checkpointed = run_sharded(dir.path(), "checkpointed", &cfg);
    let (plain, checkpointed) = (peak(&plain), peak(&checkpointed));
    eprintln!(
        "peak memory: {} MiB without, {} MiB with activation checkpointing",
        plain >> 20,
        checkpointed >> 20
    );
    // Without checkpointing each of the 4 blocks keeps its activations (tens of MiB); with
    // it, only the block inputs (4 MiB each). Ask for at least 64 MiB saved.
    assert!(
        checkpointed + (64 << 20) < plain,
        "peak memory with activation checkpointing {} MiB, without {} MiB",
        checkpointed >> 20,
        plain >> 20
    );
}

#[test]
fn model_state_per_rank_shrinks_with_the_world() {
    let dir = temp_dir();
    let state = |world: u64| {
        let run = run_sharded(
            dir.path(),
            &format!("world{world}"),
            &config(tiny_transformer(), ShardingStrategy::FullShard, world),
        );
        run.metrics
            .iter()
            .map(|m| m.model_state_bytes)
            .max()
            .unwrap_or(0)
    };
    let (one, four) = (state(1), state(4));
    eprintln!("model state per rank: {one} B on 1 rank, {four} B on 4 ranks");
    // Params, grads and both AdamW moments per rank: a quarter, plus at most the extra
    // padding of each of the 3 units on 4 ranks (to 4 × 8 elements instead of 8: at most 31
    // elements × 4 tensors × 4 bytes).
    assert!(one > 0 && four > 0);
    assert!(
        four * 4 <= one + 3 * 31 * 4 * 4 && four * 4 >= one,
        "model state per rank: {one} B on 1 rank, {four} B on 4 ranks"
    );
}

/// The peak resident memory the kernel measured for the whole process (`wait4`'s
/// `ru_maxrss`, its `VmHWM` at exit), and whether it exited 0.
fn wait_for_peak(child: std::process::Child) -> (u64, bool) {
    let mut status = 0;
    // SAFETY: a zeroed rusage is a valid out-parameter; the pid is our own child's.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    let pid = unsafe { libc::wait4(child.id() as i32, &mut status, 0, &mut usage) };
    assert_eq!(pid, child.id() as i32, "wait4");
    let exited_0 = libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0;
    (usage.ru_maxrss as u64 * 1024, exited_0)
}

#[test]
fn the_reported_peak_is_the_process_peak_up_to_its_exit() {
    let dir = temp_dir();
    let config = activation_heavy(1);
    let (_, child) = spawn_sharded(dir.path(), "exit", &config, &[])
        .pop()
        .expect("one rank");
    let (process_peak, exited_0) = wait_for_peak(child);
    let log = std::fs::read_to_string(dir.path().join("rank0.log")).unwrap_or_default();
    assert!(exited_0, "the rank failed:\n{log}");
    let reported = std::fs::read_to_string(dir.path().join("exit.metrics.jsonl"))
        .expect("metrics file")
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|r| r["peak_memory_bytes"].as_u64())
        .max()
        .expect("a peak in the metrics");
    eprintln!(
        "peak memory: {} MiB reported, {} MiB measured by the kernel at exit",
        reported >> 20,
        process_peak >> 20
    );
    // What the rank does after its last report (writing its parameters, leaving) takes a
    // few MiB; exit-time destructors of the C++ libraries took tens.
    assert!(
        process_peak <= reported + (8 << 20),
        "the process peaked at {} MiB, above the {} MiB it reported",
        process_peak >> 20,
        reported >> 20
    );
}
