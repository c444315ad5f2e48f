//! Which sequence is global sample `i` of a run: epoch `i / n`, and within it position
//! `i % n` of that epoch's seeded permutation of the `n` sequences.
//!
//! The order is a function of (seed, epoch, n) only. Rank `r` of `W` reads samples
//! `base + m·b·W + r·b ..` of micro-batch `m`, so ranks never share a sample, HYBRID_SHARD
//! replicas included, and a run resumed at global sample `base` (on any world size) reads
//! what an uninterrupted run would have read.

use crate::error::{DataError, Result};
use crate::rng::{permutation, splitmix64};
use std::sync::{Arc, Mutex};

/// First global sample rank `rank` reads in micro-batch `micro` of the optimizer step that
/// starts at global sample `step_start` (`per_device` samples per rank per micro-batch).
pub fn first_sample(step_start: u64, micro: u64, per_device: u64, world: u64, rank: u64) -> u64 {
    step_start + micro * per_device * world + rank * per_device
}

pub struct EpochOrder {
    sequences: u64,
    seed: u64,
    shuffle: bool,
    /// The permutations of the epochs read last (a batch may span two epochs).
    recent: Mutex<Vec<(u64, Arc<Vec<u32>>)>>,
}

impl EpochOrder {
    pub fn new(sequences: u64, seed: u64, shuffle: bool) -> Result<EpochOrder> {
        if sequences == 0 {
            return Err(DataError::NotEnoughData {
                why: "the training data makes no sequence".into(),
                fix: "add data".into(),
            });
        }
        if sequences > u64::from(u32::MAX) {
            return Err(DataError::Config(format!(
                "{sequences} sequences per epoch: more than this version shuffles (2^32 - 1); raise seq_len"
            )));
        }
        Ok(EpochOrder {
            sequences,
            seed,
            shuffle,
            recent: Mutex::new(Vec::new()),
        })
    }

    pub fn sequences_per_epoch(&self) -> u64 {
        self.sequences
    }

    /// (epoch, sequence) of global sample `sample`.
    pub fn locate(&self, sample: u64) -> (u64, u64) {
        let epoch = sample / self.sequences;
        let position = sample % self.sequences;
        if !self.shuffle {
            return (epoch, position);
        }
        let order = self.order(epoch);
        (epoch, u64::from(order[position as usize]))
    }

    /// The permutation of `epoch`.
    pub fn order(&self, epoch: u64) -> Arc<Vec<u32>> {
        let mut recent = self.recent.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, order)) = recent.iter().find(|(e, _)| *e == epoch) {
            return order.clone();
        }
        let seed = splitmix64(self.seed ^ splitmix64(epoch ^ 0x0e90_c4de_5eed_0000));
        let order = Arc::new(permutation(self.sequences as u32, seed));
        recent.push((epoch, order.clone()));
        if recent.len() > 2 {
            recent.remove(0);
        }
        order
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn epochs_are_permutations_that_differ() {
        let order = EpochOrder::new(50, 3, true).unwrap();
        let epoch = |e: u64| -> Vec<u64> { (0..50).map(|i| order.locate(e * 50 + i).1).collect() };
        let (a, b) = (epoch(0), epoch(1));
        let mut sorted = a.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..50).collect::<Vec<_>>());
        assert_ne!(a, b);
        assert_eq!(order.locate(120), (2, epoch(2)[20]));
        let plain = EpochOrder::new(50, 3, false).unwrap();
        assert_eq!(plain.locate(57), (1, 7));
    }
}
