//! A prepared corpus, memory-mapped: documents of token ids back to back, their offsets,
//! where each came from, and the loss mask. Every rank of a node maps the same files, so the
//! page cache holds one copy.
//!
//! Pre-tokenized (`tokens`) data is read from the input files themselves: each file is one
//! document, and the cache folder holds only the manifest of the checked files.

use crate::cache::{CacheManifest, DOCUMENTS, LINES, LINE_BITS, LOSS_MASK, TOKENS};
use crate::error::{DataError, Origin, Result};
use memmap2::{Mmap, UncheckedAdvice};
use shardrun_protocol::config::TokenDtype;
use std::path::{Path, PathBuf};
use xxhash_rust::xxh3::Xxh3;

pub struct Corpus {
    pub manifest: CacheManifest,
    pub dir: PathBuf,
    tokens: Tokens,
    /// `documents + 1` offsets.
    offsets: Offsets,
    lines: Option<Mmap>,
    mask: Option<Mmap>,
}

enum Tokens {
    /// `tokens.u32` of the cache.
    Cached(Mapped),
    /// The input files, one document each.
    Files {
        maps: Vec<Mapped>,
        dtype: TokenDtype,
        /// The files read since [`Corpus::release_pages`] last gave theirs back.
        read: std::sync::Mutex<Vec<usize>>,
    },
}

enum Offsets {
    Mapped(Mapped),
    Owned(Vec<u64>),
}

/// A read-only mapping (empty files have none).
struct Mapped(Option<Mmap>);

/// What a mapped file is, for what an error about it tells to do.
#[derive(Clone, Copy)]
enum Mapping {
    /// A file of a cache folder.
    Cache,
    /// One of the data's own token files, read in place.
    TokenFile,
}

impl Mapped {
    fn open(path: &Path, expected_len: Option<u64>, mapping: Mapping) -> Result<Mapped> {
        let changed = |why: String| match mapping {
            Mapping::Cache => DataError::Cache {
                path: path.to_path_buf(),
                why: format!("{why}: remove the cache folder and prepare again"),
            },
            Mapping::TokenFile => DataError::TokenFileChanged {
                path: path.to_path_buf(),
                why,
            },
        };
        let file = match std::fs::File::open(path) {
            Ok(file) => file,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(changed(
                    "is missing; it was there when the data was prepared".into(),
                ))
            }
            Err(e) => return Err(DataError::io("open", path)(e)),
        };
        let len = file.metadata().map_err(DataError::io("read", path))?.len();
        if let Some(expected) = expected_len.filter(|&e| e != len) {
            return Err(changed(format!(
                "is {len} bytes, the manifest says {expected}; the file changed since it was \
                 prepared"
            )));
        }
        if len == 0 {
            return Ok(Mapped(None));
        }
        // SAFETY: cache files are never written once their folder is in place; input token
        // files must not change while training reads them (as with numpy.memmap in nanoGPT),
        // and their size is checked against the manifest when opened.
        let map = unsafe { Mmap::map(&file) }.map_err(DataError::io("map", path))?;
        Ok(Mapped(Some(map)))
    }

    fn bytes(&self) -> &[u8] {
        self.0.as_deref().unwrap_or(&[])
    }
}

fn u64_at(bytes: &[u8], i: u64) -> u64 {
    let at = i as usize * 8;
    u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"))
}

impl Corpus {
    pub fn open(dir: &Path, manifest: CacheManifest) -> Result<Corpus> {
        let n = manifest.documents;
        let (tokens, offsets, lines, mask) = match manifest.token_files_dtype {
            Some(dtype) => {
                let width = dtype_width(dtype);
                let mut maps = Vec::new();
                let mut offsets = vec![0u64];
                for f in &manifest.files {
                    let count = f.tokens.unwrap_or(f.size / width);
                    maps.push(Mapped::open(&f.path, Some(f.size), Mapping::TokenFile)?);
                    offsets.push(offsets.last().copied().unwrap_or(0) + count);
                }
                (
                    Tokens::Files {
                        maps,
                        dtype,
                        read: Default::default(),
                    },
                    Offsets::Owned(offsets),
                    None,
                    None,
                )
            }
            None => {
                let tokens =
                    Mapped::open(&dir.join(TOKENS), Some(manifest.tokens * 4), Mapping::Cache)?;
                let offsets =
                    Mapped::open(&dir.join(DOCUMENTS), Some((n + 1) * 8), Mapping::Cache)?;
                let lines = Mapped::open(&dir.join(LINES), Some(n * 8), Mapping::Cache)?.0;
                let mask = if manifest.loss_mask {
                    Mapped::open(&dir.join(LOSS_MASK), Some(manifest.tokens), Mapping::Cache)?.0
                } else {
                    None
                };
                (
                    Tokens::Cached(tokens),
                    Offsets::Mapped(offsets),
                    lines,
                    mask,
                )
            }
        };
        Ok(Corpus {
            manifest,
            dir: dir.to_path_buf(),
            tokens,
            offsets,
            lines,
            mask,
        })
    }

    pub fn documents(&self) -> u64 {
        self.manifest.documents
    }

    /// Gives back the pages of its mapped files this process has read (`MADV_DONTNEED`).
    /// They stay in the page cache, one copy for a node's ranks, and the next read takes them
    /// from there; but they no longer count in the rank's resident memory, whose peak would
    /// otherwise grow towards the corpus's size and hide the training's own. One call for
    /// each cache file a batch reads, and one for each input token file read since the last.
    pub fn release_pages(&self) {
        let token_maps: Vec<&Mapped> = match &self.tokens {
            Tokens::Cached(map) => vec![map],
            Tokens::Files { maps, read, .. } => {
                let mut files =
                    std::mem::take(&mut *read.lock().unwrap_or_else(|e| e.into_inner()));
                files.sort_unstable();
                files.dedup();
                files.into_iter().map(|f| &maps[f]).collect()
            }
        };
        let offsets = match &self.offsets {
            Offsets::Mapped(map) => map.0.as_ref(),
            Offsets::Owned(_) => None,
        };
        let maps = token_maps.into_iter().filter_map(|m| m.0.as_ref());
        // (`lines` is read for messages only, never by a batch.)
        for map in maps.chain(offsets).chain(&self.mask) {
            // SAFETY: read-only mappings of files nothing writes while they are mapped (see
            // `Mapped::open`): a page given back is read again unchanged, and slices into
            // the mapping stay valid.
            let _ = unsafe { map.unchecked_advise(UncheckedAdvice::DontNeed) };
        }
    }

    /// Checks the cache's files against the hash its manifest recorded as they were written
    /// (the first offset, then each document's tokens, its loss mask and its end offset): a
    /// file damaged in place, its size unchanged, would otherwise train as other data.
    /// Pre-tokenized input files are the user's own, read as they are.
    pub fn verify_content(&self) -> Result<()> {
        let (Tokens::Cached(tokens), Offsets::Mapped(offsets)) = (&self.tokens, &self.offsets)
        else {
            return Ok(());
        };
        let damaged = |why: String| DataError::Cache {
            path: self.dir.clone(),
            why: format!(
                "{why}: a file of it was damaged or changed in place; remove the folder to \
                 prepare the data again"
            ),
        };
        let (tokens, offsets) = (tokens.bytes(), offsets.bytes());
        let mut hash = Xxh3::new();
        hash.update(&offsets[..8.min(offsets.len())]);
        for d in 0..self.documents() {
            let (start, end) = (self.doc_start(d), self.doc_start(d + 1));
            if start > end || end > self.tokens() {
                return Err(damaged(format!(
                    "document {d} spans tokens {start}..{end} of {}",
                    self.tokens()
                )));
            }
            hash.update(&tokens[start as usize * 4..end as usize * 4]);
            if let Some(mask) = &self.mask {
                hash.update(&mask[start as usize..end as usize]);
            }
            hash.update(&offsets[(d as usize + 1) * 8..(d as usize + 2) * 8]);
        }
        let found = format!("{:032x}", hash.digest128());
        if found != self.manifest.content_hash {
            return Err(damaged(format!(
                "its files hash to {found}, its manifest recorded {}",
                self.manifest.content_hash
            )));
        }
        Ok(())
    }

    pub fn tokens(&self) -> u64 {
        self.manifest.tokens
    }

    /// Where document `d` starts (`d == documents()` gives the end of the last one).
    pub fn doc_start(&self, d: u64) -> u64 {
        match &self.offsets {
            Offsets::Mapped(m) => u64_at(m.bytes(), d),
            Offsets::Owned(v) => v[d as usize],
        }
    }

    pub fn doc_len(&self, d: u64) -> u64 {
        self.doc_start(d + 1) - self.doc_start(d)
    }

    /// The document holding token `position`, searched within documents `lo..hi`.
    pub fn doc_containing(&self, position: u64, mut lo: u64, mut hi: u64) -> u64 {
        // Last d in lo..hi with doc_start(d) <= position.
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            if self.doc_start(mid) <= position {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        lo
    }

    /// Appends tokens `start..end` to `out`.
    pub fn copy_tokens(&self, start: u64, end: u64, out: &mut Vec<u32>) {
        match &self.tokens {
            Tokens::Cached(m) => {
                let bytes = &m.bytes()[start as usize * 4..end as usize * 4];
                out.extend(
                    bytes
                        .chunks_exact(4)
                        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])),
                );
            }
            Tokens::Files { maps, dtype, read } => {
                // One lock for the whole range, not one per document it spans.
                let mut read = read.lock().unwrap_or_else(|e| e.into_inner());
                let mut at = start;
                while at < end {
                    let d = self.doc_containing(at, 0, self.documents());
                    read.push(d as usize);
                    let (first, stop) = (self.doc_start(d), self.doc_start(d + 1).min(end));
                    let bytes = maps[d as usize].bytes();
                    let (lo, hi) = ((at - first) as usize, (stop - first) as usize);
                    match dtype {
                        TokenDtype::U16 => out.extend(
                            bytes[lo * 2..hi * 2]
                                .chunks_exact(2)
                                .map(|c| u32::from(u16::from_le_bytes([c[0], c[1]]))),
                        ),
                        TokenDtype::U32 => out.extend(
                            bytes[lo * 4..hi * 4]
                                .chunks_exact(4)
                                .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])),
                        ),
                    }
                    at = stop;
                }
            }
        }
    }

    /// Whether token `position` is a training target.
    pub fn trains_on(&self, position: u64) -> bool {
        self.mask.as_ref().is_none_or(|m| m[position as usize] != 0)
    }

    /// Training targets among tokens `start..end` (one byte of the mask read per token).
    pub fn trained_in(&self, start: u64, end: u64) -> u64 {
        match &self.mask {
            Some(m) => m[start as usize..end as usize]
                .iter()
                .filter(|&&b| b != 0)
                .count() as u64,
            None => end - start,
        }
    }

    pub fn has_mask(&self) -> bool {
        self.mask.is_some()
    }

    /// The file and line document `d` was read from.
    pub fn origin(&self, d: u64) -> Origin {
        let (file, line) = match &self.lines {
            Some(lines) => {
                let entry = u64_at(lines, d);
                (entry >> LINE_BITS, entry & ((1 << LINE_BITS) - 1))
            }
            None => (d, 0),
        };
        let path = self
            .manifest
            .files
            .get(file as usize)
            .map(|f| f.path.clone())
            .unwrap_or_default();
        Origin { path, line }
    }

    /// The first token `>= vocab_size`, as (document, position in it, id).
    pub fn first_token_at_least(&self, vocab_size: u64) -> Option<(u64, u64, u64)> {
        let mut buf = Vec::new();
        for d in 0..self.documents() {
            buf.clear();
            self.copy_tokens(self.doc_start(d), self.doc_start(d + 1), &mut buf);
            if let Some(i) = buf.iter().position(|&t| u64::from(t) >= vocab_size) {
                return Some((d, i as u64, u64::from(buf[i])));
            }
        }
        None
    }
}

pub fn dtype_width(dtype: TokenDtype) -> u64 {
    match dtype {
        TokenDtype::U16 => 2,
        TokenDtype::U32 => 4,
    }
}
