//! The batch split: `total = per_device × world × accumulation`, never rounded.

use super::{ResolveError, Section};
use std::fmt::Write as _;

/// `total / (per_device × world)`, or an error that lists the nearest totals that divide.
pub fn batch_split(
    s: &Section,
    total: u64,
    per_device: u64,
    world: u64,
) -> Result<u64, ResolveError> {
    if per_device == 0 {
        return Err(s.err(
            "training.batch_size_per_device",
            "`batch_size_per_device` is 0",
            "use at least 1 sample per device",
        ));
    }
    let unit = per_device * world;
    if total == 0 || !total.is_multiple_of(unit) {
        let below = (total / unit) * unit;
        let above = below + unit;
        let nearest = if below > 0 {
            format!("{below} or {above}")
        } else {
            format!("{above}")
        };
        let mut fix = format!("set `total_batch_size` to a multiple of {per_device} × {world} = {unit}: nearest {nearest}");
        if total > 0 && total.is_multiple_of(world) {
            let per_rank = total / world;
            let divisors: Vec<String> = (1..=per_rank)
                .filter(|d| per_rank.is_multiple_of(*d))
                .map(|d| d.to_string())
                .collect();
            let _ = write!(
                fix,
                "; or keep it and use `batch_size_per_device` in [{}]",
                divisors.join(", ")
            );
        }
        return Err(s.err(
            "training.total_batch_size",
            format!("total batch {total} does not split into per-device batches of {per_device} on {world} ranks ({total} / {unit} is not a whole number of accumulation steps)"),
            fix,
        ));
    }
    Ok(total / unit)
}
