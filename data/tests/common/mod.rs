//! Shared set-up of the data tests: the tokenizer folders and expectations that
//! `tests/python/make_tokenizers.py` builds with Python `tokenizers` and `transformers`, and
//! dataset configs.

#![allow(dead_code)]

use shardrun_protocol::config::*;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// The fixture folder, built once per version of the script (kept under the target dir, so
/// test binaries share it and reruns skip Python).
pub fn fixture() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let script =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/python/make_tokenizers.py");
        let source = std::fs::read(&script).expect("read make_tokenizers.py");
        let version = format!("{:016x}", fnv1a(&source));
        let root = Path::new(env!("CARGO_TARGET_TMPDIR")).join("data-fixture");
        let dir = root.join(&version);
        if dir.join("expected.json").is_file() {
            return dir;
        }
        std::fs::create_dir_all(&root).unwrap();
        let python = python();
        let tmp = root.join(format!("{version}.tmp-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&tmp);
        let out = Command::new(&python)
            .arg(&script)
            .arg(&tmp)
            .output()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", python.display()));
        assert!(
            out.status.success(),
            "make_tokenizers.py failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        // Another test binary may have finished first: either copy is complete.
        if std::fs::rename(&tmp, &dir).is_err() {
            let _ = std::fs::remove_dir_all(&tmp);
        }
        dir
    })
}

/// `SHARDRUN_PYTHON`, else the project's venv (`scripts/setup.sh` makes it).
pub fn python() -> PathBuf {
    if let Some(p) = std::env::var_os("SHARDRUN_PYTHON") {
        return p.into();
    }
    let cache = std::env::var_os("SHARDRUN_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").expect("HOME is set")).join(".cache/shardrun")
        });
    let python = cache.join("venv/bin/python");
    assert!(
        python.exists(),
        "{} is missing: these tests build tokenizers with the venv's Python `tokenizers` and \
         `transformers`; run scripts/setup.sh, or set SHARDRUN_PYTHON to a Python that has them",
        python.display()
    );
    python
}

/// FNV-1a: names the fixture version (no need for a crypto hash here).
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

pub fn expected() -> serde_json::Value {
    let text = std::fs::read_to_string(fixture().join("expected.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

pub fn ids(value: &serde_json::Value) -> Vec<u32> {
    value
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as u32)
        .collect()
}

pub fn hf(folder: &str) -> TokenizerConfig {
    TokenizerConfig::HuggingFace {
        path: fixture().join(folder),
        bos_token: None,
        eos_token: None,
    }
}

/// A dataset of `source` with stream packing, no validation, the cache under `cache`.
pub fn dataset(
    source: DataSource,
    tokenizer: TokenizerConfig,
    seq_len: u64,
    cache: &Path,
) -> DatasetConfig {
    DatasetConfig {
        source,
        seq_len,
        tokenizer,
        packing: Packing::Stream,
        truncate: false,
        document_mask: false,
        shuffle: true,
        validation: None,
        cache_dir: cache.to_path_buf(),
        on_bad_record: OnBadRecord::Stop,
    }
}

pub fn text_files(files: Vec<PathBuf>, split: TextSplit) -> DataSource {
    DataSource::Text { files, split }
}

/// Every document's tokens and loss mask, in corpus order.
pub fn documents(corpus: &shardrun_data::corpus::Corpus) -> Vec<(Vec<u32>, Vec<bool>)> {
    (0..corpus.documents())
        .map(|d| {
            let (s, e) = (corpus.doc_start(d), corpus.doc_start(d + 1));
            let mut tokens = Vec::new();
            corpus.copy_tokens(s, e, &mut tokens);
            (tokens, (s..e).map(|p| corpus.trains_on(p)).collect())
        })
        .collect()
}

/// Cache folder entries that are not lock files (what a failed build must not leave).
pub fn cache_entries(cache: &Path) -> Vec<String> {
    match std::fs::read_dir(cache) {
        Ok(entries) => entries
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|n| !n.ends_with(".lock"))
            .collect(),
        Err(_) => Vec::new(),
    }
}

/// The lines a preparation says.
#[derive(Default)]
pub struct Lines(pub std::sync::Mutex<Vec<String>>);

impl shardrun_data::Observer for Lines {
    fn line(&self, text: &str) {
        self.0.lock().unwrap().push(text.to_string());
    }
}
