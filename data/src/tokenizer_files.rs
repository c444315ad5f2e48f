//! A run's tokenizer as the files of a Hugging Face model folder, so that
//! `AutoTokenizer.from_pretrained(export)` gives the ids the run trained on and chats with the
//! template it trained with:
//!
//! * a Hugging Face tokenizer: its folder's tokenizer files (the `tokenizer.json` the spec
//!   names, `tokenizer_config.json`, `special_tokens_map.json`, `tokenizer.model`, chat
//!   templates, ...), with the spec's `bos_token` and `eos_token` written into its configs, as
//!   `AutoTokenizer.from_pretrained(folder, eos_token=...).save_pretrained(export)` saves them;
//! * the spec's `chat_template` file as `chat_template.jinja`, in place of the folder's own
//!   templates (the run rendered every record with it, tool use included);
//! * the byte tokenizer as a byte-level `tokenizer.json` with no merges: byte `b` is id `b`,
//!   and `<eos>` is 256. Its `tokenizer_config.json` sets `split_special_tokens`, so that the
//!   text `<eos>` is read as its five bytes, as the run read it.

use crate::error::{DataError, Result};
use crate::tokenizer::{
    parse_json, tokenizer_folder, tokenizer_json_path, BYTES_EOS, BYTES_EOS_TEXT,
};
use serde_json::value::RawValue;
use serde_json::{json, Value};
use shardrun_models::hf::{self, FolderFile, ADDITIONAL_CHAT_TEMPLATES};
use shardrun_protocol::config::TokenizerConfig;
use std::collections::BTreeMap;
use std::path::Path;
use tokenizers::models::bpe::BPE;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::{AddedToken, Tokenizer};

const TOKENIZER_JSON: &str = "tokenizer.json";
const TOKENIZER_CONFIG: &str = "tokenizer_config.json";
const SPECIAL_TOKENS_MAP: &str = "special_tokens_map.json";
/// Where the spec's `chat_template` goes in an exported folder.
pub const CHAT_TEMPLATE: &str = "chat_template.jinja";

/// The files of `tokenizer` (with the spec's `chat_template`, if any) in an exported model
/// folder; `None` for pre-tokenized data, which names no tokenizer.
pub fn tokenizer_files(
    tokenizer: &TokenizerConfig,
    chat_template: Option<&Path>,
) -> Result<Option<Vec<FolderFile>>> {
    let mut files = match tokenizer {
        TokenizerConfig::PreTokenized => return Ok(None),
        TokenizerConfig::Bytes => bytes_files()?,
        TokenizerConfig::HuggingFace {
            path,
            bos_token,
            eos_token,
        } => hugging_face_files(path, bos_token.as_deref(), eos_token.as_deref())?,
    };
    if let Some(template) = chat_template {
        files.retain(|f| !is_chat_template(&f.name));
        files.push(FolderFile::copy_of(CHAT_TEMPLATE, template));
    }
    files.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(Some(files))
}

/// Files that hold chat templates: `transformers` reads `chat_template.jinja` and
/// `additional_chat_templates/`, a processor `chat_template.json`.
fn is_chat_template(name: &str) -> bool {
    name == CHAT_TEMPLATE
        || name == "chat_template.json"
        || name.starts_with(&format!("{ADDITIONAL_CHAT_TEMPLATES}/"))
}

fn hugging_face_files(
    path: &Path,
    bos_token: Option<&str>,
    eos_token: Option<&str>,
) -> Result<Vec<FolderFile>> {
    let folder = tokenizer_folder(path);
    let mut files: Vec<FolderFile> = hf::tokenizer_and_generation_files(&folder)
        .map_err(|e| DataError::Tokenizer {
            path: folder.clone(),
            why: e.to_string(),
        })?
        .into_iter()
        .filter(|f| hf::is_tokenizer_file(&f.name) && f.name != TOKENIZER_JSON)
        .collect();
    // The file the spec names, whatever its name.
    files.push(FolderFile::copy_of(
        TOKENIZER_JSON,
        tokenizer_json_path(path),
    ));
    let overrides: Vec<(&str, &str)> = [("bos_token", bos_token), ("eos_token", eos_token)]
        .into_iter()
        .filter_map(|(key, text)| Some((key, text?)))
        .collect();
    if overrides.is_empty() {
        return Ok(files);
    }
    // The configs with the spec's tokens; without a tokenizer_config.json, one that names them.
    for (name, always) in [(TOKENIZER_CONFIG, true), (SPECIAL_TOKENS_MAP, false)] {
        let source = folder.join(name);
        let mut config = match read_raw_object(&source)? {
            Some(config) => config,
            None if always => RawObject::from([(
                "tokenizer_class".to_string(),
                raw_json(&"PreTrainedTokenizerFast"),
            )]),
            None => continue,
        };
        let mut changed = false;
        for (key, text) in &overrides {
            // special_tokens_map.json only speaks of the tokens it names.
            if always || config.contains_key(*key) {
                config.insert(key.to_string(), raw_json(text));
                changed = true;
            }
        }
        if changed {
            files.retain(|f| f.name != name);
            let mut text = serde_json::to_string_pretty(&config).expect("JSON values serialize");
            text.push('\n');
            files.push(FolderFile::bytes(name, text));
        }
    }
    Ok(files)
}

/// A JSON object whose values are kept as written: `model_max_length` is often
/// 1000000000000000019884624838656, which a parsed number would write back as `1e+30`, a
/// float `transformers` then reads.
type RawObject = BTreeMap<String, Box<RawValue>>;

/// The JSON object of `path`, `None` when absent.
fn read_raw_object(path: &Path) -> Result<Option<RawObject>> {
    let bytes = match std::fs::read(path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(DataError::io("read", path)(e)),
    };
    // Valid JSON of another kind than an object is said so, not as invalid JSON.
    if !parse_json(path, &bytes)?.is_object() {
        return Err(DataError::Tokenizer {
            path: path.to_path_buf(),
            why: "not a JSON object".into(),
        });
    }
    Ok(Some(
        serde_json::from_slice(&bytes).expect("a JSON object parses as one"),
    ))
}

fn raw_json(value: &impl serde::Serialize) -> Box<RawValue> {
    serde_json::value::to_raw_value(value).expect("JSON values serialize")
}

fn bytes_files() -> Result<Vec<FolderFile>> {
    let config = json!({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": BYTES_EOS_TEXT,
        "split_special_tokens": true,
        "clean_up_tokenization_spaces": false,
    });
    Ok(vec![
        FolderFile::bytes(TOKENIZER_JSON, bytes_tokenizer_json()?),
        FolderFile::bytes(TOKENIZER_CONFIG, json_text(&config)),
    ])
}

/// The byte tokenizer as a `tokenizer.json`: GPT-2's byte-level alphabet with one id per
/// byte (the byte's value) and no merges, and `<eos>` as 256.
pub fn bytes_tokenizer_json() -> Result<String> {
    let failed = |e: tokenizers::Error| DataError::Config(format!("the byte tokenizer: {e}"));
    let vocab: [(String, u32); 256] =
        std::array::from_fn(|b| (byte_char(b as u8).to_string(), b as u32));
    let model = BPE::builder()
        .vocab_and_merges(vocab, Vec::new())
        .build()
        .map_err(failed)?;
    let mut tokenizer = Tokenizer::new(model);
    // Neither a space before the text nor GPT-2's word split: the bytes, as they are.
    let bytes = ByteLevel::new(false, false, false);
    tokenizer.with_pre_tokenizer(Some(bytes));
    tokenizer.with_decoder(Some(bytes));
    tokenizer
        .add_special_tokens([AddedToken::from(BYTES_EOS_TEXT, true)])
        .map_err(failed)?;
    debug_assert_eq!(tokenizer.token_to_id(BYTES_EOS_TEXT), Some(BYTES_EOS));
    tokenizer.to_string(true).map_err(failed)
}

/// The character GPT-2's byte-level alphabet writes byte `b` as: printable Latin-1
/// characters stand for themselves, the other bytes for the characters from U+0100 on, in
/// order.
fn byte_char(b: u8) -> char {
    let printable = |b: u8| matches!(b, b'!'..=b'~' | 0xa1..=0xac | 0xae..=0xff);
    if printable(b) {
        char::from(b)
    } else {
        let rank = (0..b).filter(|&c| !printable(c)).count() as u32;
        char::from_u32(256 + rank).expect("below U+0200")
    }
}

fn json_text(value: &Value) -> String {
    let mut text = serde_json::to_string_pretty(value).expect("JSON values serialize");
    text.push('\n');
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokenizer::TextTokenizer;

    #[test]
    fn the_byte_tokenizer_file_gives_the_byte_tokenizer_ids() {
        let file: Tokenizer = bytes_tokenizer_json().unwrap().parse().unwrap();
        let bytes = TextTokenizer::load(&TokenizerConfig::Bytes).unwrap();
        let every_char: String = (1..=0x7f_u8)
            .map(char::from)
            .chain("é ü ß 漢字 🤗 \u{a0}\u{ad}".chars())
            .collect();
        for text in [every_char.as_str(), "  two spaces\n\ttab", "", "x"] {
            let ids = file.encode(text, true).unwrap().get_ids().to_vec();
            assert_eq!(
                ids,
                bytes.encode(text, true, false).unwrap().ids,
                "{text:?}"
            );
            assert_eq!(file.decode(&ids, false).unwrap(), text);
        }
        assert_eq!(file.token_to_id(BYTES_EOS_TEXT), Some(BYTES_EOS));
        assert_eq!(file.get_vocab_size(true) as u64, bytes.vocab_size);
        // The same alphabet as the library's byte-level pre-tokenizer.
        let ours: std::collections::HashSet<char> = (0..=255).map(byte_char).collect();
        assert_eq!(ours, ByteLevel::alphabet().into_iter().collect());
    }

    #[test]
    fn the_spec_template_and_tokens_replace_the_folder_s() {
        let tmp = tempfile::tempdir().unwrap();
        let folder = tmp.path();
        for (name, text) in [
            ("tokenizer.json", "{}"),
            (
                "tokenizer_config.json",
                r#"{"eos_token": "</s>", "pad_token": "<pad>", "model_max_length": 1000000000000000019884624838656}"#,
            ),
            ("special_tokens_map.json", r#"{"pad_token": "<pad>"}"#),
            ("chat_template.jinja", "folder"),
            ("additional_chat_templates/tool_use.jinja", "tools"),
            ("config.json", "{}"),
            ("generation_config.json", "{}"),
            ("model.safetensors", ""),
        ] {
            let path = folder.join(name);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
        }
        let template = folder.join("spec.jinja");
        let config = TokenizerConfig::HuggingFace {
            path: folder.to_path_buf(),
            bos_token: None,
            eos_token: Some("<|end|>".into()),
        };
        let files = tokenizer_files(&config, Some(&template)).unwrap().unwrap();
        let names: Vec<&str> = files.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "chat_template.jinja",
                "special_tokens_map.json",
                "tokenizer.json",
                "tokenizer_config.json"
            ]
        );
        assert_eq!(files[0], FolderFile::copy_of(CHAT_TEMPLATE, &template));
        // special_tokens_map.json names no eos_token: copied as it is.
        assert_eq!(
            files[1],
            FolderFile::copy_of(SPECIAL_TOKENS_MAP, folder.join(SPECIAL_TOKENS_MAP))
        );
        let hf::FileContents::Bytes(written) = &files[3].contents else {
            panic!("{:?}", files[3])
        };
        // Every other value as the folder wrote it: no integer turned into `1e+30`.
        let text = std::str::from_utf8(written).unwrap();
        assert!(
            text.contains(r#""model_max_length": 1000000000000000019884624838656"#),
            "{text}"
        );
        let mut written: Value = serde_json::from_slice(written).unwrap();
        written.as_object_mut().unwrap().remove("model_max_length");
        assert_eq!(
            written,
            json!({"eos_token": "<|end|>", "pad_token": "<pad>"})
        );

        // Without a template or tokens in the spec: the folder's files as they are.
        let config = TokenizerConfig::HuggingFace {
            path: folder.join("tokenizer.json"),
            bos_token: None,
            eos_token: None,
        };
        let files = tokenizer_files(&config, None).unwrap().unwrap();
        let names: Vec<&str> = files.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "additional_chat_templates/tool_use.jinja",
                "chat_template.jinja",
                "special_tokens_map.json",
                "tokenizer.json",
                "tokenizer_config.json"
            ]
        );
        assert!(files
            .iter()
            .all(|f| matches!(f.contents, hf::FileContents::CopyOf(_))));
        assert_eq!(
            tokenizer_files(&TokenizerConfig::PreTokenized, None).unwrap(),
            None
        );

        // Configs the spec's tokens go into must be JSON objects.
        let config = TokenizerConfig::HuggingFace {
            path: folder.to_path_buf(),
            bos_token: Some("<s>".into()),
            eos_token: None,
        };
        for (text, why) in [("[1, 2]", "not a JSON object"), ("{", "not valid JSON")] {
            std::fs::write(folder.join(TOKENIZER_CONFIG), text).unwrap();
            let err = tokenizer_files(&config, None).unwrap_err().to_string();
            assert!(
                err.contains(TOKENIZER_CONFIG) && err.contains(why),
                "{text}: {err}"
            );
        }
    }
}
