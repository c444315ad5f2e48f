//! Packing and sampling as the trainer draws them (rank `r` of `W` reads
//! `first_sample(step_start, micro, b, W, r)`): every token of every training document is an
//! input exactly once per epoch across all ranks, and a target once (but the first); held-out
//! documents never train; orders differ across seeds and epochs, and unshuffled is file order
//! (whole documents too); a run resumed from its data position, on another world size, reads
//! bitwise the batches of an uninterrupted run. Batches leave none of the corpus's pages in
//! the process's resident memory.
//!
//! The documents are pre-tokenized files whose ids are unique (document k holds
//! `(k+1)·100000 + j`), so every input names the document and position it came from.

mod common;

use common::*;
use shardrun_data::sampler::first_sample;
use shardrun_data::{Dataset, HostBatch, Quiet};
use shardrun_protocol::config::*;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

const LENGTHS: [u64; 9] = [5, 40, 17, 1, 64, 23, 9, 33, 2];

fn id(doc: usize, j: u64) -> i64 {
    ((doc as i64) + 1) * 100_000 + j as i64
}

fn token_files(dir: &Path) -> Vec<PathBuf> {
    LENGTHS
        .iter()
        .enumerate()
        .map(|(k, &len)| {
            let path = dir.join(format!("doc-{k}.bin"));
            let bytes: Vec<u8> = (0..len)
                .flat_map(|j| (id(k, j) as u32).to_le_bytes())
                .collect();
            std::fs::write(&path, bytes).unwrap();
            path
        })
        .collect()
}

fn config(dir: &Path, packing: Packing, document_mask: bool) -> DatasetConfig {
    let mut c = dataset(
        DataSource::Tokens {
            files: token_files(dir),
            dtype: TokenDtype::U32,
        },
        TokenizerConfig::PreTokenized,
        8,
        &dir.join("cache"),
    );
    c.packing = packing;
    c.document_mask = document_mask;
    c
}

/// (document, position) of an input id.
fn locate(id: i64) -> (usize, u64) {
    ((id / 100_000 - 1) as usize, (id % 100_000) as u64)
}

/// Every batch of `steps` optimizer steps as the ranks draw them, keyed by (step, global
/// sample), starting at global sample `start`.
fn draw(
    data: &Dataset,
    start: u64,
    steps: u64,
    world: u64,
    per_device: u64,
    accum: u64,
) -> BTreeMap<(u64, u64), Vec<i64>> {
    let total = per_device * world * accum;
    let mut rows = BTreeMap::new();
    for s in 0..steps {
        let step_start = start + s * total;
        for m in 0..accum {
            for r in 0..world {
                let first = first_sample(step_start, m, per_device, world, r);
                let batch = data.training_batch(first, per_device);
                for (i, row) in split_rows(&batch).into_iter().enumerate() {
                    rows.insert((step_start / total, first + i as u64), row);
                }
            }
        }
    }
    rows
}

/// Each row as inputs followed by targets.
fn split_rows(batch: &HostBatch) -> Vec<Vec<i64>> {
    (0..batch.rows)
        .map(|r| {
            let span = r * batch.seq_len..(r + 1) * batch.seq_len;
            let mut row = batch.inputs[span.clone()].to_vec();
            row.extend_from_slice(&batch.targets[span]);
            row
        })
        .collect()
}

#[test]
fn every_token_is_read_once_per_epoch_across_ranks() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = config(dir.path(), Packing::Stream, false);
    c.validation = Some(ValidationConfig {
        held_out: HeldOut::Fraction { fraction: 0.25 },
        every_steps: None,
        max_batches: None,
    });
    let data = Dataset::open(&c, 11, None, 2, &Quiet).unwrap();
    let train_docs: Vec<usize> = data
        .train()
        .set()
        .document_ids()
        .map(|d| d as usize)
        .collect();
    let held: Vec<usize> = (0..LENGTHS.len())
        .filter(|d| !train_docs.contains(d))
        .collect();
    assert!(!held.is_empty() && train_docs.len() > 1, "{held:?}");
    let epoch = data.samples_per_epoch();
    let (world, per_device, accum) = (3, 2, 2);
    let steps = epoch.div_ceil(world * per_device * accum);
    let rows = draw(&data, 0, steps, world, per_device, accum);

    // Inputs of epoch 0, over every rank and micro-batch.
    let mut seen: BTreeMap<(usize, u64), u32> = BTreeMap::new();
    let mut targets = 0u64;
    for (&(_, sample), row) in &rows {
        if sample >= epoch {
            continue;
        }
        let (inputs, row_targets) = row.split_at(row.len() / 2);
        for (i, &t) in inputs.iter().enumerate() {
            if t == 0 {
                assert!(row_targets[i] == -100, "padding is never trained on");
                continue;
            }
            *seen.entry(locate(t)).or_default() += 1;
            let target = row_targets[i];
            if target != -100 {
                targets += 1;
                let (d, j) = locate(t);
                let (td, tj) = locate(target);
                // The next token of the stream: the same document's next, or the next
                // training document's first.
                let next_doc = train_docs[train_docs.iter().position(|&x| x == d).unwrap() + 1..]
                    .first()
                    .copied();
                assert!(
                    (td, tj) == (d, j + 1)
                        || (j + 1 == LENGTHS[d] && Some(td) == next_doc && tj == 0),
                    "target {target} after {t}"
                );
            }
        }
    }
    let want: BTreeMap<(usize, u64), u32> = train_docs
        .iter()
        .flat_map(|&d| (0..LENGTHS[d]).map(move |j| ((d, j), 1)))
        .collect();
    assert_eq!(
        seen, want,
        "every training token exactly once, nothing held out"
    );
    let train_tokens: u64 = train_docs.iter().map(|&d| LENGTHS[d]).sum();
    assert_eq!(
        targets,
        train_tokens - 1,
        "every token but the first is a target once"
    );

    // The validation sequences hold exactly the held-out documents.
    let v = data.validation().unwrap();
    let batch = data.validation_batch(0, v.sequences() + 2);
    let mut held_seen: Vec<(usize, u64)> = batch
        .inputs
        .iter()
        .filter(|&&t| t != 0)
        .map(|&t| locate(t))
        .collect();
    held_seen.sort();
    let held_want: Vec<(usize, u64)> = held
        .iter()
        .flat_map(|&d| (0..LENGTHS[d]).map(move |j| (d, j)))
        .collect();
    assert_eq!(held_seen, held_want);
}

#[test]
fn whole_documents_stay_whole_with_the_document_mask() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = config(dir.path(), Packing::WholeDocuments, true);
    c.seq_len = 64;
    let data = Dataset::open(&c, 0, None, 2, &Quiet).unwrap();
    let batch = data.training_batch(0, data.samples_per_epoch());
    let positions = batch.position_ids.as_ref().unwrap();
    let documents = batch.document_ids.as_ref().unwrap();
    let mut placed = vec![0u32; LENGTHS.len()];
    for r in 0..batch.rows {
        let at = |i: usize| r * batch.seq_len + i;
        let mut i = 0;
        while i < batch.seq_len && batch.inputs[at(i)] != 0 {
            let (d, j) = locate(batch.inputs[at(i)]);
            assert_eq!(j, 0, "a document starts at its first token");
            let len = LENGTHS[d] as usize;
            for k in 0..len {
                assert_eq!(batch.inputs[at(i + k)], id(d, k as u64));
                assert_eq!(
                    positions[at(i + k)],
                    k as i64,
                    "positions restart per document"
                );
                assert_eq!(documents[at(i + k)], documents[at(i)]);
                let target = batch.targets[at(i + k)];
                let want = if k + 1 < len {
                    id(d, k as u64 + 1)
                } else {
                    -100
                };
                assert_eq!(target, want);
            }
            placed[d] += 1;
            i += len;
        }
        for k in i..batch.seq_len {
            assert_eq!((batch.inputs[at(k)], batch.targets[at(k)]), (0, -100));
        }
    }
    assert_eq!(placed, vec![1; LENGTHS.len()], "each document placed once");
    // 194 tokens in 64-token sequences: best-fit needs 4.
    assert_eq!(data.samples_per_epoch(), 4);
}

#[test]
fn unshuffled_whole_documents_read_in_file_order() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = config(dir.path(), Packing::WholeDocuments, false);
    c.seq_len = 64;
    c.shuffle = false;
    let data = Dataset::open(&c, 0, None, 2, &Quiet).unwrap();
    let batch = data.training_batch(0, data.samples_per_epoch());
    // The documents each sequence starts, in the order they are read.
    let mut read = Vec::new();
    for r in 0..batch.rows {
        let row = &batch.inputs[r * batch.seq_len..(r + 1) * batch.seq_len];
        let docs: Vec<usize> = row
            .iter()
            .filter(|&&t| t != 0)
            .map(|&t| locate(t))
            .filter(|&(_, j)| j == 0)
            .map(|(d, _)| d)
            .collect();
        assert!(docs.is_sorted(), "sequence {r} holds {docs:?}");
        read.push(docs);
    }
    let firsts: Vec<usize> = read.iter().map(|docs| docs[0]).collect();
    assert!(
        firsts.is_sorted(),
        "sequences start at documents {firsts:?}"
    );
    assert_eq!(firsts[0], 0, "the first file is read first");
    let mut all: Vec<usize> = read.concat();
    all.sort();
    assert_eq!(all, (0..LENGTHS.len()).collect::<Vec<_>>());
}

#[test]
fn stream_with_the_document_mask_does_not_predict_across_documents() {
    let dir = tempfile::tempdir().unwrap();
    let data = Dataset::open(
        &config(dir.path(), Packing::Stream, true),
        0,
        None,
        2,
        &Quiet,
    )
    .unwrap();
    let batch = data.training_batch(0, data.samples_per_epoch());
    let positions = batch.position_ids.as_ref().unwrap();
    for r in 0..batch.rows {
        for i in 0..batch.seq_len {
            let at = r * batch.seq_len + i;
            let t = batch.inputs[at];
            if t == 0 {
                continue;
            }
            let (d, j) = locate(t);
            if j + 1 == LENGTHS[d] {
                assert_eq!(
                    batch.targets[at], -100,
                    "the end of document {d} predicts nothing"
                );
            }
            // A document continued from the previous sequence restarts at 0 here.
            let expected = if i == 0 || locate(batch.inputs[at - 1]).0 != d {
                0
            } else {
                positions[at - 1] + 1
            };
            assert_eq!(positions[at], expected);
        }
    }
}

#[test]
fn order_differs_across_seeds_and_epochs() {
    let dir = tempfile::tempdir().unwrap();
    let c = config(dir.path(), Packing::Stream, false);
    let first_inputs = |data: &Dataset, epoch: u64| -> Vec<i64> {
        let n = data.samples_per_epoch();
        let b = data.training_batch(epoch * n, n);
        (0..b.rows).map(|r| b.inputs[r * b.seq_len]).collect()
    };
    let a = Dataset::open(&c, 1, None, 2, &Quiet).unwrap();
    let b = Dataset::open(&c, 2, None, 2, &Quiet).unwrap();
    assert!(a.samples_per_epoch() >= 20);
    assert_ne!(first_inputs(&a, 0), first_inputs(&a, 1), "epochs differ");
    assert_ne!(first_inputs(&a, 0), first_inputs(&b, 0), "seeds differ");
    let mut sorted = (first_inputs(&a, 0), first_inputs(&a, 1));
    sorted.0.sort();
    sorted.1.sort();
    assert_eq!(sorted.0, sorted.1, "each epoch holds the same sequences");
    assert_eq!(
        first_inputs(&a, 3),
        first_inputs(&Dataset::open(&c, 1, None, 2, &Quiet).unwrap(), 3)
    );
}

#[test]
fn resuming_from_the_data_position_on_another_world_size_reads_the_same_batches() {
    let dir = tempfile::tempdir().unwrap();
    let data = Dataset::open(
        &config(dir.path(), Packing::Stream, false),
        5,
        None,
        2,
        &Quiet,
    )
    .unwrap();
    // 12 samples per step: 2 ranks × 3 × 2 accumulation, or 3 ranks × 2 × 2, or 4 × 3 × 1.
    let straight = draw(&data, 0, 9, 2, 3, 2);
    let killed_at = 4;
    let before = draw(&data, 0, killed_at, 2, 3, 2);
    // What the checkpoint keeps: global samples done.
    let samples_done = killed_at * 12;
    for (world, per_device, accum) in [(3, 2, 2), (4, 3, 1), (2, 3, 2)] {
        let mut resumed = before.clone();
        resumed.extend(draw(
            &data,
            samples_done,
            9 - killed_at,
            world,
            per_device,
            accum,
        ));
        assert_eq!(resumed, straight, "resumed on {world} ranks");
    }
    assert!(
        data.samples_per_epoch() < 9 * 12,
        "the runs cross an epoch boundary"
    );
}

/// Resident kibibytes of this process's mappings of `path` (`Rss` in `/proc/self/smaps`),
/// `None` when it has none.
fn resident_kib(path: &Path) -> Option<u64> {
    let path = std::fs::canonicalize(path).unwrap();
    let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
    let mut resident = None;
    let mut in_mapping = false;
    for line in smaps.lines() {
        let first = line.split_whitespace().next().unwrap_or_default();
        if first.contains('-') && !first.ends_with(':') {
            in_mapping = line.ends_with(&*path.to_string_lossy());
        } else if let (true, Some(kib)) = (in_mapping, line.strip_prefix("Rss:")) {
            let kib: u64 = kib.trim().trim_end_matches(" kB").parse().unwrap();
            *resident.get_or_insert(0) += kib;
        }
    }
    resident
}

/// The pages of the prepared corpus a batch read stay in the page cache, not in the rank's
/// resident memory, whose peak is reported as the training's: for a cache's token file and
/// for pre-tokenized files read in place.
#[test]
fn batches_leave_no_corpus_pages_resident() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("a.txt");
    std::fs::write(&file, "one line of bytes to read\n".repeat(20_000)).unwrap();
    let text = dataset(
        text_files(vec![file], TextSplit::Line),
        TokenizerConfig::Bytes,
        64,
        &dir.path().join("cache"),
    );
    let data = Dataset::open(&text, 0, None, 1, &Quiet).unwrap();
    let tokens = data.train().corpus().dir.join("tokens.u32");
    assert!(std::fs::metadata(&tokens).unwrap().len() > 1 << 20);
    data.verify_content().unwrap();
    assert!(
        resident_kib(&tokens) > Some(1000),
        "read whole, it is resident"
    );
    let samples = data.samples_per_epoch();
    for first in (0..samples).step_by(64) {
        let batch = data.training_batch(first, 64.min(samples - first));
        assert!(batch.loss_tokens > 0);
    }
    assert_eq!(resident_kib(&tokens), Some(0), "{}", tokens.display());

    let data = Dataset::open(
        &config(dir.path(), Packing::Stream, false),
        0,
        None,
        1,
        &Quiet,
    )
    .unwrap();
    let files: Vec<PathBuf> = (0..LENGTHS.len())
        .map(|k| dir.path().join(format!("doc-{k}.bin")))
        .collect();
    let samples = data.samples_per_epoch();
    let batch = data.training_batch(0, samples);
    assert!(batch.loss_tokens > 0);
    for file in files
        .iter()
        .filter(|f| std::fs::metadata(f).unwrap().len() > 0)
    {
        assert_eq!(resident_kib(file), Some(0), "{}", file.display());
    }
}
