//! `shardrun-data`: the training data of a shardrun job, without libtorch (the orchestrator
//! prepares data on the login node and in the job's controller; the worker reads it).
//!
//! * [`files`]: `data.files` patterns to files; [`documents`]: files to documents (text,
//!   JSONL, chat records), bad records stopped on or skipped.
//! * [`tokenizer`]: Hugging Face `tokenizer.json` (or bytes), special tokens from the
//!   folder's configs; [`chat`]: chat templates through minijinja, assistant spans;
//!   [`tokenizer_files`]: a run's tokenizer as the files of an exported model folder.
//! * [`encode`]: one document to ids and loss mask; [`tokenize`]: every core, in order.
//! * [`cache`], [`writer`], [`corpus`]: the tokenized cache, built once (locked, atomic),
//!   memory-mapped for reading; [`prepare`]: a source to a corpus; [`outdated`]: cache
//!   folders of data files since edited or removed.
//! * [`split`]: held-out documents; [`packing`]: documents into sequences;
//!   [`sampler`]: the seeded order per epoch; [`dataset`]: batches by global sample index.
//! * [`identity`]: what a dataset is made of (fingerprint, files, tokenizer), so a resumed
//!   run can tell its data from other data and say what changed.

pub mod cache;
pub mod chat;
pub mod corpus;
pub mod dataset;
pub mod documents;
pub mod encode;
pub mod error;
pub mod files;
pub mod identity;
pub mod json_array;
pub mod outdated;
pub mod packing;
pub mod prepare;
pub mod progress;
pub mod rebuild;
pub mod rng;
pub mod sampler;
pub mod split;
pub mod tokenize;
pub mod tokenizer;
pub mod tokenizer_files;
pub mod writer;

pub use dataset::{Dataset, HostBatch};
pub use error::{DataError, Origin};
pub use identity::{DataFiles, DataIdentity};
pub use progress::{Observer, Quiet, Stderr};
pub use rng::splitmix64;
pub use tokenize::default_threads;

/// xxh3-64 of `bytes`: a fast, stable digest (batch logs compare samples across runs).
pub fn digest(bytes: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64(bytes)
}
