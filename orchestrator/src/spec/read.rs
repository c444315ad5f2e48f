//! YAML text to one of the spec's types, every error explained: where (the node it is about),
//! which field (serde_path_to_error's path), why, and how to fix it.

use super::de::{DeError, Node, Problem};
use super::error::did_you_mean;
use super::yaml::{Location, SpannedDocument, Step};
use super::SpecErrorKind;
use serde::de::DeserializeOwned;
use serde_path_to_error::Segment;

/// An error in YAML text, before it is tied to a file or a flag.
#[derive(Debug, Clone, PartialEq)]
pub struct ReadError {
    pub at: Option<Location>,
    /// Dotted path of the field; for an unknown key, of the section holding it.
    pub field: String,
    pub kind: SpecErrorKind,
    pub why: String,
    pub fix: String,
    /// For an unknown key: its full path, and the key probably meant.
    pub unknown: Option<Box<UnknownKey>>,
}

/// An unknown key, by its full path (`training.stepz`).
#[derive(Debug, Clone, PartialEq)]
pub struct UnknownKey {
    pub path: String,
    /// When it is a typo: the full path of the key probably meant (`training.steps`).
    pub suggestion: Option<String>,
    /// When it is another tool's name for the suggestion: whose (`the name here of
    /// transformers' `hidden_size``).
    pub renamed_from: Option<String>,
}

impl UnknownKey {
    /// `did you mean `training.steps`?`, with whose name it was where it is another tool's.
    pub fn did_you_mean(&self) -> Option<String> {
        let key = self.suggestion.as_ref()?;
        Some(did_you_mean_text(key, self.renamed_from.as_deref()))
    }
}

/// `did you mean `key`?`, and whose name the key written was when it is another tool's.
fn did_you_mean_text(key: &str, whose: Option<&str>) -> String {
    match whose {
        Some(whose) => format!("did you mean `{key}`? ({whose})"),
        None => format!("did you mean `{key}`?"),
    }
}

/// Parses `source` as a `T`.
pub fn read<T: DeserializeOwned>(source: &str) -> Result<T, ReadError> {
    let document = SpannedDocument::parse(source).map_err(|m| ReadError {
        at: Some(m.at),
        field: String::new(),
        kind: SpecErrorKind::Syntax,
        why: m.why,
        fix: m.fix,
        unknown: None,
    })?;
    serde_path_to_error::deserialize(Node(document.root())).map_err(|e| {
        let mut steps: Vec<Step> = e
            .path()
            .iter()
            .filter_map(|segment| match segment {
                Segment::Map { key } => Some(Step::Key(key.clone())),
                Segment::Seq { index } => Some(Step::Index(*index)),
                Segment::Enum { .. } | Segment::Unknown => None,
            })
            .collect();
        let error = e.into_inner();
        // The path of an unknown key ends with that key; errors name the section holding it.
        if let Problem::UnknownKey { key, .. } = &error.problem {
            if steps.last() == Some(&Step::Key(key.clone())) {
                steps.pop();
            }
        }
        explain(error, &steps, &document, source)
    })
}

/// `training`, `data`, `files`, `[0]` → `training.data.files[0]`.
fn dotted(steps: &[Step]) -> String {
    let mut out = String::new();
    for step in steps {
        match step {
            Step::Key(key) => {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(key);
            }
            Step::Index(i) => out.push_str(&format!("[{i}]")),
        }
    }
    out
}

/// Errors serde found in a value it had buffered (a tagged section such as `model: {kind:
/// llama, ...}`) come with no node, and a path that stops at that section. The key they are
/// about, when only one place inside the section can be meant: an unknown key written once
/// there, or a wrong value written once there.
fn inside_buffered(
    error: &DeError,
    path: &[Step],
    document: &SpannedDocument<'_>,
) -> Option<(Vec<Step>, Location)> {
    if error.at.is_some() {
        return None;
    }
    let entries = document.entries_within(path);
    let mut matching: Vec<(Vec<Step>, Option<Location>)> = match &error.problem {
        Problem::UnknownKey { key, .. } => entries
            .iter()
            .filter(|e| e.key == key)
            .map(|e| (e.parent.clone(), e.key_at))
            .collect(),
        Problem::WrongValue {
            found: Some(found), ..
        } => entries
            .iter()
            .filter(|e| found.is_in(e.value))
            .map(|e| (e.path(), e.value_at()))
            .collect(),
        _ => return None,
    };
    match (matching.pop(), matching.is_empty()) {
        (Some((steps, Some(at))), true) => Some((steps, at)),
        _ => None,
    }
}

fn explain(
    mut error: DeError,
    path: &[Step],
    document: &SpannedDocument<'_>,
    source: &str,
) -> ReadError {
    let path = match inside_buffered(&error, path, document) {
        Some((steps, at)) => {
            error.at = Some(at);
            steps
        }
        None => path.to_vec(),
    };
    let path = path.as_slice();
    let field = dotted(path);
    let join = |key: &str| {
        if field.is_empty() {
            key.to_string()
        } else {
            format!("{field}.{key}")
        }
    };
    // Errors serde found in a value it had buffered come without a node: find the key or
    // value by the path instead.
    let locate = |key: Option<&str>| {
        error.at.or_else(|| match key {
            Some(key) => {
                let mut to_key = path.to_vec();
                to_key.push(Step::Key(key.to_string()));
                document.key_location(&to_key)
            }
            None => document
                .value_location(path)
                .or_else(|| document.key_location(path)),
        })
    };
    let mut unknown = None;
    let (at, kind, why, fix) = match &error.problem {
        Problem::UnknownKey { key, expected } => {
            let elsewhere = other_place(key);
            let renamed = transformers_name(key, expected);
            let close = did_you_mean(key, expected);
            // Another tool's name: the key meant, as written here, and whose name it was.
            let (meant, whose) = match (elsewhere, renamed) {
                (Some((ours, "", _)), _) => (Some(ours.to_string()), None),
                (Some((ours, whose, note)), _) => (
                    Some(ours.to_string()),
                    Some(format!("the name here of {whose} `{key}`{note}")),
                ),
                (None, Some(name)) => (
                    Some(name.to_string()),
                    Some(format!("the name here of transformers' `{key}`")),
                ),
                (None, None) => (close.map(str::to_string), None),
            };
            let fix = match (&meant, &whose, elsewhere) {
                (Some(meant), Some(whose), _) => did_you_mean_text(meant, Some(whose)),
                (Some(meant), None, Some(_)) => did_you_mean_text(meant, None),
                _ => choose(close, expected, "key"),
            };
            // Another place's key is a whole path already.
            let whole = |meant: String| {
                if elsewhere.is_some() {
                    meant
                } else {
                    join(&meant)
                }
            };
            unknown = Some(Box::new(UnknownKey {
                path: join(key),
                suggestion: meant.map(whole),
                renamed_from: whose,
            }));
            (
                locate(Some(key)),
                SpecErrorKind::UnknownField,
                format!("unknown key `{}`", join(key)),
                fix,
            )
        }
        Problem::UnknownValue { value, expected } => (
            locate(None),
            SpecErrorKind::WrongValue,
            format!("unknown value `{value}`"),
            match torch_dtype_name(value, expected) {
                Some(ours) => {
                    format!("did you mean `{ours}`? (the name here of PyTorch's `{value}`)")
                }
                None => choose(did_you_mean(value, expected), expected, "value"),
            },
        ),
        Problem::MissingKey(key) => {
            // Written at the top level, where no such key belongs, instead of indented under
            // its section (`steps:` under `training:`). Keys of other sections are left
            // alone: a `kind` or `name` there is that section's own.
            let misplaced = document.entries_within(&[]).into_iter().find(|e| {
                e.parent.is_empty()
                    && e.key == *key
                    && !super::schema::TOP_LEVEL_KEYS.contains(&e.key)
                    && !path.is_empty()
            });
            let fix = match misplaced {
                Some(entry) => format!(
                    "`{key}` is written at the top level{}: move it under `{field}:`, indented",
                    entry
                        .key_at
                        .map(|at| format!(" (line {})", at.line))
                        .unwrap_or_default()
                ),
                None => {
                    format!("add `{key}:` here; docs/job-spec.md lists every key with its default")
                }
            };
            (
                locate(None),
                SpecErrorKind::MissingField,
                format!("required key `{}` is missing", join(key)),
                fix,
            )
        }
        Problem::WrongValue {
            message, expected, ..
        } => {
            let at = locate(None);
            let written = at.and_then(|at| flow_text_at(source, at));
            (
                at,
                SpecErrorKind::WrongValue,
                message.clone(),
                wrong_value_fix(&field, message, expected, written.as_deref()),
            )
        }
        Problem::Other(message) => (
            locate(None),
            SpecErrorKind::WrongValue,
            message.clone(),
            "compare with examples/demo.yaml and docs/job-spec.md".into(),
        ),
    };
    ReadError {
        at,
        field,
        kind,
        why,
        fix,
        unknown,
    }
}

/// How the sections people most often write otherwise look: (field, an example).
pub(crate) const SECTION_EXAMPLES: [(&str, &str); 12] = [
    ("resources.env", "env: { NCCL_DEBUG: WARN }"),
    ("resources.extra_sbatch", "extra_sbatch: [--mail-type=END]"),
    ("resources.setup", "setup: [\"source /etc/profile\"]"),
    (
        "preemption",
        "preemption: { signal_seconds: 300, requeue: true }",
    ),
    (
        "training.data",
        "data: { kind: jsonl, files: [train.jsonl], seq_len: 2048 }",
    ),
    (
        "training.data.validation",
        "validation: { fraction: 0.02 }` or `validation: { files: [val.jsonl] }",
    ),
    (
        "training.optimizer",
        "optimizer: { lr: 3.0e-4, weight_decay: 0.1 }",
    ),
    (
        "training.schedule",
        "schedule: { warmup_steps: 100, decay: cosine }",
    ),
    (
        "training.checkpoint",
        "checkpoint: { interval_steps: 500, keep: 2 }",
    ),
    (
        "training.fsdp",
        "fsdp: { strategy: FULL_SHARD, activation_checkpointing: true }",
    ),
    (
        "training.fsdp.mixed_precision",
        "mixed_precision: { param_dtype: bf16, reduce_dtype: f32 }",
    ),
    (
        "sweep.grid",
        "grid: { training.optimizer.lr: [1.0e-4, 3.0e-4] }",
    ),
];

/// How to write a value where one of the wrong type was: an example for the sections of
/// [`SECTION_EXAMPLES`]; where text was expected and a list or a mapping found, one value
/// (and, for `written` in brackets, that YAML reads them as a list or a mapping); else what
/// the field takes.
fn wrong_value_fix(field: &str, message: &str, expected: &str, written: Option<&str>) -> String {
    if let Some((_, example)) = SECTION_EXAMPLES.iter().find(|(f, _)| *f == field) {
        return format!("write {expected} here, e.g. `{example}`");
    }
    let text_expected = expected.contains("string");
    let read_as = ["sequence", "map"]
        .into_iter()
        .find(|what| message.starts_with(&format!("invalid type: {what},")));
    let what = match read_as {
        Some("map") => "mapping",
        _ => "list",
    };
    match (read_as, written) {
        (Some(_), Some(written)) if text_expected => format!(
            "write one value here; YAML reads an unquoted `{written}` as a {what}: to give \
             it as text, quote it: `\"{written}\"`"
        ),
        (Some(_), None) if text_expected => format!("write one value here, not a {what}"),
        _ => format!("write {expected} here"),
    }
}

/// The flow collection written at `at` (`[a100|h100]`, `{ hours: 2 }`), up to its closing
/// bracket; `None` for anything else (a block list or mapping).
fn flow_text_at(source: &str, at: Location) -> Option<String> {
    let rest = super::yaml::line_from(source, at)?;
    if !rest.starts_with(['[', '{']) {
        return None;
    }
    let mut depth = 0usize;
    for (i, c) in rest.char_indices() {
        match c {
            '[' | '{' => depth += 1,
            ']' | '}' => {
                depth -= 1;
                if depth == 0 {
                    return Some(rest[..=i].to_string());
                }
            }
            _ => {}
        }
    }
    None
}

/// The Llama keys `transformers`' `config.json` names otherwise than this spec: (theirs,
/// ours).
pub(crate) const TRANSFORMERS_NAMES: [(&str, &str); 7] = [
    ("hidden_size", "dim"),
    ("num_hidden_layers", "n_layers"),
    ("num_attention_heads", "n_heads"),
    ("num_key_value_heads", "n_kv_heads"),
    ("intermediate_size", "ffn_dim"),
    ("rms_norm_eps", "norm_eps"),
    ("tie_word_embeddings", "tie_embeddings"),
];

const TRAINER: &str = "the Hugging Face Trainer's";
const TRL: &str = "TRL's";
const SUBMITIT: &str = "submitit's";

/// Keys of other tools (the Hugging Face Trainer, TRL, submitit) that this spec has under
/// another name and place, and keys of this spec written in another section: (theirs, ours
/// as a whole path, whose name it is (`""`: this spec's, misplaced), what differs).
const OTHER_PLACES: [(&str, &str, &str, &str); 30] = [
    ("learning_rate", "training.optimizer.lr", TRAINER, ""),
    ("max_steps", "training.steps", TRAINER, ""),
    (
        "num_train_epochs",
        "training.steps",
        TRAINER,
        ": training is counted in steps here, and `shardrun plan` says how many epochs they make",
    ),
    (
        "per_device_train_batch_size",
        "training.batch_size_per_device",
        TRAINER,
        "",
    ),
    (
        "gradient_accumulation_steps",
        "training.total_batch_size",
        TRAINER,
        ": here the accumulation is worked out from the samples per optimizer step over all ranks",
    ),
    ("max_grad_norm", "training.optimizer.grad_clip", TRAINER, ""),
    (
        "weight_decay",
        "training.optimizer.weight_decay",
        TRAINER,
        "",
    ),
    ("adam_beta1", "training.optimizer.beta1", TRAINER, ""),
    ("adam_beta2", "training.optimizer.beta2", TRAINER, ""),
    ("adam_epsilon", "training.optimizer.eps", TRAINER, ""),
    (
        "warmup_steps",
        "training.schedule.warmup_steps",
        TRAINER,
        "",
    ),
    ("lr_scheduler_type", "training.schedule.decay", TRAINER, ""),
    (
        "bf16",
        "training.fsdp.mixed_precision",
        TRAINER,
        ": `mixed_precision: { param_dtype: bf16, reduce_dtype: f32 }`",
    ),
    (
        "fp16",
        "training.fsdp.mixed_precision",
        TRAINER,
        ": `mixed_precision: { param_dtype: f16, reduce_dtype: f32 }`, with loss scaling",
    ),
    (
        "gradient_checkpointing",
        "training.fsdp.activation_checkpointing",
        TRAINER,
        "",
    ),
    (
        "save_steps",
        "training.checkpoint.interval_steps",
        TRAINER,
        "",
    ),
    ("save_total_limit", "training.checkpoint.keep", TRAINER, ""),
    ("logging_steps", "training.log_every", TRAINER, ""),
    (
        "eval_steps",
        "training.data.validation.every_steps",
        TRAINER,
        "",
    ),
    (
        "output_dir",
        "run_root",
        TRAINER,
        ": the run directory is `<run_root>/<name>`",
    ),
    ("max_length", "training.data.seq_len", TRL, ""),
    ("max_seq_length", "training.data.seq_len", TRL, ""),
    (
        "timeout_min",
        "resources.time",
        SUBMITIT,
        ": Slurm's syntax, e.g. `time: \"02:00:00\"`",
    ),
    ("slurm_partition", "resources.partition", SUBMITIT, ""),
    (
        "slurm_additional_parameters",
        "resources.extra_sbatch",
        SUBMITIT,
        ": sbatch options as on the command line, e.g. `[--mail-type=END]`",
    ),
    (
        "mem_gb",
        "resources.mem",
        SUBMITIT,
        ": Slurm's syntax, e.g. `mem: 64G`",
    ),
    ("setup", "resources.setup", SUBMITIT, ""),
    ("lr", "training.optimizer.lr", "", ""),
    ("seq_len", "training.data.seq_len", "", ""),
    ("strategy", "training.fsdp.strategy", "", ""),
];

/// Where this spec has another tool's key (or one of its own keys written in another
/// section), whose name it is and what differs, wherever in the spec it was written (only
/// keys unknown where they are written are looked up).
fn other_place(key: &str) -> Option<(&'static str, &'static str, &'static str)> {
    OTHER_PLACES
        .iter()
        .find(|(theirs, _, _, _)| *theirs == key)
        .map(|(_, ours, whose, note)| (*ours, *whose, *note))
}

/// A Llama model's key under the name transformers' `config.json` gives it, when `expected`
/// (the keys allowed where it was written) has it under this spec's name.
fn transformers_name(key: &str, expected: &[&'static str]) -> Option<&'static str> {
    TRANSFORMERS_NAMES
        .iter()
        .find(|(theirs, ours)| *theirs == key && expected.contains(ours))
        .map(|(_, ours)| *ours)
}

/// A dtype under the name PyTorch (and `config.json`'s `torch_dtype`) gives it, when
/// `expected` (the values allowed where it was written) has it under this spec's name.
fn torch_dtype_name(value: &str, expected: &[&'static str]) -> Option<&'static str> {
    let ours = match value {
        "bfloat16" => "bf16",
        "float16" | "half" => "f16",
        "float32" | "float" => "f32",
        _ => return None,
    };
    expected.contains(&ours).then_some(ours)
}

/// The fix for an unknown key or value: the one probably meant, else the list.
fn choose(best: Option<&str>, expected: &[&str], what: &str) -> String {
    match best {
        Some(best) => format!("did you mean `{best}`?"),
        None if expected.is_empty() => format!("remove the {what}"),
        None => format!(
            "use one of {}",
            expected
                .iter()
                .map(|e| format!("`{e}`"))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}
