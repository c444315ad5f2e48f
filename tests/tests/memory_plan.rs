//! The memory plan against real runs: the peak per rank `shardrun plan --json` predicts for a
//! job equals, within 15%, the peak its workers report when `shardrun run` trains it on 2 CPU
//! ranks, for FULL_SHARD, SHARD_GRAD_OP and NO_SHARD on two model sizes, and with activation
//! checkpointing; for the transformer and for a Llama (grouped-query attention, SwiGLU).
//!
//! How the peak is measured: a CPU worker reports its peak resident set size (`VmHWM`) and
//! its resident memory before its shards were allocated; the growth of one over the other is
//! what the plan models. The resident memory a process starts with varies by several MiB from
//! run to run (how much of libtorch it has paged in), so one process's peak is never compared
//! with another's. The growth every job has beyond its model (libtorch's kernels and buffers
//! on the first step, threads, sockets) is subtracted: the growth of the same job with a
//! transformer of ~1,000 parameters. The workers run with jemalloc returning freed pages at
//! once (`MALLOC_CONF=dirty_decay_ms:0,muzzy_decay_ms:0`), so the resident peak is the peak of
//! memory in use; the worker's default keeps freed pages for speed, which costs up to a
//! fifth more resident memory on CPU (allocator policy, not memory the job needs).

use shardrun_e2e::jobs::run_local;
use shardrun_e2e::*;
use std::path::Path;
use std::time::Duration;

const TOLERANCE: f64 = 0.15;

struct Case {
    name: &'static str,
    vocab: u64,
    dim: u64,
    layers: u64,
    heads: u64,
    batch_per_rank: u64,
    strategy: &'static str,
    checkpointing: bool,
    /// A Llama model instead of the transformer: its key/value heads and MLP width.
    llama: Option<(u64, u64)>,
    /// `training.fsdp.loss_chunk_tokens`.
    loss_chunk_tokens: Option<u64>,
}

fn spec(c: &Case) -> String {
    let model = match c.llama {
        None => format!(
            "{{ kind: transformer, vocab_size: {}, dim: {}, n_layers: {}, n_heads: {}, max_seq_len: 128 }}",
            c.vocab, c.dim, c.layers, c.heads
        ),
        Some((kv_heads, ffn)) => format!(
            "{{ kind: llama, vocab_size: {}, dim: {}, n_layers: {}, n_heads: {}, n_kv_heads: {kv_heads}, ffn_dim: {ffn} }}",
            c.vocab, c.dim, c.layers, c.heads
        ),
    };
    format!(
        "name: {}\nresources: {{ tasks_per_node: 2, cpus_per_task: 1 }}\ntraining:\n  \
         model: {model}\n  \
         data: {{ kind: synthetic, seq_len: 128 }}\n  steps: 2\n  total_batch_size: {}\n  \
         batch_size_per_device: {}\n  fsdp: {{ strategy: {}, activation_checkpointing: {}{} }}\n",
        c.name,
        2 * c.batch_per_rank,
        c.batch_per_rank,
        c.strategy,
        c.checkpointing,
        c.loss_chunk_tokens
            .map_or(String::new(), |n| format!(", loss_chunk_tokens: {n}"))
    )
}

/// The plan's peak per rank for the chosen strategy.
fn planned_peak(spec: &Path) -> u64 {
    let spec = spec.to_str().expect("a UTF-8 path");
    let out = shardrun_in(
        Path::new("."),
        &["plan", "--json", spec],
        Duration::from_secs(60),
    );
    assert!(out.status.success(), "{}", stderr_of(&out));
    let plan: serde_json::Value = serde_json::from_slice(&out.stdout).expect("plan JSON");
    plan["memory"]["chosen"]["peak"]
        .as_u64()
        .unwrap_or_else(|| panic!("no memory.chosen.peak in {plan}"))
}

/// The largest growth of resident memory over what the process had before its shards, of
/// any rank in any step of a local run.
fn measured_growth(dir: &TestDir, spec: &Path) -> u64 {
    let (out, run) = run_local(
        dir,
        spec,
        &["--no-progress"],
        &[(
            "MALLOC_CONF",
            "dirty_decay_ms:0,muzzy_decay_ms:0".to_string(),
        )],
        Duration::from_secs(600),
    );
    assert!(
        out.status.success(),
        "{}\n{}",
        stdout_of(&out),
        stderr_of(&out)
    );
    let mut growths = Vec::new();
    for rank in 0..2 {
        let path = run.join(format!("logs/rank-{rank}.metrics.jsonl"));
        let metrics =
            std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        for record in metrics
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter(|m| m.get("peak_memory_bytes").is_some())
        {
            let (Some(peak), Some(before)) = (
                record["peak_memory_bytes"].as_u64(),
                record["rss_before_model_bytes"].as_u64(),
            ) else {
                panic!("a CPU step record without the memory before the model: {record}");
            };
            growths.push(peak.saturating_sub(before));
        }
    }
    assert!(!growths.is_empty(), "no step records in {}", run.display());
    std::fs::remove_dir_all(&run).expect("remove the run directory");
    growths.into_iter().max().unwrap_or(0)
}

#[test]
fn planned_peak_memory_matches_real_cpu_runs_within_15_percent() {
    let dir = TestDir::new("memory-plan");
    let small = |name, strategy, checkpointing| Case {
        name,
        vocab: 4096,
        dim: 256,
        layers: 4,
        heads: 4,
        batch_per_rank: 4,
        strategy,
        checkpointing,
        llama: None,
        loss_chunk_tokens: None,
    };
    // Grouped-query attention, SwiGLU: the Llama architecture's own activation figures.
    let llama = |name, strategy, checkpointing| Case {
        llama: Some((2, 688)),
        ..small(name, strategy, checkpointing)
    };
    let large = |name, strategy| Case {
        name,
        vocab: 8192,
        dim: 512,
        layers: 8,
        heads: 8,
        batch_per_rank: 1,
        strategy,
        checkpointing: false,
        llama: None,
        loss_chunk_tokens: None,
    };
    // A vocabulary whose logits outweigh the rest, its loss in chunks of 128 tokens (an
    // eighth of a micro-batch): what the loss holds is one chunk's (whole, the logits and
    // their gradients would be 375 MiB more).
    let wide_vocabulary = Case {
        name: "llama-vocab",
        vocab: 32_000,
        dim: 64,
        layers: 2,
        heads: 4,
        batch_per_rank: 8,
        strategy: "FULL_SHARD",
        checkpointing: false,
        llama: Some((2, 172)),
        loss_chunk_tokens: Some(128),
    };
    let cases = [
        small("small-full", "FULL_SHARD", false),
        small("small-zero2", "SHARD_GRAD_OP", false),
        small("small-noshard", "NO_SHARD", false),
        small("small-full-ac", "FULL_SHARD", true),
        large("large-full", "FULL_SHARD"),
        large("large-zero2", "SHARD_GRAD_OP"),
        large("large-noshard", "NO_SHARD"),
        llama("llama-full", "FULL_SHARD", false),
        llama("llama-zero2", "SHARD_GRAD_OP", false),
        llama("llama-full-ac", "FULL_SHARD", true),
        wide_vocabulary,
    ];
    let baseline_spec = dir.write(
        "baseline.yaml",
        &spec(&Case {
            name: "baseline",
            vocab: 16,
            dim: 8,
            layers: 1,
            heads: 2,
            batch_per_rank: 1,
            strategy: "FULL_SHARD",
            checkpointing: false,
            llama: None,
            loss_chunk_tokens: None,
        }),
    );
    let baseline = measured_growth(&dir, &baseline_spec);
    let mut report = vec![format!("growth of every job {} MiB", baseline >> 20)];
    eprintln!("{}", report[0]);
    let mut worst = (0.0f64, String::new());
    for case in &cases {
        let path = dir.write(&format!("{}.yaml", case.name), &spec(case));
        let planned = planned_peak(&path);
        let measured = measured_growth(&dir, &path).saturating_sub(baseline);
        let error = (planned as f64 - measured as f64) / measured as f64;
        let line = format!(
            "{:<14} planned {:>6.1} MiB, measured {:>6.1} MiB: {:+.1}%",
            case.name,
            planned as f64 / (1 << 20) as f64,
            measured as f64 / (1 << 20) as f64,
            100.0 * error
        );
        eprintln!("{line}");
        report.push(line.clone());
        assert!(
            error.is_finite() && measured > 0,
            "{line}: nothing measured"
        );
        if error.abs() > worst.0.abs() {
            worst = (error, line);
        }
    }
    assert!(
        worst.0.abs() <= TOLERANCE,
        "the plan is off by more than {:.0}% for {}\n{}",
        100.0 * TOLERANCE,
        worst.1,
        report.join("\n")
    );
}
