//! Reading data files into documents: whole files, lines or separated pieces of text, JSONL
//! records (a text field, or a prompt and its completion), chat records (messages, or a
//! prompt and a completion of messages), records a line each or in one JSON array. Files
//! are read in order, in batches of about a given size, so tokenization can run on one batch
//! while the next is read; a file of lines, separated pieces or array elements is read a
//! record at a time, so memory holds a batch, not the file. A leading UTF-8 byte-order mark
//! is not text.

use crate::chat::{self, messages_of, prompt_completion_of};
use crate::error::{DataError, Origin, Result, SKIP_HINT};
use crate::files::DataFile;
use crate::json_array::{ArrayRecords, Element};
use minijinja::value::ValueKind;
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
    /// on the assistant's turns only, or, for a prompt-completion record, on what follows
    /// its first `prompt_len` messages.
    Chat {
        messages: Vec<minijinja::Value>,
        tools: Option<minijinja::Value>,
        prompt_len: Option<usize>,
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

impl Document {
    /// The bytes of text the tokenizer gets (a chat's message contents; not the template's).
    pub fn text_bytes(&self) -> usize {
        match &self.body {
            Body::Text(text) => text.len(),
            Body::PromptCompletion { prompt, completion } => prompt.len() + completion.len(),
            Body::Chat { messages, .. } => messages
                .iter()
                .filter_map(|m| m.get_attr("content").ok())
                .filter_map(|c| c.as_str().map(str::len))
                .sum(),
        }
    }
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
    /// The field the record lacks, when that is why.
    pub lacks: Option<Lacking>,
}

impl Skipped {
    pub fn new(origin: Origin, why: String) -> Skipped {
        Skipped {
            origin,
            why,
            lacks: None,
        }
    }
}

/// A field a skipped record lacks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lacking {
    /// The spec key that names it: `field`, `prompt_field`, `completion_field` or
    /// `messages_field`.
    pub key: &'static str,
    /// What to set the key to (`did you mean `field: text`?`), worked out for the first
    /// record read only.
    pub todo: Option<String>,
}

/// When every record was skipped for lacking the same field, what to do: likely the key
/// names a field no record has.
pub fn fix_for_every_record_lacking(skipped: &[Skipped]) -> Option<String> {
    let first = skipped.first()?.lacks.as_ref()?;
    let todo = first.todo.as_ref()?;
    let same = skipped
        .iter()
        .all(|s| s.lacks.as_ref().is_some_and(|l| l.key == first.key));
    same.then(|| format!("`data.{}` names a field no record has: {todo}", first.key))
}

pub struct DocumentReader<'a> {
    files: &'a [DataFile],
    source: &'a DataSource,
    policy: OnBadRecord,
    next_file: usize,
    /// The file being read a record (line or piece) at a time.
    open: Option<OpenFile>,
    /// Capacity of a file's read buffer.
    read_buffer: usize,
    /// Every record skipped so far.
    pub skipped: Vec<Skipped>,
    /// Documents read so far.
    read: u64,
}

struct OpenFile {
    file: u32,
    reader: BufReader<std::fs::File>,
    /// A JSONL or chat file that holds one JSON array of records instead of lines.
    array: Option<ArrayRecords>,
    /// Line the next record starts on (1-based).
    line: u64,
    /// Bytes of the file read so far.
    offset: u64,
    buf: Vec<u8>,
    /// Records met so far, bad ones included: a file that ends with none is a bad record,
    /// as an empty file is, not nothing said.
    records: u64,
}

/// The UTF-8 byte-order mark some editors write first: not text (Python's `utf-8-sig`, what
/// `datasets` reads JSON with, drops it).
const BOM: &[u8] = b"\xef\xbb\xbf";

/// Drops a byte-order mark from the start of `bytes`; the bytes dropped.
fn drop_bom(bytes: &mut Vec<u8>) -> usize {
    if bytes.starts_with(BOM) {
        bytes.drain(..BOM.len());
        BOM.len()
    } else {
        0
    }
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
            open: None,
            read_buffer: 1 << 20,
            skipped: Vec::new(),
            read: 0,
        }
    }

    /// The next documents, about `target_bytes` of input (a record is never cut, and a file
    /// read whole is one record); `None` at the end.
    pub fn next_batch(&mut self, target_bytes: u64) -> Result<Option<ReadBatch>> {
        let mut batch = ReadBatch {
            documents: Vec::new(),
            bytes: 0,
        };
        while batch.bytes < target_bytes {
            if self.open.is_some() {
                if !self.read_records(&mut batch, target_bytes)? {
                    self.open = None;
                }
                continue;
            }
            let Some(file) = self.files.get(self.next_file) else {
                break;
            };
            let whole = matches!(
                self.source,
                DataSource::Text {
                    split: TextSplit::File,
                    ..
                }
            );
            // A whole file that would overshoot the batch starts the next one.
            if whole && batch.bytes > 0 && batch.bytes + file.size > target_bytes {
                break;
            }
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
            if whole {
                batch.bytes += file.size;
                if let Some(text) = self.whole_file(opened, &origin)? {
                    batch.documents.push(Document {
                        body: Body::Text(text),
                        file: index,
                        line: 0,
                    });
                }
            } else {
                let mut reader = BufReader::with_capacity(self.read_buffer, opened);
                let records = matches!(
                    self.source,
                    DataSource::Jsonl { .. } | DataSource::Chat { .. }
                );
                let array = match records {
                    true => ArrayRecords::open(&mut reader, BOM)
                        .map_err(DataError::io("read", &file.path))?,
                    false => None,
                };
                self.open = Some(OpenFile {
                    file: index,
                    reader,
                    array,
                    line: 1,
                    offset: 0,
                    buf: Vec::new(),
                    records: 0,
                });
            }
        }
        if batch.documents.is_empty() && batch.bytes == 0 {
            return Ok(None);
        }
        Ok(Some(batch))
    }

    /// Reads records of the open file into `batch`; false at its end.
    fn read_records(&mut self, batch: &mut ReadBatch, target_bytes: u64) -> Result<bool> {
        if self.open.as_ref().is_some_and(|open| open.array.is_some()) {
            return self.read_array(batch, target_bytes);
        }
        match self.source {
            DataSource::Text {
                split: TextSplit::Separator { separator },
                ..
            } => self.read_pieces(separator.as_bytes(), batch, target_bytes),
            _ => self.read_lines(batch, target_bytes),
        }
    }

    /// Reads records of the open line-based file into `batch`; false at its end.
    fn read_lines(&mut self, batch: &mut ReadBatch, target_bytes: u64) -> Result<bool> {
        let Some(lines) = self.open.as_mut() else {
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
                if lines.records == 0 {
                    self.bad(Origin::new(&path, 0), "the file holds only white space")?;
                }
                return Ok(false);
            }
            let (file, line) = (lines.file, lines.line);
            lines.line += 1;
            lines.offset += n as u64;
            batch.bytes += n as u64;
            let origin = Origin::new(&path, line);
            let mut bytes = strip_newline(&lines.buf);
            if line == 1 {
                refuse_compressed(&origin, bytes)?;
                bytes = bytes.strip_prefix(BOM).unwrap_or(bytes);
            }
            let text = match std::str::from_utf8(bytes) {
                Ok(text) => text,
                Err(e) => {
                    lines.records += 1;
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
            lines.records += 1;
            let body = match parse_record(self.source, text, first_record(self.read, &self.skipped))
            {
                Ok(body) => body,
                Err(refused) => {
                    self.refuse(origin, refused)?;
                    return Ok(true);
                }
            };
            self.read += 1;
            batch.documents.push(Document { body, file, line });
        }
        Ok(true)
    }

    /// Reads records of the open file's JSON array into `batch`; false at its end. A file
    /// that stops being an array is a bad record where it does, and the end of the file.
    fn read_array(&mut self, batch: &mut ReadBatch, target_bytes: u64) -> Result<bool> {
        let Some(open) = self.open.as_mut() else {
            return Ok(false);
        };
        let Some(array) = open.array.as_mut() else {
            return Ok(false);
        };
        let path = self.files[open.file as usize].path.clone();
        let file = open.file;
        while batch.bytes < target_bytes {
            let before = array.consumed;
            let element = array
                .next(&mut open.reader)
                .map_err(DataError::io("read", &path))?;
            batch.bytes += array.consumed - before;
            let (text, line) = match element {
                Element::Record { text, line } => (text, line),
                Element::End if open.records == 0 => {
                    self.bad(
                        Origin::new(&path, 0),
                        "the file is an empty JSON array `[]`",
                    )?;
                    return Ok(false);
                }
                Element::End => return Ok(false),
                Element::Broken { why, line } => {
                    let why = format!("{why}; the rest of the file is not read");
                    self.bad(Origin::new(&path, line), why)?;
                    return Ok(false);
                }
            };
            open.records += 1;
            let origin = Origin::new(&path, line);
            let Ok(text) = std::str::from_utf8(&text) else {
                self.bad(origin, "not UTF-8 text")?;
                return Ok(true);
            };
            match parse_record(self.source, text, first_record(self.read, &self.skipped)) {
                Ok(body) => {
                    self.read += 1;
                    batch.documents.push(Document { body, file, line });
                }
                Err(refused) => {
                    // A record of several lines that is not JSON: the line of the file where.
                    let refused = match serde_json::from_str::<serde_json::Value>(text) {
                        Err(e) if e.line() > 1 => not_a_record_from(e, line),
                        _ => refused,
                    };
                    self.refuse(origin, refused)?;
                    return Ok(true);
                }
            }
        }
        Ok(true)
    }

    /// Reads the pieces between `separator`s of the open file into `batch`; false at its
    /// end. Only the piece being read is held, however large the file.
    fn read_pieces(
        &mut self,
        separator: &[u8],
        batch: &mut ReadBatch,
        target_bytes: u64,
    ) -> Result<bool> {
        let Some(open) = self.open.as_mut() else {
            return Ok(false);
        };
        let path = self.files[open.file as usize].path.clone();
        // Configurations refuse an empty separator; one that never matches keeps the file whole.
        let stop = separator.last().copied();
        while batch.bytes < target_bytes {
            // Reading up to each occurrence of the separator's last byte and checking the
            // piece's end finds the first separator wherever the reader's buffer cuts the
            // file: matches all have the separator's length, so the first to end is the first
            // to start, as `str::split` takes them.
            let mut piece = Vec::new();
            let mut read = 0;
            let at_end = loop {
                let n = match stop {
                    Some(stop) => open.reader.read_until(stop, &mut piece),
                    None => open.reader.read_to_end(&mut piece),
                }
                .map_err(DataError::io("read", &path))?;
                read += n;
                if n == 0 {
                    break true;
                }
                if stop.is_some() && piece.ends_with(separator) {
                    piece.truncate(piece.len() - separator.len());
                    break false;
                }
            };
            let (line, offset) = (open.line, open.offset);
            if offset == 0 {
                refuse_compressed(&Origin::new(&path, line), &piece)?;
            }
            let lead = if offset == 0 { drop_bom(&mut piece) } else { 0 };
            open.line += newlines(&piece);
            if !at_end {
                open.line += newlines(separator);
            }
            open.offset += read as u64;
            batch.bytes += read as u64;
            let file = open.file;
            match String::from_utf8(piece) {
                Ok(text) => {
                    if !text.trim().is_empty() {
                        // The line of the piece's first non-blank character.
                        let blank = text.len() - text.trim_start().len();
                        batch.documents.push(Document {
                            line: line + newlines(&text.as_bytes()[..blank]),
                            body: Body::Text(text),
                            file,
                        });
                    }
                }
                Err(e) => {
                    let at = e.utf8_error().valid_up_to();
                    let origin = Origin::new(&path, line + newlines(&e.as_bytes()[..at]));
                    let at = offset + (lead + at) as u64;
                    // `bad` needs `&mut self`: the open file is not used again here.
                    self.bad(origin, format!("not UTF-8 text (bad byte at offset {at})"))?;
                    return Ok(!at_end);
                }
            }
            if at_end {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// A file as one text, the only copy of it (read at its size, checked as UTF-8 in place).
    fn whole_file(&mut self, mut file: std::fs::File, origin: &Origin) -> Result<Option<String>> {
        let mut bytes = Vec::new();
        if let Err(e) = file.read_to_end(&mut bytes) {
            self.bad(origin.clone(), format!("cannot be read: {e}"))?;
            return Ok(None);
        }
        refuse_compressed(origin, &bytes)?;
        let lead = drop_bom(&mut bytes);
        if bytes.is_empty() {
            self.bad(origin.clone(), "the file is empty")?;
            return Ok(None);
        }
        match String::from_utf8(bytes) {
            // As a blank line or an empty JSONL text: nothing to train on.
            Ok(text) if text.trim().is_empty() => {
                self.bad(origin.clone(), "the file holds only white space")?;
                Ok(None)
            }
            Ok(text) => Ok(Some(text)),
            Err(e) => {
                let at = e.utf8_error().valid_up_to();
                let line = newlines(&e.as_bytes()[..at]) + 1;
                self.bad(
                    Origin::new(&origin.path, line),
                    format!("not UTF-8 text (bad byte at offset {})", lead + at),
                )?;
                Ok(None)
            }
        }
    }

    /// Stop with the error, or note the record as skipped.
    fn bad(&mut self, origin: Origin, why: impl Into<String>) -> Result<()> {
        self.refuse(origin, Refused::from(why.into()))
    }

    /// [`Self::bad`], with the field the record lacks when that is why.
    fn refuse(&mut self, origin: Origin, refused: Refused) -> Result<()> {
        match self.policy {
            OnBadRecord::Stop => Err(DataError::BadRecord {
                origin,
                why: refused.why,
                fix: refused
                    .missing
                    .map_or_else(|| SKIP_HINT.into(), |m| m.fix()),
            }),
            OnBadRecord::Skip => {
                let lacks = refused.lacks.map(|key| Lacking {
                    key,
                    todo: refused.missing.map(|m| m.todo()),
                });
                self.skipped.push(Skipped {
                    origin,
                    why: refused.why,
                    lacks,
                });
                Ok(())
            }
        }
    }
}

/// Whether the record being read is the first (none `read` or `skipped` before it): a
/// field it lacks, likely no record has (skipping would leave nothing), so its error works
/// out the field meant. Only for that record: it is the one shown when it stops the
/// preparation, or when every record is skipped. (Fields, not `&self`: the open file is
/// borrowed while a record is read.)
fn first_record(read: u64, skipped: &[Skipped]) -> bool {
    read == 0 && skipped.is_empty()
}

/// A compressed file read as text is not a bad record to skip but the wrong file: a
/// `.jsonl.gz` read line by line yields nothing but refusals.
fn refuse_compressed(origin: &Origin, start: &[u8]) -> Result<()> {
    let format = match start {
        [0x1f, 0x8b, ..] => "gzip",
        [0x28, 0xb5, 0x2f, 0xfd, ..] => "zstd",
        [b'B', b'Z', b'h', b'1'..=b'9', ..] => "bzip2",
        [0xfd, b'7', b'z', b'X', b'Z', 0, ..] => "xz",
        _ => return Ok(()),
    };
    Err(DataError::BadRecord {
        origin: origin.clone(),
        why: format!("the file is {format}-compressed, not text"),
        fix: "decompress it first (e.g. `gunzip -k`, `zstd -d`): data files are read as plain \
              UTF-8 text"
            .into(),
    })
}

fn strip_newline(line: &[u8]) -> &[u8] {
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    line.strip_suffix(b"\r").unwrap_or(line)
}

fn newlines(bytes: &[u8]) -> u64 {
    bytes.iter().filter(|&&b| b == b'\n').count() as u64
}

/// Why a line is not a document.
struct Refused {
    why: String,
    /// The spec key of the field the record lacks, when that is why.
    lacks: Option<&'static str>,
    /// More about that field, when a hint was asked for.
    missing: Option<Box<MissingField>>,
}

impl From<String> for Refused {
    fn from(why: String) -> Refused {
        Refused {
            why,
            lacks: None,
            missing: None,
        }
    }
}

/// A field a record does not have, the spec key that names it, and the fields it does have.
struct MissingField {
    /// `field`, `prompt_field`, `completion_field` or `messages_field`.
    key: &'static str,
    field: String,
    /// What the field should hold (`the text`).
    holds: &'static str,
    has: Vec<String>,
    /// The record's fields that could be it (strings for a text, lists for messages), for a
    /// key that names the record's one field of that kind.
    fits: Vec<String>,
    /// Dotted names of a field of the name asked for one level down (`meta.text`).
    nested: Vec<String>,
    /// What to set instead when the record is of another kind of data (a prompt and its
    /// completion, a conversation): [`other_kind_of_data`].
    other_kind: Option<String>,
}

impl MissingField {
    /// The key's fix when the first record lacks the field.
    fn fix(&self) -> String {
        // The key may be its default, which the spec does not write.
        let default = match (self.key, self.field.as_str()) {
            ("field", "text") | ("messages_field", "messages") => " (its default)",
            _ => "",
        };
        format!(
            "`data.{}: {}`{default} names a field the first record does not have, so likely \
             no record has it: {}",
            self.key,
            self.field,
            self.todo()
        )
    }

    /// What to set the key to: a field of that name one level down, else the record's field
    /// closest to the one named, else another kind of data when the record is one, else its
    /// one field that fits, else what the field should hold.
    fn todo(&self) -> String {
        let key = self.key;
        // A dotted name is near the name of the object it reaches into, which is no text.
        let near = self
            .has
            .iter()
            .filter(|_| !self.field.contains('.'))
            .map(|f| (strsim::jaro_winkler(&self.field, f), f))
            .filter(|(score, _)| *score > 0.8)
            .max_by(|a, b| a.0.total_cmp(&b.0))
            .map(|(_, f)| f);
        match (
            self.nested.first().or(near),
            &self.other_kind,
            self.fits.as_slice(),
        ) {
            (Some(f), _, _) => format!("did you mean `{key}: {f}`?"),
            (None, Some(other), _) => other.clone(),
            (None, None, [f]) => format!("did you mean `{key}: {f}`?"),
            _ => format!("set it to the field that holds {}", self.holds),
        }
    }
}

/// Why a line is not JSON, where in the line: serde's own "at line 1 column N" would read as
/// a contradiction next to the file's line number.
fn not_a_record(e: serde_json::Error) -> Refused {
    not_a_record_from(e, 1)
}

/// [`not_a_record`] for a record whose text starts on line `first_line` of its file (an
/// element of a JSON array): where it is wrong past its first line, the file's line says.
fn not_a_record_from(e: serde_json::Error, first_line: u64) -> Refused {
    let text = e.to_string();
    let why = text
        .strip_suffix(&format!(" at line {} column {}", e.line(), e.column()))
        .unwrap_or(&text);
    let why = match why {
        // serde_json's words for a `\uD800`-style escape without its other half.
        why if why.ends_with("hex escape") => {
            "a \\u escape of half a UTF-16 surrogate pair without the other half: not a \
             character, so no tokenizer can encode it (Python's json reads it, the tokenizer \
             then refuses it)"
        }
        // Its words for text that is not JSON (`ident`: it began as `null`, `true` or `false`
        // would).
        "expected value" | "expected ident" => "expected a JSON value",
        why => why,
    };
    match (e.line(), e.column()) {
        (_, 0) => format!("not a JSON record ({why})").into(),
        (0 | 1, column) => format!("not a JSON record ({why} at column {column})").into(),
        (line, column) => format!(
            "not a JSON record ({why} at line {}, column {column})",
            first_line + line as u64 - 1
        )
        .into(),
    }
}

/// One line of a line-based source as a document body, or why it is not one; `hint`: work out
/// the [`MissingField`] when a field is missing.
fn parse_record(source: &DataSource, line: &str, hint: bool) -> std::result::Result<Body, Refused> {
    match source {
        DataSource::Text { .. } => Ok(Body::Text(line.to_string())),
        DataSource::Jsonl { text, .. } => {
            let record: serde_json::Value = serde_json::from_str(line).map_err(not_a_record)?;
            if !record.is_object() {
                return Err(String::from("the record is not a JSON object").into());
            }
            match text {
                // A blank text or completion would train nothing but the end-of-document
                // token (an empty JSONL text, as an empty text file, is a bad record).
                JsonlText::Field { field } => Ok(Body::Text(not_blank(
                    field,
                    string_field(&record, field, &TEXT, hint)?,
                )?)),
                JsonlText::PromptCompletion { prompt, completion } => Ok(Body::PromptCompletion {
                    prompt: string_field(&record, prompt, &PROMPT, hint)?,
                    completion: not_blank(
                        completion,
                        string_field(&record, completion, &COMPLETION, hint)?,
                    )?,
                }),
            }
        }
        DataSource::Chat { messages_field, .. } => {
            let record: minijinja::Value = serde_json::from_str(line).map_err(not_a_record)?;
            let lacks = record
                .get_attr(messages_field)
                .map_or(true, |m| m.is_undefined());
            let tools = record
                .get_attr("tools")
                .ok()
                .filter(|t| !t.is_undefined() && !t.is_none());
            if lacks {
                if let Some((messages, prompt_len)) = prompt_completion_of(&record)? {
                    return Ok(Body::Chat {
                        messages,
                        tools,
                        prompt_len: Some(prompt_len),
                    });
                }
            }
            if record.kind() == ValueKind::Map && lacks {
                let missing = hint.then(|| {
                    let has = crate::chat::keys_of(&record);
                    let fits: Vec<String> = has
                        .iter()
                        .filter(|f| record.get_attr(f).is_ok_and(|v| v.kind() == ValueKind::Seq))
                        .cloned()
                        .collect();
                    let texts: Vec<&String> = has
                        .iter()
                        .filter(|f| record.get_attr(f).is_ok_and(|v| v.as_str().is_some()))
                        .collect();
                    // No list to read as messages, but text: another kind of data (a prompt
                    // and completion as text is told by `prompt_completion_of`).
                    let other_kind = match (fits.is_empty(), texts.as_slice()) {
                        (true, [first, ..]) => Some(format!(
                            "the records hold text, not conversations: they are `kind: jsonl` \
                             data (`field: {first}`)"
                        )),
                        _ => None,
                    };
                    Box::new(MissingField {
                        key: "messages_field",
                        field: messages_field.clone(),
                        holds: "the messages",
                        has,
                        fits,
                        nested: Vec::new(),
                        other_kind,
                    })
                });
                return Err(Refused {
                    why: format!(
                        "no field `{messages_field}` (the messages) in the record, nor \
                         `{}` and `{}` lists of messages (it has: {})",
                        chat::PROMPT,
                        chat::COMPLETION,
                        chat::keys_of(&record).join(", ")
                    ),
                    lacks: Some("messages_field"),
                    missing,
                });
            }
            Ok(Body::Chat {
                messages: messages_of(&record, messages_field)?,
                tools,
                prompt_len: None,
            })
        }
        DataSource::Tokens { .. } => Err(String::from("token files hold no text records").into()),
    }
}

/// `text`, unless it is empty or only white space.
fn not_blank(field: &str, text: String) -> std::result::Result<String, Refused> {
    match text.trim().is_empty() {
        true => Err(format!("field `{field}` is empty: nothing to train on").into()),
        false => Ok(text),
    }
}

/// The spec key that names a string field, for the fix when records lack it.
struct StringKey {
    key: &'static str,
    /// What the field holds (`the text`).
    holds: &'static str,
    /// Whether the record's one string field is the likely answer (not when the record
    /// needs two).
    one_string_fits: bool,
}

const TEXT: StringKey = StringKey {
    key: "field",
    holds: "the text",
    one_string_fits: true,
};
const PROMPT: StringKey = StringKey {
    key: "prompt_field",
    holds: "the prompt",
    one_string_fits: false,
};
const COMPLETION: StringKey = StringKey {
    key: "completion_field",
    holds: "the completion",
    one_string_fits: false,
};

/// A string field, named by `named`; a dotted name (`meta.text`) reaches into nested
/// objects unless the record has a key with the dot in it. `hint`: work out the
/// [`MissingField`] when the record lacks it.
fn string_field(
    record: &serde_json::Value,
    field: &str,
    named: &StringKey,
    hint: bool,
) -> std::result::Result<String, Refused> {
    let value = record.get(field).or_else(|| {
        field
            .split('.')
            .try_fold(record, |value, key| value.get(key))
    });
    match value {
        Some(serde_json::Value::String(s)) => Ok(s.clone()),
        Some(serde_json::Value::Null) => Err(format!("field `{field}` is null").into()),
        Some(serde_json::Value::Object(object)) => {
            // Its text is likely its longest string, reached by a dotted name.
            let longest = object
                .iter()
                .filter_map(|(k, v)| Some((k, v.as_str()?.len())))
                .max_by_key(|&(_, len)| len)
                .map(|(k, _)| k);
            Err(match longest {
                Some(k) => format!(
                    "field `{field}` is an object, not a string (it has: {}; `{field}.{k}` \
                     names its longest string)",
                    object
                        .keys()
                        .map(String::as_str)
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
                None => format!("field `{field}` is an object, not a string"),
            }
            .into())
        }
        Some(value @ serde_json::Value::Array(_)) if holds_messages(value) => Err(format!(
            "field `{field}` is a list of messages, not a string: conversations are \
                 `kind: chat` data, rendered with the model's chat template"
        )
        .into()),
        Some(other) => Err(format!(
            "field `{field}` is {}, not a string",
            match other {
                serde_json::Value::Bool(_) => "a boolean",
                serde_json::Value::Number(_) => "a number",
                _ => "a list",
            }
        )
        .into()),
        None => {
            let object = record.as_object();
            let has: Vec<&str> = object
                .map(|o| o.keys().map(String::as_str).collect())
                .unwrap_or_default();
            let part_way = reached(record, field);
            let why = match &part_way {
                // A dotted name that reaches into the record part of the way: what is there.
                Some((prefix, serde_json::Value::Object(inner))) if inner.is_empty() => {
                    format!("no field `{field}` in the record (`{prefix}` is an empty object)")
                }
                Some((prefix, serde_json::Value::Object(inner))) => format!(
                    "no field `{field}` in the record (`{prefix}` has: {})",
                    inner
                        .keys()
                        .map(String::as_str)
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
                Some((prefix, serde_json::Value::Array(_))) => format!(
                    "no field `{field}` in the record (`{prefix}` is a list, not an object)"
                ),
                Some((prefix, _)) => {
                    format!("no field `{field}` in the record (`{prefix}` is not an object)")
                }
                None => format!(
                    "no field `{field}` in the record (it has: {})",
                    has.join(", ")
                ),
            };
            let missing = hint.then(|| {
                let fits = object
                    .filter(|_| named.one_string_fits)
                    .map(|o| {
                        o.iter()
                            .filter(|(_, v)| v.is_string())
                            .map(|(k, _)| k.clone())
                            .collect()
                    })
                    .unwrap_or_default();
                let mut nested: Vec<String> = object
                    .into_iter()
                    .flatten()
                    .filter(|(_, v)| v.get(field).is_some_and(|v| v.is_string()))
                    .map(|(k, _)| format!("{k}.{field}"))
                    .collect();
                // Where a dotted name stops: the strings of the object it reached, the one
                // nearest the name's last part first.
                if let Some((prefix, serde_json::Value::Object(inner))) = &part_way {
                    let last = field.rsplit('.').next().unwrap_or(field);
                    let mut strings: Vec<(&String, f64)> = inner
                        .iter()
                        .filter(|(_, v)| v.is_string())
                        .map(|(k, _)| (k, strsim::jaro_winkler(last, k)))
                        .collect();
                    strings.sort_by(|a, b| b.1.total_cmp(&a.1));
                    nested.extend(strings.into_iter().map(|(k, _)| format!("{prefix}.{k}")));
                }
                Box::new(MissingField {
                    key: named.key,
                    field: field.to_string(),
                    holds: named.holds,
                    has: has.iter().map(|k| k.to_string()).collect(),
                    fits,
                    nested,
                    other_kind: object
                        .filter(|_| named.key == TEXT.key)
                        .and_then(other_kind_of_data),
                })
            });
            Err(Refused {
                why,
                lacks: Some(named.key),
                missing,
            })
        }
    }
}

/// How far a dotted `field` reaches into `record` before a key is missing: the dotted name
/// of the value reached and the value, `None` when not even its first key is there.
fn reached<'r>(
    record: &'r serde_json::Value,
    field: &str,
) -> Option<(String, &'r serde_json::Value)> {
    let mut value = record;
    let mut keys = Vec::new();
    for key in field.split('.') {
        match value.get(key) {
            Some(inner) => {
                value = inner;
                keys.push(key);
            }
            None => break,
        }
    }
    (!keys.is_empty()).then(|| (keys.join("."), value))
}

/// What a record read as a JSONL text (`data.field`) is instead, when it is another kind of
/// data: TRL's prompt-completion (text, or lists of messages), or a conversation.
fn other_kind_of_data(record: &serde_json::Map<String, serde_json::Value>) -> Option<String> {
    let (prompt, completion) = (record.get(chat::PROMPT), record.get(chat::COMPLETION));
    if let (Some(prompt), Some(completion)) = (prompt, completion) {
        if prompt.is_string() && completion.is_string() {
            return Some(format!(
                "the records hold a prompt and its completion: in place of `field`, set \
                 `prompt_field: {}` and `completion_field: {}` to train on the completion \
                 given its prompt",
                chat::PROMPT,
                chat::COMPLETION
            ));
        }
        if holds_messages(prompt) || holds_messages(completion) {
            return Some(
                "the records are conversational prompt-completion records (lists of \
                 messages): they are `kind: chat` data, rendered with the model's chat \
                 template and trained on the completion"
                    .into(),
            );
        }
    }
    let (name, _) = record.iter().find(|(_, value)| holds_messages(value))?;
    Some(format!(
        "field `{name}` holds conversations: they are `kind: chat` data, rendered with the \
         model's chat template (`messages_field: {name}`)"
    ))
}

/// Whether a JSON value is a list of chat messages: objects with a `role` (or ShareGPT's
/// `from`).
fn holds_messages(value: &serde_json::Value) -> bool {
    value.as_array().is_some_and(|items| {
        items
            .iter()
            .any(|m| m.get("role").or_else(|| m.get("from")).is_some())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::{Path, PathBuf};

    /// Reads `files` as `source` makes of them, through a read buffer
    /// of `read_buffer` bytes in batches of about `target` bytes: the documents (body, line)
    /// and each batch's bytes.
    fn read_all(
        source: &DataSource,
        files: &[PathBuf],
        read_buffer: usize,
        target: u64,
    ) -> (Vec<(String, u64)>, Vec<u64>) {
        let files: Vec<DataFile> = files
            .iter()
            .map(|f| crate::files::stat(f).unwrap())
            .collect();
        let mut reader = DocumentReader::new(&files, source, OnBadRecord::Stop);
        reader.read_buffer = read_buffer;
        let (mut docs, mut sizes) = (Vec::new(), Vec::new());
        while let Some(batch) = reader.next_batch(target).unwrap() {
            sizes.push(batch.bytes);
            docs.extend(
                batch
                    .documents
                    .into_iter()
                    .map(|d| (format!("{:?}", d.body), d.line)),
            );
        }
        (docs, sizes)
    }

    fn separated(path: &Path, separator: &str) -> DataSource {
        DataSource::Text {
            files: vec![path.to_path_buf()],
            split: TextSplit::Separator {
                separator: separator.into(),
            },
        }
    }

    /// The pieces `str::split` cuts the whole text into, each with the line of its first
    /// non-blank character; blank pieces dropped.
    fn split_whole(text: &str, separator: &str) -> Vec<(String, u64)> {
        let mut line = 1u64;
        let mut out = Vec::new();
        for piece in text.split(separator) {
            if !piece.trim().is_empty() {
                let lead = piece.len() - piece.trim_start().len();
                let start = line + piece[..lead].matches('\n').count() as u64;
                out.push((format!("{:?}", Body::Text(piece.to_string())), start));
            }
            line += piece.matches('\n').count() as u64 + separator.matches('\n').count() as u64;
        }
        out
    }

    #[test]
    fn separator_pieces_know_their_lines() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("d.txt");
        std::fs::write(&path, "a\nb\n\n\n\nc\n\n\n").unwrap();
        let (docs, sizes) = read_all(&separated(&path, "\n\n"), &[path], 1 << 20, 1 << 20);
        let text = |t: &str| format!("{:?}", Body::Text(t.into()));
        assert_eq!(docs, [(text("a\nb"), 1), (text("c"), 6)]);
        assert_eq!(sizes, [11]);
    }

    #[test]
    fn separators_across_read_buffers_cut_as_the_whole_text_would() {
        // Few symbols make separators, near misses and overlapping matches common.
        let symbols = ["a", "b", "\n", " ", "é", "<|end", "|>", "<|"];
        let separators = ["\n\n", "aa", "aba", "<|end|>", "é", "\n", "|>"];
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("d.txt");
        let mut rng = crate::rng::SplitMix64::new(7);
        for round in 0..300 {
            let n = 1 + rng.below(60);
            let text: String = (0..n)
                .map(|_| symbols[rng.below(symbols.len() as u64) as usize])
                .collect();
            std::fs::write(&path, &text).unwrap();
            let separator = separators[round % separators.len()];
            let want = split_whole(&text, separator);
            for read_buffer in [1, 2, 3, 5, 8, 1 << 20] {
                let source = separated(&path, separator);
                let (got, sizes) = read_all(&source, std::slice::from_ref(&path), read_buffer, 16);
                assert_eq!(
                    got, want,
                    "{text:?} split by {separator:?}, buffer {read_buffer}"
                );
                assert_eq!(sizes.iter().sum::<u64>(), text.len() as u64);
            }
        }
    }

    #[test]
    fn batches_stay_near_their_target() {
        let dir = tempfile::tempdir().unwrap();
        // 1000 pieces of 97 bytes with their separators.
        let path = dir.path().join("d.txt");
        let text = format!("{}<|end|>", "x".repeat(90)).repeat(1000);
        std::fs::write(&path, &text).unwrap();
        let (docs, sizes) = read_all(&separated(&path, "<|end|>"), &[path], 64, 1000);
        assert_eq!(docs.len(), 1000);
        assert_eq!(sizes.iter().sum::<u64>(), text.len() as u64);
        // A batch ends with the piece that reaches the target.
        assert!(sizes.iter().all(|&b| b < 1000 + 97), "{sizes:?}");

        // Whole files: as many as fit, or one alone when it is larger.
        let files: Vec<PathBuf> = [400, 400, 400, 3000, 400]
            .iter()
            .enumerate()
            .map(|(i, &size)| {
                let path = dir.path().join(format!("f{i}.txt"));
                std::fs::write(&path, "y".repeat(size)).unwrap();
                path
            })
            .collect();
        let whole = DataSource::Text {
            files: files.clone(),
            split: TextSplit::File,
        };
        let (docs, sizes) = read_all(&whole, &files, 1 << 20, 1000);
        assert_eq!(docs.len(), 5);
        assert_eq!(sizes, [800, 400, 3000, 400]);
    }

    #[test]
    fn a_leading_byte_order_mark_is_not_text() {
        let dir = tempfile::tempdir().unwrap();
        let text = |split| DataSource::Text {
            files: vec![],
            split,
        };
        let jsonl = |text| DataSource::Jsonl {
            files: vec![],
            text,
        };
        let cases = [
            (text(TextSplit::File), "one\ntwo\n"),
            (text(TextSplit::Line), "one\n\u{feff}two\n"),
            (
                text(TextSplit::Separator {
                    separator: "\n--\n".into(),
                }),
                "one\n--\ntwo\n",
            ),
            (
                jsonl(JsonlText::Field {
                    field: "text".into(),
                }),
                "{\"text\": \"one\"}\n{\"text\": \"two\"}\n",
            ),
            (
                jsonl(JsonlText::PromptCompletion {
                    prompt: "p".into(),
                    completion: "c".into(),
                }),
                "{\"p\": \"1+1=\", \"c\": \"2\"}\n",
            ),
            (
                DataSource::Chat {
                    files: vec![],
                    messages_field: "messages".into(),
                    chat_template: None,
                    chat_template_kwargs: Default::default(),
                },
                "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}\n",
            ),
        ];
        for (i, (source, content)) in cases.iter().enumerate() {
            let plain = dir.path().join(format!("{i}.txt"));
            let marked = dir.path().join(format!("{i}-bom.txt"));
            std::fs::write(&plain, content).unwrap();
            std::fs::write(&marked, format!("\u{feff}{content}")).unwrap();
            let (want, _) = read_all(source, &[plain], 1 << 20, 1 << 20);
            let (got, sizes) = read_all(source, &[marked], 1 << 20, 1 << 20);
            assert!(!want.is_empty());
            assert_eq!(got, want, "{source:?}");
            assert_eq!(sizes, [content.len() as u64 + 3], "{source:?}");
        }
        // Only the first bytes of a file: a mark further on is text (as `utf-8-sig` reads it).
        let (docs, _) = read_all(&cases[1].0, &[dir.path().join("1-bom.txt")], 64, 1 << 20);
        assert_eq!(docs[1].0, format!("{:?}", Body::Text("\u{feff}two".into())));

        // A file holding only the mark holds no text.
        let empty = dir.path().join("empty.txt");
        std::fs::write(&empty, BOM).unwrap();
        let files = vec![crate::files::stat(&empty).unwrap()];
        let whole = text(TextSplit::File);
        let err = DocumentReader::new(&files, &whole, OnBadRecord::Stop)
            .next_batch(1 << 20)
            .err()
            .unwrap();
        assert!(err.to_string().contains("the file is empty"), "{err}");

        // Nor one of white space only, as a blank line or an empty JSONL text.
        std::fs::write(&empty, "  \r\n\n").unwrap();
        let files = vec![crate::files::stat(&empty).unwrap()];
        let err = DocumentReader::new(&files, &whole, OnBadRecord::Stop)
            .next_batch(1 << 20)
            .err()
            .unwrap();
        assert!(
            err.to_string().contains("the file holds only white space"),
            "{err}"
        );
    }

    #[test]
    fn a_piece_that_is_not_utf8_is_a_bad_record() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("d.txt");
        std::fs::write(&path, b"one\n--\ntw\xff\n--\nthree\n").unwrap();
        let source = separated(&path, "\n--\n");
        let files = vec![crate::files::stat(&path).unwrap()];
        let err = DocumentReader::new(&files, &source, OnBadRecord::Stop)
            .next_batch(1 << 20)
            .err()
            .unwrap();
        assert!(
            err.to_string().starts_with(&format!(
                "{}:3: not UTF-8 text (bad byte at offset 9)",
                path.display()
            )),
            "{err}"
        );
        let mut reader = DocumentReader::new(&files, &source, OnBadRecord::Skip);
        let batch = reader.next_batch(1 << 20).unwrap().unwrap();
        let lines: Vec<u64> = batch.documents.iter().map(|d| d.line).collect();
        assert_eq!((lines, reader.skipped.len()), (vec![1, 5], 1));
    }

    #[test]
    fn fields_and_their_errors() {
        let r: serde_json::Value = serde_json::from_str(
            r#"{"a": {"b": "x"}, "n": 3, "z": null, "l": [1], "m": [{"role": "user"}]}"#,
        )
        .unwrap();
        let field = |name| string_field(&r, name, &TEXT, true);
        assert_eq!(field("a.b").ok().unwrap(), "x");
        assert!(field("n").err().unwrap().why.contains("a number"));
        assert_eq!(
            field("l").err().unwrap().why,
            "field `l` is a list, not a string"
        );
        assert!(field("m")
            .err()
            .unwrap()
            .why
            .contains("a list of messages, not a string: conversations are `kind: chat` data"));
        assert!(field("z").err().unwrap().why.contains("null"));
        let missing = field("text").err().unwrap();
        assert!(
            missing.why.contains("it has: a, l, m, n, z"),
            "{}",
            missing.why
        );
        assert_eq!(missing.missing.unwrap().has, ["a", "l", "m", "n", "z"]);
        // Records whose error is not shown get none.
        let missing = string_field(&r, "text", &TEXT, false).err().unwrap();
        assert!(
            missing.why.contains("it has: a, l, m, n, z"),
            "{}",
            missing.why
        );
        assert!(missing.missing.is_none());
    }

    #[test]
    fn a_missing_field_names_its_key_and_the_closest_field_the_record_has() {
        let chat = DataSource::Chat {
            files: Vec::new(),
            messages_field: "messages".into(),
            chat_template: None,
            chat_template_kwargs: Default::default(),
        };
        let Err(refused) = parse_record(&chat, r#"{"msgs": [], "id": 1}"#, true) else {
            panic!("no messages")
        };
        assert_eq!(
            refused.missing.unwrap().fix(),
            "`data.messages_field: messages` (its default) names a field the first record does \
             not have, so likely no record has it: did you mean `messages_field: msgs`?"
        );
        let Err(refused) = parse_record(&chat, r#"{"msgs": [], "id": 1}"#, false) else {
            panic!("no messages")
        };
        assert!(refused.missing.is_none(), "no hint unless asked for");
        // Records of text under `kind: chat`: the kind to use instead.
        let fix = |record: &str| match parse_record(&chat, record, true) {
            Err(refused) => refused.missing.unwrap().fix(),
            Ok(_) => panic!("{record} was read"),
        };
        assert!(
            fix(r#"{"text": "def f(): pass", "id": 1}"#).ends_with(
                "the records hold text, not conversations: they are `kind: jsonl` data \
                 (`field: text`)"
            ),
            "{}",
            fix(r#"{"text": "def f(): pass", "id": 1}"#)
        );
        let jsonl = DataSource::Jsonl {
            files: Vec::new(),
            text: JsonlText::Field {
                field: "text".into(),
            },
        };
        let Err(refused) = parse_record(&jsonl, r#"{"content": "hi", "id": 1}"#, true) else {
            panic!("no text")
        };
        assert!(
            refused
                .missing
                .unwrap()
                .fix()
                .ends_with("did you mean `field: content`?"),
            "the record's one string"
        );
        let Err(refused) = parse_record(&jsonl, r#"{"a": "x", "b": "y"}"#, true) else {
            panic!("no text")
        };
        assert!(refused
            .missing
            .unwrap()
            .fix()
            .ends_with("set it to the field that holds the text"));
        let Err(refused) = parse_record(&chat, r#"{"messages": 3}"#, true) else {
            panic!("not a list")
        };
        assert!(refused.missing.is_none(), "{}", refused.why);
    }

    #[test]
    fn a_jsonl_text_record_of_another_kind_of_data_is_pointed_at_that_kind() {
        let jsonl = DataSource::Jsonl {
            files: Vec::new(),
            text: JsonlText::Field {
                field: "text".into(),
            },
        };
        let fix = |record: &str| match parse_record(&jsonl, record, true) {
            Err(refused) => refused.missing.unwrap().fix(),
            Ok(_) => panic!("{record} read as a text"),
        };
        assert_eq!(
            fix(r#"{"prompt": "def f():", "completion": " return 1"}"#),
            "`data.field: text` (its default) names a field the first record does not have, so \
             likely no record has it: the records hold a prompt and its completion: in place of \
             `field`, set `prompt_field: prompt` and `completion_field: completion` to train on \
             the completion given its prompt"
        );
        assert!(
            fix(r#"{"prompt": [{"role": "user", "content": "q"}], "completion": [{"role": "assistant", "content": "a"}]}"#)
                .ends_with("they are `kind: chat` data, rendered with the model's chat template and trained on the completion"),
        );
        assert!(
            fix(r#"{"id": 3, "conversations": [{"from": "human", "value": "q"}]}"#).ends_with(
                "field `conversations` holds conversations: they are `kind: chat` data, rendered \
             with the model's chat template (`messages_field: conversations`)"
            )
        );
        // A list of anything else is not a conversation.
        assert!(fix(r#"{"tags": ["a"], "body": "x"}"#).ends_with("did you mean `field: body`?"));
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
        // The file's line, and the place in it: no "line 1" of serde's beside it.
        assert!(
            err.to_string().starts_with(&format!(
                "{}:3: not a JSON record (key must be a string at column 2)",
                path.display()
            )),
            "{err}"
        );
        let mut reader = DocumentReader::new(&files, &source, OnBadRecord::Skip);
        let batch = reader.next_batch(1 << 20).unwrap().unwrap();
        let lines: Vec<u64> = batch.documents.iter().map(|d| d.line).collect();
        assert_eq!(lines, [1, 4]);
        assert_eq!(reader.skipped.len(), 1);
        assert!(reader.next_batch(1 << 20).unwrap().is_none());

        // Text that is no JSON at all, in words without serde's.
        for record in ["not json at all", "hello"] {
            let Err(refused) = parse_record(&source, record, false) else {
                panic!("{record} was read")
            };
            assert!(
                refused
                    .why
                    .starts_with("not a JSON record (expected a JSON value at column "),
                "{}",
                refused.why
            );
        }

        // Half a surrogate pair, which Python's json reads and a tokenizer then refuses.
        for record in [r#"{"text": "a\ud800b"}"#, r#"{"text": "a\udc00"}"#] {
            let Err(refused) = parse_record(&source, record, false) else {
                panic!("{record} was read")
            };
            let why = refused.why;
            assert!(
                why.contains("half a UTF-16 surrogate pair") && why.contains("at column"),
                "{why}"
            );
        }

        let text = DataSource::Text {
            files: vec![],
            split: TextSplit::Line,
        };
        assert!(matches!(parse_record(&text, "x", false), Ok(Body::Text(t)) if t == "x"));
    }
}
