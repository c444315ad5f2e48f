//! The model: architecture sizes checked, and the sequence length agreed with the data.

use super::{PlanError, Section};
use crate::spec::ModelSpec;
use shardrun_protocol::config::ModelConfig;

/// The model and the sequence length the data will use.
pub fn resolve_model(s: &Section) -> Result<(ModelConfig, u64), PlanError> {
    let t = &s.spec().training;
    let data_seq = t.data.as_ref().and_then(|d| d.seq_len);
    match t.model {
        ModelSpec::Mlp {
            input_dim,
            hidden_dim,
            output_dim,
        } => {
            if input_dim == 0 || hidden_dim == 0 || output_dim == 0 {
                return Err(s.err(
                    "training.model",
                    "a layer dimension is 0",
                    "use positive `input_dim`, `hidden_dim`, `output_dim`",
                ));
            }
            Ok((
                ModelConfig::Mlp {
                    input_dim,
                    hidden_dim,
                    output_dim,
                },
                1,
            ))
        }
        ModelSpec::Transformer {
            vocab_size,
            dim,
            n_layers,
            n_heads,
            max_seq_len,
        } => {
            if vocab_size == 0 || dim == 0 || n_layers == 0 || n_heads == 0 {
                return Err(s.err(
                    "training.model",
                    "a transformer dimension is 0",
                    "use positive `vocab_size`, `dim`, `n_layers`, `n_heads`",
                ));
            }
            if dim % n_heads != 0 {
                return Err(s.err(
                    "training.model.n_heads",
                    format!("dim {dim} is not divisible by {n_heads} heads"),
                    format!("use a number of heads that divides {dim}"),
                ));
            }
            let (max_seq_len, seq_len) = match (max_seq_len, data_seq) {
                (Some(m), Some(s)) => (m, s),
                (Some(m), None) => (m, m),
                (None, Some(s)) => (s, s),
                (None, None) => {
                    return Err(s.err(
                        "training.model.max_seq_len",
                        "the sequence length is not given",
                        "add `max_seq_len: 256` to the model (or `seq_len` to `training.data`)",
                    ));
                }
            };
            if seq_len == 0 || seq_len > max_seq_len {
                return Err(s.err(
                    "training.data.seq_len",
                    format!(
                        "seq_len {seq_len} is outside 1..={max_seq_len} (the model's max_seq_len)"
                    ),
                    format!("use seq_len ≤ {max_seq_len} or raise max_seq_len"),
                ));
            }
            Ok((
                ModelConfig::Transformer {
                    vocab_size,
                    dim,
                    n_layers,
                    n_heads,
                    max_seq_len,
                },
                seq_len,
            ))
        }
    }
}
