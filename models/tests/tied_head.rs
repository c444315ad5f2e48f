//! A tied model (`tie_word_embeddings: true`) loads as `from_pretrained` loads it, whatever
//! its file holds of the pair: the embedding alone, both with equal values (the head
//! ignored), both with different values (untied: the model keeps both), or the head alone
//! (the embedding takes its values).

use serde_json::json;
use shardrun_models::hf::{open_folder, save_folder, SaveOptions, StoredDtype};
use shardrun_models::llama::{EMBED_TOKENS, LM_HEAD};
use shardrun_models::source::ParamSource;
use shardrun_models::{LlamaModel, ModelConfig};
use std::path::Path;

const VOCAB: u64 = 32;
const DIM: u64 = 8;

fn config() -> serde_json::Value {
    json!({
        "model_type": "llama", "vocab_size": VOCAB, "hidden_size": DIM,
        "intermediate_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2,
        "num_key_value_heads": 1, "tie_word_embeddings": true
    })
}

/// Element `i` of tensor `name`: the embedding and the head differ unless `same_head`.
fn value(name: &str, i: u64, same_head: bool) -> f32 {
    let offset = if name == LM_HEAD && !same_head {
        0.5
    } else {
        0.0
    };
    (i % 17) as f32 - 8.0 + offset
}

/// A folder of the tied config holding the embedding (`embed`), the head (`head`) and every
/// other parameter.
fn folder(dir: &Path, embed: bool, head: bool, same_head: bool) {
    let tied = shardrun_models::hf::config::parse_config(&config(), Path::new("config.json"))
        .unwrap()
        .describe();
    let mut tensors: Vec<(String, Vec<u64>)> = tied
        .params
        .iter()
        .filter(|p| embed || p.name != EMBED_TOKENS)
        .map(|p| (p.name.clone(), p.shape.iter().map(|&d| d as u64).collect()))
        .collect();
    if head {
        tensors.push((LM_HEAD.to_string(), vec![VOCAB, DIM]));
    }
    save_folder(
        dir,
        &config(),
        &tensors,
        |name, out| {
            let (_, shape) = tensors.iter().find(|(n, _)| n == name).unwrap();
            out.extend((0..shape.iter().product()).map(|i| value(name, i, same_head)));
            Ok(())
        },
        &[],
        &SaveOptions {
            dtype: StoredDtype::F32,
            max_shard_bytes: u64::MAX,
        },
    )
    .unwrap();
}

/// `name`'s values as a rank fills them from the folder, for the model `open_folder` found.
fn loaded(dir: &Path, name: &str) -> Vec<f32> {
    let folder = open_folder(dir).unwrap();
    let model = ModelConfig::Llama(LlamaModel {
        architecture: folder.config,
        pretrained: Some(dir.to_path_buf()),
    });
    let spec = model
        .describe()
        .params
        .into_iter()
        .find(|p| p.name == name)
        .unwrap_or_else(|| panic!("{name} is not a parameter"));
    let source = ParamSource::pretrained(dir, &model).unwrap();
    let mut out = vec![0.0; (VOCAB * DIM) as usize];
    source.fill(&spec, 0..VOCAB * DIM, &mut out).unwrap();
    out
}

fn expected(name: &str, same_head: bool) -> Vec<f32> {
    (0..VOCAB * DIM)
        .map(|i| value(name, i, same_head))
        .collect()
}

#[test]
fn an_output_head_unlike_the_tied_embedding_makes_the_model_untied() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("m");
    folder(&dir, true, true, false);
    let folder = open_folder(&dir).unwrap();
    assert!(
        !folder.config.tie_embeddings,
        "transformers does not tie them"
    );
    assert!(
        folder
            .notes
            .iter()
            .any(|n| n.contains("differs") && n.contains("tie_word_embeddings: false")),
        "{:?}",
        folder.notes
    );
    assert_eq!(loaded(&dir, LM_HEAD), expected(LM_HEAD, false));
    assert_eq!(loaded(&dir, EMBED_TOKENS), expected(EMBED_TOKENS, false));
}

#[test]
fn an_output_head_equal_to_the_tied_embedding_is_ignored() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("m");
    folder(&dir, true, true, true);
    let folder = open_folder(&dir).unwrap();
    assert!(folder.config.tie_embeddings);
    assert!(
        folder
            .notes
            .iter()
            .any(|n| n.starts_with(&format!("{LM_HEAD} in")) && n.contains("ignored")),
        "{:?}",
        folder.notes
    );
}

#[test]
fn a_tied_folder_holding_only_the_output_head_gives_the_embedding_its_values() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("m");
    folder(&dir, false, true, false);
    let folder = open_folder(&dir).unwrap();
    assert!(folder.config.tie_embeddings);
    assert!(
        folder
            .notes
            .iter()
            .any(|n| n.starts_with(&format!("{EMBED_TOKENS} read from {LM_HEAD}"))),
        "{:?}",
        folder.notes
    );
    assert_eq!(loaded(&dir, EMBED_TOKENS), expected(LM_HEAD, false));
}
