//! `config.json` of a Llama-family folder → [`LlamaConfig`], in both dialects:
//! transformers 4.x (`rope_theta`, `rope_scaling`, `torch_dtype`) and 5.x (`rope_parameters`,
//! `dtype`). Keys that are absent take the default of the `transformers` config class of the
//! folder's `model_type`, as `from_pretrained` would; anything this architecture cannot
//! honour (another `model_type`, another activation, a rope type without an implementation
//! here, quantised weights, attention dropout) is an error naming the key.

use super::{ConfigProblem, HfError};
use crate::llama::{yarn_mscale, LlamaConfig, LlamaFamily, Rope, RopeScaling};
use serde_json::{json, Map, Value};
use std::path::Path;

pub const CONFIG_FILE: &str = "config.json";

/// The `model_type`s this architecture reads, and the model families they cover.
pub const SUPPORTED_TYPES: &str = "llama, mistral, qwen2, qwen3 (Llama 1-3, CodeLlama, SmolLM, TinyLlama, Mistral, Qwen2, Qwen2.5, Qwen3 and their fine-tunes)";
const SUPPORTED_ROPE: &str =
    "default, linear, llama3, yarn, dynamic (up to max_position_embeddings)";

/// Reads and parses `<dir>/config.json`.
pub fn read_config(dir: &Path) -> Result<LlamaConfig, HfError> {
    let path = dir.join(CONFIG_FILE);
    let text = std::fs::read_to_string(&path).map_err(HfError::io("read", &path))?;
    let value: Value = serde_json::from_str(&text).map_err(|e| {
        HfError::folder(
            &path,
            format!("is not valid JSON ({e}): copy config.json again from the model's source"),
        )
    })?;
    parse_config(&value, &path)
}

/// The dtype the folder's weights were saved in (`dtype` in 5.x, `torch_dtype` in 4.x), as
/// written there (`bfloat16`, `float32`, ...).
pub fn saved_dtype(config: &Value) -> Option<&str> {
    config
        .get("dtype")
        .or_else(|| config.get("torch_dtype"))
        .and_then(Value::as_str)
}

/// The floating-point dtypes PyTorch names (`getattr(torch, name)`), which `transformers` casts
/// a model to from `dtype`: what else is written there is a mistake.
const FLOATING_DTYPES: &[&str] = &[
    "float32",
    "float",
    "bfloat16",
    "float16",
    "half",
    "float64",
    "double",
    "float8_e4m3fn",
    "float8_e4m3fnuz",
    "float8_e5m2",
    "float8_e5m2fnuz",
    "float8_e8m0fnu",
];

/// Typed access to the keys of one JSON object, with errors naming `path` and the key.
struct Keys<'a> {
    map: &'a Map<String, Value>,
    path: &'a Path,
    /// Prefix for nested objects (`rope_scaling.`).
    prefix: &'a str,
}

impl<'a> Keys<'a> {
    fn err(&self, key: &str, problem: ConfigProblem, why: impl Into<String>) -> HfError {
        HfError::config(self.path, &format!("{}{key}", self.prefix), problem, why)
    }

    fn missing(&self, key: &str, why: impl Into<String>) -> HfError {
        self.err(key, ConfigProblem::Missing, why)
    }

    fn invalid(&self, key: &str, why: impl Into<String>) -> HfError {
        self.err(key, ConfigProblem::Invalid, why)
    }

    fn unsupported(&self, key: &str, why: impl Into<String>) -> HfError {
        self.err(key, ConfigProblem::Unsupported, why)
    }

    /// The value of `key`, `None` when absent or null.
    fn get(&self, key: &str) -> Option<&'a Value> {
        self.map.get(key).filter(|v| !v.is_null())
    }

    fn u64_opt(&self, key: &str) -> Result<Option<u64>, HfError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_u64()
                .or_else(|| {
                    v.as_f64()
                        .filter(|f| f.fract() == 0.0 && *f >= 0.0)
                        .map(|f| f as u64)
                })
                .map(Some)
                .ok_or_else(|| self.invalid(key, format!("is {v}, expected a whole number"))),
        }
    }

    fn u64_req(&self, key: &str) -> Result<u64, HfError> {
        self.u64_opt(key)?.ok_or_else(|| {
            self.missing(
                key,
                "is missing: a Llama-family config.json states it; is this the model's own config.json?",
            )
        })
    }

    fn f64_opt(&self, key: &str) -> Result<Option<f64>, HfError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_f64()
                .map(Some)
                .ok_or_else(|| self.invalid(key, format!("is {v}, expected a number"))),
        }
    }

    fn f64_req(&self, key: &str) -> Result<f64, HfError> {
        self.f64_opt(key)?
            .ok_or_else(|| self.missing(key, "is missing: this rope type needs it"))
    }

    fn bool_or(&self, key: &str, default: bool) -> Result<bool, HfError> {
        match self.get(key) {
            None => Ok(default),
            Some(v) => v
                .as_bool()
                .ok_or_else(|| self.invalid(key, format!("is {v}, expected true or false"))),
        }
    }

    fn str_opt(&self, key: &str) -> Result<Option<&'a str>, HfError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_str()
                .map(Some)
                .ok_or_else(|| self.invalid(key, format!("is {v}, expected a string"))),
        }
    }
}

/// Defaults of `transformers`' config classes for keys a config.json may leave out.
struct FamilyDefaults {
    max_position_embeddings: u64,
    /// `None`: as many key/value heads as query heads.
    n_kv_heads: Option<u64>,
    /// Mistral's window applies unless the config says `null`.
    sliding_window: Option<u64>,
    /// `None`: `hidden_size / num_attention_heads`.
    head_dim: Option<u64>,
}

fn defaults(family: LlamaFamily) -> FamilyDefaults {
    match family {
        LlamaFamily::Llama => FamilyDefaults {
            max_position_embeddings: 2048,
            n_kv_heads: None,
            sliding_window: None,
            head_dim: None,
        },
        LlamaFamily::Mistral => FamilyDefaults {
            max_position_embeddings: 4096 * 32,
            n_kv_heads: Some(8),
            sliding_window: Some(4096),
            head_dim: None,
        },
        LlamaFamily::Qwen2 => FamilyDefaults {
            max_position_embeddings: 32768,
            n_kv_heads: Some(32),
            sliding_window: None,
            head_dim: None,
        },
        // Qwen3Config's head_dim is 128 whatever the hidden size.
        LlamaFamily::Qwen3 => FamilyDefaults {
            max_position_embeddings: 32768,
            n_kv_heads: Some(32),
            sliding_window: None,
            head_dim: Some(128),
        },
    }
}

/// Parses a `config.json` value (its file is `path`, for messages).
pub fn parse_config(value: &Value, path: &Path) -> Result<LlamaConfig, HfError> {
    let map = value
        .as_object()
        .ok_or_else(|| HfError::folder(path, "is not a JSON object"))?;
    let k = Keys {
        map,
        path,
        prefix: "",
    };
    let model_type = match k.str_opt("model_type")? {
        Some("llama") => LlamaFamily::Llama,
        Some("mistral") => LlamaFamily::Mistral,
        Some("qwen2") => LlamaFamily::Qwen2,
        Some("qwen3") => LlamaFamily::Qwen3,
        Some(other) => {
            return Err(k.unsupported(
                "model_type",
                format!("\"{other}\" is not supported; supported model types: {SUPPORTED_TYPES}"),
            ))
        }
        None => {
            return Err(k.missing(
                "model_type",
                format!("is missing; supported model types: {SUPPORTED_TYPES}"),
            ))
        }
    };
    let family = defaults(model_type);
    // `transformers`' ACT2FN maps "swish" to the same SiLU.
    if let Some(act) = k
        .str_opt("hidden_act")?
        .filter(|a| !matches!(*a, "silu" | "swish"))
    {
        return Err(k.unsupported(
            "hidden_act",
            format!("\"{act}\" is not supported: the Llama MLP here is SwiGLU (silu)"),
        ));
    }
    if k.get("quantization_config").is_some() {
        return Err(k.unsupported(
            "quantization_config",
            "quantised weights are not supported: use the model's bf16 or fp32 weights",
        ));
    }
    for key in ["dtype", "torch_dtype"] {
        if let Some(name) = k.str_opt(key)?.filter(|n| !FLOATING_DTYPES.contains(n)) {
            return Err(k.invalid(
                key,
                format!(
                    "\"{name}\" is not a PyTorch floating-point dtype, so transformers cannot \
                     load this folder either: write the dtype its weights are stored in \
                     (bfloat16, float16 or float32)"
                ),
            ));
        }
    }
    if let Some(p) = k.f64_opt("attention_dropout")?.filter(|&p| p != 0.0) {
        return Err(k.invalid(
            "attention_dropout",
            format!("{p} is not supported: training runs without dropout (set it to 0.0)"),
        ));
    }

    let vocab_size = k.u64_req("vocab_size")?;
    let dim = k.u64_req("hidden_size")?;
    let ffn_dim = k.u64_req("intermediate_size")?;
    let n_layers = k.u64_req("num_hidden_layers")?;
    let n_heads = k.u64_req("num_attention_heads")?;
    if n_heads == 0 {
        return Err(k.invalid("num_attention_heads", "is 0"));
    }
    let n_kv_heads = k
        .u64_opt("num_key_value_heads")?
        .or(family.n_kv_heads)
        .unwrap_or(n_heads);
    let head_dim = match k.u64_opt("head_dim")?.or(family.head_dim) {
        Some(h) => h,
        None if dim.is_multiple_of(n_heads) => dim / n_heads,
        None => {
            return Err(k.invalid(
                "head_dim",
                format!(
                    "is not given and hidden_size {dim} is not a multiple of num_attention_heads {n_heads}"
                ),
            ))
        }
    };
    let max_position_embeddings = k
        .u64_opt("max_position_embeddings")?
        .unwrap_or(family.max_position_embeddings);
    let (qkv_bias, o_proj_bias, mlp_bias) = match model_type {
        LlamaFamily::Llama => {
            let attention = k.bool_or("attention_bias", false)?;
            (attention, attention, k.bool_or("mlp_bias", false)?)
        }
        LlamaFamily::Mistral => (false, false, false),
        LlamaFamily::Qwen2 => (true, false, false),
        LlamaFamily::Qwen3 => {
            let attention = k.bool_or("attention_bias", false)?;
            (attention, attention, false)
        }
    };
    let sliding_window = match model_type {
        LlamaFamily::Llama => None,
        LlamaFamily::Mistral => {
            if map.contains_key("sliding_window") {
                k.u64_opt("sliding_window")?
            } else {
                family.sliding_window
            }
        }
        LlamaFamily::Qwen2 | LlamaFamily::Qwen3 => qwen_window(&k, n_layers)?,
    };
    Ok(LlamaConfig {
        model_type,
        vocab_size,
        dim,
        n_layers,
        n_heads,
        n_kv_heads,
        head_dim,
        ffn_dim,
        norm_eps: k.f64_opt("rms_norm_eps")?.unwrap_or(1e-6),
        rope: rope(&k, max_position_embeddings)?,
        max_position_embeddings,
        tie_embeddings: k.bool_or("tie_word_embeddings", false)?,
        qkv_bias,
        o_proj_bias,
        mlp_bias,
        initializer_range: k.f64_opt("initializer_range")?.unwrap_or(0.02),
        pad_token_id: k.u64_opt("pad_token_id")?,
        sliding_window,
    })
}

/// Qwen2 and Qwen3 slide their window only where `use_sliding_window` is on, in the layers
/// from `max_window_layers` (or those `layer_types` marks `sliding_attention`, 5.x).
fn qwen_window(k: &Keys, n_layers: u64) -> Result<Option<u64>, HfError> {
    if !k.bool_or("use_sliding_window", false)? {
        return Ok(None);
    }
    let window = k.u64_opt("sliding_window")?.unwrap_or(4096);
    let sliding_layers = match k.get("layer_types").and_then(Value::as_array) {
        Some(types) => types
            .iter()
            .any(|t| t.as_str() == Some("sliding_attention")),
        None => k.u64_opt("max_window_layers")?.unwrap_or(28) < n_layers,
    };
    Ok(sliding_layers.then_some(window))
}

/// The rotary settings: 4.x's `rope_scaling` wins over 5.x's `rope_parameters` (as
/// `transformers` does), `rope_theta` inside them over the top-level key.
fn rope(k: &Keys, max_position_embeddings: u64) -> Result<Rope, HfError> {
    let (key, params) = match (k.get("rope_scaling"), k.get("rope_parameters")) {
        (Some(v), _) => ("rope_scaling", v),
        (None, Some(v)) => ("rope_parameters", v),
        (None, None) => ("rope_parameters", &Value::Null),
    };
    let empty = Map::new();
    let map = match params {
        Value::Null => &empty,
        Value::Object(map) => map,
        other => return Err(k.invalid(key, format!("is {other}, expected an object"))),
    };
    let prefix = format!("{key}.");
    let p = Keys {
        map,
        path: k.path,
        prefix: &prefix,
    };
    if map.values().any(Value::is_object) {
        return Err(k.unsupported(
            key,
            "holds rotary settings per layer type; this architecture has one for all layers",
        ));
    }
    let theta = match p.f64_opt("rope_theta")? {
        Some(t) => t,
        None => k.f64_opt("rope_theta")?.unwrap_or(10_000.0),
    };
    // Named where the file writes it: in the rotary settings, or beside them.
    let partial = match p.f64_opt("partial_rotary_factor")? {
        Some(f) => Some((&p, f)),
        None => k.f64_opt("partial_rotary_factor")?.map(|f| (k, f)),
    };
    if let Some((keys, f)) = partial.filter(|&(_, f)| f != 1.0) {
        return Err(keys.unsupported(
            "partial_rotary_factor",
            format!("{f} is not supported: rotary embeddings here cover the whole head"),
        ));
    }
    // 4.x configs may say `type` for `rope_type`; messages name the key the file has.
    let (type_key, rope_type) = match p.str_opt("rope_type")? {
        Some(t) => ("rope_type", t),
        None => ("type", p.str_opt("type")?.unwrap_or("default")),
    };
    // The context the model was pretrained on: a top-level key wins (as transformers does),
    // then the rope settings', then max_position_embeddings.
    let original_max_position_embeddings = match k.u64_opt("original_max_position_embeddings")? {
        Some(n) => n,
        None => p
            .u64_opt("original_max_position_embeddings")?
            .unwrap_or(max_position_embeddings),
    };
    let scaling = match rope_type {
        "default" => RopeScaling::Default,
        "linear" => RopeScaling::Linear {
            factor: p.f64_req("factor")?,
        },
        "llama3" => RopeScaling::Llama3 {
            factor: p.f64_req("factor")?,
            low_freq_factor: p.f64_req("low_freq_factor")?,
            high_freq_factor: p.f64_req("high_freq_factor")?,
            original_max_position_embeddings,
        },
        "yarn" => {
            let factor = p.f64_req("factor")?;
            // DeepSeek's form of the attention factor, as transformers reads it (a zero is
            // unset).
            let mscales = (p.f64_opt("mscale")?, p.f64_opt("mscale_all_dim")?);
            let attention_factor = match (p.f64_opt("attention_factor")?, mscales) {
                (Some(given), _) => Some(given),
                (None, (Some(m), Some(all))) if m != 0.0 && all != 0.0 => {
                    Some(yarn_mscale(factor, m) / yarn_mscale(factor, all))
                }
                (None, _) => None,
            };
            RopeScaling::Yarn {
                factor,
                original_max_position_embeddings,
                attention_factor,
                beta_fast: p
                    .f64_opt("beta_fast")?
                    .unwrap_or(RopeScaling::YARN_BETA_FAST),
                beta_slow: p
                    .f64_opt("beta_slow")?
                    .unwrap_or(RopeScaling::YARN_BETA_SLOW),
                truncate: p.bool_or("truncate", RopeScaling::YARN_TRUNCATE)?,
            }
        }
        "dynamic" => RopeScaling::Dynamic {
            factor: p.f64_req("factor")?,
        },
        other => {
            return Err(p.unsupported(
                type_key,
                format!("\"{other}\" is not supported; supported rope types: {SUPPORTED_ROPE}"),
            ))
        }
    };
    Ok(Rope { theta, scaling })
}

/// A `config.json` for a model trained from scratch, in the transformers 5.x dialect with the
/// 4.x keys beside it (`rope_theta`, `rope_scaling`, `torch_dtype`), so both read it.
pub fn config_json(config: &LlamaConfig, dtype: &str) -> Value {
    // `RopeScaling` serialises as transformers names the rope settings: `rope_type` and the
    // type's own keys.
    let Ok(Value::Object(mut scaling)) = serde_json::to_value(config.rope.scaling) else {
        unreachable!("rope settings serialise to an object")
    };
    let rope_scaling =
        (config.rope.scaling != RopeScaling::Default).then(|| Value::Object(scaling.clone()));
    scaling.insert("rope_theta".into(), json!(config.rope.theta));
    let mut v = json!({
        "architectures": [config.model_type.architecture()],
        "model_type": config.model_type.model_type(),
        "vocab_size": config.vocab_size,
        "hidden_size": config.dim,
        "intermediate_size": config.ffn_dim,
        "num_hidden_layers": config.n_layers,
        "num_attention_heads": config.n_heads,
        "num_key_value_heads": config.n_kv_heads,
        "head_dim": config.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": config.max_position_embeddings,
        "initializer_range": config.initializer_range,
        "rms_norm_eps": config.norm_eps,
        "tie_word_embeddings": config.tie_embeddings,
        "pad_token_id": config.pad_token_id,
        "attention_dropout": 0.0,
        "rope_theta": config.rope.theta,
        "rope_scaling": rope_scaling,
        "rope_parameters": Value::Object(scaling),
        "dtype": dtype,
        "torch_dtype": dtype,
        "use_cache": true,
    });
    let map = v.as_object_mut().expect("a JSON object");
    match config.model_type {
        LlamaFamily::Llama => {
            map.insert("attention_bias".into(), json!(config.qkv_bias));
            map.insert("mlp_bias".into(), json!(config.mlp_bias));
        }
        LlamaFamily::Mistral => {
            map.insert("sliding_window".into(), json!(config.sliding_window));
        }
        LlamaFamily::Qwen2 | LlamaFamily::Qwen3 => {
            map.insert(
                "use_sliding_window".into(),
                json!(config.sliding_window.is_some()),
            );
            map.insert("sliding_window".into(), json!(config.sliding_window));
            map.insert("max_window_layers".into(), json!(0));
            if config.model_type == LlamaFamily::Qwen3 {
                map.insert("attention_bias".into(), json!(config.qkv_bias));
            }
        }
    }
    v
}

pub const GENERATION_CONFIG_FILE: &str = "generation_config.json";

/// `generation_config.json` as `save_pretrained` derives it from a model's config when the
/// model has none of its own (`GenerationConfig.from_model_config`): the special token ids
/// and the cache setting. `None` when the config names no end-of-sequence token: generation
/// would not know where text ends, and `from_pretrained` derives the same on loading.
pub fn generation_config_json(config: &Value) -> Option<Value> {
    let set = |key: &str| config.get(key).filter(|v| !v.is_null()).cloned();
    let eos = set("eos_token_id")?;
    let mut out = Map::new();
    out.insert("_from_model_config".into(), json!(true));
    if let Some(bos) = set("bos_token_id") {
        out.insert("bos_token_id".into(), bos);
    }
    out.insert("eos_token_id".into(), eos);
    for key in ["pad_token_id", "use_cache"] {
        if let Some(value) = set(key) {
            out.insert(key.into(), value);
        }
    }
    Some(Value::Object(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_generation_config_carries_the_token_ids_of_the_model_config() {
        let mut config = base();
        assert_eq!(generation_config_json(&config), None, "no eos, no file");
        config["bos_token_id"] = Value::Null;
        config["eos_token_id"] = json!(256);
        config["pad_token_id"] = json!(0);
        config["use_cache"] = json!(true);
        assert_eq!(
            generation_config_json(&config),
            Some(
                json!({"_from_model_config": true, "eos_token_id": 256, "pad_token_id": 0, "use_cache": true})
            )
        );
    }

    fn parse(v: Value) -> Result<LlamaConfig, HfError> {
        parse_config(&v, Path::new("/m/config.json"))
    }

    fn base() -> Value {
        json!({
            "model_type": "llama", "vocab_size": 128, "hidden_size": 64,
            "intermediate_size": 160, "num_hidden_layers": 2, "num_attention_heads": 4,
            "num_key_value_heads": 2, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
            "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                             "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
            "max_position_embeddings": 131072, "tie_word_embeddings": true,
            "torch_dtype": "bfloat16"
        })
    }

    #[test]
    fn both_dialects_give_the_same_architecture() {
        let old = parse(base()).unwrap();
        let mut new = base();
        let m = new.as_object_mut().unwrap();
        m.remove("rope_theta");
        let mut params = m.remove("rope_scaling").unwrap();
        params["rope_theta"] = json!(500000.0);
        m.insert("rope_parameters".into(), params);
        assert_eq!(parse(new).unwrap(), old);
        assert_eq!(old.head_dim, 16);
        assert_eq!(old.n_kv_heads, 2);
        assert!(old.tie_embeddings);
        assert_eq!(
            old.rope,
            Rope {
                theta: 500000.0,
                scaling: RopeScaling::Llama3 {
                    factor: 8.0,
                    low_freq_factor: 1.0,
                    high_freq_factor: 4.0,
                    original_max_position_embeddings: 8192
                }
            }
        );
        // What an export writes reads back as the same architecture.
        assert_eq!(parse(config_json(&old, "float32")).unwrap(), old);
    }

    #[test]
    fn unsupported_settings_name_their_key() {
        let mut v = base();
        v["model_type"] = json!("gpt2");
        let e = parse(v).unwrap_err().to_string();
        assert!(
            e.contains("`model_type`") && e.contains("llama, mistral, qwen2"),
            "{e}"
        );
        let mut v = base();
        v["rope_scaling"]["rope_type"] = json!("longrope");
        let e = parse(v).unwrap_err().to_string();
        assert!(
            e.contains("`rope_scaling.rope_type`") && e.contains("\"longrope\""),
            "{e}"
        );
        // Named where the file writes it.
        let mut v = base();
        v["partial_rotary_factor"] = json!(0.5);
        let e = parse(v).unwrap_err().to_string();
        assert!(
            e.contains("`partial_rotary_factor`") && !e.contains("rope_scaling.partial"),
            "{e}"
        );
        let mut v = base();
        v["rope_scaling"]["partial_rotary_factor"] = json!(0.5);
        let e = parse(v).unwrap_err().to_string();
        assert!(e.contains("`rope_scaling.partial_rotary_factor`"), "{e}");
        let mut v = base();
        v.as_object_mut().unwrap().remove("hidden_size");
        let e = parse(v).unwrap_err().to_string();
        assert!(e.contains("`hidden_size`: is missing"), "{e}");
        let mut v = base();
        v["hidden_act"] = json!("gelu");
        assert!(parse(v).unwrap_err().to_string().contains("`hidden_act`"));
    }

    #[test]
    fn a_dtype_pytorch_does_not_have_is_named() {
        for (key, value, said) in [
            (
                "dtype",
                json!("float7"),
                "\"float7\" is not a PyTorch floating-point dtype",
            ),
            (
                "torch_dtype",
                json!("int8"),
                "\"int8\" is not a PyTorch floating-point dtype",
            ),
            ("dtype", json!(5), "is 5, expected a string"),
        ] {
            let mut v = base();
            v[key] = value;
            let e = parse(v).unwrap_err().to_string();
            assert!(e.contains(&format!("`{key}`")) && e.contains(said), "{e}");
        }
        for name in ["bfloat16", "float16", "float32", "float64"] {
            let mut v = base();
            v["torch_dtype"] = json!(name);
            v["dtype"] = json!(name);
            assert!(parse(v).is_ok(), "{name}");
        }
        let mut v = base();
        v["dtype"] = Value::Null;
        assert!(parse(v).is_ok());
    }

    #[test]
    fn swish_is_silu() {
        let mut v = base();
        v["hidden_act"] = json!("silu");
        let silu = parse(v.clone()).unwrap();
        v["hidden_act"] = json!("swish");
        assert_eq!(parse(v).unwrap(), silu);
    }

    #[test]
    fn dynamic_rope_trains_within_max_position_embeddings() {
        // 4.x writes `type`, 5.x `rope_type`: both read, and errors name the key written.
        for key in ["type", "rope_type"] {
            let mut v = base();
            v["max_position_embeddings"] = json!(64);
            v["rope_scaling"] = json!({ key: "dynamic", "factor": 2.0 });
            let c = parse(v.clone()).unwrap();
            assert_eq!(c.rope.scaling, RopeScaling::Dynamic { factor: 2.0 });
            assert_eq!(parse(config_json(&c, "float32")).unwrap(), c);
            assert!(c.validate(64).is_ok());
            let e = c.validate(65).unwrap_err();
            assert!(
                e.contains("rope_type dynamic") && e.contains("seq_len <= 64"),
                "{e}"
            );
            v["rope_scaling"][key] = json!("longrope");
            let e = parse(v).unwrap_err().to_string();
            assert!(e.contains(&format!("`rope_scaling.{key}`")), "{e}");
        }
    }

    #[test]
    fn yarn_takes_transformers_defaults_and_attention_factor() {
        // Qwen3's long-context setting, as its model card gives it.
        let mut v = base();
        v["model_type"] = json!("qwen3");
        v["rope_scaling"] = json!({"rope_type": "yarn", "factor": 4.0,
                                   "original_max_position_embeddings": 32768});
        let c = parse(v.clone()).unwrap();
        assert_eq!(c.rope.scaling, RopeScaling::yarn(4.0, 32768));
        assert!(c.validate(4096).is_ok());
        // transformers' `_compute_yarn_parameters` gives these attention factors.
        let factor = |s: RopeScaling| s.attention_factor();
        assert!((factor(c.rope.scaling) - 1.138629436111989).abs() < 1e-12);
        assert_eq!(factor(RopeScaling::yarn(0.5, 32768)), 1.0);
        let mut deepseek = v.clone();
        deepseek["rope_scaling"] = json!({"rope_type": "yarn", "factor": 40.0, "mscale": 1.0,
                                          "mscale_all_dim": 0.707});
        let scaling = parse(deepseek.clone()).unwrap().rope.scaling;
        assert!((factor(scaling) - 1.0857263992561355).abs() < 1e-12);
        deepseek["rope_scaling"]["mscale"] = json!(0.0);
        let scaling = parse(deepseek).unwrap().rope.scaling;
        assert!((factor(scaling) - (0.1 * 40f64.ln() + 1.0)).abs() < 1e-12);
        assert_eq!(RopeScaling::Default.attention_factor(), 1.0);
        // Every option survives an export; a top-level original context wins, and without
        // either the model's own is the original.
        v["rope_scaling"]["beta_fast"] = json!(16.0);
        v["rope_scaling"]["truncate"] = json!(false);
        v["rope_scaling"]["attention_factor"] = json!(1.5);
        let c = parse(v.clone()).unwrap();
        assert_eq!(parse(config_json(&c, "float32")).unwrap(), c);
        assert_eq!(c.rope.scaling.attention_factor(), 1.5);
        v["original_max_position_embeddings"] = json!(8192);
        let original = |c: LlamaConfig| match c.rope.scaling {
            RopeScaling::Yarn {
                original_max_position_embeddings,
                ..
            } => original_max_position_embeddings,
            other => panic!("{other:?}"),
        };
        assert_eq!(original(parse(v.clone()).unwrap()), 8192);
        let m = v.as_object_mut().unwrap();
        m.remove("original_max_position_embeddings");
        m["rope_scaling"]
            .as_object_mut()
            .unwrap()
            .remove("original_max_position_embeddings");
        assert_eq!(original(parse(v.clone()).unwrap()), 131072);
        v["rope_scaling"]["beta_slow"] = json!(32.0);
        let e = parse(v).unwrap().validate(64).unwrap_err();
        assert!(e.contains("beta_fast > beta_slow"), "{e}");
        v = base();
        v["rope_scaling"] = json!({"rope_type": "yarn"});
        let e = parse(v).unwrap_err().to_string();
        assert!(e.contains("`rope_scaling.factor`: is missing"), "{e}");
    }

    #[test]
    fn mistral_window_and_qwen2_biases() {
        let mut v = base();
        v["model_type"] = json!("mistral");
        let m = parse(v.clone()).unwrap();
        assert_eq!(m.sliding_window, Some(4096), "MistralConfig's default");
        v["sliding_window"] = Value::Null;
        assert_eq!(parse(v).unwrap().sliding_window, None);
        let mut v = base();
        v["model_type"] = json!("qwen2");
        let q = parse(v.clone()).unwrap();
        assert_eq!(
            (q.qkv_bias, q.o_proj_bias, q.sliding_window),
            (true, false, None)
        );
        v["use_sliding_window"] = json!(true);
        v["max_window_layers"] = json!(1);
        v["sliding_window"] = json!(32);
        assert_eq!(parse(v).unwrap().sliding_window, Some(32));
    }

    #[test]
    fn qwen3_takes_its_config_class_defaults_and_writes_them_back() {
        let mut v = base();
        v["model_type"] = json!("qwen3");
        let q = parse(v.clone()).unwrap();
        assert!(q.qk_norm());
        assert_eq!(
            (q.qkv_bias, q.o_proj_bias, q.mlp_bias, q.sliding_window),
            (false, false, false, None)
        );
        // Qwen3Config's head_dim (128) applies when config.json leaves it out, not
        // hidden_size / num_attention_heads (16 here).
        assert_eq!(q.head_dim, 128);
        v["head_dim"] = json!(16);
        v["attention_bias"] = json!(true);
        let q = parse(v).unwrap();
        assert_eq!((q.head_dim, q.qkv_bias, q.o_proj_bias), (16, true, true));
        q.validate(64).unwrap();
        let written = config_json(&q, "bfloat16");
        assert_eq!(written["architectures"], json!(["Qwen3ForCausalLM"]));
        assert_eq!(parse(written).unwrap(), q);
    }

    #[test]
    fn the_published_qwen3_small_config_reads_as_transformers_builds_it() {
        // Qwen3-0.6B's config.json (transformers 4.51 dialect): 16 heads of 128 on a hidden
        // size of 1024, so the attention is wider than the residual stream.
        let v = json!({
            "architectures": ["Qwen3ForCausalLM"], "attention_bias": false,
            "attention_dropout": 0.0, "bos_token_id": 151643, "eos_token_id": 151645,
            "head_dim": 128, "hidden_act": "silu", "hidden_size": 1024,
            "initializer_range": 0.02, "intermediate_size": 3072,
            "max_position_embeddings": 40960, "max_window_layers": 28, "model_type": "qwen3",
            "num_attention_heads": 16, "num_hidden_layers": 28, "num_key_value_heads": 8,
            "rms_norm_eps": 1e-06, "rope_scaling": null, "rope_theta": 1000000,
            "sliding_window": null, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
            "use_cache": true, "use_sliding_window": false, "vocab_size": 151936
        });
        let c = parse(v).unwrap();
        c.validate(4096).unwrap();
        assert_eq!(
            (c.head_dim, c.n_kv_heads, c.rope.theta, c.sliding_window),
            (128, 8, 1e6, None)
        );
        assert_eq!(c.rope.scaling, RopeScaling::Default);
        // sum(p.numel() for p in Qwen3ForCausalLM(config).parameters()), built on the meta
        // device with transformers 5.23.
        assert_eq!(c.describe().num_params(), 596_049_920);
    }
}
