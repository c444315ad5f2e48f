//! `shardrun export` as people run it: on a run directory, on a damaged newest checkpoint,
//! on a path that holds none; Hugging Face folders of Llamas trained from scratch and
//! fine-tuned, with the tokenizer, chat template and special token ids the run trained with,
//! as `transformers` reads them.

mod common;

use shardrun_checkpoint::tensor_file::TensorFile;
use shardrun_checkpoint::{
    commit, write_rank_report, CommitKind, CommitRequest, DataPosition, Layout, SaveTarget,
    SchedulerState, ShardWriter, StateDtypes, TrainerState, UnitLayout,
};
use shardrun_models::hf::config::config_json;
use shardrun_models::hf::{save_folder, HfWeights, SaveOptions, StoredDtype};
use shardrun_protocol::config::{
    CheckpointFormat, DType, LlamaModel, ModelConfig, ShardingStrategy,
};
use shardrun_protocol::TrainConfig;
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
    save_values(root, step, world, layout, |_, value| value);
}

/// [`save_layout`], element `i` of unit `u` being `value(u, step + i / 1000)`.
fn save_values(
    root: &Path,
    step: u64,
    world: u64,
    layout: Layout,
    value: impl Fn(usize, f32) -> f32,
) {
    let target = SaveTarget::new(root, step, world);
    target.prepare().unwrap();
    for rank in 0..world {
        let mut writer = ShardWriter::create(&target, &layout, rank).unwrap();
        for (u, unit) in layout.units.iter().enumerate() {
            let shard: Vec<u8> = unit
                .shard_range(rank)
                .flat_map(|i| {
                    if i < unit.numel {
                        value(u, step as f32 + i as f32 / 1000.0)
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
            diverged_at: None,
        },
        config_hash: "feedfacefeedface".into(),
        config: None,
        kind: CommitKind::Checkpoint { keep: 5 },
    };
    commit(&target, &request).unwrap();
}

/// `shardrun export args...`: whether it succeeded, and what it printed.
fn export(args: &[&Path]) -> (bool, String) {
    let mut all = vec!["export"];
    all.extend(args.iter().map(|p| p.to_str().expect("a UTF-8 path")));
    let out = common::shardrun(Path::new("."), &all);
    (out.status.success(), common::text(&out))
}

/// `shardrun export <run> --out <out>`, which must succeed: what it printed.
fn export_to(run: &Path, out: &Path) -> String {
    let (ok, text) = export(&[run, Path::new("--out"), out]);
    assert!(ok, "{text}");
    text
}

#[test]
fn exports_the_newest_checkpoint_of_a_run_directory() {
    let run = tempfile::tempdir().unwrap();
    save(&run.path().join("checkpoints"), 10, 2);
    save(&run.path().join("checkpoints"), 20, 2);
    let (ok, text) = export(&[run.path()]);
    assert!(ok, "{text}");
    assert!(
        text.contains("Exported step 20 (2 ranks, FULL_SHARD,"),
        "{text}"
    );
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
    // A Hugging Face folder's options are not offered for a run that has no such folder.
    let (ok, text) = export(&[run.path(), Path::new("--dtype"), Path::new("bf16")]);
    assert!(!ok);
    assert!(
        text.contains("drop them (a Hugging Face folder is written for Llama-family runs only)")
            && !text.contains("export with --format hf"),
        "{text}"
    );
    // A Hugging Face folder is written from the run's model description, which this run
    // directory lacks: said so, not blamed on the model.
    let (ok, text) = export(&[run.path(), Path::new("--format"), Path::new("hf")]);
    assert!(!ok);
    assert!(
        text.contains("described in its train_config.json, and there is none in")
            && text.contains("use --format full"),
        "{text}"
    );
}

/// An export where one is already is refused, naming it; one written before the checkpoint
/// was saved is said to be of another checkpoint (a run that `--force` replaced keeps its
/// exports, and the new run reaches the same step numbers).
#[test]
fn an_export_already_there_is_kept_and_said_whose_it_is() {
    let run = tempfile::tempdir().unwrap();
    save(&run.path().join("checkpoints"), 20, 2);
    let (ok, text) = export(&[run.path()]);
    assert!(ok, "{text}");
    let exported = run.path().join("checkpoints/export/step-20");
    let model = std::fs::read(exported.join("model.safetensors")).unwrap();
    let (ok, text) = export(&[run.path()]);
    assert!(!ok);
    assert!(
        text.contains(&format!("{} already exists, written ", exported.display()))
            && !text.contains("another checkpoint")
            && text.contains(
                "fix: remove it to export this checkpoint there, or choose another --out"
            ),
        "{text}"
    );
    // The export of an earlier run of this directory: older than the checkpoint.
    let an_hour_ago = std::time::SystemTime::now() - std::time::Duration::from_secs(3600);
    std::fs::File::open(&exported)
        .unwrap()
        .set_modified(an_hour_ago)
        .unwrap();
    let (ok, text) = export(&[run.path()]);
    assert!(!ok);
    assert!(
        text.contains(&format!(
            "UTC, before the checkpoint {} was saved: it is an export of another checkpoint of \
             that step (a run started over with `--force` keeps the models exported from the \
             run it replaced)",
            run.path().join("checkpoints/step-20").display()
        )),
        "{text}"
    );
    assert_eq!(
        std::fs::read(exported.join("model.safetensors")).unwrap(),
        model
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
    let text = export_to(root.path(), &out);
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
    let (ok, text) = export(&[empty.path()]);
    assert!(!ok);
    assert!(
        text.contains("no checkpoints under")
            && text.contains("neither a run directory nor a checkpoint folder"),
        "{text}"
    );
    // A run directory that ended before its first checkpoint says how it ended.
    let run = empty.path().join("run");
    std::fs::create_dir(&run).unwrap();
    let config = train_config(
        empty.path(),
        "{ kind: mlp, input_dim: 4, hidden_dim: 8, output_dim: 4 }",
        "{ kind: synthetic }",
    );
    std::fs::write(
        run.join("train_config.json"),
        serde_json::to_vec(&config).unwrap(),
    )
    .unwrap();
    let (ok, text) = export(&[&run]);
    assert!(!ok);
    assert!(text.contains("has saved no checkpoint yet"), "{text}");
    // Its data did not prepare: the manifest says so, result.json not written.
    let manifest = serde_json::json!({
        "version": 1, "name": "run", "state": "FAILED", "config_hash": "71dff282a63e7b72",
        "created_at": 1796156121, "updated_at": 1796156121, "slurm_job_ids": [],
        "error": "preparing the training data: the training data holds no documents",
        "spec_dir": empty.path(), "run_dir": run,
    });
    std::fs::write(run.join("manifest.json"), manifest.to_string()).unwrap();
    let (ok, text) = export(&[&run]);
    assert!(!ok);
    assert!(
        text.contains(
            "saved no checkpoint to export: it ended FAILED before saving one (preparing the \
             training data: the training data holds no documents)"
        ),
        "{text}"
    );
    std::fs::write(
        run.join("result.json"),
        r#"{"status": "failed", "ended": "failed: preparing the training data: no file matches"}"#,
    )
    .unwrap();
    let (ok, text) = export(&[&run]);
    assert!(!ok);
    assert!(
        text.contains("saved no checkpoint to export: it failed: preparing the training data"),
        "{text}"
    );
    let (ok, text) = export(&[&empty.path().join("missing")]);
    assert!(!ok);
    assert!(text.contains("does not exist"), "{text}");
}

/// The resolved training config of a spec with `model` and `data` (YAML flow maps), as the
/// run in `dir` would write it.
fn train_config(dir: &Path, model: &str, data: &str) -> TrainConfig {
    // The data cache follows `run_root`: in the test's folder, not the crate's.
    let yaml = format!(
        "name: t\nrun_root: {}\ntraining:\n  model: {model}\n  data: {data}\n  steps: 1\n  total_batch_size: 1\n  batch_size_per_device: 1\n",
        dir.join("runs").display()
    );
    let loaded = shardrun::spec::parse(&yaml, &dir.join("job.yaml")).unwrap();
    shardrun::resolve::resolve(&loaded, &Default::default())
        .unwrap()
        .train
}

fn llama(train: &TrainConfig) -> &LlamaModel {
    let ModelConfig::Llama(model) = &train.model else {
        panic!("a llama model")
    };
    model
}

/// The Llama's parameters as (name, shape), in order.
fn tensors(model: &LlamaModel) -> Vec<(String, Vec<u64>)> {
    model
        .architecture
        .describe()
        .params
        .iter()
        .map(|p| (p.name.clone(), p.shape.iter().map(|&d| d as u64).collect()))
        .collect()
}

/// A Hugging Face folder with the Llama of `train` and nothing else (no tokenizer): its
/// config.json as `edit` leaves it and every weight 0.5, stored as `dtype`.
fn weights_folder(
    dir: &Path,
    train: &TrainConfig,
    dtype: StoredDtype,
    edit: impl FnOnce(&mut serde_json::Map<String, serde_json::Value>),
) {
    let model = llama(train);
    let mut config = config_json(&model.architecture, dtype.torch_name());
    edit(config.as_object_mut().unwrap());
    let tensors = tensors(model);
    save_folder(
        dir,
        &config,
        &tensors,
        |name, out| {
            let (_, shape) = tensors.iter().find(|(n, _)| n == name).unwrap();
            out.resize(shape.iter().product::<u64>() as usize, 0.5);
            Ok(())
        },
        &[],
        &SaveOptions {
            dtype,
            max_shard_bytes: u64::MAX,
        },
    )
    .unwrap();
}

/// The Llama of `train` as a checkpoint lays it out on one rank: a unit per parameter.
fn layout_of(train: &TrainConfig) -> Layout {
    let units = tensors(llama(train))
        .into_iter()
        .map(|(name, shape)| UnitLayout::packed(&name, [(name.clone(), shape)], 1).unwrap())
        .collect();
    Layout::new(units).unwrap()
}

/// A run directory in `dir` of `model` trained on `data`, with one checkpoint.
fn run_of(dir: &Path, model: &str, data: &str) -> PathBuf {
    let train = train_config(dir, model, data);
    let run = dir.join("run");
    save_layout(&run.join("checkpoints"), 3, 1, layout_of(&train));
    std::fs::write(
        run.join("train_config.json"),
        serde_json::to_string(&train).unwrap(),
    )
    .unwrap();
    run
}

/// A Hugging Face folder `dir/source` of a small Llama (weights 0.5, stored as `dtype`, its
/// config.json as `edit` leaves it) and a run in `dir` that started from it, with one
/// checkpoint: the Llama's config from scratch, the folder and the run directory.
fn run_from_folder(
    dir: &Path,
    dtype: StoredDtype,
    edit: impl FnOnce(&mut serde_json::Map<String, serde_json::Value>),
) -> (TrainConfig, PathBuf, PathBuf) {
    let source = dir.join("source");
    let synthetic = "{ kind: synthetic, seq_len: 8 }";
    let scratch = train_config(
        dir,
        "{ kind: llama, vocab_size: 16, dim: 8, n_layers: 1, n_heads: 2, ffn_dim: 16 }",
        synthetic,
    );
    weights_folder(&source, &scratch, dtype, edit);
    let run = run_of(
        dir,
        &format!("{{ kind: hf, path: {} }}", source.display()),
        synthetic,
    );
    (scratch, source, run)
}

#[test]
fn an_hf_export_defaults_to_the_dtype_of_the_source_weights() {
    // A bf16 folder whose config.json names no dtype (neither `dtype` nor `torch_dtype`),
    // and a run that started from it.
    let tmp = tempfile::tempdir().unwrap();
    let (_, source, run) = run_from_folder(tmp.path(), StoredDtype::Bf16, |keys| {
        keys.remove("dtype");
        keys.remove("torch_dtype");
    });
    let out = tmp.path().join("export");
    let text = export_to(&run, &out);
    assert_eq!(
        HfWeights::open(&out).unwrap().main_dtype(),
        Some(StoredDtype::Bf16),
        "{text}"
    );
    let written: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("config.json")).unwrap()).unwrap();
    assert_eq!(written["dtype"], "bfloat16");
    // Synthetic tokens, a folder without a tokenizer: the export has none, and says so.
    assert!(
        text.contains(
            "\n  no tokenizer: the run read none (synthetic or pre-tokenized data) and the \
             folder it started from has none: AutoTokenizer cannot load the export"
        ),
        "{text}"
    );

    // The source folder's config.json, changed since the run started from it (a folder
    // reused for another revision), would export the weights as another model: refused.
    let config_path = source.join("config.json");
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&config_path).unwrap()).unwrap();
    config["rms_norm_eps"] = serde_json::json!(0.5);
    std::fs::write(&config_path, config.to_string()).unwrap();
    let (ok, text) = export(&[&run, Path::new("--out"), &tmp.path().join("again")]);
    assert!(!ok, "{text}");
    assert!(
        text.contains("has changed since the run started from it (norm_eps: 1e-6 → 0.5)")
            && text.contains("or export with --format full"),
        "{text}"
    );
    assert!(!tmp.path().join("again").exists());
}

/// The weights of a diverged run (not finite) export as they are, with a warning that says
/// so, how many, and to export a checkpoint from before instead.
#[test]
fn an_export_of_weights_that_are_not_finite_warns_in_either_format() {
    let tmp = tempfile::tempdir().unwrap();
    let (scratch, _, run) = run_from_folder(tmp.path(), StoredDtype::F32, |_| {});
    let text = export_to(&run, &tmp.path().join("finite"));
    assert!(!text.contains("not finite"), "{text}");
    // Step 4: the second unit (of the Llama's parameters in order) is NaN throughout.
    let layout = layout_of(&scratch);
    let second = layout.units[1].params[0].name.clone();
    let numel = layout.units[1].numel;
    save_values(&run.join("checkpoints"), 4, 1, layout, |u, value| {
        if u == 1 {
            f32::NAN
        } else {
            value
        }
    });
    let text = export_to(&run, &tmp.path().join("diverged"));
    assert!(
        text.contains(&format!(
            "warning: {numel} of the {} exported weights are not finite (NaN or inf), in 1 \
             tensor(s) from {second} on: the run diverged before step 4",
            llama(&scratch).architecture.describe().num_params()
        )) && text.contains("fix: export a checkpoint from before it diverged"),
        "{text}"
    );
    // A full checkpoint of them says so too.
    let (ok, text) = export(&[
        &run,
        Path::new("--format"),
        Path::new("full"),
        Path::new("--out"),
        &tmp.path().join("full"),
    ]);
    assert!(ok, "{text}");
    assert!(
        text.contains(&format!(
            "warning: {numel} of the {} exported weights are not finite (NaN or inf), in its \
             parameters: the run diverged before step 4",
            llama(&scratch).architecture.describe().num_params()
        )),
        "{text}"
    );
}

/// `tests/python/hf_token_ids.py args...` with the project's venv python (`scripts/setup.sh`
/// makes it, with torch and transformers, under `SHARDRUN_CACHE` as scripts/env.sh places
/// it), or `SHARDRUN_PYTHON`; its stdout.
fn hf_token_ids(args: &[&Path]) -> String {
    let python = std::env::var_os("SHARDRUN_PYTHON").map_or_else(
        || {
            let cache = std::env::var_os("SHARDRUN_CACHE").map_or_else(
                || {
                    PathBuf::from(std::env::var_os("HOME").expect("HOME is set"))
                        .join(".cache/shardrun")
                },
                PathBuf::from,
            );
            cache.join("venv/bin/python")
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

/// What `AutoTokenizer.from_pretrained(folder)` makes of `text`: its ids, bos and eos ids
/// and chat template.
fn auto_tokenizer(folder: &Path, text: &str) -> serde_json::Value {
    serde_json::from_str(&hf_token_ids(&[
        Path::new("encode"),
        folder,
        Path::new(text),
    ]))
    .unwrap()
}

/// A run of a Llama from scratch on text read with `tokenizer` (the spec's YAML for it), with
/// one checkpoint: its run directory.
fn scratch_run(dir: &Path, vocab_size: u64, tokenizer: &str) -> PathBuf {
    std::fs::write(dir.join("data.txt"), "a b c d\nd c b a\n").unwrap();
    run_of(
        dir,
        &format!("{{ kind: llama, vocab_size: {vocab_size}, dim: 8, n_layers: 1, n_heads: 2, ffn_dim: 16 }}"),
        &format!("{{ kind: text, files: [data.txt], split: line, seq_len: 4, tokenizer: {tokenizer} }}"),
    )
}

/// A run of a Llama from scratch on text read with a Hugging Face tokenizer made in
/// `dir/tokenizer` (`<s>` = 5 added by its post-processor, `</s>` = 6), which the spec names
/// by its folder or by `file` in it: the tokenizer's folder and the run directory.
fn hf_scratch_run(dir: &Path, file: Option<&str>) -> (PathBuf, PathBuf) {
    let tokenizer = dir.join("tokenizer");
    hf_token_ids(&[Path::new("tokenizer"), &tokenizer]);
    let named = file.map_or_else(|| tokenizer.clone(), |file| tokenizer.join(file));
    let run = scratch_run(dir, 16, &format!("{{ path: {} }}", named.display()));
    (tokenizer, run)
}

#[test]
fn an_hf_export_of_a_model_from_scratch_carries_its_tokenizer_and_token_ids() {
    let tmp = tempfile::tempdir().unwrap();
    let (tokenizer, run) = hf_scratch_run(tmp.path(), None);
    let out = tmp.path().join("hf");
    let text = export_to(&run, &out);
    assert!(
        text.contains(
            "token ids of the run's tokenizer in config.json and generation_config.json: \
             bos 5 (`<s>`), eos 6 (`</s>`)"
        ) && text.contains("  config.json: written from the run's architecture, dtype float32"),
        "{text}"
    );
    // The tokenizer the run read its text with, as `transformers` loads it from either folder.
    let exported = auto_tokenizer(&out, "a b c d d c");
    assert_eq!(exported["ids"], serde_json::json!([5, 1, 2, 3, 4, 4, 3]));
    assert_eq!(exported, auto_tokenizer(&tokenizer, "a b c d d c"));
    let read: serde_json::Value =
        serde_json::from_str(&hf_token_ids(&[Path::new("read"), &out, &out])).unwrap();
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
}

/// A tokenizer read from a Hugging Face cache (`snapshots/<revision>/` holds links into
/// `blobs/`) is exported with all its files, as from a plain folder.
#[test]
fn an_hf_export_of_a_tokenizer_from_a_hub_cache_snapshot_carries_every_file() {
    let tmp = tempfile::tempdir().unwrap();
    let plain = tmp.path().join("tokenizer");
    hf_token_ids(&[Path::new("tokenizer"), &plain]);
    let cache = tmp.path().join("hub/models--org--tokenizer");
    let snapshot = cache.join("snapshots/0123abcd");
    std::fs::create_dir_all(cache.join("blobs")).unwrap();
    std::fs::create_dir_all(&snapshot).unwrap();
    let mut names = Vec::new();
    for entry in std::fs::read_dir(&plain).unwrap() {
        let entry = entry.unwrap();
        let name = entry.file_name().into_string().unwrap();
        let blob = format!("blob-{}", names.len());
        std::fs::copy(entry.path(), cache.join("blobs").join(&blob)).unwrap();
        std::os::unix::fs::symlink(format!("../../blobs/{blob}"), snapshot.join(&name)).unwrap();
        names.push(name);
    }
    assert!(names.len() > 1, "{names:?}");
    let run = scratch_run(
        tmp.path(),
        16,
        &format!("{{ path: {} }}", snapshot.display()),
    );
    let out = tmp.path().join("hf");
    export_to(&run, &out);
    for name in &names {
        assert_eq!(
            std::fs::read(out.join(name)).ok(),
            Some(std::fs::read(plain.join(name)).unwrap()),
            "{name} exported as it is in the cache"
        );
    }
    assert_eq!(
        auto_tokenizer(&out, "a b c d d c"),
        auto_tokenizer(&plain, "a b c d d c")
    );
}

#[test]
fn an_hf_export_refuses_tokenizer_files_changed_since_the_run_read_its_data() {
    let tmp = tempfile::tempdir().unwrap();
    let (tokenizer, run) = hf_scratch_run(tmp.path(), None);
    // What the job's controller records once the data is prepared.
    let config: TrainConfig =
        serde_json::from_slice(&std::fs::read(run.join("train_config.json")).unwrap()).unwrap();
    let shardrun_protocol::config::DataConfig::Dataset(data) = &config.data else {
        panic!("a dataset")
    };
    let dataset = shardrun_data::Dataset::open(data, 0, Some(16), 1, &shardrun_data::Quiet)
        .expect("the data prepares");
    std::fs::write(
        run.join("data.json"),
        serde_json::to_vec(dataset.identity()).unwrap(),
    )
    .unwrap();
    export_to(&run, &tmp.path().join("hf"));

    // The tokenizer folder, since rewritten (another revision saved over it): its files would
    // read text into other ids than those the model learned.
    let json_path = tokenizer.join("tokenizer.json");
    let mut json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&json_path).unwrap()).unwrap();
    json["model"]["vocab"]["a"] = serde_json::json!(4);
    json["model"]["vocab"]["d"] = serde_json::json!(1);
    std::fs::write(&json_path, serde_json::to_vec_pretty(&json).unwrap()).unwrap();
    let again = tmp.path().join("again");
    let (ok, text) = export(&[&run, Path::new("--out"), &again]);
    assert!(!ok, "{text}");
    assert!(
        text.contains(&format!(
            "the tokenizer files of {} have changed since the run tokenized its data with them \
             (tokenizer file tokenizer.json: changed; hashes recorded in {})",
            tokenizer.display(),
            run.join("data.json").display()
        )) && text.contains("put the files back as they were"),
        "{text}"
    );
    assert!(!again.exists());
}

#[test]
fn an_hf_export_whose_tokenizer_is_gone_warns_once_of_what_it_lacks() {
    for file in [None, Some("tokenizer.json")] {
        let tmp = tempfile::tempdir().unwrap();
        let (tokenizer, run) = hf_scratch_run(tmp.path(), file);
        std::fs::remove_dir_all(&tokenizer).unwrap();
        let out = tmp.path().join("hf");
        let text = export_to(&run, &out);
        let warnings: Vec<&str> = text.lines().filter(|l| l.starts_with("warning:")).collect();
        assert_eq!(warnings.len(), 1, "{text}");
        assert!(
            warnings[0].starts_with("warning: cannot read the run's tokenizer (")
                && warnings[0].ends_with(
                    "the export has no tokenizer files and names no bos or eos token; copy the \
                     tokenizer files in before loading it with AutoTokenizer, and set \
                     `bos_token_id` and `eos_token_id` in its config.json"
                ),
            "{text}"
        );
        assert!(!out.join("tokenizer.json").exists());
    }
}

#[test]
fn an_hf_export_of_a_model_on_bytes_reads_text_as_bytes() {
    // UTF-8 bytes: no BOS (not LlamaConfig's default of 1), 256 ends a document.
    let tmp = tempfile::tempdir().unwrap();
    let run = scratch_run(tmp.path(), 260, "{ kind: bytes }");
    let out = tmp.path().join("hf");
    export_to(&run, &out);
    let generation: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("generation_config.json")).unwrap())
            .unwrap();
    assert_eq!(
        generation,
        serde_json::json!({"_from_model_config": true, "eos_token_id": 256, "use_cache": true})
    );
    let read: serde_json::Value =
        serde_json::from_str(&hf_token_ids(&[Path::new("read"), &out, &out])).unwrap();
    assert_eq!(read["config"], serde_json::json!([null, 256]), "{read}");
    assert_eq!(read["generation"], serde_json::json!([null, 256]), "{read}");
    assert_eq!(read["tokenizer"], read["config"], "{read}");
    // Every byte its own id, the text of the end-of-document token included.
    let sample = "héllo\twörld 🤗\n<eos>";
    let exported = auto_tokenizer(&out, sample);
    assert_eq!(
        exported["ids"],
        serde_json::json!(sample.bytes().collect::<Vec<u8>>())
    );
}

/// A chat template that shows which one rendered.
fn write_template(path: &Path, name: &str) -> String {
    let text = format!("{{% for m in messages %}}{name}: {{{{ m.content }}}} {{% endfor %}}");
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, &text).unwrap();
    text
}

/// A chat run's makings in `dir`: the tokenizer folder `tokenizer/` with a default template
/// and one for tool use, the spec's template `chat.jinja`, the records `chat.jsonl`; the
/// spec's `data` keys for them (without `chat_template` and `tokenizer`) and the weights of a
/// model that fits the tokenizer.
struct ChatRun {
    tokenizer: PathBuf,
    folder_default: String,
    folder_tools: String,
    spec_template: String,
    data: String,
    model: TrainConfig,
}

fn chat_run(dir: &Path) -> ChatRun {
    let tokenizer = dir.join("tokenizer");
    hf_token_ids(&[Path::new("tokenizer"), &tokenizer]);
    let records = dir.join("chat.jsonl");
    std::fs::write(
        &records,
        r#"{"messages": [{"role": "user", "content": "a b"}, {"role": "assistant", "content": "c d"}]}"#,
    )
    .unwrap();
    ChatRun {
        folder_default: write_template(&tokenizer.join("chat_template.jinja"), "default"),
        folder_tools: write_template(
            &tokenizer.join("additional_chat_templates/tool_use.jinja"),
            "tools",
        ),
        spec_template: write_template(&dir.join("chat.jinja"), "spec"),
        data: format!("kind: chat, files: [{}], seq_len: 4", records.display()),
        model: train_config(
            dir,
            "{ kind: llama, vocab_size: 16, dim: 8, n_layers: 1, n_heads: 2, ffn_dim: 16 }",
            "{ kind: synthetic, seq_len: 4 }",
        ),
        tokenizer,
    }
}

#[test]
fn an_hf_export_chats_with_the_tokenizer_and_template_the_run_trained_with() {
    // Fine-tuned from a folder of weights only, on chat records rendered with the spec's
    // template and ended with the spec's eos token: the export carries the tokenizer folder
    // the spec names, the spec's eos and template, and none of the folder's own templates.
    let tmp = tempfile::tempdir().unwrap();
    let chat = chat_run(tmp.path());
    let source = tmp.path().join("weights");
    // Its generation config, derived from these ids, stops at `</s>`.
    weights_folder(&source, &chat.model, StoredDtype::F32, |keys| {
        keys.insert("bos_token_id".into(), 5.into());
        keys.insert("eos_token_id".into(), 6.into());
    });
    let run = run_of(
        tmp.path(),
        &format!("{{ kind: hf, path: {} }}", source.display()),
        &format!(
            "{{ {}, chat_template: {}, tokenizer: {{ path: {}, eos_token: d }} }}",
            chat.data,
            tmp.path().join("chat.jinja").display(),
            chat.tokenizer.display()
        ),
    );
    let out = tmp.path().join("hf");
    let text = export_to(&run, &out);
    assert_eq!(
        std::fs::read(out.join("tokenizer.json")).unwrap(),
        std::fs::read(chat.tokenizer.join("tokenizer.json")).unwrap()
    );
    assert!(!out.join("additional_chat_templates").exists(), "{text}");
    let exported = auto_tokenizer(&out, "a b c d");
    let source_ids = auto_tokenizer(&chat.tokenizer, "a b c d");
    assert_eq!(exported["ids"], source_ids["ids"]);
    assert_eq!(exported["bos"], source_ids["bos"]);
    assert_eq!(exported["eos"], 4, "the spec's eos_token `d`");
    assert_eq!(exported["chat_template"], chat.spec_template.as_str());
    // Generation stops at the end of a turn as trained, and where the source model stopped.
    let read: serde_json::Value =
        serde_json::from_str(&hf_token_ids(&[Path::new("read"), &out, &out])).unwrap();
    assert_eq!(read["generation"], serde_json::json!([5, [6, 4]]), "{read}");
    assert_eq!(read["config"], serde_json::json!([5, 6]), "{read}");
    assert!(
        text.contains("generation_config.json: generation stops at eos_token_id [6, 4], the spec's eos_token `d` (4) among them")
            && text.contains(&format!("  config.json: the one of {}, dtype float32", source.display())),
        "{text}"
    );
    assert!(
        text.contains("its configs with the spec's eos_token)") && !text.contains("bos_token"),
        "the spec gave no bos_token: {text}"
    );
}

#[test]
fn an_hf_export_keeps_every_chat_template_of_the_folder_it_started_from() {
    // Fine-tuned from a model folder with its tokenizer and templates, tool use included.
    let tmp = tempfile::tempdir().unwrap();
    let chat = chat_run(tmp.path());
    let model_folder = tmp.path().join("model");
    weights_folder(&model_folder, &chat.model, StoredDtype::F32, |_| {});
    for name in [
        "tokenizer.json",
        "tokenizer_config.json",
        "chat_template.jinja",
        "additional_chat_templates/tool_use.jinja",
    ] {
        let to = model_folder.join(name);
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        std::fs::copy(chat.tokenizer.join(name), to).unwrap();
    }
    let run = run_of(
        tmp.path(),
        &format!("{{ kind: hf, path: {} }}", model_folder.display()),
        &format!("{{ {} }}", chat.data),
    );
    let out = tmp.path().join("hf");
    export_to(&run, &out);
    let exported = auto_tokenizer(&out, "a b c d");
    assert_eq!(exported, auto_tokenizer(&model_folder, "a b c d"));
    assert_eq!(
        exported["chat_template"],
        serde_json::json!({"default": chat.folder_default, "tool_use": chat.folder_tools})
    );
}
