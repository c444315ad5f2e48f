//! Broken Hugging Face folders are refused with an error that names the tensor (or the
//! `config.json` key) and the file, and nothing keeps running:
//!
//! * `shardrun plan` finds every problem on the login node: a missing, extra, mis-shaped or
//!   int8 tensor, a config that disagrees with the weights, a truncated file, an index naming
//!   a missing file, an unknown `model_type`, an unsupported rope type, a sliding window the
//!   sequences exceed; `shardrun run` fails the same way before starting a rank, leaving no
//!   process behind;
//! * the worker checks the weights again when it opens them (a folder can change after
//!   planning): both ranks of a 2-rank job exit with the error, no rank hangs.

mod common;
mod hf_common;

use common::{config, free_port, temp_dir, WORKER};
use hf_common::*;
use shardrun_protocol::config::{LlamaModel, ModelConfig, ShardingStrategy};
use std::collections::BTreeMap;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn shardrun() -> PathBuf {
    let path = Path::new(WORKER).with_file_name("shardrun");
    assert!(
        path.is_file(),
        "{} is not built: run `cargo build --release -p shardrun` first",
        path.display()
    );
    path
}

/// Broken copies of `llama-gqa` and what each error must name.
fn bad_folders(work: &Path) -> BTreeMap<String, Vec<String>> {
    let out = work.join("bad");
    run_script(&[
        "make-bad",
        "--good",
        folder("llama-gqa").to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ]);
    let text = std::fs::read_to_string(out.join("manifest.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn spec(work: &Path, name: &str, folder: &Path) -> PathBuf {
    let path = work.join(format!("{name}.yaml"));
    std::fs::write(
        &path,
        format!(
            "name: {name}\nrun_root: {}\nresources: {{ tasks_per_node: 2 }}\ntraining:\n  model: {{ kind: hf, path: {} }}\n  data: {{ kind: synthetic, seq_len: 12 }}\n  steps: 1\n  total_batch_size: 2\n  batch_size_per_device: 1\n",
            work.join("runs").display(),
            folder.display()
        ),
    )
    .unwrap();
    path
}

fn assert_names(what: &str, text: &str, expected: &[String]) {
    for needle in expected {
        assert!(
            text.contains(needle.as_str()),
            "{what}: the error does not name {needle:?}:\n{text}"
        );
    }
}

#[test]
fn plan_and_run_refuse_every_bad_folder_naming_tensor_and_file() {
    let work = temp_dir();
    let manifest = bad_folders(work.path());
    assert!(manifest.len() >= 10, "{manifest:?}");
    for (name, expected) in &manifest {
        let spec = spec(work.path(), name, &work.path().join("bad").join(name));
        let out = Command::new(shardrun())
            .arg("plan")
            .arg(&spec)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stderr).into_owned()
            + &String::from_utf8_lossy(&out.stdout);
        assert!(!out.status.success(), "{name}: plan accepted it:\n{text}");
        assert_names(name, &text, expected);
        assert!(
            text.contains("training.model.path") || text.contains("seq_len"),
            "{text}"
        );
    }
    // `run` fails before any rank starts and leaves no process of its group.
    let spec = spec(work.path(), "truncated", &work.path().join("bad/truncated"));
    let mut child = Command::new(shardrun())
        .arg("run")
        .arg(&spec)
        .arg("--nproc")
        .arg("2")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .unwrap();
    let pgid = child.id() as i32;
    let status = child.wait().unwrap();
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    assert!(
        !status.success(),
        "run accepted a truncated folder:\n{stderr}"
    );
    assert_names("run", &stderr, &manifest["truncated"]);
    // SAFETY: signal 0 only asks whether any process of the group is left.
    let alive = unsafe { libc::kill(-pgid, 0) } == 0;
    assert!(!alive, "processes of the failed run are still running");
    assert!(
        !work.path().join("runs/truncated/logs").exists(),
        "a rank started"
    );
}

#[test]
fn every_rank_refuses_weights_that_changed_after_planning() {
    let work = temp_dir();
    let manifest = bad_folders(work.path());
    let good = hf_model(&folder("llama-gqa"));
    for name in [
        "missing-tensor",
        "extra-tensor",
        "misshaped-tensor",
        "truncated",
        "int8-tensor",
        "index-missing-file",
    ] {
        // The plan was made from the good folder; the files are broken by the time ranks start.
        let dir = work.path().join("bad").join(name);
        let ModelConfig::Llama(m) = &good else {
            unreachable!()
        };
        let model = ModelConfig::Llama(LlamaModel {
            architecture: m.architecture.clone(),
            pretrained: Some(dir),
        });
        let mut cfg = config(model, ShardingStrategy::FullShard, 2);
        cfg.data = shardrun_protocol::config::DataConfig::Synthetic { seq_len: 12 };
        let config_path = work.path().join(format!("{name}.json"));
        std::fs::write(&config_path, serde_json::to_string(&cfg).unwrap()).unwrap();
        // Not an ephemeral port, which a connection beside this test could take first.
        let port = free_port();
        let mut ranks: Vec<_> = (0..2)
            .map(|rank| {
                Command::new(WORKER)
                    .arg("--config")
                    .arg(&config_path)
                    .env("RANK", rank.to_string())
                    .env("WORLD_SIZE", "2")
                    .env("LOCAL_RANK", rank.to_string())
                    .env("MASTER_ADDR", "127.0.0.1")
                    .env("MASTER_PORT", port.to_string())
                    .env_remove("SHARDRUN_CONTROLLER")
                    .stdout(Stdio::null())
                    .stderr(Stdio::piped())
                    .spawn()
                    .unwrap()
            })
            .collect();
        let deadline = Instant::now() + Duration::from_secs(120);
        for (rank, child) in ranks.iter_mut().enumerate() {
            let status = loop {
                if let Some(status) = child.try_wait().unwrap() {
                    break status;
                }
                if Instant::now() > deadline {
                    let _ = child.kill();
                    panic!("{name}: rank {rank} still running after 120 s");
                }
                std::thread::sleep(Duration::from_millis(20));
            };
            let mut stderr = String::new();
            std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
            assert!(!status.success(), "{name}: rank {rank} trained:\n{stderr}");
            assert_names(&format!("{name} rank {rank}"), &stderr, &manifest[name]);
        }
    }
}
