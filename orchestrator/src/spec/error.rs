//! Spec errors that say where (file, line, column, field), why, and how to fix it.

use std::fmt;
use std::path::{Path, PathBuf};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpecErrorKind {
    /// The file could not be read.
    Io,
    /// Not valid YAML at all.
    Syntax,
    /// A key the schema does not know.
    UnknownField,
    /// A required key is absent.
    MissingField,
    /// A value of the wrong type or an unknown variant.
    WrongValue,
    /// Well-formed but not acceptable (checked after parsing).
    Invalid,
}

#[derive(Debug, Clone, thiserror::Error)]
pub struct SpecError {
    /// The file the error is in, or the flag that set the value (`--set training.steps=x`).
    pub file: PathBuf,
    /// 1-based line and column, when known.
    pub line: Option<u32>,
    pub column: Option<u32>,
    /// Dotted path of the offending field (`training.optimizer.lr`); empty for the document.
    pub field: String,
    pub kind: SpecErrorKind,
    pub why: String,
    pub fix: String,
}

impl fmt::Display for SpecError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file.display())?;
        if let Some(line) = self.line {
            write!(f, ":{line}")?;
            if let Some(column) = self.column {
                write!(f, ":{column}")?;
            }
        }
        if !self.field.is_empty() {
            write!(f, ": field `{}`", self.field)?;
        }
        write!(f, ": {}", self.why)?;
        if !self.fix.is_empty() {
            write!(f, "\n  fix: {}", self.fix)?;
        }
        Ok(())
    }
}

impl SpecError {
    /// Turn serde_norway's error into one with a field path, a reason and a fix.
    /// serde_norway renders messages as `<path>: <message> at line L column C`; the path and
    /// message are split back out here because the error type does not expose them.
    pub(crate) fn from_yaml(err: &serde_norway::Error, file: &Path, source: &str) -> SpecError {
        let location = err.location();
        let mut text = err.to_string();
        if let Some(idx) = text.rfind(" at line ") {
            text.truncate(idx);
        }
        let (field, message) = split_path(&text);
        let (kind, why, fix) = explain(field, message, source);
        SpecError {
            file: file.to_path_buf(),
            line: location.as_ref().map(|l| l.line() as u32),
            column: location.as_ref().map(|l| l.column() as u32),
            field: field.to_string(),
            kind,
            why,
            fix,
        }
    }
}

/// `training.optimizer: unknown field ...` → (`training.optimizer`, `unknown field ...`).
fn split_path(text: &str) -> (&str, &str) {
    if let Some((head, rest)) = text.split_once(": ") {
        let looks_like_path = !head.is_empty()
            && head
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '[' | ']' | '-'));
        if looks_like_path {
            return (head, rest);
        }
    }
    ("", text)
}

/// Backtick-quoted words of a serde message: ``unknown field `lrr`, expected `lr` or `eps` ``.
fn quoted(message: &str) -> Vec<&str> {
    message.split('`').skip(1).step_by(2).collect()
}

fn explain(field: &str, message: &str, _source: &str) -> (SpecErrorKind, String, String) {
    let join = |parent: &str, key: &str| {
        if parent.is_empty() {
            key.to_string()
        } else {
            format!("{parent}.{key}")
        }
    };
    if message.starts_with("unknown field") || message.starts_with("unknown variant") {
        let words = quoted(message);
        let (given, expected) = match words.split_first() {
            Some((given, rest)) => (*given, rest.to_vec()),
            None => ("", Vec::new()),
        };
        let what = if message.starts_with("unknown field") {
            "key"
        } else {
            "value"
        };
        let why = if what == "key" {
            format!("unknown key `{}`", join(field, given))
        } else {
            format!("unknown value `{given}`")
        };
        let fix = match did_you_mean(given, &expected) {
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
        };
        let kind = if what == "key" {
            SpecErrorKind::UnknownField
        } else {
            SpecErrorKind::WrongValue
        };
        return (kind, why, fix);
    }
    if message.starts_with("missing field") {
        let key = quoted(message).first().copied().unwrap_or("");
        return (
            SpecErrorKind::MissingField,
            format!("required key `{}` is missing", join(field, key)),
            format!("add `{key}:` here; docs/job-spec.md lists every key with its default"),
        );
    }
    if message.starts_with("invalid type") || message.starts_with("invalid value") {
        let expected = message
            .split_once(", expected ")
            .map(|(_, e)| e)
            .unwrap_or("a different value");
        return (
            SpecErrorKind::WrongValue,
            message.to_string(),
            format!("write {} here", plain_type(expected)),
        );
    }
    if message.starts_with("duplicate") {
        return (
            SpecErrorKind::Syntax,
            message.to_string(),
            "keep only one of the two keys".into(),
        );
    }
    if message.contains("did not find expected")
        || message.contains("mapping values are not allowed")
        || message.contains("found character")
        || message.contains("while parsing")
        || message.contains("while scanning")
    {
        return (
            SpecErrorKind::Syntax,
            format!("not valid YAML: {message}"),
            "check indentation (spaces only) and quoting around this position".into(),
        );
    }
    (
        SpecErrorKind::WrongValue,
        message.to_string(),
        "compare with examples/demo.yaml and docs/job-spec.md".into(),
    )
}

/// The closest candidate by Jaro-Winkler similarity, if it is close enough to be a typo.
pub fn did_you_mean<'a>(given: &str, candidates: &[&'a str]) -> Option<&'a str> {
    candidates
        .iter()
        .map(|c| (strsim::jaro_winkler(given, c), *c))
        .filter(|(score, _)| *score > 0.8)
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, c)| c)
}

/// serde's type names in words people use.
fn plain_type(expected: &str) -> String {
    match expected {
        "u64" | "u32" | "usize" => "a whole number (0 or more)".into(),
        "f64" => "a number".into(),
        "a boolean" | "bool" => "true or false".into(),
        other => other.to_string(),
    }
}
