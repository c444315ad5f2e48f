//! What the Hugging Face tests share: the project's Python (`transformers`, PyTorch) running
//! `tests/python/hf_models.py`, the tiny model folders it makes, and comparisons that fail on
//! any NaN or inf.

#![allow(dead_code)]

use shardrun_models::hf;
use shardrun_protocol::config::{LlamaModel, ModelConfig};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// The folders `hf_models.py make` writes.
pub const FOLDERS: [&str; 6] = [
    "llama-gqa",
    "llama-tied-llama3",
    "qwen2-bias",
    "qwen3-qk-norm-yarn",
    "mistral",
    "llama-sharded-bf16",
];

/// The project's venv python (`scripts/setup.sh` makes it, under `SHARDRUN_CACHE` as
/// scripts/env.sh places it), or `SHARDRUN_PYTHON`.
pub fn python() -> PathBuf {
    if let Some(p) = std::env::var_os("SHARDRUN_PYTHON") {
        return p.into();
    }
    let cache = std::env::var_os("SHARDRUN_CACHE").map_or_else(
        || PathBuf::from(std::env::var_os("HOME").expect("HOME is set")).join(".cache/shardrun"),
        PathBuf::from,
    );
    cache.join("venv/bin/python")
}

pub fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/python/hf_models.py")
}

/// Runs `hf_models.py <args>`; panics with its output unless it succeeds. Returns stdout.
pub fn run_script(args: &[&str]) -> String {
    let out = Command::new(python())
        .arg(script())
        .args(args)
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "cannot run {}: {e}. Run scripts/setup.sh (it makes the venv with torch and transformers) or set SHARDRUN_PYTHON",
                python().display()
            )
        });
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "hf_models.py {args:?} failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// The test folders, made once per test binary under the target's temp dir, remade when the
/// script changes (keyed by its contents).
pub fn fixtures() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let text = std::fs::read(script()).expect("read hf_models.py");
        let key = text.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        });
        let root = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
        let dir = root.join(format!("hf-fixtures-{key:016x}"));
        if !dir.join("done").is_file() {
            let tmp = root.join(format!("hf-fixtures-{key:016x}.tmp-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&tmp);
            std::fs::create_dir_all(&tmp).expect("create fixture dir");
            run_script(&["make", "--out", tmp.to_str().expect("utf-8 path")]);
            std::fs::write(tmp.join("done"), b"").expect("mark fixtures done");
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::rename(&tmp, &dir).expect("move fixtures into place");
        }
        dir
    })
}

pub fn folder(name: &str) -> PathBuf {
    fixtures().join(name)
}

/// The model config of a folder, as `shardrun plan` resolves `model: { kind: hf, path }`.
pub fn hf_model(dir: &Path) -> ModelConfig {
    let folder = hf::open_folder(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    ModelConfig::Llama(LlamaModel {
        architecture: folder.config,
        pretrained: Some(dir.to_path_buf()),
    })
}

/// f32 tensors of a safetensors file, by name: (shape, values).
pub fn read_tensors(path: &Path) -> std::collections::BTreeMap<String, (Vec<usize>, Vec<f32>)> {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let file = safetensors::SafeTensors::deserialize(&bytes).expect("a safetensors file");
    file.tensors()
        .into_iter()
        .map(|(name, view)| {
            assert_eq!(view.dtype(), safetensors::Dtype::F32, "{name} is f32");
            let values = view
                .data()
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect();
            (name, (view.shape().to_vec(), values))
        })
        .collect()
}

/// Largest `|a - b|`, failing on any non-finite value on either side.
pub fn max_abs_difference(what: &str, a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len(), "{what}: lengths differ");
    let mut worst = 0.0f64;
    for (i, (&x, &y)) in a.iter().zip(b).enumerate() {
        assert!(
            x.is_finite() && y.is_finite(),
            "{what}: element {i} is not finite ({x} vs {y})"
        );
        worst = worst.max(f64::from((x - y).abs()));
    }
    worst
}

/// `max |a - b| / max |b|`, failing on any non-finite value.
pub fn max_relative_difference(what: &str, a: &[f32], b: &[f32]) -> f64 {
    let scale = b
        .iter()
        .fold(0.0f64, |m, v| m.max(f64::from(v.abs())))
        .max(1e-12);
    max_abs_difference(what, a, b) / scale
}

/// Relative difference of two scalars, failing on non-finite ones.
pub fn relative(what: &str, a: f64, b: f64) -> f64 {
    assert!(
        a.is_finite() && b.is_finite(),
        "{what}: not finite ({a} vs {b})"
    );
    (a - b).abs() / b.abs().max(1e-12)
}

/// `transformers`' logits for `ids` (extra arguments to `hf_models.py logits`).
pub fn transformers_logits(dir: &Path, work: &Path, ids: &[[i64; 12]], extra: &[&str]) -> Vec<f32> {
    let ids_path = work.join("ids.json");
    std::fs::write(&ids_path, serde_json::to_string(ids).unwrap()).unwrap();
    let out = work.join("logits.safetensors");
    let mut args = vec![
        "logits",
        "--model",
        dir.to_str().unwrap(),
        "--ids",
        ids_path.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    run_script(&args);
    read_tensors(&out).remove("logits").expect("logits").1
}
