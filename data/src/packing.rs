//! Documents into fixed-length sequences: inputs, next-token targets (-100 where there is
//! no loss, `transformers`' labels convention), and with the document mask, positions that
//! restart per document and the document each token belongs to.
//!
//! * `stream`: the set's documents back to back, cut every `seq_len` tokens; sequence `k`
//!   reads tokens `k·L .. k·L + L` and their successors, so every token is an input exactly
//!   once per epoch and every token but the first is a target once. Only the last sequence
//!   is padded.
//! * `whole_documents`: documents placed whole (best-fit decreasing), a sequence padded
//!   after its last document; a document's last token has no target. Sequences, and the
//!   documents within one, are in document order (an unshuffled run reads its files in
//!   order, not longest first). A document longer than `seq_len` is left out, or with
//!   `truncate` keeps its first `seq_len` tokens (as TRL's `truncation_mode="keep_start"`:
//!   the end-of-document token goes with the rest, and the last kept token has no target).
//!
//! With the document mask, a token is not trained to predict the first token of the next
//! document (attention cannot see across the boundary), as `transformers`' flattening
//! collator does.

use crate::corpus::Corpus;
use crate::error::{DataError, Origin, Result};
use crate::split::DocSet;
use shardrun_protocol::config::{OnBadRecord, Packing};
use std::collections::BTreeSet;
use std::sync::Arc;

/// Target of a position with no loss (PyTorch's `ignore_index`).
pub const IGNORE: i64 = -100;
/// Input id of padding (never a target, and after every real token, so causal attention
/// never lets real tokens see it).
pub const PAD: i64 = 0;

/// A document set cut into sequences.
pub struct Packed {
    corpus: Arc<Corpus>,
    set: DocSet,
    seq_len: u64,
    document_mask: bool,
    layout: Layout,
    /// Documents left out for not fitting (`on_bad_record: skip`).
    pub left_out: Dropped,
    /// Documents cut to `seq_len` (`truncate`); `tokens` are those cut off.
    pub truncated: Dropped,
}

/// Documents of a set not in its sequences in full, and their tokens that are not.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Dropped {
    pub documents: u64,
    pub tokens: u64,
    /// Of `tokens`, the training targets.
    pub trained_tokens: u64,
    /// Where the first document came from, and its length in tokens.
    pub first: Option<(Origin, u64)>,
    /// Of `documents`, those truncated to no target in the loss (a prompt as long as a
    /// sequence): rows of compute that train nothing.
    pub untrained: u64,
}

impl Dropped {
    /// Counts document `d` of `len` tokens, of which `start..end` (corpus positions) are
    /// not in the sequences.
    fn add(&mut self, corpus: &Corpus, d: u64, len: u64, start: u64, end: u64) {
        self.documents += 1;
        self.tokens += end - start;
        self.trained_tokens += corpus.trained_in(start, end);
        self.first.get_or_insert_with(|| (corpus.origin(d), len));
    }
}

enum Layout {
    Stream {
        sequences: u64,
    },
    /// Sequence `k` holds documents `members[starts[k]..starts[k + 1]]`.
    Whole {
        starts: Vec<u64>,
        members: Vec<u64>,
    },
}

/// One output row of a batch.
pub struct Row<'a> {
    pub inputs: &'a mut [i64],
    pub targets: &'a mut [i64],
    pub positions: Option<&'a mut [i64]>,
    pub documents: Option<&'a mut [i64]>,
}

/// Tokens of one window with what the row needs to know about each.
#[derive(Default)]
struct Window {
    tokens: Vec<u32>,
    trains: Vec<bool>,
    /// Last token of its document.
    ends_doc: Vec<bool>,
    /// Index of the document piece a token belongs to, counted within the window.
    piece: Vec<u32>,
    /// First window index of each piece.
    piece_starts: Vec<usize>,
}

impl Packed {
    pub fn new(
        corpus: Arc<Corpus>,
        set: DocSet,
        seq_len: u64,
        packing: Packing,
        truncate: bool,
        document_mask: bool,
        on_bad_record: OnBadRecord,
    ) -> Result<Packed> {
        let mut left_out = Dropped::default();
        let mut truncated = Dropped::default();
        let layout = match packing {
            Packing::Stream => Layout::Stream {
                sequences: set.tokens.div_ceil(seq_len),
            },
            Packing::WholeDocuments => {
                let mut docs = Vec::with_capacity(set.documents as usize);
                for d in set.document_ids() {
                    let len = corpus.doc_len(d);
                    let start = corpus.doc_start(d);
                    if len > seq_len && truncate {
                        truncated.add(&corpus, d, len, start + seq_len, start + len);
                        // The kept tokens' targets are its tokens 1..seq_len.
                        if corpus.trained_in(start + 1, start + len) > 0
                            && corpus.trained_in(start + 1, start + seq_len) == 0
                        {
                            truncated.untrained += 1;
                        }
                        docs.push((d, seq_len));
                    } else if len > seq_len {
                        match on_bad_record {
                            OnBadRecord::Stop => {
                                return Err(DataError::DocumentTooLong {
                                    origin: corpus.origin(d),
                                    tokens: len,
                                    seq_len,
                                })
                            }
                            OnBadRecord::Skip => left_out.add(&corpus, d, len, start, start + len),
                        }
                    } else {
                        docs.push((d, len));
                    }
                }
                best_fit_decreasing(docs, seq_len)
            }
        };
        Ok(Packed {
            corpus,
            set,
            seq_len,
            document_mask,
            layout,
            left_out,
            truncated,
        })
    }

    pub fn sequences(&self) -> u64 {
        match &self.layout {
            Layout::Stream { sequences } => *sequences,
            Layout::Whole { starts, .. } => starts.len() as u64 - 1,
        }
    }

    pub fn set(&self) -> &DocSet {
        &self.set
    }

    /// Documents in the sequences: the set's, less those left out.
    pub fn documents(&self) -> u64 {
        self.set.documents - self.left_out.documents
    }

    /// Tokens in the sequences: the set's, less those left out or cut off.
    pub fn tokens(&self) -> u64 {
        self.set.tokens - self.left_out.tokens - self.truncated.tokens
    }

    /// Tokens in the sequences that are training targets (by the loss mask).
    pub fn trained_tokens(&self) -> u64 {
        self.set.trained_tokens - self.left_out.trained_tokens - self.truncated.trained_tokens
    }

    pub fn corpus(&self) -> &Corpus {
        &self.corpus
    }

    pub fn seq_len(&self) -> u64 {
        self.seq_len
    }

    /// Writes sequence `k` into `row`; returns its number of targets (loss tokens).
    pub fn fill(&self, k: u64, row: Row<'_>) -> u64 {
        let mut window = Window::default();
        match &self.layout {
            Layout::Stream { .. } => {
                let start = k * self.seq_len;
                let end = (start + self.seq_len + 1).min(self.set.tokens);
                self.read_stream(start, end, &mut window);
            }
            Layout::Whole { starts, members } => {
                for &d in &members[starts[k as usize] as usize..starts[k as usize + 1] as usize] {
                    let s = self.corpus.doc_start(d);
                    // Only a truncated document is longer than a sequence.
                    let e = self.corpus.doc_start(d + 1).min(s + self.seq_len);
                    self.read_piece(s, e, true, &mut window);
                }
            }
        }
        self.write_row(&window, row)
    }

    /// Stream tokens `start..end` (crossing runs and documents).
    fn read_stream(&self, start: u64, end: u64, window: &mut Window) {
        let mut at = start;
        while at < end {
            let run = self.set.run_at(at);
            let position = run.corpus_start + (at - run.stream_start);
            let d = self.corpus.doc_containing(position, run.first, run.end);
            let doc_end = self.corpus.doc_start(d + 1);
            let take = (doc_end - position).min(end - at);
            self.read_piece(
                position,
                position + take,
                position + take == doc_end,
                window,
            );
            at += take;
        }
    }

    fn read_piece(&self, start: u64, end: u64, reaches_doc_end: bool, window: &mut Window) {
        let piece = window.piece_starts.len() as u32;
        window.piece_starts.push(window.tokens.len());
        self.corpus.copy_tokens(start, end, &mut window.tokens);
        let n = (end - start) as usize;
        if self.corpus.has_mask() {
            window
                .trains
                .extend((start..end).map(|p| self.corpus.trains_on(p)));
        } else {
            window.trains.extend(std::iter::repeat_n(true, n));
        }
        window.ends_doc.extend(std::iter::repeat_n(false, n));
        if reaches_doc_end && n > 0 {
            *window.ends_doc.last_mut().expect("n > 0") = true;
        }
        window.piece.extend(std::iter::repeat_n(piece, n));
    }

    fn write_row(&self, w: &Window, mut row: Row<'_>) -> u64 {
        let whole = matches!(self.layout, Layout::Whole { .. });
        let n = w.tokens.len();
        let mut loss_tokens = 0;
        let pieces = w.piece_starts.len() as i64;
        for i in 0..row.inputs.len() {
            if i < n && i < row.inputs.len() {
                row.inputs[i] = i64::from(w.tokens[i]);
                // Across a document boundary there is no target in `whole_documents` (the
                // next document is unrelated) nor under the document mask.
                let crosses = w.ends_doc[i] && (whole || self.document_mask);
                let target = i + 1 < n && w.trains[i + 1] && !crosses;
                row.targets[i] = if target {
                    loss_tokens += 1;
                    i64::from(w.tokens[i + 1])
                } else {
                    IGNORE
                };
                let piece = w.piece[i] as usize;
                if let Some(p) = row.positions.as_deref_mut() {
                    p[i] = (i - w.piece_starts[piece]) as i64;
                }
                if let Some(d) = row.documents.as_deref_mut() {
                    d[i] = piece as i64;
                }
            } else {
                row.inputs[i] = PAD;
                row.targets[i] = IGNORE;
                if let Some(p) = row.positions.as_deref_mut() {
                    p[i] = (i - n.min(i)) as i64;
                }
                if let Some(d) = row.documents.as_deref_mut() {
                    d[i] = pieces;
                }
            }
        }
        loss_tokens
    }
}

/// Places documents (id, length) into bins of `capacity` tokens: longest first, each into the
/// fullest bin it fits (best-fit decreasing), ties by document order so the result is
/// deterministic. The bins are then put in order of their lowest document, and each bin's
/// documents in order.
fn best_fit_decreasing(mut docs: Vec<(u64, u64)>, capacity: u64) -> Layout {
    docs.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    let mut bins: Vec<Vec<u64>> = Vec::new();
    // (room left, bin): the first entry with room >= len is the best fit.
    let mut open: BTreeSet<(u64, usize)> = BTreeSet::new();
    for (d, len) in docs {
        let fit = open.range((len, 0)..).next().copied();
        let (room, bin) = match fit {
            Some(entry) => {
                open.remove(&entry);
                entry
            }
            None => {
                bins.push(Vec::new());
                (capacity, bins.len() - 1)
            }
        };
        bins[bin].push(d);
        if room - len > 0 {
            open.insert((room - len, bin));
        }
    }
    for bin in &mut bins {
        bin.sort_unstable();
    }
    // Every bin holds a document and no document is in two: first members are distinct.
    bins.sort_unstable_by_key(|bin| bin[0]);
    let mut starts = vec![0u64];
    let mut members = Vec::new();
    for bin in bins {
        members.extend(bin);
        starts.push(members.len() as u64);
    }
    Layout::Whole { starts, members }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn best_fit_packs_tightly_and_deterministically() {
        let docs = vec![(0, 6), (1, 4), (2, 5), (3, 5), (4, 2), (5, 8)];
        let Layout::Whole { starts, members } = best_fit_decreasing(docs, 10) else {
            unreachable!()
        };
        let bins: Vec<Vec<u64>> = starts
            .windows(2)
            .map(|w| members[w[0] as usize..w[1] as usize].to_vec())
            .collect();
        // 6+4, 5+5, 8+2: in order of their lowest document.
        assert_eq!(bins, vec![vec![0, 1], vec![2, 3], vec![4, 5]]);
    }
}
