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
    /// Of `tokens`, the training targets (all of them without a loss mask).
    pub trained_tokens: u64,
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
        set.trained_tokens = corpus.manifest.trained_tokens;
        set
    }

    fn empty() -> DocSet {
        DocSet {
            runs: Vec::new(),
            documents: 0,
            tokens: 0,
            trained_tokens: 0,
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

/// Splits `corpus` into (training, validation): the documents whose hashes are the
/// `held_out_count` smallest are held out, so the split is the fraction asked for.
pub fn hold_out(corpus: &Corpus, fraction: f64) -> Result<(DocSet, DocSet)> {
    let n = corpus.documents();
    let is_held = held_out_documents(n, fraction);
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
    // Counted over the held-out side, the smaller one as a rule (with a loss mask: a byte
    // read per token); the training side is the rest of the corpus.
    validation.trained_tokens = validation
        .runs
        .iter()
        .map(|r| corpus.trained_in(r.corpus_start, r.corpus_start + r.len))
        .sum();
    train.trained_tokens = corpus.manifest.trained_tokens - validation.trained_tokens;
    if train.documents == 0 {
        return Err(DataError::NotEnoughData {
            why: format!(
                "holding out {fraction} of {n} document(s) ({} of them, the nearest whole \
                 number) leaves none to train on",
                validation.documents
            ),
            fix: "lower `data.validation.fraction`, or give `data.validation.files`".into(),
        });
    }
    Ok((train, validation))
}

fn document_hash(d: u64) -> u64 {
    splitmix64(d ^ HOLD_OUT_SALT)
}

/// How many of `n` documents a `fraction` holds out: the nearest whole number, at least one.
fn held_out_count(n: u64, fraction: f64) -> u64 {
    ((fraction.clamp(0.0, 1.0) * n as f64).round() as u64).clamp(1.min(n), n)
}

/// Whether document `d` of `n` is held out. The hash is a bijection of the index, so no two
/// documents share one and exactly `held_out_count` fall at or below the threshold.
fn held_out_documents(n: u64, fraction: f64) -> impl Fn(u64) -> bool {
    let k = held_out_count(n, fraction);
    let threshold = (k > 0).then(|| kth_smallest_hash(n, k));
    move |d| threshold.is_some_and(|t| document_hash(d) <= t)
}

/// The `k`-th smallest (1-based) document hash, in two passes over the hashes and memory
/// for one bucket of them: count by the top 16 bits, then sort out the bucket holding it.
fn kth_smallest_hash(n: u64, k: u64) -> u64 {
    const SHIFT: u32 = 48;
    let mut counts = vec![0u64; 1 << (64 - SHIFT)];
    for d in 0..n {
        counts[(document_hash(d) >> SHIFT) as usize] += 1;
    }
    let mut before = 0;
    let mut bucket = 0;
    for (b, &count) in counts.iter().enumerate() {
        if before + count >= k {
            bucket = b as u64;
            break;
        }
        before += count;
    }
    let mut hashes: Vec<u64> = (0..n)
        .map(document_hash)
        .filter(|h| h >> SHIFT == bucket)
        .collect();
    let (_, kth, _) = hashes.select_nth_unstable((k - before - 1) as usize);
    *kth
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_count_held_out_is_the_fraction_asked_for() {
        for (n, fraction, want) in [
            (25, 0.1, 3),
            (30, 0.1, 3),
            (10, 0.01, 1),
            (1000, 0.02, 20),
            (7, 0.5, 4),
            (1, 0.5, 1),
            (0, 0.5, 0),
        ] {
            assert_eq!(held_out_count(n, fraction), want, "{fraction} of {n}");
            let held = held_out_documents(n, fraction);
            assert_eq!((0..n).filter(|&d| held(d)).count() as u64, want);
        }
    }

    #[test]
    fn the_held_out_documents_have_the_smallest_hashes() {
        let n = 200_000;
        let held = held_out_documents(n, 0.05);
        let mut by_hash: Vec<u64> = (0..n).collect();
        by_hash.sort_by_key(|&d| document_hash(d));
        let (want_held, want_train) = by_hash.split_at(10_000);
        assert!(want_held.iter().all(|&d| held(d)));
        assert!(want_train.iter().all(|&d| !held(d)));
    }

    #[test]
    fn appending_documents_keeps_most_held_out_ones() {
        // Appending documents moves the threshold a little: most held-out documents stay.
        let before = held_out_documents(10_000, 0.1);
        let after = held_out_documents(11_000, 0.1);
        let kept = (0..10_000).filter(|&d| before(d) && after(d)).count();
        assert!(kept > 900, "{kept} of 1000 stay held out");
    }
}
