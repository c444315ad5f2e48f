//! The batch split: `total = per_device × world × accumulation`, never rounded.

use super::ranks::ranks_words;
use super::{Overrides, ResolveError, Section};
use std::fmt::Write as _;

/// The largest number of ranks or per-device batch a fix suggests: past any cluster, and
/// keeps the search for them short whatever the total.
const SUGGESTED_UP_TO: u64 = 1 << 24;

/// `total / (per_device × world)`, or an error that says what splits: the nearest totals
/// for a new run, the numbers of ranks for a run that continues (its total is fixed).
pub fn batch_split(
    s: &Section,
    total: u64,
    per_device: u64,
    world: u64,
    overrides: &Overrides,
) -> Result<u64, ResolveError> {
    if per_device == 0 {
        return Err(s.err(
            "training.batch_size_per_device",
            "`batch_size_per_device` is 0",
            "use at least 1 sample per device",
        ));
    }
    let Some(unit) = per_device.checked_mul(world) else {
        return Err(s.err(
            "training.batch_size_per_device",
            format!(
                "{per_device} samples per device on {world} ranks are more than 2^64 samples, \
                 far past the total batch of {total}"
            ),
            format!(
                "lower `batch_size_per_device` to at most {}",
                (total / world).max(1)
            ),
        ));
    };
    if total == 0 {
        return Err(s.err(
            "training.total_batch_size",
            "`total_batch_size` is 0; a step trains on at least 1 sample",
            format!("set `total_batch_size` to a multiple of {per_device} × {world} = {unit}, such as {unit}"),
        ));
    }
    if !total.is_multiple_of(unit) {
        let ranks_from = match overrides.world_size {
            Some(_) => "--nproc",
            None => "`resources`",
        };
        let fix = if overrides.continues_run {
            ranks_that_split(total, per_device, world, ranks_from)
        } else {
            let mut fix = totals_that_split(total, per_device, world);
            // Ranks asked for on the command line are the easiest thing to change.
            if overrides.world_size.is_some() && total.is_multiple_of(per_device) {
                let _ = write!(
                    fix,
                    "; or run it on {} ranks (--nproc)",
                    or_list(&divisors(total / per_device))
                );
            }
            fix
        };
        // A per-device batch given on the command line, or swept, is what changed: its
        // flag or swept value is named.
        let per_device_chosen = s.chosen("training.batch_size_per_device", overrides)
            && !s.chosen("training.total_batch_size", overrides);
        let field = if per_device_chosen {
            "training.batch_size_per_device"
        } else {
            "training.total_batch_size"
        };
        // A swept per-device batch that does not split the total is one to drop from the
        // sweep, unless the total becomes a multiple of every one swept.
        let fix = if per_device_chosen
            && overrides
                .swept
                .iter()
                .any(|p| p == "training.batch_size_per_device")
        {
            let splitting = if total.is_multiple_of(world) {
                format!(
                    " ({total} on {world} rank(s) splits into per-device batches of {})",
                    or_list(&divisors(total / world))
                )
            } else {
                String::new()
            };
            format!(
                "drop {per_device} from the sweep's `batch_size_per_device` values{splitting}, \
                 or make `total_batch_size` a common multiple of every swept per-device batch \
                 × {world} rank(s)"
            )
        } else {
            fix
        };
        return Err(s.err(
            field,
            format!("total batch {total} does not split into per-device batches of {per_device} on {} ({ranks_from}; {total} / {unit} is not a whole number of accumulation steps)", ranks_words(world)),
            fix,
        ));
    }
    Ok(total / unit)
}

/// A new run may change its total: the nearest that split, or the per-device batches that
/// split the total it has.
fn totals_that_split(total: u64, per_device: u64, world: u64) -> String {
    let unit = per_device * world;
    let below = (total / unit) * unit;
    let nearest = match below.checked_add(unit) {
        Some(above) if below > 0 => format!("{below} or {above}"),
        Some(above) => format!("{above}"),
        None => format!("{below}"),
    };
    let mut fix = format!(
        "set `total_batch_size` to a multiple of {per_device} × {world} = {unit}: nearest {nearest}"
    );
    if total.is_multiple_of(world) {
        let _ = write!(
            fix,
            "; or keep it and use a `batch_size_per_device` of {}",
            or_list(&divisors(total / world))
        );
    }
    fix
}

/// A run that continues keeps its total batch (a step would compute something else): the
/// numbers of ranks it splits on, with this per-device batch and with a smaller one.
fn ranks_that_split(total: u64, per_device: u64, world: u64, ranks_from: &str) -> String {
    let with_this = if total.is_multiple_of(per_device) {
        divisors(total / per_device)
    } else {
        Vec::new()
    };
    let with_smaller: Vec<u64> = divisors(total)
        .into_iter()
        .filter(|w| !with_this.contains(w) && *w != world)
        .collect();
    let mut fix =
        "a resumed run keeps its total batch (it decides what a step computes): ".to_string();
    if with_this.is_empty() {
        let _ = write!(
            fix,
            "run it on {} ranks ({ranks_from}) with a `batch_size_per_device` that divides \
             {total} / ranks",
            or_list(&divisors(total))
        );
    } else {
        let _ = write!(
            fix,
            "run it on {} ranks ({ranks_from}): those split the total batch of {total} into \
             whole per-device batches of {per_device}",
            or_list(&with_this)
        );
        if !with_smaller.is_empty() {
            let _ = write!(
                fix,
                " ({} ranks do with a smaller `batch_size_per_device`)",
                or_list(&with_smaller)
            );
        }
    }
    if total.is_multiple_of(world) {
        match divisors(total / world).as_slice() {
            [one] => {
                let _ = write!(
                    fix,
                    "; or keep {world} ranks with `batch_size_per_device: {one}`"
                );
            }
            many => {
                let _ = write!(
                    fix,
                    "; or keep {world} ranks with a `batch_size_per_device` of {}",
                    or_list(many)
                );
            }
        }
    }
    fix.push_str("; or start it over with --force");
    fix
}

/// Every divisor of `n` (at least 1) up to [`SUGGESTED_UP_TO`], in order: the numbers of
/// ranks or per-device batches a fix can suggest.
fn divisors(n: u64) -> Vec<u64> {
    let (mut low, mut high) = (Vec::new(), Vec::new());
    let mut d = 1;
    while d <= SUGGESTED_UP_TO && d * d <= n {
        if n.is_multiple_of(d) {
            low.push(d);
            if d != n / d && n / d <= SUGGESTED_UP_TO {
                high.push(n / d);
            }
        }
        d += 1;
    }
    low.extend(high.into_iter().rev());
    low
}

/// `1, 2, 4 or 8`.
fn or_list(items: &[u64]) -> String {
    crate::output::listed(items, "or")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranks_a_kept_total_splits_on() {
        assert_eq!(divisors(12), [1, 2, 3, 4, 6, 12]);
        assert_eq!(divisors(16), [1, 2, 4, 8, 16]);
        assert_eq!(or_list(&[1, 2, 4]), "1, 2 or 4");
        assert_eq!(
            ranks_that_split(8, 1, 3, "--nproc"),
            "a resumed run keeps its total batch (it decides what a step computes): run it on \
             1, 2, 4 or 8 ranks (--nproc): those split the total batch of 8 into whole \
             per-device batches of 1; or start it over with --force"
        );
        assert_eq!(
            ranks_that_split(12, 2, 4, "`resources`"),
            "a resumed run keeps its total batch (it decides what a step computes): run it on \
             1, 2, 3 or 6 ranks (`resources`): those split the total batch of 12 into whole \
             per-device batches of 2 (12 ranks do with a smaller `batch_size_per_device`); or \
             keep 4 ranks with a `batch_size_per_device` of 1 or 3; or start it over with --force"
        );
    }
}
