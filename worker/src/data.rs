//! Training data as tensors, a pure function of (seed, global sample index): every world
//! size and strategy sees the same global batches, and the data position of a run is the
//! number of global samples it has consumed.
//!
//! Rank `r` reads samples `r·b .. (r+1)·b` of each global micro-batch (`b` = batch size per
//! device); micro-batch `m` of the optimizer step starting at global sample `s` starts at
//! `s + m·b·W` ([`shardrun_data::sampler::first_sample`]).
//!
//! Real documents come from `shardrun-data` (tokenized once, packed, shuffled per epoch);
//! synthetic tokens and vectors are generated here.

use shardrun_data::{HostBatch, Observer};
use shardrun_protocol::config::{DataConfig, ModelConfig, TrainConfig};
use tch::{Kind, Tensor};

pub use shardrun_data::sampler::first_sample;
pub use shardrun_data::splitmix64;

#[derive(Debug, thiserror::Error)]
pub enum TrainingDataError {
    #[error(transparent)]
    Documents(#[from] shardrun_data::DataError),
    #[error("documents feed a token model (kind: transformer), not the MLP: use `data: {{kind: synthetic}}` for the MLP")]
    DocumentsForMlp,
}

/// One batch, in the `transformers` conventions the models follow: `inputs` and `targets`
/// are `[batch, seq]` ids with -100 in `targets` where there is no loss (the head averages
/// over the other targets); with the document mask, `position_ids` restart at every document
/// and `document_ids` say which document of its row each token belongs to (for a
/// block-diagonal attention mask). The MLP's batches are float features instead.
pub struct Batch {
    pub inputs: Tensor,
    pub targets: Tensor,
    pub position_ids: Option<Tensor>,
    pub document_ids: Option<Tensor>,
    /// The same documents as `document_ids`, as bounds (made with them from host data).
    pub document_bounds: Option<DocumentBounds>,
    /// Targets that carry loss (not -100); all of them for synthetic data.
    pub loss_tokens: u64,
    /// The dense attention mask the model makes from `document_ids` when it needs one, once
    /// for all its layers (forwards and recomputations alike).
    pub attention_mask: std::sync::OnceLock<Tensor>,
}

/// Where the documents of a packed batch begin, its rows laid end to end, and the longest
/// one: flash attention's variable-length kernel keeps attention within documents by these
/// (`cu_seqlens`, `max_seqlen`) instead of a dense (seq × seq) mask.
pub struct DocumentBounds {
    /// int32: the offset of every document's first token, then the batch's token count.
    pub offsets: Tensor,
    /// Tokens of the longest document.
    pub longest: i64,
}

impl DocumentBounds {
    /// From the document id of every token, `seq_len` tokens a row: a document is a run of
    /// equal ids within one row (the padding ending a row is one too). The same documents as
    /// the block-diagonal mask of `document_ids` sees where, as packing writes them, each
    /// document is contiguous and its neighbours in the row have other ids (the mask would
    /// join two runs of one id in a row; these bounds keep them apart).
    pub fn from_ids(ids: &[i64], seq_len: usize) -> DocumentBounds {
        let mut offsets = vec![0i32];
        let mut longest = 0;
        let mut start = 0;
        for i in 1..=ids.len() {
            let ends = i == ids.len() || i % seq_len.max(1) == 0 || ids[i] != ids[i - 1];
            if ends {
                offsets.push(i32::try_from(i).expect("a batch of fewer than 2^31 tokens"));
                longest = longest.max(i - start);
                start = i;
            }
        }
        DocumentBounds {
            offsets: Tensor::from_slice(&offsets),
            longest: longest as i64,
        }
    }

    pub(crate) fn map(&self, f: impl Fn(&Tensor) -> Tensor) -> DocumentBounds {
        DocumentBounds {
            offsets: f(&self.offsets),
            longest: self.longest,
        }
    }
}

enum Source {
    /// Arithmetic token sequences `t[j+1] = (t[j] + stride) mod vocab` with a random start and
    /// stride per sample: random-looking, yet learnable, so a falling loss means training works.
    SyntheticTokens {
        vocab: u64,
    },
    /// The FSDP tutorial MLP's data: inputs and targets uniform in [-1, 1).
    SyntheticVectors {
        input_dim: u64,
        output_dim: u64,
    },
    Documents(Box<shardrun_data::Dataset>),
}

pub struct TrainingData {
    source: Source,
    seed: u64,
    seq_len: u64,
}

impl TrainingData {
    /// The config's data, quietly (tests, the reference trainer).
    pub fn new(config: &TrainConfig) -> Result<TrainingData, TrainingDataError> {
        TrainingData::open(config, &shardrun_data::Quiet)
    }

    /// The config's data. Documents are prepared first if no one has (normally the job's
    /// controller has: then this only maps the cache).
    pub fn open(
        config: &TrainConfig,
        observer: &dyn Observer,
    ) -> Result<TrainingData, TrainingDataError> {
        let seq_len = config.data.sequence_length(&config.model);
        let source = match (&config.data, &config.model) {
            (
                DataConfig::Synthetic { .. },
                ModelConfig::Transformer { .. } | ModelConfig::Llama(_),
            ) => Source::SyntheticTokens {
                vocab: config.model.vocab_size().unwrap_or(1),
            },
            (
                DataConfig::Synthetic { .. },
                ModelConfig::Mlp {
                    input_dim,
                    output_dim,
                    ..
                },
            ) => Source::SyntheticVectors {
                input_dim: *input_dim,
                output_dim: *output_dim,
            },
            (DataConfig::Dataset(d), ModelConfig::Transformer { .. } | ModelConfig::Llama(_)) => {
                Source::Documents(Box::new(shardrun_data::Dataset::open(
                    d,
                    config.seed,
                    config.model.vocab_size(),
                    shardrun_data::default_threads(),
                    observer,
                )?))
            }
            (DataConfig::Dataset(_), ModelConfig::Mlp { .. }) => {
                return Err(TrainingDataError::DocumentsForMlp)
            }
        };
        Ok(TrainingData {
            source,
            seed: config.seed,
            seq_len,
        })
    }

    /// The documents behind this dataset, when it has some.
    pub fn documents(&self) -> Option<&shardrun_data::Dataset> {
        match &self.source {
            Source::Documents(d) => Some(d),
            _ => None,
        }
    }

    /// Samples `first .. first + count` of the job, stacked into one batch.
    pub fn samples(&self, first: u64, count: u64) -> Result<Batch, TrainingDataError> {
        let n = count as i64;
        match &self.source {
            Source::SyntheticTokens { vocab } => {
                let mut tokens = Vec::with_capacity((count * (self.seq_len + 1)) as usize);
                for i in first..first + count {
                    let h = splitmix64(self.seed ^ splitmix64(i));
                    let start = h % vocab;
                    let stride = 1 + splitmix64(h) % 7;
                    tokens
                        .extend((0..=self.seq_len).map(|j| ((start + j * stride) % vocab) as i64));
                }
                let seq = self.seq_len as i64;
                let all = Tensor::from_slice(&tokens).view([n, seq + 1]);
                Ok(Batch {
                    inputs: all.narrow(1, 0, seq).contiguous(),
                    targets: all.narrow(1, 1, seq).contiguous(),
                    position_ids: None,
                    document_ids: None,
                    document_bounds: None,
                    loss_tokens: count * self.seq_len,
                    attention_mask: Default::default(),
                })
            }
            Source::Documents(d) => Ok(Batch::from_host(&d.training_batch(first, count))),
            Source::SyntheticVectors {
                input_dim,
                output_dim,
            } => {
                let uniform = |state: &mut u64| {
                    *state = splitmix64(*state);
                    ((*state >> 40) as f32) / (1u64 << 24) as f32 * 2.0 - 1.0
                };
                let mut inputs = Vec::with_capacity((count * input_dim) as usize);
                let mut targets = Vec::with_capacity((count * output_dim) as usize);
                for i in first..first + count {
                    let mut state = splitmix64(self.seed ^ splitmix64(i));
                    inputs.extend((0..*input_dim).map(|_| uniform(&mut state)));
                    targets.extend((0..*output_dim).map(|_| uniform(&mut state)));
                }
                Ok(Batch {
                    inputs: Tensor::from_slice(&inputs).view([n, *input_dim as i64]),
                    targets: Tensor::from_slice(&targets).view([n, *output_dim as i64]),
                    position_ids: None,
                    document_ids: None,
                    document_bounds: None,
                    loss_tokens: count,
                    attention_mask: Default::default(),
                })
            }
        }
    }
}

impl Batch {
    /// A batch without document structure: token ids and their targets (-100 where there
    /// is no loss), or the MLP's feature rows.
    pub fn new(inputs: Tensor, targets: Tensor) -> Batch {
        let loss_tokens = if targets.is_floating_point() {
            targets.size().first().copied().unwrap_or(0) as u64
        } else {
            targets.ne(-100).sum(Kind::Int64).int64_value(&[]) as u64
        };
        Batch {
            inputs,
            targets,
            position_ids: None,
            document_ids: None,
            document_bounds: None,
            loss_tokens,
            attention_mask: Default::default(),
        }
    }

    /// Tensors of a host batch (one copy each).
    pub fn from_host(host: &HostBatch) -> Batch {
        let shape = [host.rows as i64, host.seq_len as i64];
        let tensor = |values: &[i64]| Tensor::from_slice(values).view(shape);
        Batch {
            inputs: tensor(&host.inputs),
            targets: tensor(&host.targets),
            position_ids: host.position_ids.as_deref().map(tensor),
            document_ids: host.document_ids.as_deref().map(tensor),
            document_bounds: host
                .document_ids
                .as_deref()
                .map(|ids| DocumentBounds::from_ids(ids, host.seq_len)),
            loss_tokens: host.loss_tokens,
            attention_mask: Default::default(),
        }
    }

    /// The batch on the training device: on a GPU copied from page-locked memory without
    /// blocking the host (each copy is queued before the kernels that read it); a blocking
    /// copy where memory cannot be page-locked.
    pub fn upload(self, device: tch::Device) -> Batch {
        if !device.is_cuda() {
            return self;
        }
        self.map_tensors(|t| match crate::shim::pin_memory(t) {
            Ok(pinned) => pinned.to_device_(device, t.kind(), true, false),
            Err(e) => {
                static SAID: std::sync::Once = std::sync::Once::new();
                SAID.call_once(|| {
                    eprintln!(
                        "warning: batches cannot be page-locked ({e}); each is copied to the \
                         GPU with the host waiting"
                    )
                });
                t.to_device(device)
            }
        })
    }

    /// The batch with `f` applied to each of its tensors.
    fn map_tensors(&self, f: impl Fn(&Tensor) -> Tensor) -> Batch {
        Batch {
            inputs: f(&self.inputs),
            targets: f(&self.targets),
            position_ids: self.position_ids.as_ref().map(&f),
            document_ids: self.document_ids.as_ref().map(&f),
            document_bounds: self.document_bounds.as_ref().map(|b| b.map(&f)),
            loss_tokens: self.loss_tokens,
            attention_mask: Default::default(),
        }
    }

    /// Inputs cast for a model whose floating inputs run in `kind` (token ids stay integers).
    pub fn inputs_as(&self, kind: Kind) -> Tensor {
        if self.inputs.is_floating_point() {
            self.inputs.to_kind(kind)
        } else {
            self.inputs.shallow_clone()
        }
    }

    /// A digest of row `row` (inputs, targets, positions, document ids): equal digests, equal
    /// samples (the batch log compares runs with it).
    pub fn row_digest(&self, row: i64) -> u64 {
        let mut bytes = Vec::new();
        let tensors = [
            Some(&self.inputs),
            Some(&self.targets),
            self.position_ids.as_ref(),
            self.document_ids.as_ref(),
        ];
        for t in tensors.into_iter().flatten() {
            let r = t.get(row).to_device(tch::Device::Cpu).contiguous();
            let values: Vec<f64> =
                Vec::<f64>::try_from(r.to_kind(Kind::Double).flatten(0, -1)).unwrap_or_default();
            for v in values {
                bytes.extend_from_slice(&v.to_le_bytes());
            }
        }
        shardrun_data::digest(&bytes)
    }
}

/// Names a file prefix: every rank appends one line per sample it trains on to
/// `<prefix>.rank<r>` (`step micro sample digest`), to compare what two runs fed the model.
pub const BATCH_LOG: &str = "SHARDRUN_BATCH_LOG";

/// The per-rank batch log ([`BATCH_LOG`]).
pub struct BatchLog {
    file: std::sync::Mutex<std::fs::File>,
}

impl BatchLog {
    /// `None` unless [`BATCH_LOG`] is set.
    pub fn from_env(rank: u64) -> Result<Option<BatchLog>, String> {
        let Some(prefix) = std::env::var_os(BATCH_LOG) else {
            return Ok(None);
        };
        let mut path = prefix;
        path.push(format!(".rank{rank}"));
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(|e| format!("{BATCH_LOG}: cannot open {}: {e}", path.to_string_lossy()))?;
        Ok(Some(BatchLog {
            file: std::sync::Mutex::new(file),
        }))
    }

    /// One line per row of `batch`, whose first row is global sample `first`.
    pub fn record(&self, step: u64, micro: u64, first: u64, batch: &Batch) {
        use std::io::Write;
        let rows = batch.inputs.size().first().copied().unwrap_or(0);
        let mut text = String::new();
        for r in 0..rows {
            text.push_str(&format!(
                "{step} {micro} {} {:016x}\n",
                first + r as u64,
                batch.row_digest(r)
            ));
        }
        let mut file = self.file.lock().unwrap_or_else(|e| e.into_inner());
        let _ = file.write_all(text.as_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn document_bounds_are_the_runs_of_ids_in_each_row() {
        // Two rows of 16, ids from 0 in each as packing writes them: one document filling
        // the first row; documents of 9 and 4 tokens and 3 of padding in the second.
        let mut ids = vec![0i64; 16];
        ids.extend([0; 9].iter().chain(&[1; 4]).chain(&[2; 3]));
        let bounds = DocumentBounds::from_ids(&ids, 16);
        assert_eq!(
            Vec::<i32>::try_from(&bounds.offsets).unwrap(),
            [0, 16, 25, 29, 32]
        );
        assert_eq!(bounds.longest, 16);
        let bounds = DocumentBounds::from_ids(&[0, 0, 0, 0, 0, 0], 3);
        assert_eq!(Vec::<i32>::try_from(&bounds.offsets).unwrap(), [0, 3, 6]);
        assert_eq!(bounds.longest, 3);
        let none = DocumentBounds::from_ids(&[], 4);
        assert_eq!(Vec::<i32>::try_from(&none.offsets).unwrap(), [0]);
    }

    #[test]
    fn sample_slices_cover_the_global_micro_batch() {
        let firsts: Vec<u64> = (0..3).map(|r| first_sample(100, 5, 4, 3, r)).collect();
        assert_eq!(firsts, vec![160, 164, 168]);
    }
}
