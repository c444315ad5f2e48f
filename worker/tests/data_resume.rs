//! Real documents through the real worker processes: a run killed after a checkpoint and
//! resumed on another world size feeds the model bitwise the samples of an uninterrupted run
//! (compared sample by sample through the batch log), reaches its losses and validation
//! losses, and HYBRID_SHARD replicas read disjoint samples; the sharded runs equal the
//! single-process reference on masked, padded data (the loss is a mean over the step's target
//! tokens whatever the world size and accumulation).
//!
//! The corpus is the Python standard library's sources (every Debian machine has them), read
//! as one document per file with the byte tokenizer.

mod common;

use common::*;
use shardrun_checkpoint::naming::COMPLETE_FILE;
use shardrun_protocol::config::*;
use shardrun_protocol::messages::StepMetrics;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// 40 of the standard library's modules, copied so the test owns its files.
fn corpus(dir: &Path) -> Vec<PathBuf> {
    let mut sources: Vec<PathBuf> = std::fs::read_dir("/usr/lib/python3.11")
        .or_else(|_| std::fs::read_dir("/usr/lib/python3"))
        .expect("the Python standard library sources (/usr/lib/python3.11) are missing: install python3")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "py"))
        .filter(|p| std::fs::metadata(p).is_ok_and(|m| m.len() > 0 && m.len() < 20_000))
        .collect();
    sources.sort();
    let data = dir.join("data");
    std::fs::create_dir_all(&data).unwrap();
    sources
        .iter()
        .take(40)
        .map(|p| {
            let to = data.join(p.file_name().unwrap());
            std::fs::copy(p, &to).unwrap();
            to
        })
        .collect()
}

fn data_config(dir: &Path, files: Vec<PathBuf>) -> TrainConfig {
    let model = ModelConfig::Transformer {
        vocab_size: 257,
        dim: 16,
        n_layers: 2,
        n_heads: 2,
        max_seq_len: 32,
    };
    let mut c = config(model, ShardingStrategy::FullShard, 2);
    c.data = DataConfig::Dataset(Box::new(DatasetConfig {
        source: DataSource::Text {
            files,
            split: TextSplit::File,
        },
        seq_len: 32,
        tokenizer: TokenizerConfig::Bytes,
        packing: Packing::Stream,
        truncate: false,
        document_mask: false,
        shuffle: true,
        validation: Some(ValidationConfig {
            held_out: HeldOut::Fraction { fraction: 0.1 },
            every_steps: Some(4),
            max_batches: Some(3),
        }),
        cache_dir: dir.join("cache"),
        on_bad_record: OnBadRecord::Stop,
    }));
    c.steps = 12;
    // 12 samples per step: 2 ranks × 3 × 2 micro-steps, or 3 ranks × 1 × 4.
    c.batch = BatchPlan {
        total_batch_size: 12,
        batch_size_per_device: 3,
        world_size: 2,
        grad_accum_steps: 2,
    };
    c
}

fn on_world(c: &TrainConfig, world: u64, per_device: u64, accum: u64) -> TrainConfig {
    let mut c = c.clone();
    c.batch.world_size = world;
    c.batch.batch_size_per_device = per_device;
    c.batch.grad_accum_steps = accum;
    c
}

/// (step, global sample) -> digest, from every rank's batch log; each sample once.
fn batch_log(prefix: &Path, world: u64) -> BTreeMap<(u64, u64), String> {
    let mut samples = BTreeMap::new();
    for rank in 0..world {
        let path = PathBuf::from(format!("{}.rank{rank}", prefix.display()));
        let text =
            std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        for line in text.lines() {
            let f: Vec<&str> = line.split(' ').collect();
            let key = (f[0].parse().unwrap(), f[2].parse().unwrap());
            let before = samples.insert(key, f[3].to_string());
            assert!(
                before.is_none(),
                "sample {key:?} read twice ({})",
                path.display()
            );
        }
    }
    samples
}

fn env(prefix: &Path) -> Vec<(&'static str, String)> {
    vec![("SHARDRUN_BATCH_LOG", prefix.display().to_string())]
}

fn run(dir: &Path, name: &str, c: &TrainConfig, prefix: &Path) -> RunResult {
    let env = env(prefix);
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    run_sharded_with_env(dir, name, c, &env)
}

#[test]
fn a_killed_run_resumed_on_another_world_size_reads_the_same_samples() {
    let tmp = temp_dir();
    let dir = tmp.path();
    let base = data_config(dir, corpus(dir));

    let straight = run(dir, "straight", &base, &dir.join("straight"));
    let straight_samples = batch_log(&dir.join("straight"), 2);
    assert_eq!(
        straight_samples.len(),
        12 * 12,
        "12 steps of 12 samples, each once"
    );
    assert_eq!(
        straight.evals.iter().map(|e| e.step).collect::<Vec<_>>(),
        vec![4, 8, 12]
    );
    assert!(straight
        .evals
        .iter()
        .all(|e| e.eval_loss.is_finite() && e.eval_tokens > 0));
    assert!(
        straight.evals[2].eval_loss < straight.evals[0].eval_loss,
        "{:?}",
        straight.evals
    );
    // Packed plain text: every position is a target, so every token is trained on, but
    // for the padding of the stream's last sequence (12 steps are less than an epoch, so
    // at most one step draws it, and it misses less than one sequence).
    let positions = 12.0 * 32.0;
    let mut short_steps = 0;
    for m in &straight.metrics {
        let trained = m
            .trained_tokens_per_s
            .expect("real data reports trained tokens");
        let missing = (1.0 - trained / m.tokens_per_s) * positions;
        assert!(
            missing.is_finite() && missing > -1e-6 && missing < 32.0,
            "step {}: {trained} trained of {} tokens/s",
            m.step,
            m.tokens_per_s
        );
        short_steps += usize::from(missing > 0.5);
    }
    assert!(short_steps <= 1, "{:?}", straight.metrics);

    // The same job with checkpoints, killed once its step-4 checkpoint is complete.
    let mut checkpointed = base.clone();
    checkpointed.checkpoint.dir = Some(dir.join("checkpoints"));
    checkpointed.checkpoint.interval_steps = Some(4);
    checkpointed.checkpoint.keep = 5;
    checkpointed.checkpoint.resume = true;
    let killed_env = env(&dir.join("killed"));
    let killed_env: Vec<(&str, &str)> = killed_env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let mut children = spawn_sharded(dir, "killed", &checkpointed, &killed_env);
    let marker = dir.join("checkpoints/step-4").join(COMPLETE_FILE);
    let deadline = Instant::now() + Duration::from_secs(240);
    while !marker.exists() {
        assert!(
            Instant::now() < deadline,
            "no step-4 checkpoint after 240 s"
        );
        assert!(
            children
                .iter_mut()
                .all(|(_, c)| c.try_wait().unwrap().is_none()),
            "a rank exited before the checkpoint"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    for (_, child) in &mut children {
        child.kill().unwrap();
        child.wait().unwrap();
    }
    let killed = batch_log(&dir.join("killed"), 2);

    // Resumed on 3 ranks (1 sample each, 4 micro-steps): evaluation rounds of 3 sequences
    // where the run had 6, and the same `max_batches` sequences evaluated.
    let resumed_config = on_world(&checkpointed, 3, 1, 4);
    let resumed = run(dir, "resumed", &resumed_config, &dir.join("resumed"));
    let resumed_samples = batch_log(&dir.join("resumed"), 3);
    let first_resumed_step = *resumed_samples.keys().map(|(s, _)| s).min().unwrap();
    assert!(
        first_resumed_step > 4,
        "resumed from a checkpoint, at step {first_resumed_step}"
    );
    for (key, digest) in killed.iter().chain(&resumed_samples) {
        assert_eq!(
            Some(digest),
            straight_samples.get(key),
            "step {} sample {}: not the uninterrupted run's",
            key.0,
            key.1
        );
    }
    let covered: Vec<u64> = killed
        .keys()
        .chain(resumed_samples.keys())
        .map(|(s, _)| *s)
        .collect();
    assert!((1..=12).all(|s| covered.contains(&s)), "every step was run");

    // The resumed losses and the final evaluation: the uninterrupted run's (another world
    // size sums in another order: ≤ 1e-5).
    let resumed_losses: Vec<f64> = resumed.metrics.iter().map(|m| m.loss).collect();
    let straight_tail = &straight.losses[12 - resumed_losses.len()..];
    for (a, b) in resumed_losses.iter().zip(straight_tail) {
        assert!(
            (a - b).abs() <= 1e-5 * b.abs(),
            "{resumed_losses:?} vs {straight_tail:?}"
        );
    }
    let (a, b) = (
        resumed.evals.last().unwrap(),
        straight.evals.last().unwrap(),
    );
    assert_eq!((a.step, a.eval_tokens), (b.step, b.eval_tokens));
    assert!(
        (a.eval_loss - b.eval_loss).abs() <= 1e-5 * b.eval_loss,
        "{a:?} vs {b:?}"
    );
    assert!(resumed.metrics.last().unwrap().epoch.unwrap() > 0.0);
}

#[test]
fn hybrid_shard_replicas_read_disjoint_samples_and_masked_data_matches_the_reference() {
    let tmp = temp_dir();
    let dir = tmp.path();
    let files = corpus(dir);
    // Prompt/completion records: each file's first line is the prompt, the rest the
    // completion; whole documents, so sequences are padded.
    let records = dir.join("records.jsonl");
    let mut text = String::new();
    for f in &files {
        let body = std::fs::read_to_string(f).unwrap();
        let (prompt, completion) = body.split_at(body.find('\n').unwrap_or(0) + 1);
        let completion: String = completion.chars().take(40).collect();
        text.push_str(&serde_json::json!({"prompt": prompt, "completion": completion}).to_string());
        text.push('\n');
    }
    std::fs::write(&records, text).unwrap();
    let mut base = data_config(dir, vec![]);
    if let DataConfig::Dataset(d) = &mut base.data {
        d.source = DataSource::Jsonl {
            files: vec![records],
            text: JsonlText::PromptCompletion {
                prompt: "prompt".into(),
                completion: "completion".into(),
            },
        };
        d.packing = Packing::WholeDocuments;
        d.seq_len = 128;
        d.validation = None;
    }
    base.model = ModelConfig::Transformer {
        vocab_size: 257,
        dim: 16,
        n_layers: 2,
        n_heads: 2,
        max_seq_len: 128,
    };
    base.steps = 4;

    let reference = run_reference(dir, "reference", &base);
    let two = run(dir, "two", &base, &dir.join("two"));
    let mut hybrid = on_world(&base, 4, 3, 1);
    hybrid.fsdp.strategy = ShardingStrategy::HybridShard;
    hybrid.fsdp.shard_group_size = Some(2);
    let four = run(dir, "hybrid", &hybrid, &dir.join("hybrid"));
    // Every sample of every step read by exactly one rank (batch_log checks), the same ones.
    assert_eq!(
        batch_log(&dir.join("hybrid"), 4),
        batch_log(&dir.join("two"), 2)
    );
    for (name, run) in [("2 ranks", &two), ("HYBRID_SHARD 4 ranks", &four)] {
        let (worst, at) = max_relative_difference(run, &reference);
        assert!(worst <= 1e-5, "{name}: {worst:e} at {at}");
        // Prompts and padding are not trained on: the share of trained tokens is the
        // single-process reference's count of target tokens over the step's tokens.
        assert_eq!(run.metrics.len(), reference.metrics.len());
        for (m, r) in run.metrics.iter().zip(&reference.metrics) {
            let share = |m: &StepMetrics| m.trained_tokens_per_s.unwrap() / m.tokens_per_s;
            assert!(
                share(r) > 0.0 && share(r) < 0.9,
                "step {}: reference trains on {} of the tokens",
                r.step,
                share(r)
            );
            assert!(
                (share(m) - share(r)).abs() <= 1e-9,
                "{name} step {}: trains on {} of the tokens, the reference on {}",
                m.step,
                share(m),
                share(r)
            );
        }
    }
}

/// Fine-tuning documents packed whole with the document mask: each batch's document bounds
/// (what flash attention's variable-length kernel reads on a GPU) start exactly where the
/// positions restart, rows laid end to end, and span every token.
#[test]
fn packed_batches_bound_their_documents_where_positions_restart() {
    let tmp = temp_dir();
    let dir = tmp.path();
    let mut c = data_config(dir, corpus(dir));
    // Rows of 4 KiB: several of the smaller files each, the larger ones truncated to one.
    if let DataConfig::Dataset(d) = &mut c.data {
        d.packing = Packing::WholeDocuments;
        d.truncate = true;
        d.document_mask = true;
        d.seq_len = 4096;
    }
    if let ModelConfig::Transformer { max_seq_len, .. } = &mut c.model {
        *max_seq_len = 4096;
    }
    let data = shardrun_worker::data::TrainingData::new(&c).expect("the documents prepare");
    let mut documents_per_row: BTreeMap<(u64, usize), usize> = BTreeMap::new();
    for first in (0..48).step_by(8) {
        let batch = data.samples(first, 8).expect("a batch");
        let positions =
            Vec::<i64>::try_from(batch.position_ids.as_ref().unwrap().reshape([-1])).unwrap();
        let bounds = batch
            .document_bounds
            .as_ref()
            .expect("bounds with the mask");
        let offsets = Vec::<i32>::try_from(&bounds.offsets).unwrap();
        let starts: Vec<usize> = positions
            .iter()
            .enumerate()
            .filter(|(_, &p)| p == 0)
            .map(|(i, _)| i)
            .collect();
        assert_eq!(
            offsets[..offsets.len() - 1]
                .iter()
                .map(|&o| o as usize)
                .collect::<Vec<_>>(),
            starts,
            "batch at sample {first}"
        );
        assert_eq!(*offsets.last().unwrap() as usize, positions.len());
        let longest = offsets.windows(2).map(|w| w[1] - w[0]).max().unwrap();
        assert_eq!(bounds.longest, i64::from(longest));
        // Real documents (not the padding ending a row) in the row a bound starts in.
        let inputs = Vec::<i64>::try_from(batch.inputs.reshape([-1])).unwrap();
        for w in offsets.windows(2) {
            if inputs[w[0] as usize] != shardrun_data::packing::PAD {
                *documents_per_row
                    .entry((first, w[0] as usize / 4096))
                    .or_insert(0) += 1;
            }
        }
    }
    // Rows of 4 KiB hold several of the smaller files: bounds inside rows are exercised.
    let most = documents_per_row.values().max().copied().unwrap_or(0);
    assert!(most >= 3, "at most {most} documents in a row");
}
