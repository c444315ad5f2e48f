//! The one-time tokenization: a reader thread reads documents in batches, every core encodes
//! a batch (rayon), and the results are written in document order, so the cache is the same
//! whatever the number of threads.

use crate::documents::{DocumentReader, ReadBatch, Skipped};
use crate::encode::{Encoded, Encoder};
use crate::error::{DataError, Origin, Result};
use crate::files::DataFile;
use crate::progress::{Observer, Progress};
use crate::writer::CorpusWriter;
use rayon::prelude::*;
use shardrun_protocol::config::{DataSource, OnBadRecord};
use std::sync::mpsc;

/// Input bytes per batch: enough documents to keep every core busy, few enough to bound
/// memory (a batch, its tokens and the next batch being read).
const BATCH_BYTES: u64 = 16 << 20;

/// Documents from this size on are named before they are encoded: the tokenizer holds about
/// [`ENCODING_BYTES_PER_BYTE`] bytes per byte of a document while it encodes it (offsets and
/// alignments of every byte; Python `tokenizers` does the same), and says nothing until done.
const LARGE_DOCUMENT_BYTES: usize = 16 << 20;

/// Peak memory of encoding one document, per byte of its text (measured: 4.1 GB for 30 MB).
const ENCODING_BYTES_PER_BYTE: usize = 140;

/// Threads for tokenization: every CPU this process may use (`sched_getaffinity` and cgroup
/// quotas, which is what a Slurm allocation grants), capped by `SLURM_CPUS_ON_NODE`.
pub fn default_threads() -> usize {
    let available = std::thread::available_parallelism().map_or(1, |n| n.get());
    let slurm = std::env::var("SLURM_CPUS_ON_NODE")
        .ok()
        .and_then(|n| n.trim().parse::<usize>().ok())
        .filter(|&n| n > 0);
    slurm.map_or(available, |n| n.min(available))
}

/// Reads every record once without encoding, to stop at the first bad one (a line that is
/// not JSON or not UTF-8, a missing field, an empty file) in seconds rather than after
/// tokenizing everything before it: reading runs hundreds of times faster than encoding.
fn first_bad_record(files: &[DataFile], source: &DataSource) -> Result<()> {
    let mut reader = DocumentReader::new(files, source, OnBadRecord::Stop);
    while reader.next_batch(BATCH_BYTES)?.is_some() {}
    Ok(())
}

/// A warning for each document of `batch` of `at_least` bytes: large enough to strain
/// memory while it is encoded.
fn large_documents(batch: &ReadBatch, files: &[DataFile], at_least: usize) -> Vec<String> {
    batch
        .documents
        .iter()
        .filter(|d| d.text_bytes() >= at_least)
        .map(|d| {
            let origin = Origin::new(&files[d.file as usize].path, d.line);
            large_document(&origin, d.text_bytes())
        })
        .collect()
}

fn large_document(origin: &Origin, size: usize) -> String {
    format!(
        "warning: {origin} is one document of {:.1} MB: encoding it takes about {:.1} GB of \
         memory for a while ({ENCODING_BYTES_PER_BYTE} bytes per byte, as in Python \
         `tokenizers`), more while others are encoded beside it; split such text into \
         smaller documents (`split: line`, or a `separator`) where memory is short",
        size as f64 / 1e6,
        (size * ENCODING_BYTES_PER_BYTE) as f64 / 1e9
    )
}

/// Tokenizes every document of `files` into `writer`; returns the records skipped.
#[allow(clippy::too_many_arguments)]
pub fn tokenize(
    files: &[DataFile],
    source: &DataSource,
    encoder: &Encoder<'_>,
    policy: OnBadRecord,
    threads: usize,
    writer: &mut CorpusWriter,
    what: &str,
    observer: &dyn Observer,
) -> Result<Vec<Skipped>> {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads.max(1))
        .thread_name(|i| format!("tokenize-{i}"))
        .build()
        .map_err(|e| DataError::Config(format!("cannot start tokenizer threads: {e}")))?;
    if policy == OnBadRecord::Stop {
        first_bad_record(files, source)?;
    }
    let total: u64 = files.iter().map(|f| f.size).sum();
    let mut progress = Progress::new(observer, what, total);
    let mut skipped = Vec::new();
    let result = std::thread::scope(|scope| -> Result<()> {
        let (tx, rx) = mpsc::sync_channel::<Result<ReadBatch>>(1);
        let reader = scope.spawn(move || {
            let mut reader = DocumentReader::new(files, source, policy);
            loop {
                let next = reader.next_batch(BATCH_BYTES);
                let done = !matches!(next, Ok(Some(_)));
                // A closed channel means the consumer stopped on an error: stop reading.
                if tx.send(next.map(|b| b.unwrap_or(empty_batch()))).is_err() || done {
                    break;
                }
            }
            reader.skipped
        });
        let outcome = (|| -> Result<()> {
            for batch in rx.iter() {
                let batch = batch?;
                if batch.documents.is_empty() && batch.bytes == 0 {
                    break;
                }
                for warning in large_documents(&batch, files, LARGE_DOCUMENT_BYTES) {
                    progress.note(&warning);
                }
                let encoded: Vec<std::result::Result<Encoded, String>> = pool.install(|| {
                    batch
                        .documents
                        .par_iter()
                        .map(|d| encoder.encode(d))
                        .collect()
                });
                let before = writer.written().tokens;
                for (document, result) in batch.documents.iter().zip(encoded) {
                    match result {
                        Ok(e) => writer.push(&e, document.file, document.line)?,
                        Err(why) => {
                            let origin =
                                Origin::new(&files[document.file as usize].path, document.line);
                            match policy {
                                OnBadRecord::Stop => return Err(DataError::bad(origin, why)),
                                OnBadRecord::Skip => skipped.push(Skipped::new(origin, why)),
                            }
                        }
                    }
                }
                progress.advance(batch.bytes, writer.written().tokens - before);
            }
            Ok(())
        })();
        // Dropping the receiver unblocks a reader waiting to send.
        drop(rx);
        let mut read_skipped = reader.join().expect("the document reader does not panic");
        read_skipped.append(&mut skipped);
        skipped = read_skipped;
        outcome
    });
    progress.finish();
    result?;
    // The reader's skips (records that do not parse) and the encoder's (records the template
    // or tokenizer refused) came apart: put them back in file order, so the first named are
    // the first in the files.
    let file_index = |origin: &Origin| files.iter().position(|f| f.path == origin.path);
    skipped.sort_by_key(|s| (file_index(&s.origin), s.origin.line));
    Ok(skipped)
}

fn empty_batch() -> ReadBatch {
    ReadBatch {
        documents: Vec::new(),
        bytes: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::documents::{Body, Document};
    use std::path::PathBuf;

    #[test]
    fn documents_that_strain_memory_are_named_with_the_memory_they_take() {
        let file = |name: &str| DataFile {
            path: PathBuf::from(name),
            size: 0,
            mtime_ns: 0,
            ctime_ns: 0,
        };
        let files = [file("corpus.txt"), file("records.jsonl")];
        let batch = ReadBatch {
            documents: vec![
                Document {
                    body: Body::Text("x".repeat(2_000_000)),
                    file: 0,
                    line: 0,
                },
                Document {
                    body: Body::Text("short".into()),
                    file: 1,
                    line: 3,
                },
                Document {
                    body: Body::PromptCompletion {
                        prompt: "p".repeat(600_000),
                        completion: "c".repeat(500_000),
                    },
                    file: 1,
                    line: 7,
                },
            ],
            bytes: 0,
        };
        let warnings = large_documents(&batch, &files, 1_000_000);
        assert_eq!(warnings.len(), 2, "{warnings:?}");
        assert!(
            warnings[0].starts_with("warning: corpus.txt is one document of 2.0 MB")
                && warnings[0].contains("about 0.3 GB")
                && warnings[0].contains("`split: line`"),
            "{}",
            warnings[0]
        );
        assert!(
            warnings[1].starts_with("warning: records.jsonl:7 is one document of 1.1 MB"),
            "{}",
            warnings[1]
        );
        assert!(large_documents(&batch, &files, 3_000_000).is_empty());
    }
}
