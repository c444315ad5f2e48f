//! Text to token ids: a Hugging Face `tokenizer.json` through the `tokenizers` crate (the
//! library Python's `tokenizers` and `transformers` wrap), or UTF-8 bytes when the spec asks
//! for them. The ids are those of `AutoTokenizer.from_pretrained(folder)` in transformers 5:
//! `tokenizer.json` as saved, except for the Llama, CodeLlama and Qwen2 tokenizers
//! transformers rebuilds (see [`crate::rebuild`]).
//!
//! The end-of-document token comes from, in order: the spec's `eos_token`, the folder's
//! `tokenizer_config.json` (or `special_tokens_map.json`), the model's `config.json`, its
//! `generation_config.json`. The beginning-of-sequence token is whatever the tokenizer's
//! post-processor adds (as `tokenizer(text)` does in `transformers`); it is reported, and
//! chat templates see it as `bos_token`. The spec's `bos_token` and `eos_token` stand in for
//! the folder's in chat templates, as `AutoTokenizer.from_pretrained(folder, bos_token=...)`
//! passes them; like it, they leave the post-processor as the file has it (CodeLlama's, which
//! transformers rebuilds, adds the `bos_token` given).

use crate::error::{DataError, Result};
use crate::rebuild::Rebuild;
use serde_json::Value;
use shardrun_protocol::config::TokenizerConfig;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The end-of-document id of [`TokenizerConfig::Bytes`].
pub const BYTES_EOS: u32 = 256;
/// What chat templates and exports call it.
pub const BYTES_EOS_TEXT: &str = "<eos>";

/// A special token and where its identity came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpecialToken {
    pub id: u32,
    pub text: String,
    pub source: String,
}

pub struct TextTokenizer {
    inner: Inner,
    /// Ends every document.
    pub eos: SpecialToken,
    pub bos: Option<SpecialToken>,
    /// `bos_token`, `eos_token`, `unk_token`, ... by the names chat templates use, from the
    /// spec's overrides, else the tokenizer's own files (what `transformers`'
    /// `apply_chat_template` passes).
    pub template_tokens: BTreeMap<String, String>,
    /// Ids it can produce: the base vocabulary plus added tokens.
    pub vocab_size: u64,
    pub description: String,
    /// Folder of `tokenizer.json`, where the chat template is looked for.
    pub folder: Option<PathBuf>,
}

enum Inner {
    HuggingFace(Box<tokenizers::Tokenizer>),
    Bytes,
}

/// Token ids and, when asked for, the byte range of the text each one covers (`(0, 0)` for
/// tokens the post-processor added).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Encoding {
    pub ids: Vec<u32>,
    pub offsets: Vec<(usize, usize)>,
}

const TEMPLATE_TOKEN_NAMES: [&str; 7] = [
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
];

impl TextTokenizer {
    pub fn load(config: &TokenizerConfig) -> Result<TextTokenizer> {
        match config {
            TokenizerConfig::HuggingFace {
                path,
                bos_token,
                eos_token,
            } => load_hugging_face(path, bos_token.as_deref(), eos_token.as_deref()),
            TokenizerConfig::Bytes => Ok(TextTokenizer {
                inner: Inner::Bytes,
                eos: SpecialToken {
                    id: BYTES_EOS,
                    text: BYTES_EOS_TEXT.into(),
                    source: "the byte tokenizer".into(),
                },
                bos: None,
                template_tokens: BTreeMap::from([("eos_token".into(), BYTES_EOS_TEXT.into())]),
                vocab_size: u64::from(BYTES_EOS) + 1,
                description: "UTF-8 bytes (ids 0-255, end of document 256)".into(),
                folder: None,
            }),
            TokenizerConfig::PreTokenized => Err(DataError::Config(
                "pre-tokenized data has no tokenizer to load".into(),
            )),
        }
    }

    /// Ids of `text`; `add_special_tokens` runs the tokenizer's post-processor (BOS for
    /// Llama-style tokenizers), as `transformers`' `tokenizer(text)` does by default.
    pub fn encode(
        &self,
        text: &str,
        add_special_tokens: bool,
        with_offsets: bool,
    ) -> std::result::Result<Encoding, String> {
        match &self.inner {
            Inner::HuggingFace(tokenizer) => {
                let encoding = if with_offsets {
                    tokenizer.encode(text, add_special_tokens)
                } else {
                    tokenizer.encode_fast(text, add_special_tokens)
                }
                .map_err(|e| format!("the tokenizer failed: {e}"))?;
                Ok(Encoding {
                    ids: encoding.get_ids().to_vec(),
                    offsets: if with_offsets {
                        encoding.get_offsets().to_vec()
                    } else {
                        Vec::new()
                    },
                })
            }
            Inner::Bytes => Ok(Encoding {
                ids: text.bytes().map(u32::from).collect(),
                offsets: if with_offsets {
                    (0..text.len()).map(|i| (i, i + 1)).collect()
                } else {
                    Vec::new()
                },
            }),
        }
    }

    /// The text of `id` when it is a special token (`<|eot_id|>`, `<|im_end|>`), one a chat
    /// template may end turns with; `None` for other ids.
    pub fn special_token(&self, id: u32) -> Option<String> {
        match &self.inner {
            Inner::HuggingFace(tokenizer) => tokenizer
                .get_added_tokens_decoder()
                .remove(&id)
                .filter(|token| token.special)
                .map(|token| token.content),
            Inner::Bytes => (id == BYTES_EOS).then(|| BYTES_EOS_TEXT.to_string()),
        }
    }
}

fn load_hugging_face(
    path: &Path,
    bos_override: Option<&str>,
    eos_override: Option<&str>,
) -> Result<TextTokenizer> {
    let file = tokenizer_json_path(path);
    let bytes = read_tokenizer_json(&file)?;
    let mut tokenizer =
        tokenizers::Tokenizer::from_bytes(&bytes).map_err(|e| DataError::Tokenizer {
            path: file.clone(),
            why: format!(
                "not a tokenizer file the `tokenizers` library reads ({e}); save the tokenizer \
                 again with transformers (`save_pretrained`), or name another folder"
            ),
        })?;
    // Documents are packed whole: a truncation or padding rule saved in the file must not
    // cut or pad them.
    tokenizer
        .with_truncation(None)
        .map_err(|e| DataError::Tokenizer {
            path: file.clone(),
            why: e.to_string(),
        })?;
    tokenizer.with_padding(None);
    let folder = tokenizer_folder(path);
    let json = |name: &str| read_json(&folder.join(name));
    let tokenizer_config = json("tokenizer_config.json")?;
    let special_tokens_map = json("special_tokens_map.json")?;
    let model_config = json("config.json")?;
    let rebuild = Rebuild::of(&bytes, tokenizer_config.as_ref(), model_config.as_ref());

    let mut template_tokens = BTreeMap::new();
    for name in TEMPLATE_TOKEN_NAMES {
        let text = [&tokenizer_config, &special_tokens_map]
            .into_iter()
            .flatten()
            .find_map(|c| token_text(c.get(name)?));
        if let Some(text) = text {
            template_tokens.insert(name.to_string(), text);
        }
    }
    let vocab_size = tokenizer.get_vocab_size(true) as u64;
    // `required`: a token the data cannot do without (the end of document).
    let find = |kind: &str,
                override_text: Option<&str>,
                required: bool|
     -> Result<Option<SpecialToken>> {
        let key = format!("{kind}_token");
        let id_key = format!("{kind}_token_id");
        let by_text = |text: &str, source: String| -> Result<SpecialToken> {
            let id = tokenizer
                .token_to_id(text)
                .ok_or_else(|| DataError::Tokenizer {
                    path: file.clone(),
                    why: format!(
                        "{source} names `{text}` as the {kind} token, but the tokenizer has no such token{}",
                        special_tokens_in_words(&tokenizer)
                    ),
                })?;
            Ok(SpecialToken {
                id,
                text: text.to_string(),
                source,
            })
        };
        if let Some(text) = override_text {
            let id = tokenizer
                .token_to_id(text)
                .ok_or_else(|| DataError::UnknownSpecToken {
                    path: file.clone(),
                    token: text.to_string(),
                    special: special_tokens_in_words(&tokenizer),
                    key: key.clone(),
                })?;
            return Ok(Some(SpecialToken {
                id,
                text: text.to_string(),
                source: format!("data.tokenizer.{key}"),
            }));
        }
        for (name, config) in [
            ("tokenizer_config.json", &tokenizer_config),
            ("special_tokens_map.json", &special_tokens_map),
        ] {
            if let Some(text) = config.as_ref().and_then(|c| token_text(c.get(&key)?)) {
                return by_text(&text, name.to_string()).map(Some);
            }
        }
        let by_id = |name: &str, config: Option<&Value>| -> Result<Option<SpecialToken>> {
            let Some(id) = config.and_then(|c| first_id(c.get(&id_key)?)) else {
                return Ok(None);
            };
            let text = tokenizer
                .id_to_token(id)
                .ok_or_else(|| DataError::Tokenizer {
                    path: folder.join(name),
                    why: format!("`{id_key}` is {id}, beyond the tokenizer's {vocab_size} ids"),
                })?;
            Ok(Some(SpecialToken {
                id,
                text,
                source: name.to_string(),
            }))
        };
        if let Some(token) = by_id("config.json", model_config.as_ref())? {
            return Ok(Some(token));
        }
        // Read only when nothing before it names the token, and unread where it is broken
        // unless the token is required: transformers reads it only to generate, so a broken
        // one stops nothing that does not need it.
        let generation_config = match json("generation_config.json") {
            Err(e) if required => return Err(e),
            read => read.ok().flatten(),
        };
        by_id("generation_config.json", generation_config.as_ref())
    };
    let eos = find("eos", eos_override, true)?.ok_or_else(|| DataError::Tokenizer {
        path: file.clone(),
        why: "no end-of-sequence token in tokenizer_config.json, special_tokens_map.json, \
              config.json or generation_config.json; name one with `data.tokenizer.eos_token`"
            .into(),
    })?;
    let bos = find("bos", bos_override, false)?;
    if let Some(rebuild) = &rebuild {
        let bos = rebuild.bos_text(bos_override, tokenizer_config.as_ref());
        let bos = bos.and_then(|text| Some((text.clone(), tokenizer.token_to_id(&text)?)));
        rebuild
            .apply(&mut tokenizer, bos)
            .map_err(|why| DataError::Tokenizer {
                path: file.clone(),
                why: format!("cannot build it as transformers does ({why})"),
            })?;
    }
    for (name, text) in [("bos_token", bos_override), ("eos_token", eos_override)] {
        if let Some(text) = text {
            template_tokens.insert(name.to_string(), text.to_string());
        }
    }
    Ok(TextTokenizer {
        inner: Inner::HuggingFace(Box::new(tokenizer)),
        description: format!(
            "{} ({vocab_size} ids, end of document `{}` = {} from {}{})",
            file.display(),
            eos.text,
            eos.id,
            eos.source,
            rebuild.map_or(String::new(), |r| format!("; {}", r.describe()))
        ),
        eos,
        bos,
        template_tokens,
        vocab_size,
        folder: Some(folder),
    })
}

/// `; its special tokens: `<s>`, `</s>`` (the first ten, by id), what a token the spec
/// names could be instead.
fn special_tokens_in_words(tokenizer: &tokenizers::Tokenizer) -> String {
    let mut special: Vec<(u32, String)> = tokenizer
        .get_added_tokens_decoder()
        .into_iter()
        .filter(|(_, token)| token.special)
        .map(|(id, token)| (id, token.content))
        .collect();
    if special.is_empty() {
        return String::new();
    }
    special.sort();
    let shown: Vec<String> = special
        .iter()
        .take(10)
        .map(|(_, text)| format!("`{text}`"))
        .collect();
    let more = match special.len() {
        n if n > 10 => format!(" and {} more", n - 10),
        _ => String::new(),
    };
    format!("; its special tokens: {}{more}", shown.join(", "))
}

/// `tokenizer.json` of a folder, or the file named.
pub fn tokenizer_json_path(path: &Path) -> PathBuf {
    if path.is_dir() {
        path.join("tokenizer.json")
    } else {
        path.to_path_buf()
    }
}

/// The folder of a tokenizer's files (its `tokenizer_config.json`, its chat templates):
/// the folder named, or the one of the `tokenizer.json` named.
pub fn tokenizer_folder(path: &Path) -> PathBuf {
    tokenizer_json_path(path)
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default()
}

/// The bytes of `tokenizer.json`, or an error saying how to get one.
pub fn read_tokenizer_json(file: &Path) -> Result<Vec<u8>> {
    std::fs::read(file).map_err(|e| DataError::Tokenizer {
        path: file.to_path_buf(),
        why: if e.kind() == std::io::ErrorKind::NotFound {
            "not found. shardrun reads the `tokenizer.json` that `transformers` saves; a folder \
             with only `tokenizer.model` (SentencePiece) gets one from \
             `AutoTokenizer.from_pretrained(folder).save_pretrained(folder)`"
                .into()
        } else {
            format!("cannot be read: {e}")
        },
    })
}

/// Files next to `tokenizer.json` whose contents decide the ids and special tokens.
pub const FOLDER_FILES: [&str; 7] = [
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "config.json",
    "generation_config.json",
    "chat_template.jinja",
    "chat_template.json",
];

/// A JSON file of the tokenizer folder, `None` when absent.
pub(crate) fn read_json(path: &Path) -> Result<Option<Value>> {
    match std::fs::read(path) {
        Ok(bytes) => parse_json(path, &bytes).map(Some),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(DataError::io("read", path)(e)),
    }
}

/// The contents of the tokenizer folder's JSON file `path`.
pub(crate) fn parse_json(path: &Path, bytes: &[u8]) -> Result<Value> {
    serde_json::from_slice(bytes).map_err(|e| DataError::Tokenizer {
        path: path.to_path_buf(),
        why: format!("not valid JSON ({e})"),
    })
}

/// A special token as `transformers` saves it: a string, or an `AddedToken` object.
pub(crate) fn token_text(value: &Value) -> Option<String> {
    match value {
        Value::String(s) => Some(s.clone()),
        Value::Object(o) => o.get("content")?.as_str().map(str::to_string),
        _ => None,
    }
}

/// `eos_token_id` is a number or, in newer configs, a list of them (the first is the one
/// that ends text).
fn first_id(value: &Value) -> Option<u32> {
    match value {
        Value::Number(n) => n.as_u64().and_then(|n| u32::try_from(n).ok()),
        Value::Array(items) => items.first().and_then(first_id),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn special_token_forms() {
        assert_eq!(
            token_text(&serde_json::json!("</s>")).as_deref(),
            Some("</s>")
        );
        assert_eq!(
            token_text(&serde_json::json!({"__type": "AddedToken", "content": "<|im_end|>"}))
                .as_deref(),
            Some("<|im_end|>")
        );
        assert_eq!(first_id(&serde_json::json!([128001, 128009])), Some(128001));
        assert_eq!(first_id(&serde_json::json!(2)), Some(2));
        assert_eq!(first_id(&serde_json::json!(null)), None);
    }

    #[test]
    fn bytes_tokenizer_is_utf8_with_offsets() {
        let t = TextTokenizer::load(&TokenizerConfig::Bytes).unwrap();
        let e = t.encode("é!", true, true).unwrap();
        assert_eq!(e.ids, [0xc3, 0xa9, b'!' as u32]);
        assert_eq!(e.offsets, [(0, 1), (1, 2), (2, 3)]);
        assert_eq!((t.eos.id, t.vocab_size), (256, 257));
    }
}
