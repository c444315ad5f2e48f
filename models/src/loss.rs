//! How many tokens of a language model's loss are computed at once. The worker computes the
//! output layer's logits, their cross-entropy and its gradient one chunk of tokens at a time
//! (`worker/src/model/loss.rs`), so what the loss holds grows with the chunk, not with the
//! batch; the memory plan counts one chunk of it. Both read the chunk's size from here.

/// The fp32 logits of one chunk: as many tokens as fill this (4,096 tokens of a 65,536-token
/// vocabulary, 2,092 of Llama 3's 128,256). Large enough that the output layer's matrix
/// products stay large; small enough that Llama 3's logits of a long batch stay a fraction
/// of a GPU.
pub const CHUNK_LOGIT_BYTES: u64 = 1 << 30;

/// Tokens a chunk of the loss holds: `configured` (`training.fsdp.loss_chunk_tokens`) when
/// set, else as many as [`CHUNK_LOGIT_BYTES`] of fp32 logits over `vocab_size` tokens.
pub fn chunk_tokens(configured: Option<u64>, vocab_size: u64) -> u64 {
    configured
        .unwrap_or(CHUNK_LOGIT_BYTES / (4 * vocab_size.max(1)))
        .max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chunk_fills_a_gib_of_fp32_logits_unless_configured() {
        assert_eq!(chunk_tokens(None, 128_256), 2_092);
        assert_eq!(chunk_tokens(None, 32_000), 8_388);
        assert_eq!(chunk_tokens(Some(512), 128_256), 512);
        // A vocabulary wider than the budget still computes a token at a time.
        assert_eq!(chunk_tokens(None, 1 << 29), 1);
    }
}
