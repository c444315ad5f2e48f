//! Which documents train and which are held out for validation, as runs of consecutive
//! documents read as one stream of tokens.

use crate::corpus::Corpus;
use crate::error::{DataError, Result};
use crate::rng::splitmix64;

/// A set of a corpus's documents, in corpus order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DocSet {
    pub runs: Vec<Run>,
    pub documents: u64,
    pub tokens: u64,
}

/// Documents `first..end` of the corpus: tokens `corpus_start..corpus_start + len`, which
/// are tokens `stream_start..` of the set's stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Run {
    pub first: u64,
    pub end: u64,
    pub corpus_start: u64,
    pub stream_start: u64,
    pub len: u64,
}

impl DocSet {
    pub fn everything(corpus: &Corpus) -> DocSet {
        let mut set = DocSet::empty();
        set.push_run(corpus, 0, corpus.documents());
        set
    }

    fn empty() -> DocSet {
        DocSet {
            runs: Vec::new(),
            documents: 0,
            tokens: 0,
        }
    }

    fn push_run(&mut self, corpus: &Corpus, first: u64, end: u64) {
        if first == end {
            return;
        }
        let corpus_start = corpus.doc_start(first);
        let len = corpus.doc_start(end) - corpus_start;
        self.runs.push(Run {
            first,
            end,
            corpus_start,
            stream_start: self.tokens,
            len,
        });
        self.documents += end - first;
        self.tokens += len;
    }

    /// The run holding stream position `position`.
    pub fn run_at(&self, position: u64) -> &Run {
        let i = self
            .runs
            .partition_point(|r| r.stream_start + r.len <= position);
        &self.runs[i.min(self.runs.len() - 1)]
    }

    /// Every document of the set, in order.
    pub fn document_ids(&self) -> impl Iterator<Item = u64> + '_ {
        self.runs.iter().flat_map(|r| r.first..r.end)
    }
}

/// Held-out documents are picked by a hash of their index with this salt, not by the
/// training seed: runs with different seeds are evaluated on the same documents.
const HOLD_OUT_SALT: u64 = 0x7661_6c69_6461_7465;

/// Splits `corpus` into (training, validation): each document is held out when its hash
/// falls below `fraction` of the hash range (so about that fraction, at least one).
pub fn hold_out(corpus: &Corpus, fraction: f64) -> Result<(DocSet, DocSet)> {
    let n = corpus.documents();
    let threshold = (fraction.clamp(0.0, 1.0) * u64::MAX as f64) as u64;
    let held = |d: u64| splitmix64(d ^ HOLD_OUT_SALT) < threshold;
    let smallest = (0..n).min_by_key(|&d| splitmix64(d ^ HOLD_OUT_SALT));
    let any_held = (0..n).any(held);
    let is_held = |d: u64| held(d) || (!any_held && Some(d) == smallest);
    let (mut train, mut validation) = (DocSet::empty(), DocSet::empty());
    let mut start = 0;
    while start < n {
        let side = is_held(start);
        let mut end = start + 1;
        while end < n && is_held(end) == side {
            end += 1;
        }
        let set = if side { &mut validation } else { &mut train };
        set.push_run(corpus, start, end);
        start = end;
    }
    if train.documents == 0 {
        return Err(DataError::NotEnoughData {
            why: format!("holding out {fraction} of {n} document(s) leaves none to train on"),
            fix: "lower `data.validation.fraction`, or give `data.validation.files`".into(),
        });
    }
    Ok((train, validation))
}
