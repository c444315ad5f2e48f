//! The worker binary fails with a clear message, and a non-zero status, on bad input.

mod common;

use common::*;
use shardrun_protocol::config::{ModelConfig, ShardingStrategy};
use std::process::Command;

fn run_worker(args: &[&str]) -> (i32, String) {
    let out = Command::new(WORKER)
        .args(args)
        .env_remove("SHARDRUN_CONFIG")
        .env_remove("MASTER_ADDR")
        .env_remove("RANK")
        .env_remove("WORLD_SIZE")
        .output()
        .expect("run worker");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn a_missing_config_file_is_named() {
    let (code, err) = run_worker(&["--config", "/nonexistent/train_config.json"]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("/nonexistent/train_config.json") && err.contains("--config"),
        "{err}"
    );
}

#[test]
fn impossible_model_and_batch_settings_are_explained() {
    let dir = temp_dir();
    let mut cfg = config(
        ModelConfig::Transformer {
            vocab_size: 37,
            dim: 10,
            n_layers: 1,
            n_heads: 3,
            max_seq_len: 7,
        },
        ShardingStrategy::FullShard,
        1,
    );
    let path = dir.path().join("heads.json");
    std::fs::write(&path, serde_json::to_string(&cfg).expect("json")).expect("write");
    let (code, err) = run_worker(&["--config", path.to_str().expect("utf-8 path")]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("dim 10 is not divisible by n_heads 3"),
        "{err}"
    );

    cfg.model = tiny_transformer();
    cfg.batch.total_batch_size = 13;
    std::fs::write(&path, serde_json::to_string(&cfg).expect("json")).expect("write");
    let (code, err) = run_worker(&[
        "--config",
        path.to_str().expect("utf-8 path"),
        "--reference",
    ]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("total_batch_size 13"), "{err}");

    std::fs::write(&path, "{\"name\": 3}").expect("write");
    let (code, err) = run_worker(&["--config", path.to_str().expect("utf-8 path")]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("not a valid resolved training config"),
        "{err}"
    );
}

/// NCCL is found as a launcher starts the worker (the controller's children and srun tasks
/// get no LD_LIBRARY_PATH from shardrun): with an empty environment, `--check-gpu` loads the
/// `libnccl.so.2` pip installed beside the libtorch the worker runs with. No GPU is needed to
/// load it; without one, the device line says why and the status is non-zero.
#[test]
fn nccl_loads_with_nothing_in_the_environment() {
    let out = Command::new(WORKER)
        .arg("--check-gpu")
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .output()
        .expect("run worker");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let nccl = text
        .lines()
        .find_map(|l| l.strip_prefix("nccl: "))
        .unwrap_or_else(|| panic!("no nccl line:\n{text}"));
    assert!(
        nccl.starts_with("NCCL 2.") && nccl.contains("/nvidia/nccl/lib/libnccl.so.2"),
        "{nccl}\n(pip's NCCL comes with torch's CUDA wheel: scripts/setup.sh installs it)"
    );
    let torch = text
        .lines()
        .find_map(|l| l.strip_prefix("libtorch: "))
        .expect("libtorch line");
    let site_packages = std::path::Path::new(torch)
        .ancestors()
        .nth(2)
        .expect("torch/lib under site-packages");
    assert!(
        nccl.contains(&site_packages.display().to_string()),
        "NCCL {nccl} is not the one beside libtorch {torch}"
    );
    if tch::Cuda::is_available() {
        assert!(out.status.success(), "{text}");
        assert!(
            text.contains("\nnvidia driver: ") && text.contains(" at most)"),
            "{text}"
        );
    } else {
        assert_eq!(out.status.code(), Some(1), "{text}");
        assert!(text.contains("device: node "), "{text}");
        let driver_loaded = std::path::Path::new("/proc/driver/nvidia/version").exists();
        if !driver_loaded {
            assert!(
                text.contains("\nnvidia driver: none loaded on this node\n"),
                "{text}"
            );
        }
    }
}

/// On a cluster node `module load cuda` or `module load nccl` puts other `libcudart.so` and
/// `libnccl.so` files on `LD_LIBRARY_PATH`. The worker still uses libtorch's own runtime and
/// NCCL (a second CUDA runtime in the process would not share libtorch's current device).
/// The decoys here are a library that is neither, so loading one fails loudly.
#[test]
fn libtorchs_cuda_runtime_and_nccl_win_over_ld_library_path() {
    // A dangling link would be skipped by the loader and prove nothing: a real library.
    let libz = [
        "/lib/x86_64-linux-gnu/libz.so.1",
        "/usr/lib/x86_64-linux-gnu/libz.so.1",
        "/usr/lib64/libz.so.1",
        "/lib64/libz.so.1",
    ]
    .into_iter()
    .find(|p| std::path::Path::new(p).is_file())
    .expect("zlib, which every Debian machine has, to make decoys from");
    let decoys = std::env::temp_dir().join(format!("shardrun-decoys-{}", std::process::id()));
    std::fs::create_dir_all(&decoys).unwrap();
    for name in [
        "libcudart.so",
        "libcudart.so.13",
        "libnccl.so",
        "libnccl.so.2",
    ] {
        let link = decoys.join(name);
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(libz, &link).unwrap();
    }
    let out = Command::new(WORKER)
        .arg("--check-gpu")
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("LD_LIBRARY_PATH", &decoys)
        .output()
        .expect("run worker");
    let _ = std::fs::remove_dir_all(&decoys);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let line = |prefix: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(prefix))
            .unwrap_or_else(|| {
                panic!(
                    "no {prefix:?} line:\n{text}{}",
                    String::from_utf8_lossy(&out.stderr)
                )
            })
            .to_string()
    };
    let runtime = line("cuda runtime: ");
    assert!(
        runtime.contains("/nvidia/") && runtime.contains("libcudart.so."),
        "{runtime}"
    );
    let nccl = line("nccl: ");
    assert!(
        nccl.starts_with("NCCL 2.") && nccl.contains("/nvidia/nccl/lib/libnccl.so.2"),
        "{nccl}"
    );
}
