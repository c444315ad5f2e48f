//! Reading data files into documents: whole files, lines or separated pieces of text, JSONL
//! records (a text field, or a prompt and its completion), chat records. Files are read in
//! order, in batches of about a given size, so tokenization can run on one batch while the
//! next is read.

use crate::chat::messages_of;
use crate::error::{DataError, Origin, Result};
use crate::files::DataFile;
use shardrun_protocol::config::{DataSource, JsonlText, OnBadRecord, TextSplit};
use std::io::{BufRead, BufReader, Read};

/// What a document holds before tokenization.
#[derive(Debug, Clone)]
pub enum Body {
    /// Trained on in full.
    Text(String),
    /// Trained on the completion only.
    PromptCompletion { prompt: String, completion: String },
    /// Messages for the chat template (and the record's `tools`, when it has them); trained
    /// on the assistant's turns only.
    Chat {
        messages: Vec<minijinja::Value>,
        tools: Option<minijinja::Value>,
    },
}

#[derive(Debug, Clone)]
pub struct Document {
    pub body: Body,
    /// Index into the files being read.
    pub file: u32,
    /// Line the record starts on (1-based), 0 for a whole file.
    pub line: u64,
}

/// Documents read since the previous batch, and the input bytes they consumed.
pub struct ReadBatch {
    pub documents: Vec<Document>,
    pub bytes: u64,
}

/// A record that was skipped (`on_bad_record: skip`).
#[derive(Debug, Clone)]
pub struct Skipped {
    pub origin: Origin,
    pub why: String,
}

pub struct DocumentReader<'a> {
    files: &'a [DataFile],
    source: &'a DataSource,
    policy: OnBadRecord,
    next_file: usize,
    lines: Option<LineReader>,
    /// Every record skipped so far.
    pub skipped: Vec<Skipped>,
}

struct LineReader {
    file: u32,
    reader: BufReader<std::fs::File>,
    line: u64,
    buf: Vec<u8>,
}

impl<'a> DocumentReader<'a> {
    pub fn new(
        files: &'a [DataFile],
        source: &'a DataSource,
        policy: OnBadRecord,
    ) -> DocumentReader<'a> {
        DocumentReader {
            files,
            source,
            policy,
            next_file: 0,
            lines: None,
            skipped: Vec::new(),
        }
    }

    /// The next documents, about `target_bytes` of input; `None` at the end.
    pub fn next_batch(&mut self, target_bytes: u64) -> Result<Option<ReadBatch>> {
        let mut batch = ReadBatch {
            documents: Vec::new(),
            bytes: 0,
        };
        while batch.bytes < target_bytes {
            if self.lines.is_some() {
                if !self.read_lines(&mut batch, target_bytes)? {
                    self.lines = None;
                }
                continue;
            }
            let Some(file) = self.files.get(self.next_file) else {
                break;
            };
            let index = self.next_file as u32;
            self.next_file += 1;
            let origin = Origin::new(&file.path, 0);
            if file.size == 0 {
                self.bad(origin, "the file is empty")?;
                continue;
            }
            let opened = match std::fs::File::open(&file.path) {
                Ok(f) => f,
                Err(e) => {
                    self.bad(origin, format!("cannot be read: {e}"))?;
                    continue;
                }
            };
            match self.source {
                DataSource::Text {
                    split: TextSplit::File,
                    ..
                } => {
                    batch.bytes += file.size;
                    if let Some(text) = self.whole_file(opened, &origin)? {
                        batch.documents.push(Document {
                            body: Body::Text(text),
                            file: index,
                            line: 0,
                        });
                    }
                }
                DataSource::Text {
                    split: TextSplit::Separator { separator },
                    ..
                } => {
                    batch.bytes += file.size;
                    if let Some(text) = self.whole_file(opened, &origin)? {
                        split_documents(&text, separator, index, &mut batch.documents);
                    }
                }
                _ => {
                    self.lines = Some(LineReader {
                        file: index,
                        reader: BufReader::with_capacity(1 << 20, opened),
                        line: 0,
                        buf: Vec::new(),
                    });
                }
            }
        }
        if batch.documents.is_empty() && batch.bytes == 0 {
            return Ok(None);
        }
        Ok(Some(batch))
    }

    /// Reads records of the open line-based file into `batch`; false at its end.
    fn read_lines(&mut self, batch: &mut ReadBatch, target_bytes: u64) -> Result<bool> {
        let Some(lines) = self.lines.as_mut() else {
            return Ok(false);
        };
        let path = self.files[lines.file as usize].path.clone();
        while batch.bytes < target_bytes {
            lines.buf.clear();
            let n = lines
                .reader
                .read_until(b'\n', &mut lines.buf)
                .map_err(DataError::io("read", &path))?;
            if n == 0 {
                return Ok(false);
            }
            lines.line += 1;
            batch.bytes += n as u64;
            let (file, line) = (lines.file, lines.line);
            let origin = Origin::new(&path, line);
            let bytes = strip_newline(&lines.buf);
            let text = match std::str::from_utf8(bytes) {
                Ok(text) => text,
                Err(e) => {
                    let why = format!(
                        "not UTF-8 text (bad byte at column {})",
                        e.valid_up_to() + 1
                    );
                    // `bad` needs `&mut self`: release the borrow of the line buffer first.
                    self.bad(origin, why)?;
                    return Ok(true);
                }
            };
            if text.trim().is_empty() {
                continue;
            }
            let body = match parse_record(self.source, text) {
                Ok(body) => body,
                Err(why) => {
                    self.bad(origin, why)?;
                    return Ok(true);
                }
            };
            batch.documents.push(Document { body, file, line });
        }
        Ok(true)
    }

    fn whole_file(&mut self, mut file: std::fs::File, origin: &Origin) -> Result<Option<String>> {
        let mut bytes = Vec::new();
        if let Err(e) = file.read_to_end(&mut bytes) {
            self.bad(origin.clone(), format!("cannot be read: {e}"))?;
            return Ok(None);
        }
        match String::from_utf8(bytes) {
            Ok(text) => Ok(Some(text)),
            Err(e) => {
                let at = e.utf8_error().valid_up_to();
                let line = e.as_bytes()[..at].iter().filter(|&&b| b == b'\n').count() + 1;
                self.bad(
                    Origin::new(&origin.path, line as u64),
                    format!("not UTF-8 text (bad byte at offset {at})"),
                )?;
                Ok(None)
            }
        }
    }

    /// Stop with the error, or note the record as skipped.
    fn bad(&mut self, origin: Origin, why: impl Into<String>) -> Result<()> {
        let why = why.into();
        match self.policy {
            OnBadRecord::Stop => Err(DataError::bad(origin, why)),
            OnBadRecord::Skip => {
                self.skipped.push(Skipped { origin, why });
                Ok(())
            }
        }
    }
}

fn strip_newline(line: &[u8]) -> &[u8] {
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    line.strip_suffix(b"\r").unwrap_or(line)
}

/// Pieces of `text` between separators, each starting on the line it names; blank pieces
/// are not documents.
fn split_documents(text: &str, separator: &str, file: u32, out: &mut Vec<Document>) {
    let mut line = 1u64;
    for piece in text.split(separator) {
        if !piece.trim().is_empty() {
            // The line of the piece's first non-blank character.
            let lead = piece.len() - piece.trim_start().len();
            let start = line + piece[..lead].matches('\n').count() as u64;
            out.push(Document {
                body: Body::Text(piece.to_string()),
                file,
                line: start,
            });
        }
        line += piece.matches('\n').count() as u64 + separator.matches('\n').count() as u64;
    }
}

/// One line of a line-based source as a document body, or why it is not one.
fn parse_record(source: &DataSource, line: &str) -> std::result::Result<Body, String> {
    match source {
        DataSource::Text { .. } => Ok(Body::Text(line.to_string())),
        DataSource::Jsonl { text, .. } => {
            let record: serde_json::Value =
                serde_json::from_str(line).map_err(|e| format!("not a JSON record ({e})"))?;
            if !record.is_object() {
                return Err("the record is not a JSON object".into());
            }
            match text {
                JsonlText::Field { field } => Ok(Body::Text(string_field(&record, field)?)),
                JsonlText::PromptCompletion { prompt, completion } => Ok(Body::PromptCompletion {
                    prompt: string_field(&record, prompt)?,
                    completion: string_field(&record, completion)?,
                }),
            }
        }
        DataSource::Chat { messages_field, .. } => {
            let record: minijinja::Value =
                serde_json::from_str(line).map_err(|e| format!("not a JSON record ({e})"))?;
            let tools = record
                .get_attr("tools")
                .ok()
                .filter(|t| !t.is_undefined() && !t.is_none());
            Ok(Body::Chat {
                messages: messages_of(&record, messages_field)?,
                tools,
            })
        }
        DataSource::Tokens { .. } => Err("token files hold no text records".into()),
    }
}

/// A string field; a dotted name (`meta.text`) reaches into nested objects unless the record
/// has a key with the dot in it.
fn string_field(record: &serde_json::Value, field: &str) -> std::result::Result<String, String> {
    let value = record.get(field).or_else(|| {
        field
            .split('.')
            .try_fold(record, |value, key| value.get(key))
    });
    match value {
        Some(serde_json::Value::String(s)) => Ok(s.clone()),
        Some(serde_json::Value::Null) => Err(format!("field `{field}` is null")),
        Some(other) => Err(format!(
            "field `{field}` is {}, not a string",
            match other {
                serde_json::Value::Bool(_) => "a boolean",
                serde_json::Value::Number(_) => "a number",
                serde_json::Value::Array(_) => "a list",
                _ => "an object",
            }
        )),
        None => {
            let keys: Vec<&str> = record
                .as_object()
                .map(|o| o.keys().map(String::as_str).collect())
                .unwrap_or_default();
            Err(format!(
                "no field `{field}` in the record (it has: {})",
                keys.join(", ")
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use shardrun_protocol::config::TextSplit;

    #[test]
    fn separator_pieces_know_their_lines() {
        let mut docs = Vec::new();
        split_documents("a\nb\n\n\n\nc\n\n\n", "\n\n", 0, &mut docs);
        let got: Vec<(String, u64)> = docs
            .iter()
            .map(|d| match &d.body {
                Body::Text(t) => (t.clone(), d.line),
                _ => unreachable!(),
            })
            .collect();
        assert_eq!(got, [("a\nb".to_string(), 1), ("c".to_string(), 6)]);
    }

    #[test]
    fn fields_and_their_errors() {
        let r: serde_json::Value =
            serde_json::from_str(r#"{"a": {"b": "x"}, "n": 3, "z": null}"#).unwrap();
        assert_eq!(string_field(&r, "a.b").unwrap(), "x");
        assert!(string_field(&r, "n").unwrap_err().contains("a number"));
        assert!(string_field(&r, "z").unwrap_err().contains("null"));
        assert!(string_field(&r, "text")
            .unwrap_err()
            .contains("it has: a, n, z"));
    }

    #[test]
    fn lines_become_documents_and_bad_ones_stop_or_skip() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("d.jsonl");
        std::fs::write(
            &path,
            "{\"text\": \"one\"}\n\n{oops\n{\"text\": \"two\"}\r\n",
        )
        .unwrap();
        let files = vec![crate::files::stat(&path).unwrap()];
        let source = DataSource::Jsonl {
            files: vec![path.clone()],
            text: JsonlText::Field {
                field: "text".into(),
            },
        };
        let mut reader = DocumentReader::new(&files, &source, OnBadRecord::Stop);
        let err = reader.next_batch(1 << 20).err().unwrap();
        assert!(
            err.to_string()
                .starts_with(&format!("{}:3: not a JSON record", path.display())),
            "{err}"
        );
        let mut reader = DocumentReader::new(&files, &source, OnBadRecord::Skip);
        let batch = reader.next_batch(1 << 20).unwrap().unwrap();
        let lines: Vec<u64> = batch.documents.iter().map(|d| d.line).collect();
        assert_eq!(lines, [1, 4]);
        assert_eq!(reader.skipped.len(), 1);
        assert!(reader.next_batch(1 << 20).unwrap().is_none());

        let text = DataSource::Text {
            files: vec![],
            split: TextSplit::Line,
        };
        assert!(matches!(parse_record(&text, "x"), Ok(Body::Text(t)) if t == "x"));
    }
}
