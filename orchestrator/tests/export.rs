//! `shardrun export` as people run it: on a run directory, on a damaged newest checkpoint,
//! on a path that holds none; a Llama trained from scratch exported with the special token
//! ids of its tokenizer, as `transformers` reads them.

use shardrun_checkpoint::tensor_file::TensorFile;
use shardrun_checkpoint::{
    commit, write_rank_report, CommitRequest, DataPosition, Layout, SaveTarget, SchedulerState,
    ShardWriter, StateDtypes, TrainerState, UnitLayout,
};
use shardrun_models::hf::config::config_json;
use shardrun_models::hf::{save_folder, HfWeights, SaveOptions, StoredDtype};
use shardrun_protocol::config::{CheckpointFormat, DType, ModelConfig, ShardingStrategy};
use std::path::{Path, PathBuf};
use std::process::Command;

fn layout(shards: u64) -> Layout {
    let unit = |name: &str, params: &[(&str, &[u64])]| {
        UnitLayout::packed(
            name,
            params.iter().map(|(n, s)| (n.to_string(), s.to_vec())),
            shards,
        )
        .unwrap()
    };
    Layout::new(vec![
        unit(
            "layer1",
            &[("layer1.weight", &[16, 8]), ("layer1.bias", &[16])],
        ),
        unit(
            "layer2",
            &[("layer2.weight", &[4, 16]), ("layer2.bias", &[4])],
        ),
    ])
    .unwrap()
}

/// A sharded checkpoint shaped like the MLP of PyTorch's FSDP tutorial on `world` ranks;
/// element `i` of a unit is `step + i / 1000`.
fn save(root: &Path, step: u64, world: u64) {
    save_layout(root, step, world, layout(world));
}

/// A sharded checkpoint of `layout` on `world` ranks; element `i` of a unit is
/// `step + i / 1000`.
fn save_layout(root: &Path, step: u64, world: u64, layout: Layout) {
    let target = SaveTarget::new(root, step, world);
    target.prepare().unwrap();
    for rank in 0..world {
        let mut writer = ShardWriter::create(&target, &layout, rank).unwrap();
        for (u, unit) in layout.units.iter().enumerate() {
            let shard: Vec<u8> = unit
                .shard_range(rank)
                .flat_map(|i| {
                    if i < unit.numel {
                        step as f32 + i as f32 / 1000.0
                    } else {
                        0.0
                    }
                    .to_le_bytes()
                })
                .collect();
            writer.write_unit(u, &shard, &shard, &shard).unwrap();
        }
        let file = writer.finish().unwrap();
        write_rank_report(&target, rank, vec![rank as u8], vec![file]).unwrap();
    }
    let request = CommitRequest {
        format: CheckpointFormat::Sharded,
        strategy: ShardingStrategy::FullShard,
        shard_group_size: world,
        dtypes: StateDtypes::fp32_state(DType::F32),
        layout,
        trainer: TrainerState {
            optimizer_step: step,
            scheduler: SchedulerState { step, last_lr: 0.1 },
            data: DataPosition {
                samples_done: step,
                micro_batches_done: step,
                epoch: None,
                data_fingerprint: None,
            },
            seed: 0,
            loss_scale: None,
        },
        config_hash: "feedfacefeedface".into(),
        keep: 5,
    };
    commit(&target, &request).unwrap();
}

fn shardrun(args: &[&Path]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_shardrun"))
        .arg("export")
        .args(args)
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), text)
}

#[test]
fn exports_the_newest_checkpoint_of_a_run_directory() {
    let run = tempfile::tempdir().unwrap();
    save(&run.path().join("checkpoints"), 10, 2);
    save(&run.path().join("checkpoints"), 20, 2);
    let (ok, text) = shardrun(&[run.path()]);
    assert!(ok, "{text}");
    assert!(text.contains("Exported step 20 (2 ranks"), "{text}");
    // The export folder holds the exported checkpoint only: no `latest` of a series.
    let exported: Vec<String> = std::fs::read_dir(run.path().join("checkpoints/export"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(exported, ["step-20"]);
    let model = run
        .path()
        .join("checkpoints/export/step-20/model.safetensors");
    let file = TensorFile::open(&model).unwrap();
    assert_eq!(file.shape("layer2.bias").unwrap(), [4]);
    let mut first = [0u8; 4];
    file.read_at(file.element_position("layer2.bias", 0).unwrap(), &mut first)
        .unwrap();
    assert_eq!(
        f32::from_le_bytes(first),
        20.0 + 64.0 / 1000.0,
        "layer2.bias follows the 4x16 weight"
    );
}

#[test]
fn a_damaged_newest_checkpoint_is_reported_and_the_previous_one_exported() {
    let root = tempfile::tempdir().unwrap();
    save(root.path(), 10, 3);
    save(root.path(), 20, 3);
    let shard = root.path().join("step-20/rank-2-of-3.safetensors");
    let mut bytes = std::fs::read(&shard).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0xff;
    std::fs::write(&shard, bytes).unwrap();
    let out = root.path().join("full");
    let (ok, text) = shardrun(&[root.path(), Path::new("--out"), &out]);
    assert!(ok, "{text}");
    assert!(
        text.contains("warning: skipping checkpoint") && text.contains("rank-2-of-3.safetensors"),
        "{text}"
    );
    assert!(text.contains("Exported step 10"), "{text}");
    assert!(out.join("step-10/model.safetensors").exists());
}

#[test]
fn a_folder_without_checkpoints_says_what_to_check() {
    let empty = tempfile::tempdir().unwrap();
    let (ok, text) = shardrun(&[empty.path()]);
    assert!(!ok);
    assert!(
        text.contains("no checkpoints under") && text.contains("checkpoint.dir"),
        "{text}"
    );
    let (ok, text) = shardrun(&[&empty.path().join("missing")]);
    assert!(!ok);
    assert!(text.contains("does not exist"), "{text}");
}

#[test]
fn an_hf_export_defaults_to_the_dtype_of_the_source_weights() {
    // A bf16 folder whose config.json names no dtype (neither `dtype` nor `torch_dtype`).
    let tmp = tempfile::tempdir().unwrap();
    let source = tmp.path().join("source");
    let spec = |model: &str| {
        let yaml = format!(
            "name: t\ntraining:\n  model: {model}\n  data: {{ kind: synthetic, seq_len: 8 }}\n  steps: 1\n  total_batch_size: 1\n  batch_size_per_device: 1\n"
        );
        let loaded = shardrun::spec::parse(&yaml, &tmp.path().join("job.yaml")).unwrap();
        shardrun::resolve::resolve(&loaded, &Default::default())
            .unwrap()
            .train
    };
    let scratch =
        spec("{ kind: llama, vocab_size: 16, dim: 8, n_layers: 1, n_heads: 2, ffn_dim: 16 }");
    let ModelConfig::Llama(m) = &scratch.model else {
        panic!()
    };
    let mut config = config_json(&m.architecture, "bfloat16");
    let keys = config.as_object_mut().unwrap();
    keys.remove("dtype");
    keys.remove("torch_dtype");
    let tensors: Vec<(String, Vec<u64>)> = m
        .architecture
        .describe()
        .params
        .iter()
        .map(|p| (p.name.clone(), p.shape.iter().map(|&d| d as u64).collect()))
        .collect();
    save_folder(
        &source,
        &config,
        &tensors,
        |name, out| {
            let (_, shape) = tensors.iter().find(|(n, _)| n == name).unwrap();
            out.resize(shape.iter().product::<u64>() as usize, 0.5);
            Ok(())
        },
        None,
        &SaveOptions {
            dtype: StoredDtype::Bf16,
            max_shard_bytes: u64::MAX,
        },
    )
    .unwrap();

    // A run that started from it, with one checkpoint.
    let train = spec(&format!("{{ kind: hf, path: {} }}", source.display()));
    let run = tmp.path().join("run");
    let units = tensors
        .iter()
        .map(|(name, shape)| UnitLayout::packed(name, [(name.clone(), shape.clone())], 1).unwrap())
        .collect();
    save_layout(&run.join("checkpoints"), 3, 1, Layout::new(units).unwrap());
    std::fs::write(
        run.join("train_config.json"),
        serde_json::to_string(&train).unwrap(),
    )
    .unwrap();

    let out = tmp.path().join("export");
    let (ok, text) = shardrun(&[&run, Path::new("--out"), &out]);
    assert!(ok, "{text}");
    assert_eq!(
        HfWeights::open(&out).unwrap().main_dtype(),
        Some(StoredDtype::Bf16),
        "{text}"
    );
    let written: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("config.json")).unwrap()).unwrap();
    assert_eq!(written["dtype"], "bfloat16");
}

/// `tests/python/hf_token_ids.py args...` with the project's venv python (`scripts/setup.sh`
/// makes it, with torch and transformers), or `SHARDRUN_PYTHON`; its stdout.
fn hf_token_ids(args: &[&Path]) -> String {
    let python = std::env::var_os("SHARDRUN_PYTHON").map_or_else(
        || {
            PathBuf::from(std::env::var_os("HOME").expect("HOME is set"))
                .join(".cache/shardrun/venv/bin/python")
        },
        PathBuf::from,
    );
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/python/hf_token_ids.py");
    let out = Command::new(&python)
        .arg(script)
        .args(args)
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "cannot run {}: {e}. Run scripts/setup.sh (it makes the venv with torch and transformers) or set SHARDRUN_PYTHON",
                python.display()
            )
        });
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "hf_token_ids.py failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// A run of a Llama from scratch on text read with `tokenizer` (the spec's YAML for it), with
/// one checkpoint: its run directory.
fn scratch_run(dir: &Path, vocab_size: u64, tokenizer: &str) -> PathBuf {
    std::fs::write(dir.join("data.txt"), "a b c d\nd c b a\n").unwrap();
    let yaml = format!(
        "name: scratch\ntraining:\n  model: {{ kind: llama, vocab_size: {vocab_size}, dim: 8, n_layers: 1, n_heads: 2, ffn_dim: 16 }}\n  \
         data: {{ kind: text, files: [data.txt], split: line, seq_len: 4, tokenizer: {tokenizer} }}\n  \
         steps: 1\n  total_batch_size: 1\n  batch_size_per_device: 1\n"
    );
    let loaded = shardrun::spec::parse(&yaml, &dir.join("job.yaml")).unwrap();
    let train = shardrun::resolve::resolve(&loaded, &Default::default())
        .unwrap()
        .train;
    let ModelConfig::Llama(model) = &train.model else {
        panic!("a llama model")
    };
    let units = model
        .architecture
        .describe()
        .params
        .iter()
        .map(|p| {
            let shape = p.shape.iter().map(|&d| d as u64).collect();
            UnitLayout::packed(&p.name, [(p.name.clone(), shape)], 1).unwrap()
        })
        .collect();
    let run = dir.join("run");
    save_layout(&run.join("checkpoints"), 3, 1, Layout::new(units).unwrap());
    std::fs::write(
        run.join("train_config.json"),
        serde_json::to_string(&train).unwrap(),
    )
    .unwrap();
    run
}

#[test]
fn an_hf_export_of_a_model_from_scratch_carries_the_token_ids_of_its_tokenizer() {
    // A Hugging Face tokenizer: `<s>` = 5 added by its post-processor, `</s>` = 6.
    let tmp = tempfile::tempdir().unwrap();
    let tokenizer = tmp.path().join("tokenizer");
    hf_token_ids(&[Path::new("tokenizer"), &tokenizer]);
    let run = scratch_run(
        tmp.path(),
        16,
        &format!("{{ path: {} }}", tokenizer.display()),
    );
    let out = tmp.path().join("hf");
    let (ok, text) = shardrun(&[&run, Path::new("--out"), &out]);
    assert!(ok, "{text}");
    assert!(
        text.contains(
            "token ids of the run's tokenizer in config.json and generation_config.json: \
             bos 5 (`<s>`), eos 6 (`</s>`)"
        ),
        "{text}"
    );
    let read: serde_json::Value =
        serde_json::from_str(&hf_token_ids(&[Path::new("read"), &out, &tokenizer])).unwrap();
    assert_eq!(read["tokenizer"], serde_json::json!([5, 6]), "{read}");
    assert_eq!(read["config"], read["tokenizer"], "{read}");
    assert_eq!(
        read["generation"], read["tokenizer"],
        "generate stops at eos: {read}"
    );
    assert_eq!(
        read["generated"].as_array().map(|ids| ids[..2].to_vec()),
        Some(vec![serde_json::json!(1), serde_json::json!(2)]),
        "generate runs from the prompt: {read}"
    );

    // UTF-8 bytes: no BOS (not LlamaConfig's default of 1), 256 ends a document.
    let tmp = tempfile::tempdir().unwrap();
    let run = scratch_run(tmp.path(), 260, "{ kind: bytes }");
    let out = tmp.path().join("hf");
    let (ok, text) = shardrun(&[&run, Path::new("--out"), &out]);
    assert!(ok, "{text}");
    let generation: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("generation_config.json")).unwrap())
            .unwrap();
    assert_eq!(
        generation,
        serde_json::json!({"_from_model_config": true, "eos_token_id": 256, "use_cache": true})
    );
    let read: serde_json::Value =
        serde_json::from_str(&hf_token_ids(&[Path::new("read"), &out])).unwrap();
    assert_eq!(read["config"], serde_json::json!([null, 256]), "{read}");
    assert_eq!(read["generation"], serde_json::json!([null, 256]), "{read}");
}
