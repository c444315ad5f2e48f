//! Training data: where samples come from, checked against the model.

use super::{PlanError, Section};
use crate::spec::DataSpec;
use shardrun_protocol::config::{DataConfig, ModelConfig};

pub fn resolve_data(
    s: &Section,
    model: &ModelConfig,
    seq_len: u64,
) -> Result<DataConfig, PlanError> {
    match &s.spec().training.data {
        None | Some(DataSpec::Synthetic { .. }) => Ok(DataConfig::Synthetic { seq_len }),
        Some(DataSpec::TokenFile { path, .. }) => {
            if let Some(vocab_size) = model.vocab_size() {
                if vocab_size > 65536 {
                    return Err(s.err(
                        "training.model.vocab_size",
                        format!("vocab_size {vocab_size} does not fit the token file's u16 ids"),
                        "use vocab_size ≤ 65536 with `token_file` data",
                    ));
                }
            }
            Ok(DataConfig::TokenFile {
                path: s.spec_relative(path),
                seq_len,
            })
        }
    }
}
