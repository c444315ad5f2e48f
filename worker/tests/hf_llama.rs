//! The Llama family against `transformers` itself, on tiny random folders made by
//! `tests/python/hf_models.py` (Llama with GQA and an untied head, Llama with tied embeddings,
//! biases, an explicit head_dim and llama3 rope scaling in the 4.x config dialect, Qwen2 with
//! biases and one key/value head, Mistral with linear rope scaling, a sharded bf16 folder):
//!
//! * the worker's logits for fixed ids equal `LlamaForCausalLM`'s (≤ 1e-4, fp32);
//! * packed sequences (document ids, positions) equal each document run alone;
//! * `buffer_dtype: bf16` rounds the rotary frequencies as FSDP's cast of the buffer does;
//! * one optimizer step (loss, global gradient norm, every parameter after AdamW with clipping
//!   and the no-decay group) equals PyTorch's `torch.optim.AdamW` on the HF model (≤ 1e-5),
//!   on 1 rank and on 2 ranks with FULL_SHARD (with and without activation checkpointing),
//!   weights loaded shard by shard.

mod common;
mod hf_common;

use common::{config, run_sharded, temp_dir};
use hf_common::*;
use shardrun_models::source::ParamSource;
use shardrun_protocol::config::{LrDecay, ShardingStrategy};
use shardrun_worker::data::{Batch, TrainingData};
use shardrun_worker::model::{self, Params};
use std::path::Path;
use tch::{Device, Kind, Tensor};

/// Two rows of 12 token ids; token 0 is the pad token of `llama-gqa`.
const IDS: [[i64; 12]; 2] = [
    [1, 5, 17, 0, 42, 95, 3, 3, 60, 7, 0, 88],
    [2, 90, 44, 13, 13, 8, 71, 0, 29, 50, 64, 11],
];

fn ids_batch(ids: &[[i64; 12]]) -> Batch {
    let flat: Vec<i64> = ids.iter().flatten().copied().collect();
    let inputs = Tensor::from_slice(&flat).view([ids.len() as i64, 12]);
    Batch::new(inputs.shallow_clone(), inputs)
}

/// The worker's fp32 logits for `batch` on the weights of `dir`.
fn worker_logits(dir: &Path, batch: &Batch, buffer_kind: Kind) -> Vec<f32> {
    let config = hf_model(dir);
    let model = model::build(&config, buffer_kind);
    let source = ParamSource::for_model(&config, 0).expect("folder loads");
    let params = model::full_parameters(model.as_ref(), &source, Device::Cpu).expect("weights");
    let logits = tch::no_grad(|| model::output(model.as_ref(), &Params::new(&params), batch));
    Vec::<f32>::try_from(&logits.reshape([-1])).expect("f32 logits")
}

#[test]
fn logits_equal_transformers_for_every_folder() {
    let work = temp_dir();
    for name in FOLDERS {
        let dir = folder(name);
        let ours = worker_logits(&dir, &ids_batch(&IDS), Kind::Float);
        let theirs = transformers_logits(&dir, work.path(), &IDS, &[]);
        let diff = max_abs_difference(name, &ours, &theirs);
        let scale = theirs.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        eprintln!("{name}: max |logit difference| {diff:.2e} (logits up to {scale:.2})");
        assert!(scale > 1.0, "{name}: logits too small to compare");
        assert!(diff <= 1e-4, "{name}: logits differ by {diff:e}");
    }
}

#[test]
fn packed_documents_attend_only_within_their_document() {
    let work = temp_dir();
    let dir = folder("llama-gqa");
    // Row 0: documents of 5, 4 and 3 tokens; row 1: 8 and 4.
    let docs: [[i64; 12]; 2] = [
        [0, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2],
        [3, 3, 3, 3, 3, 3, 3, 3, 4, 4, 4, 4],
    ];
    let positions: Vec<i64> = docs
        .iter()
        .flat_map(|row| {
            let mut pos = Vec::new();
            for (j, d) in row.iter().enumerate() {
                pos.push(if j > 0 && row[j - 1] == *d {
                    pos[j - 1] + 1
                } else {
                    0
                });
            }
            pos
        })
        .collect();
    let flat_docs: Vec<i64> = docs.iter().flatten().copied().collect();
    let mut batch = ids_batch(&IDS);
    batch.document_ids = Some(Tensor::from_slice(&flat_docs).view([2, 12]));
    batch.position_ids = Some(Tensor::from_slice(&positions).view([2, 12]));
    let ours = worker_logits(&dir, &batch, Kind::Float);
    let docs_path = work.path().join("docs.json");
    std::fs::write(&docs_path, serde_json::to_string(&docs).unwrap()).unwrap();
    let theirs = transformers_logits(
        &dir,
        work.path(),
        &IDS,
        &["--documents", docs_path.to_str().unwrap()],
    );
    let diff = max_abs_difference("packed", &ours, &theirs);
    assert!(
        diff <= 1e-4,
        "packed rows differ from documents run alone by {diff:e}"
    );
    // Without the mask the rows would see across documents: a different answer.
    let unmasked = worker_logits(&dir, &ids_batch(&IDS), Kind::Float);
    assert!(max_abs_difference("unmasked", &unmasked, &theirs) > 1e-2);
}

#[test]
fn bf16_buffer_dtype_rounds_the_rotary_frequencies_as_fsdp_does() {
    let work = temp_dir();
    let dir = folder("llama-tied-llama3");
    let ours = worker_logits(&dir, &ids_batch(&IDS), Kind::BFloat16);
    let theirs = transformers_logits(&dir, work.path(), &IDS, &["--inv-freq-dtype", "bfloat16"]);
    let diff = max_abs_difference("bf16 buffers", &ours, &theirs);
    assert!(
        diff <= 1e-4,
        "bf16 rotary buffer: logits differ by {diff:e}"
    );
    let fp32 = worker_logits(&dir, &ids_batch(&IDS), Kind::Float);
    let effect = max_abs_difference("fp32 vs bf16 buffers", &fp32, &ours);
    assert!(
        effect > 1e-3,
        "buffer_dtype changed the logits by only {effect:e}: is it read?"
    );
}

/// One step on `folder` with 1 and 2 ranks (FULL_SHARD) against PyTorch's.
fn step_matches_pytorch(name: &str, work: &Path) {
    let dir = folder(name);
    let step_config = |world: u64| {
        let mut cfg = config(hf_model(&dir), ShardingStrategy::FullShard, world);
        cfg.name = format!("{name}-{world}");
        cfg.steps = 1;
        cfg.data = shardrun_protocol::config::DataConfig::Synthetic { seq_len: 12 };
        cfg.batch.total_batch_size = 4;
        cfg.batch.batch_size_per_device = 4 / world;
        cfg.optimizer.lr = 1e-2;
        cfg.optimizer.grad_clip = Some(0.5);
        // With eps 1e-8 a gradient that is only rounding noise becomes a full ±lr step,
        // which differs between any two summation orders (PyTorch's own 1- and 2-rank runs
        // included): k_proj biases along dimensions RoPE barely rotates have a true
        // gradient of 0 (~1e-8 here). eps 1e-4 keeps every element's update well-conditioned.
        cfg.optimizer.eps = 1e-4;
        cfg.schedule.warmup_steps = 0;
        cfg.schedule.decay = LrDecay::Constant;
        cfg
    };
    // PyTorch on the whole global batch (samples 0..4, what the ranks split between them).
    let cfg = step_config(1);
    let batch = TrainingData::new(&cfg).unwrap().samples(0, 4).unwrap();
    let rows = |t: &Tensor| -> Vec<Vec<i64>> { Vec::<Vec<i64>>::try_from(t).unwrap() };
    let batch_path = work.join(format!("{name}.batch.json"));
    let json =
        serde_json::json!({ "inputs": rows(&batch.inputs), "targets": rows(&batch.targets) });
    std::fs::write(&batch_path, json.to_string()).unwrap();
    let config_path = work.join(format!("{name}.pytorch-config.json"));
    std::fs::write(&config_path, serde_json::to_string(&cfg).unwrap()).unwrap();
    let after = work.join(format!("{name}.pytorch.safetensors"));
    let printed = run_script(&[
        "step",
        "--model",
        dir.to_str().unwrap(),
        "--batch",
        batch_path.to_str().unwrap(),
        "--config",
        config_path.to_str().unwrap(),
        "--out",
        after.to_str().unwrap(),
    ]);
    let torch: serde_json::Value =
        serde_json::from_str(printed.lines().last().expect("a JSON line")).unwrap();
    let (loss, norm) = (
        torch["loss"].as_f64().unwrap(),
        torch["grad_norm"].as_f64().unwrap(),
    );
    let theirs = read_tensors(&after);
    let model = hf_model(&dir);
    let source = ParamSource::for_model(&model, 0).unwrap();
    let spec = model.describe().param("model.norm.weight").unwrap().clone();
    let mut before = vec![0.0; spec.numel() as usize];
    source
        .fill(&spec, 0..before.len() as u64, &mut before)
        .unwrap();

    // 1 rank, 2 ranks, 2 ranks recomputing each decoder layer in backward.
    for (world, checkpointing) in [(1, false), (2, false), (2, true)] {
        let mut cfg = step_config(world);
        cfg.fsdp.activation_checkpointing = checkpointing;
        cfg.name.push_str(if checkpointing { "-ac" } else { "" });
        let run = run_sharded(work, &cfg.name, &cfg);
        let m = &run.metrics[0];
        let what = format!("{name} on {world} rank(s), activation checkpointing {checkpointing}");
        assert!(norm > 0.5, "{what}: clipping at 0.5 must act (norm {norm})");
        assert!(
            relative("loss", m.loss, loss) <= 1e-5,
            "{what}: loss {} vs {loss}",
            m.loss
        );
        assert!(
            relative("grad norm", m.grad_norm, norm) <= 1e-5,
            "{what}: grad norm {} vs {norm}",
            m.grad_norm
        );
        assert_eq!(
            run.params.keys().collect::<Vec<_>>(),
            theirs.keys().collect::<Vec<_>>(),
            "{what}: parameter names"
        );
        for (pname, (shape, values)) in &theirs {
            let ours = &run.params[pname];
            assert_eq!(&ours.shape, shape, "{what}: shape of {pname}");
            let d = max_relative_difference(pname, &ours.values, values);
            assert!(d <= 1e-5, "{what}: {pname} differs by {d:e} after the step");
        }
        // The step moved the weights: the equality above is about the update, not the load.
        let moved = max_abs_difference("moved", &run.params[&spec.name].values, &before);
        assert!(moved > 1e-4, "{what}: the step did not move {}", spec.name);
    }
}

#[test]
fn one_adamw_step_equals_pytorch_on_1_and_2_ranks() {
    let work = temp_dir();
    for name in [
        "llama-gqa",
        "llama-tied-llama3",
        "qwen2-bias",
        "qwen3-qk-norm-yarn",
        "llama-sharded-bf16",
    ] {
        step_matches_pytorch(name, work.path());
    }
}
