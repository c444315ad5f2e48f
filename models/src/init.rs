//! From-scratch parameter values as a counter-based generator: element `i` of parameter `name`
//! is a pure function of (seed, name, i). A rank fills exactly the elements of its own shards,
//! without producing the ones before them, and every world size, strategy, wrap policy and
//! thread count gets bit-identical weights.
//!
//! Uniform numbers are splitmix64 of `key + counter · γ` (SplitMix's own output function,
//! used as a keyed hash of the counter); normals are Box-Muller on two such numbers, whose
//! cosine and sine give elements `2j` and `2j + 1` (counters `2j`, `2j + 1`).

use crate::param::{Init, ParamSpec};
use std::ops::Range;

const GAMMA: u64 = 0x9e37_79b9_7f4a_7c15;
/// Ranges at least this long are filled by several threads.
const PARALLEL_ELEMENTS: usize = 1 << 20;

/// The splitmix64 finaliser of `x + γ`: a small, well-distributed, portable hash.
pub fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(GAMMA);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The generator key of one parameter: FNV-1a of its name mixed with the seed.
pub fn param_key(seed: u64, name: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in name.bytes() {
        h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    splitmix64(seed ^ h)
}

/// Uniform in [0, 1) with 53 random bits, for counter `counter` of stream `key`.
fn unit(key: u64, counter: u64) -> f64 {
    (splitmix64(key.wrapping_add(counter.wrapping_mul(GAMMA))) >> 11) as f64 / (1u64 << 53) as f64
}

/// Writes elements `range` of the flattened initial value of `spec` into `out`
/// (`out.len() == range.len()`).
pub fn fill(spec: &ParamSpec, seed: u64, range: Range<u64>, out: &mut [f32]) {
    assert_eq!(
        out.len() as u64,
        range.end - range.start,
        "output length matches the range"
    );
    let key = param_key(seed, &spec.name);
    let row_len = spec.shape.iter().skip(1).product::<i64>().max(1) as u64;
    let init = spec.init;
    let fill_chunk = |first: u64, chunk: &mut [f32]| match init {
        Init::Normal { std, zero_row } => {
            fill_normal(key, std, first, chunk);
            if let Some(row) = zero_row {
                zero_row_in(row, row_len, first, chunk);
            }
        }
        _ => {
            for (i, v) in (first..).zip(chunk.iter_mut()) {
                *v = value(init, key, i);
            }
        }
    };
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get().min(8));
    if out.len() < PARALLEL_ELEMENTS || threads == 1 {
        fill_chunk(range.start, out);
        return;
    }
    let chunk_len = out.len().div_ceil(threads);
    std::thread::scope(|scope| {
        for (c, chunk) in out.chunks_mut(chunk_len).enumerate() {
            let first = range.start + (c * chunk_len) as u64;
            scope.spawn(move || fill_chunk(first, chunk));
        }
    });
}

fn value(init: Init, key: u64, i: u64) -> f32 {
    match init {
        Init::Uniform(bound) => ((2.0 * unit(key, 2 * i) - 1.0) * bound) as f32,
        Init::Normal { std, .. } => {
            let (c, s) = normal_pair(key, i / 2);
            (if i.is_multiple_of(2) { c } else { s } * std) as f32
        }
        Init::Ones => 1.0,
        Init::Zeros => 0.0,
    }
}

/// Box-Muller on counters `2j` and `2j + 1`: two independent standard normals.
fn normal_pair(key: u64, j: u64) -> (f64, f64) {
    let u1 = 1.0 - unit(key, 2 * j); // (0, 1]: the logarithm stays finite
    let u2 = unit(key, 2 * j + 1);
    let r = (-2.0 * u1.ln()).sqrt();
    let (s, c) = (std::f64::consts::TAU * u2).sin_cos();
    (r * c, r * s)
}

/// Elements `first..` of a normal parameter into `out`, a pair of elements per Box-Muller.
fn fill_normal(key: u64, std: f64, first: u64, out: &mut [f32]) {
    let mut i = first;
    let skip = usize::from(i % 2 == 1).min(out.len());
    let (head, rest) = out.split_at_mut(skip);
    if let [v] = head {
        *v = (normal_pair(key, i / 2).1 * std) as f32;
        i += 1;
    }
    let mut pairs = rest.chunks_exact_mut(2);
    for pair in &mut pairs {
        let (c, s) = normal_pair(key, i / 2);
        pair[0] = (c * std) as f32;
        pair[1] = (s * std) as f32;
        i += 2;
    }
    if let [v] = pairs.into_remainder() {
        *v = (normal_pair(key, i / 2).0 * std) as f32;
    }
}

/// Zeros the elements of row `row` (rows of `row_len`) that fall in `out` (elements `first..`).
fn zero_row_in(row: u64, row_len: u64, first: u64, out: &mut [f32]) {
    let (lo, hi) = (row * row_len, (row + 1) * row_len);
    let end = first + out.len() as u64;
    if lo < end && first < hi {
        let a = (lo.max(first) - first) as usize;
        let b = (hi.min(end) - first) as usize;
        out[a..b].fill(0.0);
    }
}

/// The whole initial value of `spec`, row-major.
pub fn initial_values(spec: &ParamSpec, seed: u64) -> Vec<f32> {
    let n = spec.numel() as u64;
    let mut out = vec![0.0; n as usize];
    fill(spec, seed, 0..n, &mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::param::ParamKind;

    fn spec(init: Init, shape: Vec<i64>) -> ParamSpec {
        ParamSpec::new("layers.0.w", shape, init, ParamKind::Weight)
    }

    #[test]
    fn splitmix_matches_reference_values() {
        // First output of splitmix64 seeded with 0 (Vigna's reference implementation).
        assert_eq!(splitmix64(0), 0xe220_a839_7b1d_cdaf);
    }

    #[test]
    fn any_range_equals_the_same_part_of_the_whole() {
        let s = spec(
            Init::Normal {
                std: 0.02,
                zero_row: Some(5),
            },
            vec![300, 7000],
        );
        let whole = initial_values(&s, 5);
        assert!(whole[35_000..42_000].iter().all(|&v| v == 0.0));
        // Long enough to be filled by several threads, starting mid-row at an odd element
        // (half of a Box-Muller pair), across the padding row.
        let range = 12_345..12_345 + 1_500_000;
        let mut part = vec![0.0; range.end - range.start];
        fill(&s, 5, range.start as u64..range.end as u64, &mut part);
        assert_eq!(part, whole[range]);
    }

    #[test]
    fn normal_and_uniform_have_the_asked_moments() {
        let n = 200_000u64;
        let normal = initial_values(&spec(Init::normal(0.5), vec![n as i64]), 1);
        let mean = normal.iter().map(|&v| f64::from(v)).sum::<f64>() / n as f64;
        let var = normal
            .iter()
            .map(|&v| (f64::from(v) - mean).powi(2))
            .sum::<f64>()
            / n as f64;
        assert!(mean.abs() < 0.005, "mean {mean}");
        assert!((var.sqrt() - 0.5).abs() < 0.005, "std {}", var.sqrt());
        let uniform = initial_values(&spec(Init::Uniform(0.1), vec![n as i64]), 1);
        assert!(uniform.iter().all(|v| v.abs() <= 0.1));
        let max = uniform.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        assert!(max > 0.099, "max {max}");
    }

    #[test]
    fn padding_row_is_zero_and_seeds_and_names_differ() {
        let s = spec(
            Init::Normal {
                std: 1.0,
                zero_row: Some(2),
            },
            vec![4, 3],
        );
        let v = initial_values(&s, 0);
        assert_eq!(&v[6..9], &[0.0, 0.0, 0.0]);
        assert!(v[..6].iter().chain(&v[9..]).all(|&x| x != 0.0));
        assert_ne!(v, initial_values(&s, 1));
        let mut other = s.clone();
        other.name = "layers.1.w".into();
        assert_ne!(v, initial_values(&other, 0));
    }
}
