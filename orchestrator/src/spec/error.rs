//! Spec errors that say where (file, line, column, field), why, and how to fix it, with the
//! offending line of the file shown under the message and its column marked.

use super::read::ReadError;
use super::yaml::Location;
use annotate_snippets::{AnnotationKind, Group, Level, Renderer, Snippet};
use std::fmt;
use std::path::Path;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpecErrorKind {
    /// The file could not be read.
    Io,
    /// Not valid YAML at all, or not one document.
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
    /// This and the excerpt are boxed: errors travel in `Result`s, which stay small.
    pub file: Box<Path>,
    /// 1-based line and column, when known.
    pub line: Option<u32>,
    pub column: Option<u32>,
    /// The line of the file the error is on, shown under the message.
    pub excerpt: Option<Box<Excerpt>>,
    /// Dotted path of the offending field (`training.optimizer.lr`); empty for the document.
    pub field: String,
    pub kind: SpecErrorKind,
    pub why: String,
    pub fix: String,
}

/// One line of a spec file and how much of it, from the error's column, to mark.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Excerpt {
    /// The line's text, without its line break.
    pub text: String,
    /// Characters to mark from the column (at least 1).
    pub width: u32,
}

impl SpecError {
    /// An error in the spec file `file`, whose text is `source`, at `at` when known.
    pub(crate) fn in_file(
        file: &Path,
        source: &str,
        at: Option<Location>,
        field: String,
        kind: SpecErrorKind,
        why: String,
        fix: String,
    ) -> SpecError {
        let excerpt = at.and_then(|at| {
            source
                .lines()
                .nth(at.line.checked_sub(1)? as usize)
                .map(|text| {
                    Box::new(Excerpt {
                        text: text.to_string(),
                        width: at.width,
                    })
                })
        });
        SpecError {
            file: file.into(),
            line: at.map(|a| a.line),
            column: at.map(|a| a.column),
            excerpt,
            field,
            kind,
            why,
            fix,
        }
    }

    /// An error about a value given on the command line, named by its flag (`--set ...`).
    pub(crate) fn from_flag(
        flag: &str,
        field: String,
        kind: SpecErrorKind,
        why: String,
        fix: String,
    ) -> SpecError {
        SpecError {
            file: Path::new(flag).into(),
            line: None,
            column: None,
            excerpt: None,
            field,
            kind,
            why,
            fix,
        }
    }

    /// An error read from the text of `file`.
    pub(crate) fn from_read(e: ReadError, file: &Path, source: &str) -> SpecError {
        SpecError::in_file(file, source, e.at, e.field, e.kind, e.why, e.fix)
    }
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
        if let (Some(excerpt), Some(line)) = (&self.excerpt, self.line) {
            write!(f, "\n{}", excerpt.render(line, self.column.unwrap_or(1)))?;
        }
        if !self.fix.is_empty() {
            write!(f, "\n  fix: {}", self.fix)?;
        }
        Ok(())
    }
}

impl Excerpt {
    /// ```text
    ///   |
    /// 5 |   total_batch_size: 5
    ///   |   ^^^^^^^^^^^^^^^^
    /// ```
    fn render(&self, line: u32, column: u32) -> String {
        // Columns count characters; the snippet wants byte offsets into the line.
        let byte = |chars: u32| {
            self.text
                .char_indices()
                .nth(chars as usize)
                .map_or(self.text.len(), |(i, _)| i)
        };
        let start = byte(column.saturating_sub(1));
        let end = byte(column.saturating_sub(1) + self.width).max(start);
        let report = [Group::with_level(Level::ERROR).element(
            Snippet::source(self.text.as_str())
                .line_start(line as usize)
                .annotation(AnnotationKind::Primary.span(start..end)),
        )];
        Renderer::plain().render(&report)
    }
}

/// The closest candidate by Jaro-Winkler similarity, if it is close enough to be a typo.
pub fn did_you_mean<'a>(given: &str, candidates: &[&'a str]) -> Option<&'a str> {
    // Case aside: `full_shard` is `FULL_SHARD`.
    let given = given.to_lowercase();
    candidates
        .iter()
        .map(|c| (strsim::jaro_winkler(&given, &c.to_lowercase()), *c))
        .filter(|(score, _)| *score > 0.8)
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, c)| c)
}
