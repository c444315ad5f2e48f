//! Fine-tuning a Hugging Face folder end to end, through the real binaries: `shardrun run` on
//! 2 CPU ranks (FULL_SHARD, gradient accumulation, sharded checkpoints), `shardrun export` to
//! a Hugging Face folder, and `transformers.AutoModelForCausalLM.from_pretrained` on it:
//!
//! * the exported model's logits equal the worker's on the trained weights (≤ 1e-5), and the
//!   tokenizer and generation files came along;
//! * a bf16 export split into several files with an index loads in `transformers` and holds
//!   exactly the bf16 rounding of the trained weights;
//! * resuming from the mid-run checkpoint gives the uninterrupted run's losses, bit for bit;
//! * a resume reads nothing from the folder the run started from, which may be gone by then.

mod common;
mod hf_common;

use common::{temp_dir, WORKER};
use hf_common::*;
use shardrun_checkpoint::{Checkpoint, StateKind, UnitLayout, Verify};
use shardrun_models::source::ParamSource;
use shardrun_worker::data::Batch;
use shardrun_worker::model::{self, Params};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use tch::{Kind, Tensor};

const IDS: [[i64; 12]; 2] = [
    [1, 5, 17, 0, 42, 95, 3, 3, 60, 7, 0, 88],
    [2, 90, 44, 13, 13, 8, 71, 0, 29, 50, 64, 11],
];

fn shardrun(args: &[&str]) -> String {
    shardrun_in(Path::new("."), args)
}

/// `shardrun <args>` run from `dir`, for paths relative to it.
fn shardrun_in(dir: &Path, args: &[&str]) -> String {
    let (succeeded, text) = shardrun_ending(dir, args);
    assert!(succeeded, "shardrun {args:?} failed:\n{text}");
    text
}

/// Whether `shardrun <args>` succeeded, and what it printed (stdout, then stderr).
fn shardrun_ending(dir: &Path, args: &[&str]) -> (bool, String) {
    let bin = Path::new(WORKER).with_file_name("shardrun");
    assert!(
        bin.is_file(),
        "{} is not built: run `cargo build --release -p shardrun` first",
        bin.display()
    );
    let out = Command::new(&bin)
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), text)
}

fn spec(work: &Path, name: &str, source: &Path, checkpoint: &str) -> PathBuf {
    let path = work.join(format!("{name}.yaml"));
    std::fs::write(
        &path,
        format!(
            "name: {name}
run_root: {runs}
resources: {{ tasks_per_node: 2 }}
training:
  model: {{ kind: hf, path: {source} }}
  data: {{ kind: synthetic, seq_len: 12 }}
  steps: 6
  total_batch_size: 8
  batch_size_per_device: 2
  optimizer: {{ lr: 3.0e-3, weight_decay: 0.1, grad_clip: 1.0 }}
  fsdp: {{ strategy: FULL_SHARD }}
  checkpoint: {{ {checkpoint}, interval_steps: 3, keep: 2 }}
",
            runs = work.join("runs").display(),
            source = source.display(),
        ),
    )
    .unwrap();
    path
}

/// Rank 0's loss of every step, in order.
fn losses(run: &Path) -> Vec<(u64, f64)> {
    std::fs::read_to_string(run.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        // Step records (evaluation records carry `eval_loss` instead; a resume mark neither).
        .filter(|v| v.get("loss").is_some())
        .map(|v| (v["step"].as_u64().unwrap(), v["loss"].as_f64().unwrap()))
        .collect()
}

/// The parameters a checkpoint holds, by name, as the worker reads them.
fn checkpoint_params(dir: &Path) -> HashMap<String, Tensor> {
    let checkpoint = Checkpoint::open(dir, Verify::Checksums).unwrap();
    let mut params = HashMap::new();
    for (_, slot) in checkpoint.layout().params() {
        let unit =
            UnitLayout::packed(&slot.name, [(slot.name.clone(), slot.shape.clone())], 1).unwrap();
        let mut bytes = vec![0u8; slot.numel as usize * 4];
        checkpoint
            .read_unit_range(StateKind::Param, &unit, 0..slot.numel, &mut bytes)
            .unwrap();
        let values: Vec<f32> = bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        let shape: Vec<i64> = slot.shape.iter().map(|&d| d as i64).collect();
        params.insert(
            slot.name.clone(),
            Tensor::from_slice(&values).view(shape.as_slice()),
        );
    }
    params
}

fn ids_batch() -> Batch {
    let flat: Vec<i64> = IDS.iter().flatten().copied().collect();
    let inputs = Tensor::from_slice(&flat).view([2, 12]);
    Batch::new(inputs.shallow_clone(), inputs)
}

fn logits_of(model: &dyn model::Model, params: &HashMap<String, Tensor>) -> Vec<f32> {
    let logits = tch::no_grad(|| model::output(model, &Params::new(params), &ids_batch()));
    Vec::<f32>::try_from(&logits.reshape([-1])).unwrap()
}

#[test]
fn fine_tune_export_load_in_transformers_and_resume() {
    let work = temp_dir();
    let source = folder("llama-gqa");
    let spec_a = spec(work.path(), "tune", &source, "dir: checkpoints");
    shardrun(&["run", spec_a.to_str().unwrap(), "--nproc", "2"]);
    let run = work.path().join("runs/tune");
    let uninterrupted = losses(&run);
    assert_eq!(
        uninterrupted.iter().map(|(s, _)| *s).collect::<Vec<_>>(),
        (1..=6).collect::<Vec<_>>()
    );

    // The worker's logits on the trained weights (the final checkpoint, read by name).
    let config = hf_model(&source);
    let model = model::build(&config, Kind::Float);
    let trained = checkpoint_params(&run.join("checkpoints/step-6"));
    let ours = logits_of(model.as_ref(), &trained);

    // Export and load in transformers.
    let exported = work.path().join("exported");
    let printed = shardrun(&[
        "export",
        run.to_str().unwrap(),
        "--out",
        exported.to_str().unwrap(),
    ]);
    assert!(printed.contains("from_pretrained"), "{printed}");
    let theirs = transformers_logits(&exported, work.path(), &IDS, &[]);
    let diff = max_abs_difference("exported logits", &ours, &theirs);
    assert!(
        diff <= 1e-5,
        "transformers on the export differs by {diff:e}"
    );
    let initial = {
        let source = ParamSource::for_model(&config, 0).unwrap();
        let params = model::full_parameters(model.as_ref(), &source, tch::Device::Cpu).unwrap();
        logits_of(model.as_ref(), &params)
    };
    assert!(
        max_abs_difference("trained vs initial", &ours, &initial) > 1e-3,
        "the export must hold the trained weights, not the initial ones"
    );
    for file in [
        "tokenizer.json",
        "tokenizer_config.json",
        "chat_template.jinja",
        "generation_config.json",
    ] {
        assert_eq!(
            std::fs::read(exported.join(file)).unwrap(),
            std::fs::read(source.join(file)).unwrap(),
            "{file} copied from the source folder"
        );
    }

    // bf16, split into files of at most 20 KB with an index, as save_pretrained splits;
    // written to a bare folder name, relative to where the command runs.
    let split = work.path().join("exported-bf16");
    shardrun_in(
        work.path(),
        &[
            "export",
            run.to_str().unwrap(),
            "--out",
            "exported-bf16",
            "--dtype",
            "bf16",
            "--max-shard-size",
            "20KB",
        ],
    );
    let index: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(split.join("model.safetensors.index.json")).unwrap(),
    )
    .unwrap();
    let files: std::collections::BTreeSet<&str> = index["weight_map"]
        .as_object()
        .unwrap()
        .values()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert!(files.len() >= 3, "split into several files: {files:?}");
    let rounded: HashMap<String, Tensor> = trained
        .iter()
        .map(|(k, v)| (k.clone(), v.to_kind(Kind::BFloat16).to_kind(Kind::Float)))
        .collect();
    let exported_bf16 = ParamSource::pretrained(&split, &config).unwrap();
    let read_back =
        model::full_parameters(model.as_ref(), &exported_bf16, tch::Device::Cpu).unwrap();
    for (name, value) in &rounded {
        let a = Vec::<f32>::try_from(&value.reshape([-1])).unwrap();
        let b = Vec::<f32>::try_from(&read_back[name].detach().reshape([-1])).unwrap();
        assert_eq!(
            max_abs_difference(name, &a, &b),
            0.0,
            "{name}: bf16 rounding"
        );
    }
    let theirs = transformers_logits(&split, work.path(), &IDS, &[]);
    // A full checkpoint keeps its tensors as they are: the folder's options are refused.
    let (succeeded, said) = shardrun_ending(
        work.path(),
        &[
            "export",
            run.to_str().unwrap(),
            "--format",
            "full",
            "--dtype",
            "bf16",
        ],
    );
    assert!(
        !succeeded && said.contains("--dtype and --max-shard-size shape a Hugging Face folder"),
        "{said}"
    );
    let ours_bf16 = logits_of(model.as_ref(), &rounded);
    let diff = max_abs_difference("bf16 export logits", &ours_bf16, &theirs);
    assert!(
        diff <= 1e-4,
        "transformers on the bf16 export differs by {diff:e}"
    );

    // Resume from step 3 alone: steps 4-6 repeat the uninterrupted run exactly.
    let resume_dir = work.path().join("resume-checkpoints");
    std::fs::create_dir_all(&resume_dir).unwrap();
    let status = Command::new("cp")
        .arg("-a")
        .arg(run.join("checkpoints/step-3"))
        .arg(&resume_dir)
        .status()
        .unwrap();
    assert!(status.success());
    let spec_b = spec(
        work.path(),
        "resumed",
        &source,
        &format!("dir: {}, format: full", resume_dir.display()),
    );
    let printed = shardrun(&["run", spec_b.to_str().unwrap(), "--nproc", "2"]);
    let resumed = losses(&work.path().join("runs/resumed"));
    assert_eq!(
        resumed.iter().map(|(s, _)| *s).collect::<Vec<_>>(),
        vec![4, 5, 6],
        "{printed}"
    );
    for ((step, a), (_, b)) in resumed.iter().zip(&uninterrupted[3..]) {
        assert_eq!(a, b, "step {step}: resumed loss {a} vs uninterrupted {b}");
    }
    // The resumed run saved full checkpoints: a state dict with transformers' own names that
    // `load_state_dict(strict=True)` takes, holding the same final weights.
    let full = resume_dir.join("step-6/model.safetensors");
    let theirs = transformers_logits(
        &source,
        work.path(),
        &IDS,
        &["--state-dict", full.to_str().unwrap()],
    );
    let diff = max_abs_difference("full checkpoint logits", &ours, &theirs);
    assert!(
        diff <= 1e-5,
        "the full checkpoint in transformers differs by {diff:e}"
    );
}

/// A run resumes from its own checkpoint without reading the folder it started from. With
/// the folder's weights deleted after the first three steps, the resumed run trains steps 4-6
/// exactly as the run whose folder is whole (bit for bit); starting it over then needs the
/// weights again, and is refused before anything is deleted.
#[test]
fn a_resume_reads_no_weights_from_the_folder_it_started_from() {
    let work = temp_dir();
    let whole = folder("llama-gqa");
    let copy = work.path().join("llama-copy");
    let status = Command::new("cp")
        .arg("-a")
        .arg(&whole)
        .arg(&copy)
        .status()
        .unwrap();
    assert!(status.success());
    let spec_whole = spec(work.path(), "whole", &whole, "dir: checkpoints");
    let spec_gone = spec(work.path(), "gone", &copy, "dir: checkpoints");
    for spec in [&spec_whole, &spec_gone] {
        let spec = spec.to_str().unwrap();
        shardrun(&["run", spec, "--nproc", "2", "--set", "training.steps=3"]);
    }
    std::fs::remove_file(copy.join("model.safetensors")).unwrap();

    // Asked for 6 steps now: both runs resume from step 3.
    shardrun(&["run", spec_whole.to_str().unwrap(), "--nproc", "2"]);
    let printed = shardrun(&["run", spec_gone.to_str().unwrap(), "--nproc", "2"]);
    assert!(
        printed.contains("has no model.safetensors")
            && printed.contains("the run resumes from its own checkpoint"),
        "the missing weights are a warning: {printed}"
    );
    let (with_weights, without) = (
        losses(&work.path().join("runs/whole")),
        losses(&work.path().join("runs/gone")),
    );
    assert_eq!(
        without.iter().map(|(s, _)| *s).collect::<Vec<_>>(),
        (1..=6).collect::<Vec<_>>()
    );
    assert_eq!(with_weights, without, "the same steps, the same losses");
    // Neither resumed run read its folder's weights: each made its shards for the checkpoint.
    for name in ["whole", "gone"] {
        let log =
            std::fs::read_to_string(work.path().join("runs").join(name).join("train.log")).unwrap();
        let (first, resumed) = log.split_at(log.find("resuming ").expect("a resume line"));
        assert!(
            first.contains("loaded from") && !resumed.contains("loaded from"),
            "{name}: the first part loads the folder, the resume does not:\n{log}"
        );
        assert!(
            resumed.contains("made ready for checkpoint"),
            "{name}: {log}"
        );
    }

    let (succeeded, said) = shardrun_ending(
        Path::new("."),
        &[
            "run",
            spec_gone.to_str().unwrap(),
            "--nproc",
            "2",
            "--force",
        ],
    );
    assert!(
        !succeeded && said.contains("has no model.safetensors"),
        "starting over needs the weights: {said}"
    );
    assert!(
        work.path().join("runs/gone/checkpoints/step-6").is_dir(),
        "the refused start-over deleted nothing"
    );
}

/// `count` prompt/completion records of the fixture tokenizer's words (`t3`..`t95`: no
/// special token), of varied lengths, drawn from a fixed generator.
fn prompt_completion_records(count: usize, seed: u64) -> String {
    let mut state = seed;
    let mut next = |below: u64| {
        state = state
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (state >> 33) % below
    };
    let mut lines = String::new();
    for _ in 0..count {
        let (prompt_len, completion_len) = (1 + next(6), 1 + next(7));
        let mut words = |n: u64| {
            (0..n)
                .map(|_| format!("t{}", 3 + next(93)))
                .collect::<Vec<_>>()
                .join(" ")
        };
        let record = serde_json::json!({
            "prompt": words(prompt_len) + " ",
            "completion": words(completion_len),
        });
        lines.push_str(&format!("{record}\n"));
    }
    lines
}

/// The validation loss a run reports is the loss `transformers` computes on the exported
/// model over the held-out records, each alone with the prompt out of the loss (TRL's SFT):
/// the packing, the document mask, the rank split, the padding rows and the token-weighted
/// mean across batches and ranks must all add up to it.
#[test]
fn the_validation_loss_is_transformers_loss_on_the_held_out_records() {
    let work = temp_dir();
    let source = folder("llama-gqa");
    std::fs::write(
        work.path().join("train.jsonl"),
        prompt_completion_records(40, 1),
    )
    .unwrap();
    // 21 records: several sequences, the last global batch of them part padding.
    let validation = work.path().join("val.jsonl");
    std::fs::write(&validation, prompt_completion_records(21, 2)).unwrap();
    let spec = work.path().join("evaluated.yaml");
    std::fs::write(
        &spec,
        format!(
            "name: evaluated
run_root: runs
resources: {{ tasks_per_node: 2 }}
training:
  model: {{ kind: hf, path: {source} }}
  data:
    kind: jsonl
    files: [train.jsonl]
    prompt_field: prompt
    completion_field: completion
    seq_len: 24
    packing: whole_documents
    validation: {{ files: [val.jsonl] }}
  steps: 4
  total_batch_size: 8
  batch_size_per_device: 2
  optimizer: {{ lr: 3.0e-3 }}
  checkpoint: {{ dir: checkpoints, interval_steps: 4 }}
",
            source = source.display(),
        ),
    )
    .unwrap();
    shardrun_in(work.path(), &["run", "evaluated.yaml", "--nproc", "2"]);
    let run = work.path().join("runs/evaluated");
    let eval: serde_json::Value = std::fs::read_to_string(run.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .find(|v| v.get("eval_loss").is_some())
        .expect("an evaluation after the last step");
    assert_eq!(eval["step"], 4, "{eval}");

    let exported = work.path().join("exported");
    shardrun(&[
        "export",
        run.to_str().unwrap(),
        "--out",
        exported.to_str().unwrap(),
    ]);
    let theirs: serde_json::Value = serde_json::from_str(&run_script(&[
        "eval-loss",
        "--model",
        exported.to_str().unwrap(),
        "--records",
        validation.to_str().unwrap(),
    ]))
    .unwrap();
    assert_eq!(eval["eval_tokens"], theirs["targets"], "{eval} vs {theirs}");
    let (ours, theirs) = (
        eval["eval_loss"].as_f64().unwrap(),
        theirs["loss"].as_f64().unwrap(),
    );
    let diff = relative("validation loss", ours, theirs);
    assert!(
        diff <= 1e-5,
        "validation loss {ours} vs transformers' {theirs} ({diff:e} apart)"
    );
}

#[test]
fn the_local_llama_example_plans_on_the_folder_its_comment_makes() {
    let work = temp_dir();
    let example = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples/llama-local.yaml");
    let spec = work.path().join("llama-local.yaml");
    std::fs::copy(&example, &spec).unwrap();
    // The example's script, with a small tokenizer trained on a few files to stay quick.
    let models = work.path().join("models/code-llama");
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples/make_code_llama.py");
    let made = Command::new(python())
        .arg(&script)
        .arg(&models)
        .args([
            "--files",
            "/usr/lib/python3*/json/*.py",
            "--vocab-size",
            "512",
        ])
        .output()
        .expect("the venv's python runs");
    assert!(
        made.status.success(),
        "{}",
        String::from_utf8_lossy(&made.stderr)
    );
    let plan = shardrun(&["plan", spec.to_str().unwrap()]);
    assert!(
        plan.contains("llama from") && plan.contains("(2 key/value)"),
        "{plan}"
    );
    assert!(
        plan.contains(&models.join("tokenizer.json").display().to_string())
            || plan.contains(&models.display().to_string()),
        "the tokenizer comes from the model folder: {plan}"
    );
}
