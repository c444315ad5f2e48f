//! The tokenizers transformers 5 builds anew from a folder's files instead of using its
//! `tokenizer.json` as saved, rebuilt the same way so that the ids are those of
//! `AutoTokenizer.from_pretrained(folder)`: the Llama and CodeLlama classes ([`LlamaRebuild`])
//! and the Qwen2 class of the Qwen2 and Qwen3 families ([`Qwen2Rebuild`]).

use crate::tokenizer::token_text;
use serde_json::Value;
use tokenizers::decoders::byte_fallback::ByteFallback;
use tokenizers::decoders::fuse::Fuse;
use tokenizers::decoders::sequence::Sequence as DecoderSequence;
use tokenizers::decoders::strip::Strip;
use tokenizers::decoders::DecoderWrapper;
use tokenizers::normalizers::replace::Replace;
use tokenizers::normalizers::unicode::NFC;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::metaspace::{Metaspace, PrependScheme};
use tokenizers::pre_tokenizers::sequence::Sequence as PreTokenizerSequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::processors::template::TemplateProcessing;
use tokenizers::SplitDelimiterBehavior;

/// How transformers 5 builds a folder's tokenizer, when not from `tokenizer.json` as saved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rebuild {
    Llama(LlamaRebuild),
    Qwen2(Qwen2Rebuild),
}

impl Rebuild {
    /// How transformers builds the tokenizer of a folder with these files; `None` when it uses
    /// `tokenizer.json` as saved.
    pub fn of(
        tokenizer_json: &[u8],
        tokenizer_config: Option<&Value>,
        model_config: Option<&Value>,
    ) -> Option<Rebuild> {
        let folder = FolderSettings {
            tokenizer_config,
            model_config,
        };
        LlamaRebuild::of(tokenizer_json, &folder)
            .map(Rebuild::Llama)
            .or_else(|| Qwen2Rebuild::of(&folder).map(Rebuild::Qwen2))
    }

    /// The BOS token a rebuilt post-processor adds, when the rebuild makes one (CodeLlama's).
    pub(crate) fn bos_text(
        &self,
        bos_override: Option<&str>,
        tokenizer_config: Option<&Value>,
    ) -> Option<String> {
        match self {
            Rebuild::Llama(llama) => llama.bos_text(bos_override, tokenizer_config),
            Rebuild::Qwen2(_) => None,
        }
    }

    /// Replaces what transformers replaces; `bos` is [`Self::bos_text`] with its id.
    pub(crate) fn apply(
        &self,
        tokenizer: &mut tokenizers::Tokenizer,
        bos: Option<(String, u32)>,
    ) -> Result<(), String> {
        match self {
            Rebuild::Llama(llama) => llama.apply(tokenizer, bos),
            Rebuild::Qwen2(qwen) => qwen.apply(tokenizer),
        }
    }

    /// For the log and the manifest.
    pub fn describe(&self) -> String {
        match self {
            Rebuild::Llama(llama) => llama.describe(),
            Rebuild::Qwen2(qwen) => qwen.describe(),
        }
    }

    /// Names the rule in the data cache key: caches tokenized with `tokenizer.json` as saved
    /// are not reused.
    pub fn key(&self) -> String {
        format!("transformers 5 rebuild v1: {}", self.describe())
    }
}

/// What transformers reads of a folder to pick its tokenizer class: `tokenizer_config.json`
/// and `config.json`.
pub struct FolderSettings<'a> {
    pub tokenizer_config: Option<&'a Value>,
    pub model_config: Option<&'a Value>,
}

impl<'a> FolderSettings<'a> {
    /// A key of `tokenizer_config.json`.
    fn setting(&self, name: &str) -> Option<&'a Value> {
        self.tokenizer_config?.get(name)
    }

    /// `config.json`'s `model_type`.
    fn model_type(&self) -> Option<&'a str> {
        self.model_config?.get("model_type")?.as_str()
    }

    /// The tokenizer class the folder names (`tokenizer_config.json`, else `config.json`),
    /// without `Fast` (the same class in transformers 5).
    fn class(&self) -> Option<&'a str> {
        let class = self
            .setting("tokenizer_class")
            .or_else(|| self.model_config?.get("tokenizer_class"))?
            .as_str()?;
        Some(class.strip_suffix("Fast").unwrap_or(class))
    }
}

/// transformers' rebuild of Llama tokenizers. For a folder whose `tokenizer_class` is
/// `LlamaTokenizer` or `CodeLlamaTokenizer` (`...Fast` alike), transformers 5 keeps the
/// vocabulary, merges and added tokens of `tokenizer.json` (and LlamaTokenizer its
/// post-processor) and builds the rest anew: no normalizer (the file's `Prepend("▁")` +
/// `Replace(" ", "▁")` is dropped) and a `Metaspace` pre-tokenizer that adds `▁` only at
/// the very start of the text (`prepend_scheme: first`; `always` for a LlamaTokenizer saved
/// with `legacy: true`, `never` with `add_prefix_space: false`). So a leading space is not
/// doubled and text right after a special token (`<s>[INST]`) gets no `▁`. CodeLlama's
/// post-processor is rebuilt too: BOS before the text, whatever the file or `add_eos_token`
/// say. A LlamaTokenizer folder whose `tokenizer.json` is byte-level (Llama 3 style), or
/// whose `config.json` names another `model_type` than `llama` (Mistral, Mixtral, Phi-3
/// load with their own or the generic class), is used as saved, as transformers does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LlamaRebuild {
    code_llama: bool,
    prepend_scheme: PrependScheme,
    add_prefix_space: bool,
}

impl LlamaRebuild {
    /// How transformers builds the tokenizer of a folder with these files; `None` when it uses
    /// `tokenizer.json` as saved.
    pub fn of(tokenizer_json: &[u8], folder: &FolderSettings<'_>) -> Option<LlamaRebuild> {
        let setting = |name: &str| folder.setting(name);
        // Custom tokenizer code (`auto_map`) is the model's own: nothing to follow here.
        if setting("auto_map").is_some() {
            return None;
        }
        let code_llama = match folder.class()? {
            "LlamaTokenizer" => false,
            "CodeLlamaTokenizer" => true,
            _ => return None,
        };
        match folder.model_type() {
            None | Some("llama") => {}
            Some(_) => return None,
        }
        if !code_llama && contains(tokenizer_json, b"\"ByteLevel\"") {
            return None;
        }
        // Python truth values: `None` (absent) means the class default.
        let add_prefix_space = setting("add_prefix_space")
            .filter(|v| !v.is_null())
            .is_none_or(truthy);
        let legacy = !code_llama && setting("legacy").is_some_and(truthy);
        let prepend_scheme = match (add_prefix_space, legacy) {
            (false, _) => PrependScheme::Never,
            (true, true) => PrependScheme::Always,
            (true, false) => PrependScheme::First,
        };
        Some(LlamaRebuild {
            code_llama,
            prepend_scheme,
            add_prefix_space,
        })
    }

    /// The BOS CodeLlama's rebuilt post-processor adds: the spec's, else the folder's, else
    /// the class default `<s>`. `None` for LlamaTokenizer, which keeps the file's.
    fn bos_text(
        &self,
        bos_override: Option<&str>,
        tokenizer_config: Option<&Value>,
    ) -> Option<String> {
        if !self.code_llama {
            return None;
        }
        let configured = tokenizer_config.and_then(|c| token_text(c.get("bos_token")?));
        Some(
            bos_override
                .map(str::to_string)
                .or(configured)
                .unwrap_or_else(|| "<s>".into()),
        )
    }

    /// Replaces what transformers replaces; `bos` is [`Self::bos_text`] with its id.
    fn apply(
        &self,
        tokenizer: &mut tokenizers::Tokenizer,
        bos: Option<(String, u32)>,
    ) -> std::result::Result<(), String> {
        tokenizer
            .with_normalizer(None::<tokenizers::NormalizerWrapper>)
            .map_err(|e| e.to_string())?;
        tokenizer.with_pre_tokenizer(Some(Metaspace::new('▁', self.prepend_scheme, false)));
        let mut decoders: Vec<DecoderWrapper> = vec![
            Replace::new("▁", " ").map_err(|e| e.to_string())?.into(),
            ByteFallback::new().into(),
            Fuse::new().into(),
        ];
        if self.add_prefix_space || self.code_llama {
            decoders.push(Strip::new(' ', 1, 0).into());
        }
        tokenizer.with_decoder(Some(DecoderSequence::new(decoders)));
        if self.code_llama {
            let processor = match bos {
                Some((text, id)) => TemplateProcessing::builder()
                    .try_single(format!("{text}:0 $A:0"))
                    .and_then(|b| b.try_pair(format!("{text}:0 $A:0 {text}:1 $B:1")))
                    .map_err(|e| e.to_string())?
                    .special_tokens(vec![(text, id)])
                    .build(),
                None => TemplateProcessing::builder()
                    .try_single("$A:0")
                    .and_then(|b| b.try_pair("$A:0 $B:1"))
                    .map_err(|e| e.to_string())?
                    .build(),
            }
            .map_err(|e| e.to_string())?;
            tokenizer.with_post_processor(Some(processor));
        }
        Ok(())
    }

    /// For the log and the manifest.
    pub fn describe(&self) -> String {
        let class = if self.code_llama {
            "CodeLlamaTokenizer"
        } else {
            "LlamaTokenizer"
        };
        format!(
            "built as transformers 5 builds {class}: no normalizer, Metaspace prepend_scheme {}",
            self.prepend_scheme
        )
    }
}

/// The model types transformers 5 gives the Qwen2 tokenizer class (a test compares the list
/// with transformers' own registry).
pub const QWEN2_TOKENIZER_MODELS: [&str; 25] = [
    "audioflamingo3",
    "colqwen2",
    "cosmos3_omni",
    "dots3_note",
    "fun_asr_nano",
    "hunyuan_vl",
    "internvl",
    "lighton_ocr",
    "moss_transcribe_diarize",
    "ovis2",
    "qianfan_ocr",
    "qwen2",
    "qwen2_5_omni",
    "qwen2_5_vl",
    "qwen2_audio",
    "qwen2_moe",
    "qwen2_vl",
    "qwen3",
    "qwen3_asr",
    "qwen3_moe",
    "qwen3_next",
    "qwen3_omni_moe",
    "qwen3_vl",
    "qwen3_vl_moe",
    "vibevoice",
];

/// Qwen's pre-tokenizer pattern (GPT-4's, with digits one by one).
const QWEN2_PATTERN: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// transformers' rebuild of the Qwen2 tokenizer class. transformers 5 keeps the vocabulary,
/// merges, added tokens and post-processor of `tokenizer.json` and builds the rest anew: an
/// NFC normalizer, Qwen's pre-tokenizer (a regex split that takes digits one by one, then
/// byte-level without its own regex), and a plain byte-level BPE (no byte fallback, every
/// merge applied). Real Qwen2 and Qwen3 folders ship that pipeline already; it changes the ids
/// of a folder whose `tokenizer.json` was made otherwise (a GPT-2-style byte-level one, with
/// numbers in one piece). transformers picks the class from `tokenizer_class` and the model
/// type: it is Qwen2's for a folder that names `Qwen2Tokenizer` (under a Qwen2-class model
/// type, a Llama or no model type; other types keep their own or the generic class), that
/// names none under a Qwen2-class model type, and for `model_type: qwen2` whatever it names,
/// except where the folder has tokenizer code of its own (`auto_map`), which transformers
/// does not run without being told to, and shardrun cannot: there the class named decides.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Qwen2Rebuild {
    add_prefix_space: bool,
}

impl Qwen2Rebuild {
    pub fn of(folder: &FolderSettings<'_>) -> Option<Qwen2Rebuild> {
        let setting = |name: &str| folder.setting(name);
        let model_type = folder.model_type();
        let qwen2_class_model = model_type.is_some_and(|t| QWEN2_TOKENIZER_MODELS.contains(&t));
        // Tokenizer code of the folder's own (`auto_map`'s AutoTokenizer, or its older list).
        let own_code = match setting("auto_map") {
            Some(Value::Array(_)) => true,
            Some(Value::Object(map)) => map.contains_key("AutoTokenizer"),
            _ => false,
        };
        let rebuilt = match folder.class() {
            Some("Qwen2Tokenizer") => {
                model_type.is_none() || model_type == Some("llama") || qwen2_class_model
            }
            None => qwen2_class_model,
            // transformers overrules the class `qwen2` folders name (not their own code's).
            Some(_) => model_type == Some("qwen2") && !own_code,
        };
        rebuilt.then(|| Qwen2Rebuild {
            add_prefix_space: setting("add_prefix_space").is_some_and(truthy),
        })
    }

    fn apply(&self, tokenizer: &mut tokenizers::Tokenizer) -> Result<(), String> {
        let split = Split::new(
            SplitPattern::Regex(QWEN2_PATTERN.into()),
            SplitDelimiterBehavior::Isolated,
            false,
        )
        .map_err(|e| e.to_string())?;
        let byte_level = ByteLevel::new(self.add_prefix_space, true, false);
        tokenizer
            .with_normalizer(Some(NFC))
            .map_err(|e| e.to_string())?;
        tokenizer.with_pre_tokenizer(Some(PreTokenizerSequence::new(vec![
            split.into(),
            byte_level.into(),
        ])));
        tokenizer.with_decoder(Some(ByteLevel::default()));
        // The BPE model as the class makes it from the file's vocabulary and merges.
        let mut model = serde_json::to_value(tokenizer.get_model()).map_err(|e| e.to_string())?;
        if model.get("type").and_then(Value::as_str) != Some("BPE") {
            return Err(
                "its tokenizer.json is not a BPE model, which the Qwen2 class needs".into(),
            );
        }
        for (option, value) in [
            ("dropout", Value::Null),
            ("unk_token", Value::Null),
            ("continuing_subword_prefix", Value::Null),
            ("end_of_word_suffix", Value::Null),
            ("fuse_unk", Value::Bool(false)),
            ("byte_fallback", Value::Bool(false)),
            ("ignore_merges", Value::Bool(false)),
        ] {
            model[option] = value;
        }
        let model: tokenizers::ModelWrapper =
            serde_json::from_value(model).map_err(|e| e.to_string())?;
        tokenizer.with_model(model);
        Ok(())
    }

    fn describe(&self) -> String {
        format!(
            "built as transformers 5 builds Qwen2Tokenizer: NFC, Qwen's pre-tokenizer, \
             add_prefix_space {}",
            self.add_prefix_space
        )
    }
}

/// Python's truth value of a JSON value.
fn truthy(value: &Value) -> bool {
    match value {
        Value::Null => false,
        Value::Bool(b) => *b,
        Value::Number(n) => n.as_f64() != Some(0.0),
        Value::String(s) => !s.is_empty(),
        Value::Array(a) => !a.is_empty(),
        Value::Object(o) => !o.is_empty(),
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}
