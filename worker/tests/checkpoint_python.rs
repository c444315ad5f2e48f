//! The full checkpoint in PyTorch: `tests/python/check_full_checkpoint.py` loads the worker's
//! `model.safetensors` into the FSDP2-example transformer with `load_state_dict(strict=True)`
//! and reproduces the worker's loss on the next batch (≤ 1e-5).

mod common;
mod hf_common;

use common::*;
use hf_common::python;
use shardrun_protocol::config::{CheckpointFormat, ShardingStrategy};
use shardrun_worker::data::TrainingData;
use std::path::PathBuf;
use std::process::Command;

#[test]
fn pytorch_reproduces_the_worker_loss_from_the_full_checkpoint() {
    let tmp = temp_dir();
    let ckpt = tmp.path().join("checkpoints");
    let mut config = config(tiny_transformer(), ShardingStrategy::FullShard, 2);
    config.steps = 11;
    config.checkpoint.dir = Some(ckpt.clone());
    config.checkpoint.interval_steps = Some(10);
    config.checkpoint.keep = 2;
    config.checkpoint.format = CheckpointFormat::Full;
    let run = run_sharded(tmp.path(), "run", &config);

    // Step 11's loss is computed with the step-10 parameters on global samples 120..132.
    let global_batch = config.batch.total_batch_size;
    let batch = TrainingData::new(&config)
        .unwrap()
        .samples(10 * global_batch, global_batch)
        .unwrap();
    let rows = |t: &tch::Tensor| -> Vec<Vec<i64>> { Vec::<Vec<i64>>::try_from(t).unwrap() };
    let batch_path = tmp.path().join("batch.json");
    let json =
        serde_json::json!({ "inputs": rows(&batch.inputs), "targets": rows(&batch.targets) });
    std::fs::write(&batch_path, json.to_string()).unwrap();

    let script =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/python/check_full_checkpoint.py");
    let out = Command::new(python())
        .arg(&script)
        .arg("--checkpoint")
        .arg(ckpt.join("step-10"))
        .arg("--config")
        .arg(tmp.path().join("run.json"))
        .arg("--batch")
        .arg(&batch_path)
        .arg("--expected-loss")
        .arg(run.losses[10].to_string())
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "cannot run {}: {e}; run scripts/setup.sh or set SHARDRUN_PYTHON",
                python().display()
            )
        });
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    eprintln!("{text}");
    assert!(out.status.success(), "{text}");
    assert!(text.contains("pytorch loss"), "{text}");
}
