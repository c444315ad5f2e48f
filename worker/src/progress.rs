//! Work this rank has done, counted for the controller's progress watch.
//!
//! A heartbeat carries the optimizer step and two counts. The step alone would make a rank
//! look stuck during anything long that is not a step: a validation pass over a large set, a
//! checkpoint of a big model written unit by unit, a restore. Each micro-batch, evaluation
//! batch and checkpoint unit saved or restored moves the work count; a rank blocked in a
//! collective or in I/O moves neither.
//!
//! The second count is of collective calls entered. Every rank enters the same collectives
//! in the same order, so when the job stands still the count tells the rank the others wait
//! for (it entered fewer) from the ranks waiting (what PyTorch's flight recorder compares
//! sequence numbers for).

use std::sync::atomic::{AtomicU64, Ordering};

static WORK: AtomicU64 = AtomicU64::new(0);
static COLLECTIVES: AtomicU64 = AtomicU64::new(0);

/// One more piece of work done (a micro-batch, an evaluation batch, a checkpoint unit).
pub fn advance() {
    WORK.fetch_add(1, Ordering::Relaxed);
}

/// Pieces of work done so far by this process.
pub fn work() -> u64 {
    WORK.load(Ordering::Relaxed)
}

/// This process is entering one more collective call.
pub fn entered_collective() {
    COLLECTIVES.fetch_add(1, Ordering::Relaxed);
}

/// Collective calls entered so far by this process.
pub fn collectives() -> u64 {
    COLLECTIVES.load(Ordering::Relaxed)
}
