//! Writing tokenized documents into a cache folder being built (see [`crate::cache`]).

use crate::cache::{DOCUMENTS, LINES, LINE_BITS, LOSS_MASK, TOKENS};
use crate::encode::Encoded;
use crate::error::{DataError, Result};
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use xxhash_rust::xxh3::Xxh3;

pub struct CorpusWriter {
    dir: PathBuf,
    tokens: BufWriter<File>,
    documents: BufWriter<File>,
    lines: BufWriter<File>,
    mask: Option<BufWriter<File>>,
    hash: Xxh3,
    scratch: Vec<u8>,
    written: Written,
}

/// Totals of a finished cache.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Written {
    pub documents: u64,
    pub tokens: u64,
    pub max_token_id: u64,
    pub trained_tokens: u64,
    pub content_hash: String,
    /// Documents with a loss mask that trains none of their tokens (a conversation without
    /// an assistant turn), and the first one's (file, line).
    pub untrained: u64,
    pub first_untrained: Option<(u32, u64)>,
    /// Prompt/completion records whose prompt and completion share a token
    /// ([`Encoded::merged_boundary`]), and the first one's (file, line, token text).
    pub merged_boundaries: u64,
    pub first_merged_boundary: Option<(u32, u64, String)>,
    /// Chats, and those whose end-of-document token is a training target.
    pub chats: u64,
    pub chats_training_eos: u64,
    /// The first chat that trains tokens but not the end-of-document token: its (file,
    /// line) and its last trained token, where its assistant turns end in training.
    pub first_turn_end: Option<(u32, u64, u32)>,
}

const BUFFER: usize = 4 << 20;

impl CorpusWriter {
    /// `with_mask`: the source trains on part of each document (a loss mask is written).
    pub fn create(dir: &Path, with_mask: bool) -> Result<CorpusWriter> {
        let open = |name: &str| -> Result<BufWriter<File>> {
            let path = dir.join(name);
            Ok(BufWriter::with_capacity(
                BUFFER,
                File::create(&path).map_err(DataError::io("create", &path))?,
            ))
        };
        let mut writer = CorpusWriter {
            dir: dir.to_path_buf(),
            tokens: open(TOKENS)?,
            documents: open(DOCUMENTS)?,
            lines: open(LINES)?,
            mask: if with_mask {
                Some(open(LOSS_MASK)?)
            } else {
                None
            },
            hash: Xxh3::new(),
            scratch: Vec::new(),
            written: Written::default(),
        };
        writer.offset(0)?;
        Ok(writer)
    }

    pub fn push(&mut self, document: &Encoded, file: u32, line: u64) -> Result<()> {
        self.scratch.clear();
        self.scratch.reserve(document.tokens.len() * 4);
        let mut max = self.written.max_token_id;
        for &t in &document.tokens {
            self.scratch.extend_from_slice(&t.to_le_bytes());
            max = max.max(u64::from(t));
        }
        self.written.max_token_id = max;
        self.hash.update(&self.scratch);
        let io = |e| DataError::io("write", &self.dir)(e);
        self.tokens.write_all(&self.scratch).map_err(io)?;
        match &mut self.mask {
            Some(mask) => {
                // A document read without a mask (a text record in a masked source) trains on
                // every token.
                let full;
                let values = if document.mask.is_empty() {
                    full = vec![1u8; document.tokens.len()];
                    &full
                } else {
                    &document.mask
                };
                self.hash.update(values);
                mask.write_all(values)
                    .map_err(|e| DataError::io("write", &self.dir)(e))?;
                let trained = values.iter().map(|&m| u64::from(m)).sum::<u64>();
                self.written.trained_tokens += trained;
                if trained == 0 {
                    self.written.untrained += 1;
                    self.written.first_untrained.get_or_insert((file, line));
                }
            }
            None => self.written.trained_tokens += document.tokens.len() as u64,
        }
        if let Some(trains_eos) = document.chat_trains_eos {
            self.written.chats += 1;
            self.written.chats_training_eos += u64::from(trains_eos);
            if !trains_eos && self.written.first_turn_end.is_none() {
                self.written.first_turn_end = document.turn_end.map(|id| (file, line, id));
            }
        }
        if let Some(token) = &document.merged_boundary {
            self.written.merged_boundaries += 1;
            self.written
                .first_merged_boundary
                .get_or_insert_with(|| (file, line, token.clone()));
        }
        self.written.tokens += document.tokens.len() as u64;
        self.written.documents += 1;
        let entry = (u64::from(file) << LINE_BITS) | line.min((1 << LINE_BITS) - 1);
        self.lines
            .write_all(&entry.to_le_bytes())
            .map_err(|e| DataError::io("write", &self.dir)(e))?;
        self.offset(self.written.tokens)
    }

    fn offset(&mut self, at: u64) -> Result<()> {
        let bytes = at.to_le_bytes();
        self.hash.update(&bytes);
        self.documents
            .write_all(&bytes)
            .map_err(|e| DataError::io("write", &self.dir)(e))
    }

    pub fn written(&self) -> &Written {
        &self.written
    }

    /// Flushes and fsyncs every file.
    pub fn finish(self) -> Result<Written> {
        let dir = self.dir.clone();
        let mut files = vec![self.tokens, self.documents, self.lines];
        files.extend(self.mask);
        for file in files {
            let file = file
                .into_inner()
                .map_err(|e| DataError::io("write", &dir)(e.into_error()))?;
            file.sync_all().map_err(DataError::io("sync", &dir))?;
        }
        let mut written = self.written;
        written.content_hash = format!("{:032x}", self.hash.digest128());
        Ok(written)
    }
}
