//! Training data, a pure function of (seed, global sample index): every world size and
//! strategy sees the same global batches, and the data position of a run is just its step.
//!
//! Sample `i` of the job: rank `r` reads samples `r·b .. (r+1)·b` of each global micro-batch
//! (`b` = batch size per device), micro-batch `m` of optimizer step `s` being global
//! micro-batch `s·accum + m`.

use shardrun_protocol::config::{DataConfig, ModelConfig, TrainConfig};
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use tch::{Kind, Tensor};

#[derive(Debug, thiserror::Error)]
pub enum DataError {
    #[error("cannot read token file {path}: {source}. Check `data.path` in the job spec")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("token file {path} holds {tokens} tokens; a sample needs {needed} (seq_len + 1)")]
    TooShort {
        path: PathBuf,
        tokens: u64,
        needed: u64,
    },
    #[error("token file {path} has token id {token} at position {position}, but the model's vocab_size is {vocab}")]
    TokenOutOfRange {
        path: PathBuf,
        token: u16,
        position: u64,
        vocab: u64,
    },
    #[error("a token file feeds a transformer, not the MLP")]
    TokenFileForMlp,
}

/// The splitmix64 mixer: a tiny, well-distributed, portable hash (the Python benchmark
/// reference reimplements it to see the same data).
pub fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// One batch: model inputs and loss targets (token ids: `-100` = no loss, as `transformers`'
/// labels), and for packed sequences each token's position and document (i64, like the
/// inputs): attention stays within a document and RoPE counts positions from its start.
pub struct Batch {
    pub inputs: Tensor,
    pub targets: Tensor,
    pub position_ids: Option<Tensor>,
    pub document_ids: Option<Tensor>,
}

enum Source {
    /// Arithmetic token sequences `t[j+1] = (t[j] + stride) mod vocab` with a random start and
    /// stride per sample: random-looking, yet learnable, so a falling loss means training works.
    SyntheticTokens { vocab: u64 },
    TokenFile {
        path: PathBuf,
        file: std::fs::File,
        tokens: u64,
        vocab: u64,
    },
    /// The FSDP tutorial MLP's data: inputs and targets uniform in [-1, 1).
    SyntheticVectors { input_dim: u64, output_dim: u64 },
}

pub struct Dataset {
    source: Source,
    seed: u64,
    seq_len: u64,
}

impl Dataset {
    pub fn new(config: &TrainConfig) -> Result<Dataset, DataError> {
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
            (
                DataConfig::TokenFile { path, .. },
                ModelConfig::Transformer { .. } | ModelConfig::Llama(_),
            ) => {
                let vocab_size = config.model.vocab_size().unwrap_or(1);
                let io = |source| DataError::Io {
                    path: path.clone(),
                    source,
                };
                let file = std::fs::File::open(path).map_err(io)?;
                let tokens = file.metadata().map_err(io)?.len() / 2;
                if tokens < seq_len + 1 {
                    return Err(DataError::TooShort {
                        path: path.clone(),
                        tokens,
                        needed: seq_len + 1,
                    });
                }
                Source::TokenFile {
                    path: path.clone(),
                    file,
                    tokens,
                    vocab: vocab_size,
                }
            }
            (DataConfig::TokenFile { .. }, ModelConfig::Mlp { .. }) => {
                return Err(DataError::TokenFileForMlp)
            }
        };
        Ok(Dataset {
            source,
            seed: config.seed,
            seq_len,
        })
    }

    /// Samples `first .. first + count` of the job, stacked into one batch.
    pub fn samples(&self, first: u64, count: u64) -> Result<Batch, DataError> {
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
                Ok(self.token_batch(tokens, n))
            }
            Source::TokenFile {
                path,
                file,
                tokens: total,
                vocab,
            } => {
                let window = (self.seq_len + 1) as usize;
                let mut tokens = Vec::with_capacity(count as usize * window);
                let mut bytes = vec![0u8; window * 2];
                for i in first..first + count {
                    let start = (i * self.seq_len) % total;
                    // A window that runs past the end wraps to the start of the file.
                    let head = (window as u64).min(total - start) as usize;
                    let read = |buf: &mut [u8], at: u64| {
                        file.read_exact_at(buf, at * 2)
                            .map_err(|source| DataError::Io {
                                path: path.clone(),
                                source,
                            })
                    };
                    read(&mut bytes[..head * 2], start)?;
                    read(&mut bytes[head * 2..], 0)?;
                    for (j, pair) in bytes.chunks_exact(2).enumerate() {
                        let token = u16::from_le_bytes([pair[0], pair[1]]);
                        if u64::from(token) >= *vocab {
                            return Err(DataError::TokenOutOfRange {
                                path: path.clone(),
                                token,
                                position: (start + j as u64) % total,
                                vocab: *vocab,
                            });
                        }
                        tokens.push(i64::from(token));
                    }
                }
                Ok(self.token_batch(tokens, n))
            }
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
                })
            }
        }
    }

    fn token_batch(&self, tokens: Vec<i64>, n: i64) -> Batch {
        let seq = self.seq_len as i64;
        let all = Tensor::from_slice(&tokens).view([n, seq + 1]);
        Batch {
            inputs: all.narrow(1, 0, seq).contiguous(),
            targets: all.narrow(1, 1, seq).contiguous(),
            position_ids: None,
            document_ids: None,
        }
    }
}

/// First global sample index `rank` reads for global micro-batch `micro`.
pub fn first_sample(micro: u64, batch_per_device: u64, world_size: u64, rank: u64) -> u64 {
    micro * batch_per_device * world_size + rank * batch_per_device
}

impl Batch {
    pub fn to_device(&self, device: tch::Device) -> Batch {
        Batch {
            inputs: self.inputs.to_device(device),
            targets: self.targets.to_device(device),
            position_ids: self.position_ids.as_ref().map(|t| t.to_device(device)),
            document_ids: self.document_ids.as_ref().map(|t| t.to_device(device)),
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
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splitmix_matches_reference_values() {
        // First output of splitmix64 seeded with 0 (Vigna's reference implementation).
        assert_eq!(splitmix64(0), 0xe220_a839_7b1d_cdaf);
    }

    #[test]
    fn sample_slices_cover_the_global_micro_batch() {
        let firsts: Vec<u64> = (0..3).map(|r| first_sample(5, 4, 3, r)).collect();
        assert_eq!(firsts, vec![60, 64, 68]);
    }
}
