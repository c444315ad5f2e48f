//! Chat records rendered with the model's own chat template, as `transformers`'
//! `apply_chat_template` renders them (Jinja with `trim_blocks` and `lstrip_blocks`, Python
//! string methods, `raise_exception`, `strftime_now`, a `tojson` that writes what Python's
//! `json.dumps` writes, `{% generation %}` blocks, and the tokenizer's special tokens as
//! variables). A folder with several named templates renders records that offer tools with
//! `tool_use` and the others with `default`, as `transformers` picks them.
//!
//! Messages are `{role, content}` objects, or ShareGPT's `{from, value}` (`human` is the
//! user, `gpt` the assistant). A record of TRL's conversational prompt-completion (`prompt`
//! and `completion` lists of messages) trains what follows the prompt, as TRL's
//! completion-only loss does.
//!
//! Which characters the assistant wrote: where the template has `{% generation %}` blocks,
//! what they render, as `transformers`' `return_assistant_tokens_mask` (and so TRL's
//! assistant-only loss) takes it. Most templates have none; there the conversation is rendered
//! as growing prefixes: the text up to turn `i` with the generation prompt
//! (`<|im_start|>assistant\n`), and the text through turn `i`; the assistant's span lies
//! between them, trailing whitespace (the template's glue) excluded, and so is what the
//! template writes only where a conversation ends (Phi-3's closing `eos_token`) unless the
//! turn is the last. Templates that render
//! earlier turns differently once later turns follow (reasoning models' drop the reasoning of
//! earlier answers) are refused there: the turns cannot be told apart. A conversation the
//! assistant opens has no prefix to render (templates read `messages[0]` unguarded): there the
//! opening turn is rendered with a marker in place of its content, and its span starts where
//! the marker does.

use crate::error::{DataError, Result};
use crate::tokenizer::TextTokenizer;
use minijinja::value::{Kwargs, ValueKind};
use minijinja::{Environment, Error, ErrorKind, Value};
use shardrun_models::hf::ADDITIONAL_CHAT_TEMPLATES;
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

/// What every render sets from the record (a spec's `chat_template_kwargs` cannot).
pub const RENDER_ARGUMENTS: [&str; 4] = ["messages", "tools", "documents", "add_generation_prompt"];

/// The template a folder's single template, or a spec's, is known by.
const DEFAULT: &str = "default";
/// The template `transformers` picks for a conversation with tools, when the folder has one.
const TOOL_USE: &str = "tool_use";

/// Stands in for the content of a conversation's opening assistant turn; no text holds it.
const CONTENT_MARKER: &str = "\u{e000}assistant-content\u{e000}";

/// Written where a `{% generation %}` block's output starts and ends, and taken out of the
/// text: Unicode noncharacters, set aside for a program's own use (records holding them are
/// refused).
const GENERATION_START: char = '\u{fdd0}';
const GENERATION_END: char = '\u{fdd1}';

/// One template of a tokenizer folder (or the spec's) and where it was read from.
pub struct NamedTemplate {
    pub name: String,
    pub path: PathBuf,
    pub source: String,
}

pub struct ChatTemplate {
    env: Environment<'static>,
    /// The templates in `env` by name.
    sources: BTreeMap<String, Source>,
    /// The special tokens every render sees (`bos_token`, `eos_token`, ...).
    variables: BTreeMap<String, Value>,
}

/// Where a template was read from, and whether it marks what the assistant writes.
struct Source {
    path: PathBuf,
    generation_blocks: bool,
}

impl ChatTemplate {
    /// The template named in the spec, else the tokenizer folder's: `chat_template.jinja`
    /// (`default`) and `additional_chat_templates/*.jinja`, else `tokenizer_config.json`'s
    /// `chat_template` (one, or a list of named ones), else a processor's
    /// `chat_template.json`.
    pub fn load(tokenizer: &TextTokenizer, explicit: Option<&Path>) -> Result<ChatTemplate> {
        let templates = match explicit {
            Some(path) => vec![NamedTemplate {
                name: DEFAULT.into(),
                path: path.to_path_buf(),
                source: std::fs::read_to_string(path).map_err(|e| DataError::ChatTemplate {
                    path: path.to_path_buf(),
                    why: format!("cannot be read: {e}"),
                })?,
            }],
            None => {
                let folder = tokenizer.folder.as_deref().ok_or_else(|| {
                    DataError::Config(
                        "chat data needs a chat template: use a Hugging Face tokenizer folder \
                         that has one, or name a Jinja file in `data.chat_template`"
                            .into(),
                    )
                })?;
                templates_in_folder(folder)?
            }
        };
        ChatTemplate::from_templates(templates, &tokenizer.template_tokens)
    }

    /// One template, used for every conversation.
    pub fn from_source(
        path: PathBuf,
        source: String,
        special_tokens: &BTreeMap<String, String>,
    ) -> Result<ChatTemplate> {
        let template = NamedTemplate {
            name: DEFAULT.into(),
            path,
            source,
        };
        ChatTemplate::from_templates(vec![template], special_tokens)
    }

    pub fn from_templates(
        templates: Vec<NamedTemplate>,
        special_tokens: &BTreeMap<String, String>,
    ) -> Result<ChatTemplate> {
        let mut env = Environment::new();
        // What `transformers` configures its Jinja environment with.
        let syntax = minijinja::syntax::SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()
            .map_err(|e| DataError::Config(format!("chat template syntax: {e}")))?;
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
        // A float prints as Python's `str` writes it (`1e+20`, not `100000000000000000000.0`):
        // where a template prints a value, and through the `string` and `trim` filters that
        // templates put message content through. (Joined by `~`, it keeps minijinja's form.)
        env.set_formatter(|out, state, value| match python_str_of_float(value) {
            Some(text) => out.write_str(&text).map_err(Error::from),
            None => minijinja::escape_formatter(out, state, value),
        });
        env.add_filter(
            "string",
            |state: &minijinja::State, value: Value| match python_str_of_float(&value) {
                Some(text) => Ok(Value::from(text)),
                None => minijinja::filters::string(state, &value),
            },
        );
        env.add_filter("trim", |value: Value, chars: Option<String>| {
            let text = python_str_of_float(&value).unwrap_or_else(|| value.to_string());
            match chars {
                Some(chars) => {
                    let chars: Vec<char> = chars.chars().collect();
                    text.trim_matches(&chars[..]).to_string()
                }
                None => text.trim().to_string(),
            }
        });
        let mut sources = BTreeMap::new();
        for template in templates {
            let (marked, generation_blocks) = mark_generation_blocks(&template.source);
            env.add_template_owned(template.name.clone(), marked)
                .map_err(|e| DataError::ChatTemplate {
                    path: template.path.clone(),
                    why: format!(
                        "not a valid Jinja template: {}",
                        describe(&e).replace(&format!("(in {}:", template.name), "(line ")
                    ),
                })?;
            let source = Source {
                path: template.path,
                generation_blocks,
            };
            sources.insert(template.name, source);
        }
        let variables = special_tokens
            .iter()
            .map(|(k, v)| (k.clone(), Value::from(v.as_str())))
            .collect();
        Ok(ChatTemplate {
            env,
            sources,
            variables,
        })
    }

    /// The spec's further variables, which every render sees too; they stand in for special
    /// tokens of the same name, as `apply_chat_template`'s keyword arguments do.
    pub fn with_kwargs(mut self, kwargs: &BTreeMap<String, serde_json::Value>) -> ChatTemplate {
        for (name, value) in kwargs {
            let value = serde_json::from_value(value.clone()).expect("JSON reads as a Jinja value");
            self.variables.insert(name.clone(), value);
        }
        self
    }

    /// Where the templates were read from (with their names when there are several), and
    /// which of them mark what the loss covers with `{% generation %}` blocks.
    pub fn origin(&self) -> String {
        let describe = |source: &Source| {
            let path = source.path.display();
            if source.generation_blocks {
                format!("{path} (its {{% generation %}} blocks mark what the loss covers)")
            } else {
                path.to_string()
            }
        };
        if self.sources.len() == 1 {
            if let Some(source) = self.sources.values().next() {
                return describe(source);
            }
        }
        let named: Vec<String> = self
            .sources
            .iter()
            .map(|(name, source)| format!("{name} from {}", describe(source)))
            .collect();
        named.join(", ")
    }

    /// The template `transformers`' `get_chat_template` picks: `tool_use` when tools are
    /// offered (an empty list too) and the folder has it, else `default` (a folder's single
    /// template and the spec's are `default`).
    fn pick(&self, tools: Option<&Value>) -> std::result::Result<&str, String> {
        if tools.is_some() && self.sources.contains_key(TOOL_USE) {
            return Ok(TOOL_USE);
        }
        if self.sources.contains_key(DEFAULT) {
            return Ok(DEFAULT);
        }
        let names: Vec<&str> = self.sources.keys().map(String::as_str).collect();
        Err(format!(
            "the tokenizer folder's chat templates are named {} and none is `default`; name the \
             template to use in `data.chat_template`",
            names.join(", ")
        ))
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
        let name = self.pick(tools)?;
        let text = self.render_marked(name, messages, tools, add_generation_prompt)?;
        Ok(if self.sources[name].generation_blocks {
            text.replace([GENERATION_START, GENERATION_END], "")
        } else {
            text
        })
    }

    /// The template `name`'s text, with its `{% generation %}` blocks marked.
    fn render_marked(
        &self,
        name: &str,
        messages: &[Value],
        tools: Option<&Value>,
        add_generation_prompt: bool,
    ) -> std::result::Result<String, String> {
        let [messages_name, tools_name, documents_name, prompt_name] = RENDER_ARGUMENTS;
        // The render's variables, with `extra` ones set to "" (to find which are missing).
        let context = |extra: &[&String]| {
            let mut context = self.variables.clone();
            context.insert(messages_name.into(), Value::from(messages.to_vec()));
            context.insert(tools_name.into(), tools.cloned().unwrap_or(Value::from(())));
            context.insert(documents_name.into(), Value::from(()));
            context.insert(prompt_name.into(), Value::from(add_generation_prompt));
            for name in extra {
                context.insert((*name).clone(), Value::from(""));
            }
            Value::from(context)
        };
        let template = self.env.get_template(name).map_err(|e| describe(&e))?;
        template.render(context(&[])).map_err(|e| {
            // minijinja places errors in the template's name: say its file.
            let place = format!("(in {}:", self.sources[name].path.display());
            let said = describe(&e).replace(&format!("(in {name}:"), &place);
            let mut text = format!("the chat template failed: {said}");
            // A template that reads a variable of its own (`date_string` in some Llama 3
            // templates) gets it from `apply_chat_template`'s keyword arguments: name the ones
            // nothing sets whose absence is what failed (the render works once they are set).
            let globals: Vec<&str> = self.env.globals().map(|(name, _)| name).collect();
            let mut unset: Vec<String> = template
                .undeclared_variables(false)
                .into_iter()
                .filter(|name| {
                    !self.variables.contains_key(name)
                        && !RENDER_ARGUMENTS.contains(&name.as_str())
                        && !globals.contains(&name.as_str())
                })
                .collect();
            unset.sort();
            let renders = |names: &[&String]| template.render(context(names)).is_ok();
            let alone: Vec<&String> = unset.iter().filter(|n| renders(&[*n])).collect();
            let all: Vec<&String> = unset.iter().collect();
            let missing = if !alone.is_empty() {
                alone
            } else if !all.is_empty() && renders(&all) {
                all
            } else {
                Vec::new()
            };
            if !missing.is_empty() {
                text.push_str(&format!(
                    " (it reads {}, which nothing sets: give {} in `data.chat_template_kwargs`)",
                    missing
                        .iter()
                        .map(|n| format!("`{n}`"))
                        .collect::<Vec<_>>()
                        .join(", "),
                    if missing.len() == 1 { "it" } else { "them" }
                ));
            }
            text
        })
    }

    /// A conversational prompt-completion record, its first `prompt_len` messages the
    /// prompt: the whole conversation and the byte range of the completion, what follows the
    /// prompt rendered with the generation prompt, as TRL's completion-only loss takes it
    /// (`{% generation %}` blocks play no part, as there unless `assistant_only_loss`).
    pub fn render_completion_for_training(
        &self,
        messages: &[Value],
        prompt_len: usize,
        tools: Option<&Value>,
    ) -> std::result::Result<(String, Vec<Range<usize>>), String> {
        let full = self.render_with_tools(messages, tools, false)?;
        let prompt = self.render_with_tools(&messages[..prompt_len], tools, true)?;
        if !full.starts_with(&prompt) {
            return Err(
                "the chat template renders the prompt (with the generation prompt) otherwise \
                 than the start of the prompt and completion together, so the completion \
                 cannot be told apart; give the record as `messages` (trained on the \
                 assistant's turns) instead"
                    .into(),
            );
        }
        let completion = prompt.len()..full.len();
        let spans = match completion.is_empty() {
            true => Vec::new(),
            false => vec![completion],
        };
        Ok((full, spans))
    }

    /// The whole conversation and the byte ranges of it the assistant wrote.
    pub fn render_for_training(
        &self,
        messages: &[Value],
        tools: Option<&Value>,
    ) -> std::result::Result<(String, Vec<Range<usize>>), String> {
        let name = self.pick(tools)?;
        if self.sources[name].generation_blocks {
            let holding = messages
                .iter()
                .position(holds_generation_marker)
                .map(|at| format!("message {}", at + 1))
                .or_else(|| {
                    tools
                        .is_some_and(holds_generation_marker)
                        .then(|| "the list of tools".into())
                });
            if let Some(what) = holding {
                return Err(format!(
                    "{what} holds U+FDD0 or U+FDD1, Unicode noncharacters that shardrun \
                     writes to find the template's {{% generation %}} blocks; remove them from \
                     the data"
                ));
            }
            let marked = self.render_marked(name, messages, tools, false)?;
            return Ok(generation_spans(&marked));
        }
        self.render_as_growing_prefixes(messages, tools)
    }

    /// The assistant's spans of a template without `{% generation %}` blocks: each turn's
    /// text between the conversation before it (with the generation prompt) and through it.
    fn render_as_growing_prefixes(
        &self,
        messages: &[Value],
        tools: Option<&Value>,
    ) -> std::result::Result<(String, Vec<Range<usize>>), String> {
        let full = self.render_with_tools(messages, tools, false)?;
        let mut spans = Vec::new();
        let differently = |i: usize| {
            format!(
                "the chat template renders message {} differently once later messages follow, so \
                 the assistant's tokens cannot be told apart (templates that drop earlier turns' \
                 reasoning do this); give `data.chat_template` a copy of the template with \
                 {{% generation %}}...{{% endgeneration %}} around what the assistant writes (as \
                 TRL's assistant-only loss asks), or one that renders the conversation as \
                 growing prefixes",
                i + 1
            )
        };
        for (i, message) in messages.iter().enumerate() {
            if role(message).as_deref() != Some("assistant") {
                continue;
            }
            let mut through = self.render_with_tools(&messages[..=i], tools, false)?;
            let text_end = through.trim_end().len();
            if !full.starts_with(&through) && full.starts_with(&through[..text_end]) {
                // Only the whitespace after the turn differs (a closing newline of the
                // whole conversation): it is in no span anyway.
                through.truncate(text_end);
            } else if !full.starts_with(&through) {
                // A template that refuses the prompt after the assistant's turn has no
                // ending to tell: the turns are refused as they were.
                let ending = self
                    .conversation_ending(&messages[..=i], tools)
                    .ok()
                    .flatten();
                // What the template writes only where the conversation ends (Phi-3's
                // `eos_token` without the generation prompt) is not this turn's.
                match ending.and_then(|e| through.strip_suffix(&e).map(str::len)) {
                    Some(len) if full.starts_with(&through[..len]) => through.truncate(len),
                    _ => return Err(differently(i)),
                }
            }
            let start = if i == 0 {
                self.opening_turn_start(message, tools, &through)?
                    .ok_or_else(|| {
                        "the chat template does not render the opening assistant message's \
                         content where the message stands, so its tokens cannot be told apart; \
                         give `data.chat_template` a template that renders it"
                            .to_string()
                    })?
            } else {
                let prompt = self.render_with_tools(&messages[..i], tools, true)?;
                if !through.starts_with(&prompt) {
                    return Err(differently(i));
                }
                prompt.len()
            };
            let end = through.trim_end().len().max(start);
            if end > start {
                spans.push(start..end);
            }
        }
        Ok((full, spans))
    }

    /// What the template writes after the last message only when no generation prompt
    /// follows, starting with a special token (Phi-3 ends a conversation with `eos_token`):
    /// the text of `messages` without the prompt from where the one with it parts from it.
    /// That point can lie inside the token (`</s>` and `<|assistant|>` share their `<`), so
    /// the ending is the one that starts with a special token's text at or before it.
    fn conversation_ending(
        &self,
        messages: &[Value],
        tools: Option<&Value>,
    ) -> std::result::Result<Option<String>, String> {
        let ended = self.render_with_tools(messages, tools, false)?;
        let prompted = self.render_with_tools(messages, tools, true)?;
        let parts = ended
            .char_indices()
            .zip(prompted.chars())
            .find(|((_, a), b)| a != b)
            .map_or(ended.len().min(prompted.len()), |((at, _), _)| at);
        if parts == ended.len() {
            return Ok(None);
        }
        let special: Vec<&str> = self
            .variables
            .values()
            .filter_map(|v| v.as_str())
            .filter(|text| !text.is_empty())
            .collect();
        let longest = special.iter().map(|t| t.len()).max().unwrap_or(0);
        // The token must reach past where the renders part: one ending before it is the
        // last message's own (its end-of-turn token), not the ending.
        let ending = (parts.saturating_sub(longest)..=parts)
            .rev()
            .filter(|&at| ended.is_char_boundary(at))
            .find(|&at| {
                special
                    .iter()
                    .any(|t| ended[at..].starts_with(t) && at + t.len() > parts)
            });
        Ok(ending.map(|at| ended[at..].to_string()))
    }

    /// Where the assistant's text starts in `through`, the conversation of its one opening
    /// turn: where the marker starts when the turn is rendered with the marker as its
    /// content, provided the text before it is the same. `Ok(None)` when it is not.
    fn opening_turn_start(
        &self,
        message: &Value,
        tools: Option<&Value>,
        through: &str,
    ) -> std::result::Result<Option<usize>, String> {
        let keys: Vec<Value> = message.try_iter().map_err(|e| e.to_string())?.collect();
        let mut marked = Vec::with_capacity(keys.len() + 1);
        for key in keys {
            let value = match key.as_str() {
                Some("content") => Value::from(CONTENT_MARKER),
                _ => message.get_item(&key).map_err(|e| e.to_string())?,
            };
            marked.push((key, value));
        }
        if !marked
            .iter()
            .any(|(key, _)| key.as_str() == Some("content"))
        {
            marked.push((Value::from("content"), Value::from(CONTENT_MARKER)));
        }
        let marked = Value::from_pairs(marked);
        let text = self.render_with_tools(&[marked], tools, false)?;
        Ok(text
            .find(CONTENT_MARKER)
            .filter(|&at| through.starts_with(&text[..at])))
    }
}

/// The messages of a chat record, checked: a list of objects with a known string `role`.
/// Keys holding null are dropped, as `apply_chat_template` drops them (APIs write
/// `content: null` beside tool calls; templates test for a key, and would print `None`).
pub fn messages_of(record: &Value, field: &str) -> std::result::Result<Vec<Value>, String> {
    if record.kind() != ValueKind::Map {
        return Err("the record is not a JSON object".into());
    }
    let messages = record.get_attr(field).unwrap_or(Value::UNDEFINED);
    if messages.is_undefined() {
        return Err(format!("no field `{field}` (the messages) in the record"));
    }
    messages_in(&messages, field)
}

/// The messages of a conversational prompt-completion record (TRL's `{"prompt": [...],
/// "completion": [...]}`), prompt first, and how many the prompt has; `None` when the
/// record has no `prompt` and `completion` fields.
pub fn prompt_completion_of(
    record: &Value,
) -> std::result::Result<Option<(Vec<Value>, usize)>, String> {
    let field = |name: &str| record.get_attr(name).unwrap_or(Value::UNDEFINED);
    let (prompt, completion) = (field(PROMPT), field(COMPLETION));
    if record.kind() != ValueKind::Map || prompt.is_undefined() || completion.is_undefined() {
        return Ok(None);
    }
    match (prompt.kind(), completion.kind()) {
        (ValueKind::String, ValueKind::String) => {
            return Err(format!(
                "`{PROMPT}` and `{COMPLETION}` are text, not lists of messages: records of a \
                 prompt and its completion as text are `kind: jsonl` data (trained on the \
                 completion alone)"
            ))
        }
        (ValueKind::String, _) | (_, ValueKind::String) => {
            let text = match prompt.kind() {
                ValueKind::String => PROMPT,
                _ => COMPLETION,
            };
            return Err(format!(
                "`{text}` is text, not a list of messages: a conversational prompt-completion \
                 record holds lists of messages in both `{PROMPT}` and `{COMPLETION}`"
            ));
        }
        _ => {}
    }
    // "message 2 has ..." says which list: "completion message 2 has ...".
    let read = |list: &Value, field: &str| {
        messages_in(list, field).map_err(|e| match e.starts_with("message ") {
            true => format!("{field} {e}"),
            false => e,
        })
    };
    let mut messages = read(&prompt, PROMPT)?;
    let prompt_len = messages.len();
    messages.extend(read(&completion, COMPLETION)?);
    Ok(Some((messages, prompt_len)))
}

/// The fields of a conversational prompt-completion record, as TRL names them.
pub const PROMPT: &str = "prompt";
pub const COMPLETION: &str = "completion";

/// The messages of `messages`, the value of the record's field `field`, checked.
fn messages_in(messages: &Value, field: &str) -> std::result::Result<Vec<Value>, String> {
    if messages.kind() != ValueKind::Seq {
        return Err(format!("field `{field}` is not a list of messages"));
    }
    let mut list = Vec::new();
    // Per message: whether its role is ShareGPT's `from`, and the message as written (a
    // shared handle; its keys are read only for an error).
    let mut written = Vec::new();
    for message in messages.try_iter().map_err(|e| e.to_string())? {
        let kept = without_nulls(message.clone()).map_err(|e| e.to_string())?;
        let (read, role_from) = from_sharegpt(kept).map_err(|e| e.to_string())?;
        written.push((role_from, message));
        list.push(read);
    }
    if list.is_empty() {
        return Err(format!("field `{field}` holds no messages"));
    }
    for (i, message) in list.iter().enumerate() {
        if message.kind() != ValueKind::Map {
            return Err(format!("message {} is not an object", i + 1));
        }
        match role(message) {
            Some(r) if ROLES.contains(&r.as_str()) => {}
            Some(r) if written[i].0 => {
                return Err(format!(
                    "message {} is from `{r}`; chat data takes ShareGPT's `from` human, gpt \
                     (read as user, assistant) and the roles {} (any case)",
                    i + 1,
                    ROLES.join(", ")
                ))
            }
            Some(r) => {
                return Err(format!(
                    "message {} has role `{r}`; chat data takes the roles {}",
                    i + 1,
                    ROLES.join(", ")
                ))
            }
            None => {
                return Err(format!(
                    "message {} has no string `role` (it has: {}); a message is \
                     `{{\"role\": ..., \"content\": ...}}` or ShareGPT's \
                     `{{\"from\": ..., \"value\": ...}}`",
                    i + 1,
                    keys_of(&written[i].1).join(", ")
                ));
            }
        }
        // Templates print a missing content as nothing: a turn whose text sits under another
        // key (`text`, `message`) would train on an empty turn, unseen. A `content: null` is
        // written so on purpose (APIs write it beside tool calls, or for a turn with no
        // text), and renders as `transformers` renders it.
        let written_text = ["content", "value"]
            .iter()
            .any(|key| has_key(&written[i].1, key));
        if !written_text && !has_key(message, "tool_calls") {
            return Err(format!(
                "message {} has no `content` (it has: {}); a message holds its text in \
                 `content` (ShareGPT's `value`), or is an assistant's `tool_calls`",
                i + 1,
                keys_of(&written[i].1).join(", ")
            ));
        }
    }
    Ok(list)
}

/// Whether an object has `key` (a null value counts: the caller says which it wants).
fn has_key(object: &Value, key: &str) -> bool {
    !object.get_attr(key).unwrap_or_default().is_undefined()
}

/// A message with ShareGPT's keys (`{"from": "human", "value": ...}`) as a `{role, content}`
/// one, and whether its role is ShareGPT's `from`. As TRL's `maybe_convert_to_chatml`, each
/// key on its own: `from` is the role (unless there is a `role`), `value` the content
/// (unless there is a `content`; TRL lets `from` and `value` win); other keys stay.
/// ShareGPT's speakers `human` and `gpt` are the user and the assistant, as axolotl and
/// LLaMA-Factory read them, chat templates knowing no others; speakers are read in any case
/// (`Human`, `System`).
fn from_sharegpt(message: Value) -> std::result::Result<(Value, bool), Error> {
    if message.kind() != ValueKind::Map {
        return Ok((message, false));
    }
    let has = |key: &str| has_key(&message, key);
    let from = message.get_attr("from")?;
    let role = match from.as_str() {
        Some(from) if !has("role") => Some(match from.to_lowercase().as_str() {
            "human" => "user".to_string(),
            "gpt" => "assistant".to_string(),
            known if ROLES.contains(&known) => known.to_string(),
            _ => from.to_string(),
        }),
        _ => None,
    };
    let content = has("value") && !has("content");
    if role.is_none() && !content {
        return Ok((message, false));
    }
    let mut pairs = Vec::new();
    for key in message.try_iter()? {
        let value = message.get_item(&key)?;
        match (key.as_str(), &role) {
            (Some("from"), Some(role)) => pairs.push((Value::from("role"), Value::from(role))),
            (Some("value"), _) if content => pairs.push((Value::from("content"), value)),
            _ => pairs.push((key, value)),
        }
    }
    Ok((Value::from_pairs(pairs), role.is_some()))
}

/// An object without its null-valued keys (other values as they are); most messages have
/// none and are passed on as they are.
fn without_nulls(message: Value) -> std::result::Result<Value, Error> {
    if message.kind() != ValueKind::Map {
        return Ok(message);
    }
    let mut pairs = Vec::new();
    let mut dropped = false;
    for key in message.try_iter()? {
        let value = message.get_item(&key)?;
        if value.is_none() {
            dropped = true;
        } else {
            pairs.push((key, value));
        }
    }
    Ok(if dropped {
        Value::from_pairs(pairs)
    } else {
        message
    })
}

/// The keys of a JSON object read as a template value (none for anything else), as they
/// are named in messages that say what a record or message has.
pub(crate) fn keys_of(object: &Value) -> Vec<String> {
    object
        .try_iter()
        .into_iter()
        .flatten()
        .map(|key| key.to_string())
        .collect()
}

fn role(message: &Value) -> Option<String> {
    message.get_attr("role").ok()?.as_str().map(str::to_string)
}

/// The chat templates of a tokenizer folder, found as [`ChatTemplate::load`] finds them
/// when the spec names none; an error when the folder has none. Reads the template files,
/// not the tokenizer, so a spec can be checked before its data is prepared.
pub fn templates_in_folder(folder: &Path) -> Result<Vec<NamedTemplate>> {
    let folder = folder.to_path_buf();
    let read = |name: &str, path: PathBuf| -> Result<NamedTemplate> {
        let source = std::fs::read_to_string(&path).map_err(DataError::io("read", &path))?;
        Ok(NamedTemplate {
            name: name.to_string(),
            path,
            source,
        })
    };
    // The transformers 5.x files take the place of tokenizer_config.json's templates.
    let mut found = Vec::new();
    let jinja = folder.join("chat_template.jinja");
    if jinja.is_file() {
        found.push(read(DEFAULT, jinja)?);
    }
    for path in additional_templates(&folder)? {
        let name = path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        found.push(read(&name, path)?);
    }
    if !found.is_empty() {
        return Ok(found);
    }
    // chat_template.json is a processor's file, which AutoTokenizer does not read.
    for name in ["tokenizer_config.json", "chat_template.json"] {
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
            Some(serde_json::Value::String(text)) => {
                return Ok(vec![NamedTemplate {
                    name: DEFAULT.into(),
                    path,
                    source: text.clone(),
                }])
            }
            // Several named templates, saved as a list of `{name, template}`.
            Some(serde_json::Value::Array(named)) => {
                for entry in named {
                    match (entry["name"].as_str(), entry["template"].as_str()) {
                        (Some(name), Some(text)) => found.push(NamedTemplate {
                            name: name.to_string(),
                            path: path.clone(),
                            source: text.to_string(),
                        }),
                        _ => {
                            return Err(DataError::ChatTemplate {
                                path,
                                why: "`chat_template` lists an entry without a string `name` \
                                      and `template`"
                                    .into(),
                            })
                        }
                    }
                }
                if !found.is_empty() {
                    return Ok(found);
                }
            }
            _ => {}
        }
    }
    Err(DataError::NoChatTemplate { folder })
}

/// The `.jinja` files of a tokenizer folder's `additional_chat_templates/`, by name.
pub fn additional_templates(folder: &Path) -> Result<Vec<PathBuf>> {
    let dir = folder.join(ADDITIONAL_CHAT_TEMPLATES);
    let entries = match std::fs::read_dir(&dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(DataError::io("read", &dir)(e)),
    };
    let mut paths = Vec::new();
    for entry in entries {
        let path = entry.map_err(DataError::io("read", &dir))?.path();
        if path.extension().is_some_and(|e| e == "jinja") && path.is_file() {
            paths.push(path);
        }
    }
    paths.sort();
    Ok(paths)
}

/// `transformers` adds a `{% generation %}...{% endgeneration %}` statement that renders its
/// body (in a scope of its own: it is a Jinja call block there) and notes where, for its
/// assistant mask. minijinja has no such statement: each becomes a `{% with %}` block that
/// writes [`GENERATION_START`] and [`GENERATION_END`] around its body, with the statement's
/// whitespace control on the outer tags. Returns the template and whether it has such blocks.
fn mark_generation_blocks(source: &str) -> (String, bool) {
    let mut out = String::with_capacity(source.len());
    let mut found = false;
    let mut rest = source;
    while let Some(at) = rest.find("{%") {
        let (before, tag) = rest.split_at(at);
        out.push_str(before);
        // `{%`, a whitespace control sign, blanks, the statement's name, blanks, a sign, `%}`.
        let inner = &tag[2..];
        let after_left = inner.strip_prefix(['-', '+']).unwrap_or(inner);
        let left = &inner[..inner.len() - after_left.len()];
        let name = after_left.trim_start();
        let name_len = name
            .find(|c: char| !(c.is_alphanumeric() || c == '_'))
            .unwrap_or(name.len());
        let after_name = name[name_len..].trim_start();
        let after_right = after_name.strip_prefix(['-', '+']).unwrap_or(after_name);
        let right = &after_name[..after_name.len() - after_right.len()];
        let replacement = match (&name[..name_len], after_right.strip_prefix("%}")) {
            ("generation", Some(after)) => Some((
                format!("{{%{left} with %}}{{{{ '{GENERATION_START}' }}}}{{% with {right}%}}"),
                after,
            )),
            ("endgeneration", Some(after)) => Some((
                format!("{{%{left} endwith %}}{{{{ '{GENERATION_END}' }}}}{{% endwith {right}%}}"),
                after,
            )),
            _ => None,
        };
        match replacement {
            Some((tags, after)) => {
                out.push_str(&tags);
                found = true;
                rest = after;
            }
            None => {
                out.push_str("{%");
                rest = inner;
            }
        }
    }
    out.push_str(rest);
    (out, found)
}

/// Whether a template has `{% generation %}` blocks (its text, or a JSON file holding it).
pub fn has_generation_blocks(source: &str) -> bool {
    mark_generation_blocks(source).1
}

/// The text of a render with its generation markers taken out, and the byte ranges the
/// blocks wrote (a block inside another counts as part of it).
fn generation_spans(marked: &str) -> (String, Vec<Range<usize>>) {
    let mut text = String::with_capacity(marked.len());
    let mut spans = Vec::new();
    let mut depth = 0usize;
    let mut start = 0;
    for c in marked.chars() {
        match c {
            GENERATION_START => {
                if depth == 0 {
                    start = text.len();
                }
                depth += 1;
            }
            GENERATION_END if depth > 0 => {
                depth -= 1;
                if depth == 0 && text.len() > start {
                    spans.push(start..text.len());
                }
            }
            GENERATION_END => {}
            c => text.push(c),
        }
    }
    (text, spans)
}

/// Whether a message (or the tools) holds a generation marker anywhere.
fn holds_generation_marker(value: &Value) -> bool {
    match value.kind() {
        ValueKind::String => value
            .as_str()
            .is_some_and(|s| s.contains([GENERATION_START, GENERATION_END])),
        ValueKind::Seq => value
            .try_iter()
            .is_ok_and(|mut items| items.any(|item| holds_generation_marker(&item))),
        ValueKind::Map => value.try_iter().is_ok_and(|mut keys| {
            keys.any(|key| {
                holds_generation_marker(&key)
                    || value
                        .get_item(&key)
                        .is_ok_and(|item| holds_generation_marker(&item))
            })
        }),
        _ => false,
    }
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

/// A float value as Python's `str` writes it (`nan`, `inf` as such); other values `None`.
fn python_str_of_float(value: &Value) -> Option<String> {
    if value.kind() != ValueKind::Number || value.is_integer() {
        return None;
    }
    let f = f64::try_from(value.clone()).ok()?;
    Some(match f {
        f if f.is_nan() => "nan".into(),
        f if f.is_infinite() => if f > 0.0 { "inf" } else { "-inf" }.into(),
        f => python_float(f),
    })
}

/// Python's `repr(float)` as `json.dumps` writes it: shortest round-trip digits, exponent as
/// `e+XX` / `e-XX` outside [1e-4, 1e16).
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
    fn a_variable_nothing_sets_is_named_with_where_to_give_it() {
        let t = template(
            "{% set who = 'user' %}{% if custom_tools is defined %}{{ custom_tools }}{% endif %}\
             {% for m in messages %}{{ m.content + ' on ' + date_string + ' by ' + who \
             + eos_token }}{% endfor %}",
        );
        let err = t.render(
            &messages(r#"{"messages": [{"role": "user", "content": "hi"}]}"#),
            false,
        );
        let err = err.unwrap_err();
        assert!(
            err.starts_with("the chat template failed: ")
                && err.ends_with(
                    " (it reads `date_string`, which nothing sets: give it in \
                     `data.chat_template_kwargs`)"
                ),
            "{err}"
        );
        // A failure of another kind says nothing of variables, even where the template reads
        // one nothing sets (guarded or not).
        let t = template("{{ raise_exception('no') }}{{ date_string }}");
        let err = t.render(&[], false).unwrap_err();
        assert!(!err.contains("nothing sets"), "{err}");
        let t = template(
            "{% if custom_tools is defined %}x{% endif %}{{ messages[0].name + eos_token }}",
        );
        let err = t
            .render(
                &messages(r#"{"messages": [{"role": "user", "content": "hi"}]}"#),
                false,
            )
            .unwrap_err();
        assert!(!err.contains("nothing sets"), "{err}");
    }

    #[test]
    fn python_json_and_floats() {
        let t = template("{{ x | tojson }}|{{ x | tojson(indent=2) }}");
        let mut ctx: BTreeMap<String, Value> = BTreeMap::new();
        let x: Value = serde_json::from_str(r#"{"b": [1, 2.5, "é\n"], "a": null}"#).unwrap();
        ctx.insert("x".into(), x);
        let out = t
            .env
            .get_template(DEFAULT)
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
        assert!(err.contains("no robots (in t.jinja:1)"), "{err}");
        let err = ChatTemplate::from_source("t.jinja".into(), "\n{{ x }".into(), &BTreeMap::new())
            .err()
            .unwrap()
            .to_string();
        assert!(err.ends_with("(line 2)"), "{err}");
    }

    #[test]
    fn sharegpt_messages_are_read_as_role_and_content() {
        let read = |json: &str| -> Vec<String> {
            let record: Value = serde_json::from_str(json).unwrap();
            let messages = messages_of(&record, "conversations").unwrap();
            messages.iter().map(|m| m.to_string()).collect()
        };
        assert_eq!(
            read(
                r#"{"conversations": [{"from": "system", "value": "s"}, {"from": "human", "value": "q", "lang": "en"},
                    {"from": "GPT", "value": "a", "weight": null}]}"#
            ),
            [
                "{'role': 'system', 'content': 's'}",
                "{'role': 'user', 'content': 'q', 'lang': 'en'}",
                "{'role': 'assistant', 'content': 'a'}",
            ]
        );
        // Each key on its own; a `role` or `content` written beside stays.
        assert_eq!(
            read(
                r#"{"conversations": [{"from": "human", "content": "q"}, {"role": "assistant", "value": "a"},
                    {"from": "human", "role": "user", "value": "b", "content": "c"}, {"from": "gpt", "tool_calls": []}]}"#
            ),
            [
                "{'role': 'user', 'content': 'q'}",
                "{'role': 'assistant', 'content': 'a'}",
                "{'from': 'human', 'role': 'user', 'value': 'b', 'content': 'c'}",
                "{'role': 'assistant', 'tool_calls': []}",
            ]
        );

        let refused = |json: &str| {
            let record: Value = serde_json::from_str(json).unwrap();
            messages_of(&record, "conversations").unwrap_err()
        };
        let err = refused(r#"{"conversations": [{"from": "observation", "value": "x"}]}"#);
        assert!(
            err.starts_with("message 1 is from `observation`; chat data takes ShareGPT's"),
            "{err}"
        );
        // The keys as the record writes them.
        let err = refused(r#"{"conversations": [{"from": 1, "value": "x"}]}"#);
        assert!(
            err.starts_with("message 1 has no string `role` (it has: from, value)"),
            "{err}"
        );
        let err = refused(r#"{"conversations": [{"value": "x"}]}"#);
        assert!(
            err.starts_with("message 1 has no string `role` (it has: value)"),
            "{err}"
        );
        assert_eq!(
            read(r#"{"conversations": [{"from": "System", "value": "s"}]}"#),
            ["{'role': 'system', 'content': 's'}"]
        );
    }

    #[test]
    fn a_message_without_content_is_refused_unless_it_calls_tools() {
        let read = |json: &str| {
            let record: Value = serde_json::from_str(json).unwrap();
            messages_of(&record, "messages")
        };
        let err = read(r#"{"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "text": "a"}]}"#)
            .unwrap_err();
        assert_eq!(
            err,
            "message 2 has no `content` (it has: role, text); a message holds its text in \
             `content` (ShareGPT's `value`), or is an assistant's `tool_calls`"
        );
        let err = read(r#"{"messages": [{"from": "human", "text": "q"}]}"#).unwrap_err();
        assert!(
            err.starts_with("message 1 has no `content` (it has: from, text)"),
            "{err}"
        );
        // Written as null on purpose: a turn with no text.
        assert!(read(r#"{"messages": [{"role": "user", "content": null}]}"#).is_ok());
        assert!(read(r#"{"messages": [{"from": "human", "value": null}]}"#).is_ok());
        // An assistant turn of tool calls writes `content: null` (or nothing) beside them.
        let calls = r#"[{"type": "function", "function": {"name": "f", "arguments": {}}}]"#;
        for assistant in [
            format!(r#"{{"role": "assistant", "content": null, "tool_calls": {calls}}}"#),
            format!(r#"{{"role": "assistant", "tool_calls": {calls}}}"#),
        ] {
            let json =
                format!(r#"{{"messages": [{{"role": "user", "content": "q"}}, {assistant}]}}"#);
            assert_eq!(read(&json).unwrap().len(), 2, "{json}");
        }
        // Empty text is text.
        assert!(read(r#"{"messages": [{"role": "user", "content": ""}]}"#).is_ok());
    }

    #[test]
    fn prompt_completion_records_train_what_follows_the_prompt() {
        let read = |json: &str| {
            let record: Value = serde_json::from_str(json).unwrap();
            prompt_completion_of(&record)
        };
        let (m, prompt_len) = read(
            r#"{"prompt": [{"role": "user", "content": "hi"}], "completion": [{"from": "gpt", "value": "yo"}]}"#,
        )
        .unwrap()
        .unwrap();
        assert_eq!(prompt_len, 1);
        let t = template(
            "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% if m.role == 'assistant' %}{{ eos_token }}{% endif %}{{ '\\n' }}{% endfor %}\
             {% if add_generation_prompt %}<assistant>{% endif %}",
        );
        let (text, spans) = t
            .render_completion_for_training(&m, prompt_len, None)
            .unwrap();
        assert_eq!(text, "<user>hi\n<assistant>yo</s>\n");
        assert_eq!(&text[spans[0].clone()], "yo</s>\n");

        // Not this form: no error, the record is read as messages.
        assert!(read(r#"{"messages": [], "prompt": []}"#).unwrap().is_none());
        let err = read(r#"{"prompt": [{"role": "user", "content": "hi"}], "completion": "yo"}"#)
            .unwrap_err();
        assert!(
            err.starts_with("`completion` is text, not a list of messages"),
            "{err}"
        );
        let err = read(r#"{"prompt": "2 + 2 =", "completion": " 4"}"#).unwrap_err();
        assert!(
            err.contains("records of a prompt and its completion as text are `kind: jsonl`"),
            "{err}"
        );
        let err = read(r#"{"prompt": [{"role": "user", "content": "hi"}], "completion": [{"role": "robot", "content": "x"}]}"#)
            .unwrap_err();
        assert!(
            err.starts_with("completion message 1 has role `robot`"),
            "{err}"
        );
        let err = read(r#"{"prompt": [], "completion": [{"role": "assistant", "content": "x"}]}"#)
            .unwrap_err();
        assert_eq!(err, "field `prompt` holds no messages");

        // A template that writes the prompt otherwise once the completion follows.
        let t =
            template("{{ messages|length }}:{% for m in messages %}{{ m.content }}{% endfor %}");
        let err = t.render_completion_for_training(&m, 1, None).unwrap_err();
        assert!(
            err.starts_with("the chat template renders the prompt"),
            "{err}"
        );
    }

    #[test]
    fn generation_blocks_become_marked_with_blocks() {
        let (marked, found) = mark_generation_blocks(
            "{% generation %}a{% endgeneration %}{%- generation -%}b{%+endgeneration+%}\
             {% generation_x %}{{ '{%' }}",
        );
        assert!(found);
        assert_eq!(
            marked,
            "{% with %}{{ '\u{fdd0}' }}{% with %}a{% endwith %}{{ '\u{fdd1}' }}{% endwith %}\
             {%- with %}{{ '\u{fdd0}' }}{% with -%}b{%+ endwith %}{{ '\u{fdd1}' }}{% endwith +%}\
             {% generation_x %}{{ '{%' }}"
        );
        assert!(!has_generation_blocks("{% with %}{{ '{% generation' }}"));
        // The body renders, its `set` stays inside (a Jinja call block's body is a scope).
        let t = template(
            "{% set x = 1 %}{% for m in messages %}{% generation %}{% set x = 2 %}{{ m.content }}\
             {% endgeneration %}{% endfor %}{{ x }}",
        );
        let m = messages(r#"{"messages": [{"role": "assistant", "content": "hi"}]}"#);
        assert_eq!(t.render(&m, false).unwrap(), "hi1");
        // Whitespace control and trim_blocks / lstrip_blocks act on the marked tags as on the
        // statement: the text is that of the same template with plain `with` blocks.
        let source = "{% for m in messages %}\n  <{{ m.role }}>\n  {% generation %}\n    \
                      {{ m.content }}  {%- endgeneration %}\n{%+ generation -%}   |  \
                      {%+ endgeneration +%}\n{% endfor %}";
        let plain = template(
            &source
                .replace("endgeneration", "endwith")
                .replace("generation", "with"),
        );
        let rendered = template(source).render(&m, false).unwrap();
        assert_eq!(rendered, plain.render(&m, false).unwrap());
        assert!(rendered.contains("hi"), "{rendered:?}");
    }

    #[test]
    fn generation_blocks_give_the_spans_where_earlier_turns_render_differently() {
        // Drops the reasoning of every answer but the last, as reasoning models' templates do.
        let body = "{% for m in messages %}<{{ m.role }}>{% if m.role == 'assistant' %}\
                    [start]{% if loop.last %}({{ m.reasoning }}){% endif %}{{ m.content }}</s>[end]\
                    {% else %}{{ m.content }}{% endif %}\n{% endfor %}\
                    {% if add_generation_prompt %}<assistant>{% endif %}";
        let conversation = messages(
            r#"{"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b", "reasoning": "r1"},
                {"role": "user", "content": "c"}, {"role": "assistant", "content": "d", "reasoning": "r2"}]}"#,
        );
        let untagged = template(&body.replace("[start]", "").replace("[end]", ""));
        let err = untagged
            .render_for_training(&conversation, None)
            .unwrap_err();
        assert!(
            err.starts_with("the chat template renders message 2 differently")
                && err.contains("{% generation %}"),
            "{err}"
        );
        let tagged = template(
            &body
                .replace("[start]", "{% generation %}")
                .replace("[end]", "{% endgeneration %}"),
        );
        assert_eq!(
            tagged.origin(),
            "t.jinja (its {% generation %} blocks mark what the loss covers)"
        );
        assert_eq!(untagged.origin(), "t.jinja");
        let (text, spans) = tagged.render_for_training(&conversation, None).unwrap();
        assert_eq!(text, "<user>a<assistant>b</s><user>c<assistant>(r2)d</s>");
        assert_eq!(text, tagged.render(&conversation, false).unwrap());
        let written: Vec<&str> = spans.iter().map(|s| &text[s.clone()]).collect();
        assert_eq!(written, ["b</s>", "(r2)d</s>"]);

        let marked = messages(
            r#"{"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b\ufdd1"}]}"#,
        );
        let err = tagged.render_for_training(&marked, None).unwrap_err();
        assert!(err.starts_with("message 2 holds U+FDD0 or U+FDD1"), "{err}");
        // Without blocks, noncharacters are text like any other.
        assert_eq!(
            untagged.render(&marked, false).unwrap(),
            "<user>a<assistant>()b\u{fdd1}</s>"
        );
    }

    #[test]
    fn what_only_the_end_of_a_conversation_has_is_not_an_earlier_turns() {
        // Phi-3's template: `eos_token` once, after the last message, without the prompt.
        let t = template(
            "{% for m in messages %}<|{{ m.role }}|>\n{{ m.content }}<|end|>\n{% endfor %}\
             {% if add_generation_prompt %}<|assistant|>\n{% else %}{{ eos_token }}{% endif %}",
        );
        let m = messages(
            r#"{"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
                {"role": "user", "content": "c"}, {"role": "assistant", "content": "d"}, {"role": "user", "content": "e"}]}"#,
        );
        let (text, spans) = t.render_for_training(&m, None).unwrap();
        assert_eq!(
            text,
            "<|user|>\na<|end|>\n<|assistant|>\nb<|end|>\n<|user|>\nc<|end|>\n\
             <|assistant|>\nd<|end|>\n<|user|>\ne<|end|>\n</s>"
        );
        let written: Vec<&str> = spans.iter().map(|s| &text[s.clone()]).collect();
        assert_eq!(written, ["b<|end|>", "d<|end|>"]);
        // The last message is the assistant's: the end is in its turn, as the text has it.
        let (text, spans) = t.render_for_training(&m[..4], None).unwrap();
        assert_eq!(&text[spans[1].clone()], "d<|end|>\n</s>");
        // Also where the assistant opens the conversation.
        let (text, spans) = t.render_for_training(&m[1..4], None).unwrap();
        let written: Vec<&str> = spans.iter().map(|s| &text[s.clone()]).collect();
        assert_eq!(written, ["b<|end|>", "d<|end|>\n</s>"]);
        // An ending that is not a special token, after turns that end with one: the turns'
        // own token is not taken for the ending, and the conversations are refused.
        let ending = |text: &str| {
            let source = "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}\
                          {% if m.role == 'assistant' %}{{ eos_token }}{% endif %}{% endfor %}\
                          {% if add_generation_prompt %}<|assistant|>{% else %}ENDING{% endif %}";
            template(&source.replace("ENDING", text))
        };
        let err = ending("<|end_of_chat|>")
            .render_for_training(&m[..4], None)
            .unwrap_err();
        assert!(
            err.starts_with("the chat template renders message 2 differently"),
            "{err}"
        );
        // One of whitespace only is in no span: the turns are told apart.
        let (text, spans) = ending("{{ '\\n' }}")
            .render_for_training(&m[..4], None)
            .unwrap();
        let written: Vec<&str> = spans.iter().map(|s| &text[s.clone()]).collect();
        assert_eq!(written, ["b</s>", "d</s>"]);
        // An earlier answer written otherwise once later turns follow is still refused.
        let dropping = template(
            "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% if loop.last %}!{% endif %}\
             {% endfor %}{% if add_generation_prompt %}<|assistant|>{% else %}{{ eos_token }}{% endif %}",
        );
        let err = dropping.render_for_training(&m[..4], None).unwrap_err();
        assert!(
            err.starts_with("the chat template renders message 2 differently"),
            "{err}"
        );
    }

    #[test]
    fn a_conversation_the_assistant_opens_has_its_span() {
        // Reads messages[0] unguarded, as Qwen 2.5 and Llama 3.1 templates do.
        let t = template(
            "{% if messages[0].role != 'system' %}<sys>\n{% endif %}{% for m in messages %}\
             <{{ m.role }}>{{ m.content }}</s>\n{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}",
        );
        let m = messages(
            r#"{"messages": [{"role": "assistant", "content": "hello"}, {"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}"#,
        );
        let (text, spans) = t.render_for_training(&m, None).unwrap();
        assert_eq!(
            text,
            "<sys>\n<assistant>hello</s>\n<user>hi</s>\n<assistant>yo</s>\n"
        );
        let texts: Vec<&str> = spans.iter().map(|s| &text[s.clone()]).collect();
        assert_eq!(texts, ["hello</s>", "yo</s>"]);
    }

    #[test]
    fn tools_pick_the_tool_use_template() {
        let named = |name: &str, source: &str| NamedTemplate {
            name: name.into(),
            path: format!("{name}.jinja").into(),
            source: source.into(),
        };
        let t = ChatTemplate::from_templates(
            vec![
                named("default", "plain"),
                named("tool_use", "tools {{ tools | length }}"),
            ],
            &BTreeMap::new(),
        )
        .unwrap();
        let m = messages(r#"{"messages": [{"role": "user", "content": "hi"}]}"#);
        let tools: Value = serde_json::from_str("[]").unwrap();
        assert_eq!(t.render(&m, false).unwrap(), "plain");
        assert_eq!(
            t.render_with_tools(&m, Some(&tools), false).unwrap(),
            "tools 0"
        );
        let only_tools =
            ChatTemplate::from_templates(vec![named("tool_use", "tools")], &BTreeMap::new())
                .unwrap();
        assert_eq!(
            only_tools
                .render_with_tools(&m, Some(&tools), false)
                .unwrap(),
            "tools"
        );
        let err = only_tools.render(&m, false).unwrap_err();
        assert!(err.contains("none is `default`"), "{err}");
    }
}
