//! A dataset ready to train on: prepared corpora, the validation split, packing and the
//! per-epoch order, filling batches by global sample index.

use crate::corpus::Corpus;
use crate::error::{DataError, Result};
use crate::identity::{DataIdentity, SourceIdentity};
use crate::packing::{Packed, Row, IGNORE, PAD};
use crate::prepare::{prepare_source, DatasetSources, Prepared};
use crate::progress::Observer;
use crate::sampler::EpochOrder;
use crate::split::{hold_out, DocSet};
use shardrun_protocol::config::{DataSource, DatasetConfig, HeldOut, JsonlText};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Rows of token ids ready to become tensors, row-major `[rows, seq_len]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostBatch {
    pub rows: usize,
    pub seq_len: usize,
    pub inputs: Vec<i64>,
    /// Next-token ids, -100 where there is no loss.
    pub targets: Vec<i64>,
    /// Positions restarting per document (document mask only).
    pub position_ids: Option<Vec<i64>>,
    /// Document of each token within its row (document mask only).
    pub document_ids: Option<Vec<i64>>,
    /// Targets that are not -100.
    pub loss_tokens: u64,
}

impl HostBatch {
    fn new(rows: usize, seq_len: usize, document_mask: bool) -> HostBatch {
        let n = rows * seq_len;
        HostBatch {
            rows,
            seq_len,
            inputs: vec![PAD; n],
            targets: vec![IGNORE; n],
            position_ids: document_mask.then(|| vec![0; n]),
            document_ids: document_mask.then(|| vec![0; n]),
            loss_tokens: 0,
        }
    }

    fn row(&mut self, r: usize) -> Row<'_> {
        let range = r * self.seq_len..(r + 1) * self.seq_len;
        Row {
            inputs: &mut self.inputs[range.clone()],
            targets: &mut self.targets[range.clone()],
            positions: self.position_ids.as_mut().map(|p| &mut p[range.clone()]),
            documents: self.document_ids.as_mut().map(|d| &mut d[range]),
        }
    }
}

pub struct Dataset {
    train: Packed,
    validation: Option<Packed>,
    order: EpochOrder,
    document_mask: bool,
    identity: DataIdentity,
    summary: Vec<String>,
    built: bool,
}

impl Dataset {
    /// Prepares what is not prepared yet (see [`crate::prepare`]), then packs. `vocab_size`:
    /// the model's, every id must be below it.
    pub fn open(
        config: &DatasetConfig,
        seed: u64,
        vocab_size: Option<u64>,
        threads: usize,
        observer: &dyn Observer,
    ) -> Result<Dataset> {
        let mut skipped = Vec::new();
        let opened = Dataset::assemble(config, seed, vocab_size, threads, observer, &mut skipped);
        if opened.is_err() {
            // Records left out are often why the data then fails (too little of it, no
            // sequence): the description that would have said so is not coming.
            for warning in &skipped {
                observer.line(warning);
            }
        }
        opened
    }

    /// [`Dataset::open`], noting in `skipped` the warnings about bad records left out as
    /// soon as each corpus is prepared.
    fn assemble(
        config: &DatasetConfig,
        seed: u64,
        vocab_size: Option<u64>,
        threads: usize,
        observer: &dyn Observer,
        skipped: &mut Vec<String>,
    ) -> Result<Dataset> {
        if config.seq_len == 0 {
            return Err(DataError::Config("data.seq_len must be positive".into()));
        }
        let sources = DatasetSources::new(config, threads);
        let train_prepared = prepare_source(&sources.training(), observer)?;
        let mut built = train_prepared.built;
        let mut summary = Vec::new();
        let training = SourceIdentity::of(&train_prepared.corpus.manifest);
        let mut validation_identity = None;
        let train_corpus = Arc::new(train_prepared.corpus);
        skipped.extend(skipped_records("training data", &train_corpus));
        skipped.extend(record_warnings("training data", &train_corpus));
        check_vocab(&train_corpus, vocab_size)?;
        let held_out = config.validation.as_ref().map(|v| &v.held_out);
        // How the validation files' cache came to be (its own files only): for the summary.
        let mut validation_cache = None;
        let mut overlap = None;
        let (train_set, validation) = match (sources.validation(), held_out) {
            (Some(spec), _) => {
                let Prepared {
                    corpus,
                    built: validation_built,
                    seconds,
                } = prepare_source(&spec, observer)?;
                built |= validation_built;
                validation_cache = Some((seconds, validation_built));
                skipped.extend(skipped_records("validation data", &corpus));
                skipped.extend(record_warnings("validation data", &corpus));
                check_vocab(&corpus, vocab_size)?;
                validation_identity = Some(SourceIdentity::of(&corpus.manifest));
                overlap = trained_on(&train_corpus, &corpus);
                let set = DocSet::everything(&corpus);
                (
                    DocSet::everything(&train_corpus),
                    Some((Arc::new(corpus), set)),
                )
            }
            (None, Some(HeldOut::Fraction { fraction })) => {
                let (train, held) = hold_out(&train_corpus, *fraction)?;
                (train, Some((train_corpus.clone(), held)))
            }
            (None, _) => (DocSet::everything(&train_corpus), None),
        };
        let pack = |corpus: Arc<Corpus>, set| {
            Packed::new(
                corpus,
                set,
                config.seq_len,
                config.packing,
                config.truncate,
                config.document_mask,
                config.on_bad_record,
            )
        };
        let train = pack(train_corpus.clone(), train_set)?;
        let validation = validation
            .map(|(corpus, set)| pack(corpus, set))
            .transpose()?;
        for (what, packed) in std::iter::once(("training data", &train))
            .chain(validation.as_ref().map(|v| ("validation data", v)))
        {
            all_left_out(what, packed)?;
        }
        let order = EpochOrder::new(train.sequences(), seed, config.shuffle)?;
        let loss_covers = loss_covers(&config.source);
        summary.push(describe(
            "training data",
            &train,
            loss_covers,
            Some((train_prepared.seconds, train_prepared.built)),
        ));
        // Which ids these are: the tokenizer file, the end-of-document token and where it
        // came from, and a rebuild of the file as transformers builds it.
        summary.push(format!("tokenizer: {}", train_corpus.manifest.tokenizer));
        if let Some(v) = &validation {
            if v.sequences() == 0 {
                return Err(DataError::NotEnoughData {
                    why: "the validation data makes no sequence".into(),
                    fix: "hold out more (`data.validation.fraction`) or give other files".into(),
                });
            }
            let what = match validation_cache {
                Some(_) => "validation data",
                None => "validation data (held-out documents)",
            };
            summary.push(describe(what, v, loss_covers, validation_cache));
            summary.extend(overlap);
        }
        // Said whenever the data is described, not only when it is tokenized: a run on a
        // cache made earlier is trained without those records too.
        summary.extend(skipped.iter().cloned());
        let sets = std::iter::once(("training data", &train))
            .chain(validation.as_ref().map(|v| ("validation data", v)));
        for (what, packed) in sets {
            let left_out = &packed.left_out;
            if let Some((origin, tokens)) = &left_out.first {
                summary.push(format!(
                    "warning: {} document(s) longer than seq_len {} left out of the {what} \
                     (data.on_bad_record: skip; the first: {origin}, {} tokens; \
                     `data.truncate: true` keeps their first {} tokens instead)",
                    thousands(left_out.documents),
                    config.seq_len,
                    thousands(*tokens),
                    config.seq_len
                ));
            }
            summary.extend(truncation_lines(what, packed));
        }
        Ok(Dataset {
            train,
            validation,
            order,
            document_mask: config.document_mask,
            identity: DataIdentity::new(config, training, validation_identity),
            summary,
            built,
        })
    }

    /// Identifies the sample stream (tokens, split, packing, truncation): a resumed run must
    /// find the same one.
    pub fn fingerprint(&self) -> &str {
        &self.identity.fingerprint
    }

    /// The fingerprint and what the data is made of (files, tokenizer), to be recorded.
    pub fn identity(&self) -> &DataIdentity {
        &self.identity
    }

    /// Lines describing the data, for the log.
    pub fn summary(&self) -> &[String] {
        &self.summary
    }

    /// Whether opening tokenized anything (false: every cache was there).
    pub fn built(&self) -> bool {
        self.built
    }

    pub fn samples_per_epoch(&self) -> u64 {
        self.order.sequences_per_epoch()
    }

    pub fn seq_len(&self) -> u64 {
        self.train.seq_len()
    }

    /// [`Corpus::verify_content`] of the training and validation data: once per job, by the
    /// process that prepares it, before any rank reads it.
    pub fn verify_content(&self) -> Result<()> {
        self.train.corpus().verify_content()?;
        match &self.validation {
            Some(validation) => validation.corpus().verify_content(),
            None => Ok(()),
        }
    }

    pub fn train(&self) -> &Packed {
        &self.train
    }

    /// Epoch of global sample `sample` (0-based).
    pub fn epoch_of(&self, sample: u64) -> u64 {
        sample / self.samples_per_epoch()
    }

    /// Training samples `first .. first + count` (global indices).
    pub fn training_batch(&self, first: u64, count: u64) -> HostBatch {
        let mut batch = HostBatch::new(count as usize, self.seq_len() as usize, self.document_mask);
        for r in 0..count {
            let (_, sequence) = self.order.locate(first + r);
            batch.loss_tokens += self.train.fill(sequence, batch.row(r as usize));
        }
        self.train.corpus().release_pages();
        batch
    }

    pub fn validation(&self) -> Option<&Packed> {
        self.validation.as_ref()
    }

    /// Validation sequences `first .. first + count` in order; rows past the end are padding
    /// with no targets (every rank runs the same number of batches).
    pub fn validation_batch(&self, first: u64, count: u64) -> HostBatch {
        let mut batch = HostBatch::new(count as usize, self.seq_len() as usize, self.document_mask);
        if let Some(v) = &self.validation {
            for r in 0..count {
                let k = first + r;
                if k < v.sequences() {
                    batch.loss_tokens += v.fill(k, batch.row(r as usize));
                }
            }
            v.corpus().release_pages();
        }
        batch
    }
}

/// Every id must be below the model's vocabulary size; name the first one that is not.
fn check_vocab(corpus: &Corpus, vocab_size: Option<u64>) -> Result<()> {
    let Some(vocab) = vocab_size else {
        return Ok(());
    };
    let max = corpus.manifest.max_token_id;
    if max < vocab {
        return Ok(());
    }
    let (d, i, token) = corpus.first_token_at_least(vocab).unwrap_or((0, 0, max));
    Err(DataError::TokenOutOfRange {
        origin: corpus.origin(d),
        token,
        vocab_size: vocab,
        fix: format!(
            "it is token {} of that document, and the data has ids up to {max} ({}); use the \
             tokenizer the model was made for, or give the model at least {} ids (its \
             `vocab_size`; for a Hugging Face folder, transformers' \
             `model.resize_token_embeddings`, then `save_pretrained`)",
            i + 1,
            corpus.manifest.tokenizer,
            max + 1
        ),
    })
}

/// A warning when validation files are training files too: the validation loss would be
/// measured on text the model trains on.
fn trained_on(train: &Corpus, validation: &Corpus) -> Option<String> {
    let real = |path: &Path| std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    let trained: std::collections::HashSet<PathBuf> =
        train.manifest.files.iter().map(|f| real(&f.path)).collect();
    let shared: Vec<&Path> = validation
        .manifest
        .files
        .iter()
        .map(|f| f.path.as_path())
        .filter(|path| trained.contains(&real(path)))
        .collect();
    let first = shared.first()?;
    Some(format!(
        "warning: {} of the {} validation file(s) are training files too (the first: {}): the \
         validation loss is measured on text the model trains on; hold out other files, or \
         `data.validation.fraction` of the documents",
        shared.len(),
        validation.manifest.files.len(),
        first.display()
    ))
}

/// What a loss mask keeps in the loss, in the words of the data's kind.
fn loss_covers(source: &DataSource) -> &'static str {
    match source {
        DataSource::Chat { .. } => " (the assistant's turns)",
        DataSource::Jsonl {
            text: JsonlText::PromptCompletion { .. },
            ..
        } => " (the completions)",
        _ => "",
    }
}

/// One line about a packed set, counting what its sequences hold (not the documents left
/// out); `loss_covers`: what its loss mask keeps, in words; `cache`: (seconds, built) when
/// the line should say where its cache is and whether it was just prepared.
fn describe(what: &str, packed: &Packed, loss_covers: &str, cache: Option<(f64, bool)>) -> String {
    let corpus = packed.corpus();
    let trained = if corpus.manifest.loss_mask {
        format!(
            ", {:.0}% of them in the loss{loss_covers}",
            100.0 * packed.trained_tokens() as f64 / packed.tokens().max(1) as f64
        )
    } else {
        String::new()
    };
    let cache = match cache {
        Some((seconds, true)) => format!(" (prepared in {seconds:.1} s: {})", corpus.dir.display()),
        Some((_, false)) => format!(" (cached: {})", corpus.dir.display()),
        None => String::new(),
    };
    format!(
        "{what}: {} document(s), {} tokens{trained}, {} sequence(s) of {} per epoch{cache}",
        thousands(packed.documents()),
        thousands(packed.tokens()),
        thousands(packed.sequences()),
        packed.seq_len(),
    )
}

/// What `truncate` cut from a set, if anything: how many documents and tokens, and warnings
/// when most of the set is cut or a truncated example keeps nothing in the loss.
fn truncation_lines(what: &str, packed: &Packed) -> Vec<String> {
    let cut = &packed.truncated;
    let Some((origin, tokens)) = &cut.first else {
        return Vec::new();
    };
    let seq_len = packed.seq_len();
    let targets = if packed.corpus().has_mask() {
        format!(", {} of them loss targets", thousands(cut.trained_tokens))
    } else {
        String::new()
    };
    let mut line = format!(
        "{what}: {} document(s) longer than seq_len {seq_len} cut to their first {seq_len} \
         tokens (data.truncate): {} tokens dropped{targets} (the first: {origin}, {} tokens)",
        thousands(cut.documents),
        thousands(cut.tokens),
        thousands(*tokens)
    );
    if cut.tokens > packed.tokens() {
        line = format!(
            "warning: {line}; most of the {what} is dropped: raise seq_len, or use \
             `packing: stream` (documents continue into the next sequence)"
        );
    }
    let mut lines = vec![line];
    if cut.untrained > 0 {
        lines.push(format!(
            "warning: {} truncated document(s) of the {what} keep no token in the loss (what \
             they train on starts after their first {seq_len} tokens): raise seq_len, or \
             shorten what comes before it (prompts, system messages, earlier turns)",
            thousands(cut.untrained)
        ));
    }
    lines
}

/// A set that makes no sequence because every document was left out for its length says so.
fn all_left_out(what: &str, packed: &Packed) -> Result<()> {
    let left_out = &packed.left_out;
    if packed.sequences() > 0 || left_out.documents == 0 {
        return Ok(());
    }
    Err(DataError::NotEnoughData {
        why: format!(
            "the {what} makes no sequence: all {} of its document(s) are longer than seq_len {} \
             and were left out (data.on_bad_record: skip)",
            thousands(left_out.documents),
            packed.seq_len()
        ),
        fix: format!(
            "set `data.truncate: true` to keep their first {} tokens, or raise `seq_len`",
            packed.seq_len()
        ),
    })
}

/// A warning naming the bad records the corpus was prepared without, if any.
fn skipped_records(what: &str, corpus: &Corpus) -> Option<String> {
    let m = &corpus.manifest;
    if m.skipped_records == 0 {
        return None;
    }
    let shown = &m.skipped_examples[..m.skipped_examples.len().min(3)];
    let head = format!(
        "warning: {} bad record(s) of the {what} skipped (data.on_bad_record: skip)",
        thousands(m.skipped_records)
    );
    if shown.len() as u64 == m.skipped_records {
        return Some(format!("{head}: {}", shown.join("; ")));
    }
    Some(format!(
        "{head}; the first {}: {} (the first {} are listed in {})",
        shown.len(),
        shown.join("; "),
        m.skipped_examples.len(),
        corpus.dir.join(crate::cache::MANIFEST).display()
    ))
}

/// Warnings about records that train other than a user likely means: ones that train
/// nothing, and prompts whose last token runs into the completion.
fn record_warnings(what: &str, corpus: &Corpus) -> Vec<String> {
    let m = &corpus.manifest;
    let mut lines = Vec::new();
    if let Some(first) = m
        .first_untrained
        .as_ref()
        .filter(|_| m.untrained_documents > 0)
    {
        lines.push(format!(
            "warning: {} record(s) of the {what} have no token in the loss (the first: {first}): \
             such a record, a conversation without an assistant turn for one, trains nothing",
            thousands(m.untrained_documents)
        ));
    }
    if let Some((first, token)) = m
        .first_merged_boundary
        .as_ref()
        .filter(|_| m.merged_boundaries > 0)
    {
        lines.push(format!(
            "warning: in {} prompt/completion record(s) of the {what} the prompt's last \
             characters and the completion's first are one token (the first: {first}, \
             {token:?}), trained in the loss: the model learns the completion after a prompt \
             tokenized as it never is at inference, where the prompt ends on its own; end the \
             prompts where a token ends (move trailing whitespace or newlines to the \
             completion's start)",
            thousands(m.merged_boundaries)
        ));
    }
    if let Some(eos) = &m.untrained_eos {
        lines.push(untrained_eos_warning(what, eos, m.turn_end.as_ref()));
    }
    lines
}

/// Chat data that never trains the end-of-document token `eos`: what its assistant turns end
/// with in training instead (`turn_end`: the first such conversation, the special token),
/// and what to do so that generation stops.
fn untrained_eos_warning(
    what: &str,
    eos: &str,
    turn_end: Option<&(String, Option<String>)>,
) -> String {
    let head =
        format!("warning: no conversation of the {what} trains the end-of-document token {eos:?}");
    if let Some((first, None)) = turn_end {
        return format!(
            "{head}, nor any other special token: what trains of each assistant turn ends in \
             text (the first: {first}), so the model never learns to end a reply; if the chat \
             template marks replies with `{{% generation %}}`, put the token that ends a turn \
             inside the block, as transformers' templates do"
        );
    }
    // The special token the turns end with, when the cache says (older ones do not).
    let (ends_with, stops_at, set_eos) = match turn_end {
        Some((_, Some(end))) => (
            format!("{end:?}"),
            format!("{end:?} is"),
            format!("`tokenizer.eos_token: {end:?}`"),
        ),
        _ => (
            "another token".to_string(),
            "that token is".to_string(),
            "`tokenizer.eos_token` to it".to_string(),
        ),
    };
    format!(
        "{head}: the chat template ends assistant turns with {ends_with}, which the model \
         learns to end a reply with; generation stops there only if {stops_at} among the \
         model's eos_token_id (generation_config.json), or set {set_eos}, which trains it as \
         the end and exports it as eos"
    )
}

/// `1234567` as `1,234,567`.
pub fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}
