//! Chat records rendered with the model's own chat template, as `transformers`'
//! `apply_chat_template` renders them (Jinja with `trim_blocks` and `lstrip_blocks`, Python
//! string methods, `raise_exception`, `strftime_now`, a `tojson` that writes what Python's
//! `json.dumps` writes, and the tokenizer's special tokens as variables).
//!
//! Which characters the assistant wrote is found by rendering prefixes of the conversation:
//! the text up to turn `i` with the generation prompt (`<|im_start|>assistant\n`), and the
//! text through turn `i`; the assistant's span lies between them, trailing whitespace (the
//! template's glue) excluded. This needs no `{% generation %}` markers, which few templates
//! have, and it refuses templates that render earlier turns differently once later turns
//! follow (it could not tell the turns apart there).

use crate::error::{DataError, Result};
use crate::tokenizer::TextTokenizer;
use minijinja::value::{Kwargs, ValueKind};
use minijinja::{Environment, Error, ErrorKind, Value};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::ops::Range;
use std::path::{Path, PathBuf};

/// Roles a message may have.
pub const ROLES: [&str; 6] = [
    "system",
    "developer",
    "user",
    "assistant",
    "tool",
    "ipython",
];

pub struct ChatTemplate {
    env: Environment<'static>,
    /// Where the template was read from.
    pub path: PathBuf,
    /// sha256 of the template text (part of the cache key).
    pub hash: String,
    /// The special tokens every render sees (`bos_token`, `eos_token`, ...).
    variables: BTreeMap<String, Value>,
}

const TEMPLATE_NAME: &str = "chat_template";

impl ChatTemplate {
    /// The template named in the spec, else the tokenizer folder's `chat_template.jinja`,
    /// `chat_template.json` or `tokenizer_config.json`'s `chat_template`.
    pub fn load(tokenizer: &TextTokenizer, explicit: Option<&Path>) -> Result<ChatTemplate> {
        let (path, source) = match explicit {
            Some(path) => (
                path.to_path_buf(),
                std::fs::read_to_string(path).map_err(|e| DataError::ChatTemplate {
                    path: path.to_path_buf(),
                    why: format!("cannot be read: {e}"),
                })?,
            ),
            None => find_in_folder(tokenizer)?,
        };
        ChatTemplate::from_source(path, source, &tokenizer.template_tokens)
    }

    pub fn from_source(
        path: PathBuf,
        source: String,
        special_tokens: &BTreeMap<String, String>,
    ) -> Result<ChatTemplate> {
        let hash = hex::encode(&Sha256::digest(source.as_bytes())[..12]);
        let mut env = Environment::new();
        // What `transformers` configures its Jinja environment with.
        let syntax = minijinja::syntax::SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()
            .map_err(|e| DataError::ChatTemplate {
                path: path.clone(),
                why: e.to_string(),
            })?;
        env.set_syntax(syntax);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function(
            "raise_exception",
            |message: String| -> Result<Value, Error> {
                Err(Error::new(ErrorKind::InvalidOperation, message))
            },
        );
        env.add_function("strftime_now", strftime_now);
        env.add_filter("tojson", tojson);
        env.add_template_owned(TEMPLATE_NAME, source)
            .map_err(|e| DataError::ChatTemplate {
                path: path.clone(),
                why: format!("not a valid Jinja template: {}", describe(&e)),
            })?;
        let variables = special_tokens
            .iter()
            .map(|(k, v)| (k.clone(), Value::from(v.as_str())))
            .collect();
        Ok(ChatTemplate {
            env,
            path,
            hash,
            variables,
        })
    }

    /// The conversation as text, like `apply_chat_template(messages, tokenize=False,
    /// add_generation_prompt=...)`.
    pub fn render(
        &self,
        messages: &[Value],
        add_generation_prompt: bool,
    ) -> std::result::Result<String, String> {
        self.render_with_tools(messages, None, add_generation_prompt)
    }

    /// [`ChatTemplate::render`] with the tool definitions a record offers (`tools=` of
    /// `apply_chat_template`).
    pub fn render_with_tools(
        &self,
        messages: &[Value],
        tools: Option<&Value>,
        add_generation_prompt: bool,
    ) -> std::result::Result<String, String> {
        let mut context = self.variables.clone();
        context.insert("messages".into(), Value::from(messages.to_vec()));
        context.insert(
            "add_generation_prompt".into(),
            Value::from(add_generation_prompt),
        );
        context.insert("tools".into(), tools.cloned().unwrap_or(Value::from(())));
        context.insert("documents".into(), Value::from(()));
        let template = self
            .env
            .get_template(TEMPLATE_NAME)
            .map_err(|e| describe(&e))?;
        template
            .render(Value::from(context))
            .map_err(|e| format!("the chat template failed: {}", describe(&e)))
    }

    /// The whole conversation and the byte ranges of it the assistant wrote.
    pub fn render_for_training(
        &self,
        messages: &[Value],
        tools: Option<&Value>,
    ) -> std::result::Result<(String, Vec<Range<usize>>), String> {
        let full = self.render_with_tools(messages, tools, false)?;
        let mut spans = Vec::new();
        for (i, message) in messages.iter().enumerate() {
            if role(message).as_deref() != Some("assistant") {
                continue;
            }
            let prompt = self.render_with_tools(&messages[..i], tools, true)?;
            let through = self.render_with_tools(&messages[..=i], tools, false)?;
            if !through.starts_with(&prompt) || !full.starts_with(&through) {
                return Err(format!(
                    "the chat template renders message {} differently once later messages follow, \
                     so the assistant's tokens cannot be told apart (templates that drop earlier \
                     turns' reasoning do this); give `data.chat_template` a template that renders \
                     the conversation as growing prefixes",
                    i + 1
                ));
            }
            let end = through.trim_end().len().max(prompt.len());
            if end > prompt.len() {
                spans.push(prompt.len()..end);
            }
        }
        Ok((full, spans))
    }
}

/// The messages of a chat record, checked: a list of objects with a known string `role`.
pub fn messages_of(record: &Value, field: &str) -> std::result::Result<Vec<Value>, String> {
    if record.kind() != ValueKind::Map {
        return Err("the record is not a JSON object".into());
    }
    let messages = record.get_attr(field).unwrap_or(Value::UNDEFINED);
    if messages.is_undefined() {
        return Err(format!("no field `{field}` (the messages) in the record"));
    }
    if messages.kind() != ValueKind::Seq {
        return Err(format!("field `{field}` is not a list of messages"));
    }
    let list: Vec<Value> = messages.try_iter().map_err(|e| e.to_string())?.collect();
    if list.is_empty() {
        return Err(format!("field `{field}` holds no messages"));
    }
    for (i, message) in list.iter().enumerate() {
        if message.kind() != ValueKind::Map {
            return Err(format!("message {} is not an object", i + 1));
        }
        match role(message) {
            Some(r) if ROLES.contains(&r.as_str()) => {}
            Some(r) => {
                return Err(format!(
                    "message {} has role `{r}`; chat data takes the roles {}",
                    i + 1,
                    ROLES.join(", ")
                ))
            }
            None => return Err(format!("message {} has no string `role`", i + 1)),
        }
    }
    Ok(list)
}

fn role(message: &Value) -> Option<String> {
    message.get_attr("role").ok()?.as_str().map(str::to_string)
}

fn find_in_folder(tokenizer: &TextTokenizer) -> Result<(PathBuf, String)> {
    let folder = tokenizer.folder.clone().ok_or_else(|| {
        DataError::Config(
            "chat data needs a chat template: use a Hugging Face tokenizer folder that has one, \
             or name a Jinja file in `data.chat_template`"
                .into(),
        )
    })?;
    let jinja = folder.join("chat_template.jinja");
    if jinja.is_file() {
        let text = std::fs::read_to_string(&jinja).map_err(DataError::io("read", &jinja))?;
        return Ok((jinja, text));
    }
    for name in ["chat_template.json", "tokenizer_config.json"] {
        let path = folder.join(name);
        let Ok(bytes) = std::fs::read(&path) else {
            continue;
        };
        let json: serde_json::Value =
            serde_json::from_slice(&bytes).map_err(|e| DataError::ChatTemplate {
                path: path.clone(),
                why: format!("not valid JSON ({e})"),
            })?;
        match json.get("chat_template") {
            Some(serde_json::Value::String(text)) => return Ok((path, text.clone())),
            // Several named templates: the default one, as `transformers` picks.
            Some(serde_json::Value::Array(named)) => {
                let default = named.iter().find(|t| t["name"] == "default");
                if let Some(text) = default.and_then(|t| t["template"].as_str()) {
                    return Ok((path, text.to_string()));
                }
            }
            _ => {}
        }
    }
    Err(DataError::ChatTemplate {
        path: folder,
        why: "no chat template (chat_template.jinja, or `chat_template` in \
              tokenizer_config.json); name a Jinja file in `data.chat_template`"
            .into(),
    })
}

/// A minijinja error with its template line and the causes it wraps.
fn describe(e: &Error) -> String {
    let mut text = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(cause) = source {
        text.push_str(&format!(": {cause}"));
        source = cause.source();
    }
    text
}

fn strftime_now(format: String) -> std::result::Result<String, Error> {
    let c_format = std::ffi::CString::new(format)
        .map_err(|_| Error::new(ErrorKind::InvalidOperation, "format holds a NUL byte"))?;
    let mut buf = vec![0u8; 256];
    // SAFETY: `tm` is written by localtime_r before strftime reads it; strftime writes at
    // most `buf.len()` bytes and returns how many.
    let written = unsafe {
        let now = libc::time(std::ptr::null_mut());
        let mut tm: libc::tm = std::mem::zeroed();
        libc::localtime_r(&now, &mut tm);
        libc::strftime(buf.as_mut_ptr().cast(), buf.len(), c_format.as_ptr(), &tm)
    };
    buf.truncate(written);
    Ok(String::from_utf8_lossy(&buf).into_owned())
}

/// `transformers` replaces Jinja's `tojson` with `json.dumps(x, ensure_ascii=False,
/// indent=indent, separators=separators, sort_keys=sort_keys)`; this writes the same text.
fn tojson(value: Value, kwargs: Kwargs) -> std::result::Result<String, Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    let ensure_ascii: Option<bool> = kwargs.get("ensure_ascii")?;
    let separators: Option<Vec<String>> = kwargs.get("separators")?;
    kwargs.assert_all_used()?;
    let (item, key) = match separators.as_deref() {
        Some([item, key]) => (item.clone(), key.clone()),
        Some(_) => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                "tojson: separators is a pair (item, key)",
            ))
        }
        None if indent.is_some() => (",".to_string(), ": ".to_string()),
        None => (", ".to_string(), ": ".to_string()),
    };
    let style = JsonStyle {
        indent,
        sort_keys: sort_keys.unwrap_or(false),
        ensure_ascii: ensure_ascii.unwrap_or(false),
        item,
        key,
    };
    let mut out = String::new();
    style.write(&value, 0, &mut out)?;
    Ok(out)
}

struct JsonStyle {
    indent: Option<usize>,
    sort_keys: bool,
    ensure_ascii: bool,
    item: String,
    key: String,
}

impl JsonStyle {
    fn write(
        &self,
        value: &Value,
        depth: usize,
        out: &mut String,
    ) -> std::result::Result<(), Error> {
        match value.kind() {
            ValueKind::Undefined | ValueKind::None => out.push_str("null"),
            ValueKind::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
            ValueKind::Number => {
                if let Some(i) = value.as_i64().filter(|_| value.is_integer()) {
                    out.push_str(&i.to_string());
                } else {
                    let f = f64::try_from(value.clone())?;
                    out.push_str(&python_float(f));
                }
            }
            ValueKind::String => self.string(value.as_str().unwrap_or_default(), out),
            ValueKind::Seq | ValueKind::Iterable => {
                let items: Vec<Value> = value.try_iter()?.collect();
                self.container('[', ']', items.len(), depth, out, |i, out| {
                    self.write(&items[i], depth + 1, out)
                })?;
            }
            ValueKind::Map => {
                let mut keys: Vec<Value> = value.try_iter()?.collect();
                if self.sort_keys {
                    keys.sort_by_key(|k| k.to_string());
                }
                self.container('{', '}', keys.len(), depth, out, |i, out| {
                    let k = &keys[i];
                    match k.as_str() {
                        Some(s) => self.string(s, out),
                        None => self.string(&k.to_string(), out),
                    }
                    out.push_str(&self.key);
                    self.write(&value.get_item(k)?, depth + 1, out)
                })?;
            }
            _ => self.string(&value.to_string(), out),
        }
        Ok(())
    }

    fn container(
        &self,
        open: char,
        close: char,
        len: usize,
        depth: usize,
        out: &mut String,
        mut item: impl FnMut(usize, &mut String) -> std::result::Result<(), Error>,
    ) -> std::result::Result<(), Error> {
        out.push(open);
        if len == 0 {
            out.push(close);
            return Ok(());
        }
        for i in 0..len {
            if i > 0 {
                out.push_str(&self.item);
            }
            if let Some(n) = self.indent {
                out.push('\n');
                out.push_str(&" ".repeat(n * (depth + 1)));
            }
            item(i, out)?;
        }
        if let Some(n) = self.indent {
            out.push('\n');
            out.push_str(&" ".repeat(n * depth));
        }
        out.push(close);
        Ok(())
    }

    fn string(&self, s: &str, out: &mut String) {
        out.push('"');
        for c in s.chars() {
            match c {
                '"' => out.push_str("\\\""),
                '\\' => out.push_str("\\\\"),
                '\n' => out.push_str("\\n"),
                '\r' => out.push_str("\\r"),
                '\t' => out.push_str("\\t"),
                '\u{8}' => out.push_str("\\b"),
                '\u{c}' => out.push_str("\\f"),
                c if (c as u32) < 0x20 || (self.ensure_ascii && !c.is_ascii()) => {
                    let mut units = [0u16; 2];
                    for unit in c.encode_utf16(&mut units) {
                        out.push_str(&format!("\\u{unit:04x}"));
                    }
                }
                c => out.push(c),
            }
        }
        out.push('"');
    }
}

/// Python's `repr(float)`: shortest round-trip digits, exponent as `e+XX` / `e-XX` outside
/// [1e-4, 1e16).
fn python_float(f: f64) -> String {
    if f.is_nan() {
        return "NaN".into();
    }
    if f.is_infinite() {
        return if f > 0.0 { "Infinity" } else { "-Infinity" }.into();
    }
    let abs = f.abs();
    if abs != 0.0 && !(1e-4..1e16).contains(&abs) {
        let text = format!("{f:e}");
        let (mantissa, exp) = text.split_once('e').unwrap_or((&text, "0"));
        let exp: i32 = exp.parse().unwrap_or(0);
        let sign = if exp < 0 { '-' } else { '+' };
        return format!("{mantissa}e{sign}{:02}", exp.abs());
    }
    let text = format!("{f}");
    if text.contains('.') {
        text
    } else {
        format!("{text}.0")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn template(source: &str) -> ChatTemplate {
        let tokens = BTreeMap::from([("eos_token".to_string(), "</s>".to_string())]);
        ChatTemplate::from_source("t.jinja".into(), source.into(), &tokens).unwrap()
    }

    fn messages(json: &str) -> Vec<Value> {
        let record: Value = serde_json::from_str(json).unwrap();
        messages_of(&record, "messages").unwrap()
    }

    #[test]
    fn python_json_and_floats() {
        let t = template("{{ x | tojson }}|{{ x | tojson(indent=2) }}");
        let mut ctx: BTreeMap<String, Value> = BTreeMap::new();
        let x: Value = serde_json::from_str(r#"{"b": [1, 2.5, "é\n"], "a": null}"#).unwrap();
        ctx.insert("x".into(), x);
        let out = t
            .env
            .get_template(TEMPLATE_NAME)
            .unwrap()
            .render(Value::from(ctx))
            .unwrap();
        assert_eq!(
            out,
            "{\"b\": [1, 2.5, \"é\\n\"], \"a\": null}|{\n  \"b\": [\n    1,\n    2.5,\n    \"é\\n\"\n  ],\n  \"a\": null\n}"
        );
        assert_eq!(python_float(1.0), "1.0");
        assert_eq!(python_float(1e20), "1e+20");
        assert_eq!(python_float(2.5e-7), "2.5e-07");
        assert_eq!(python_float(0.001), "0.001");
    }

    #[test]
    fn assistant_spans_exclude_glue_and_raise_exception_reports() {
        let t = template(
            "{% for m in messages %}{% if m.role == 'robot' %}{{ raise_exception('no robots') }}{% endif %}\
             <{{ m.role }}>{{ m.content.strip() }}{% if m.role == 'assistant' %}{{ eos_token }}{% endif %}{{ '\\n' }}{% endfor %}\
             {% if add_generation_prompt %}<assistant>{% endif %}",
        );
        let m = messages(
            r#"{"messages": [{"role": "user", "content": " hi "}, {"role": "assistant", "content": "yo"}]}"#,
        );
        let (text, spans) = t.render_for_training(&m, None).unwrap();
        assert_eq!(text, "<user>hi\n<assistant>yo</s>\n");
        assert_eq!(&text[spans[0].clone()], "yo</s>");
        let record: Value =
            serde_json::from_str(r#"{"messages": [{"role": "robot", "content": "x"}]}"#).unwrap();
        let err = messages_of(&record, "messages").unwrap_err();
        assert!(err.contains("role `robot`"), "{err}");
        let raw: Vec<Value> = record
            .get_attr("messages")
            .unwrap()
            .try_iter()
            .unwrap()
            .collect();
        let err = t.render(&raw, false).unwrap_err();
        assert!(err.contains("no robots"), "{err}");
    }
}
