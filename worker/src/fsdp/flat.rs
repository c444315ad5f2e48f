//! The flat-parameter layout of one unit: its parameters laid end to end in one buffer,
//! padded so the buffer splits evenly into one shard per rank of the shard group, each shard
//! a multiple of [`SHARD_ALIGN`] elements.

/// Shards hold a multiple of this many elements: 16 bytes in bf16/fp16, 32 in fp32. Every
/// rank's segment of a gathered buffer then starts 16-byte aligned, which NCCL's and the
/// CPU ring's vectorised copies and reductions want (PyTorch's FSDP pads the same way).
pub const SHARD_ALIGN: i64 = 8;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FlatParam {
    /// PyTorch module path of the parameter.
    pub name: String,
    pub shape: Vec<i64>,
    /// First element of this parameter in the unit's flat (unsharded) buffer.
    pub offset: i64,
    pub numel: i64,
}

/// Where every parameter of a unit lives, and how the unit is sharded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FlatLayout {
    pub unit: String,
    pub params: Vec<FlatParam>,
    /// Elements of all parameters together.
    pub numel: i64,
    /// `numel` rounded up to a multiple of `shard_count × SHARD_ALIGN` (the padding is
    /// zeros, never read).
    pub padded_numel: i64,
    /// Ranks the unit is sharded over (1 for NO_SHARD).
    pub shard_count: i64,
}

impl FlatLayout {
    pub fn new(
        unit: &str,
        params: impl IntoIterator<Item = (String, Vec<i64>)>,
        shard_count: i64,
    ) -> Self {
        let mut offset = 0;
        let params: Vec<FlatParam> = params
            .into_iter()
            .map(|(name, shape)| {
                let numel = shape.iter().product();
                let p = FlatParam {
                    name,
                    shape,
                    offset,
                    numel,
                };
                offset += numel;
                p
            })
            .collect();
        let multiple = shard_count * SHARD_ALIGN;
        let padded_numel = (offset + multiple - 1) / multiple * multiple;
        FlatLayout {
            unit: unit.to_string(),
            params,
            numel: offset,
            padded_numel,
            shard_count,
        }
    }

    pub fn shard_numel(&self) -> i64 {
        self.padded_numel / self.shard_count
    }

    /// Range `[start, end)` of the flat buffer held by shard `index`.
    pub fn shard_range(&self, index: i64) -> (i64, i64) {
        let n = self.shard_numel();
        (index * n, (index + 1) * n)
    }

    /// The part of parameter `p` inside `[start, end)`: (offset within the parameter,
    /// offset within the range, length), or `None` when they do not overlap.
    pub fn overlap(p: &FlatParam, start: i64, end: i64) -> Option<(i64, i64, i64)> {
        let lo = p.offset.max(start);
        let hi = (p.offset + p.numel).min(end);
        (lo < hi).then(|| (lo - p.offset, lo - start, hi - lo))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pads_to_aligned_shards() {
        let layout = FlatLayout::new(
            "u",
            [("a".to_string(), vec![2, 3]), ("b".to_string(), vec![5])],
            3,
        );
        assert_eq!(
            (layout.numel, layout.padded_numel, layout.shard_numel()),
            (11, 24, 8)
        );
        assert_eq!(layout.shard_range(2), (16, 24));
        let b = &layout.params[1];
        assert_eq!(b.offset, 6);
        assert_eq!(FlatLayout::overlap(b, 0, 8), Some((0, 6, 2)));
        assert_eq!(FlatLayout::overlap(b, 8, 16), Some((2, 0, 3)));
        assert_eq!(FlatLayout::overlap(&layout.params[0], 8, 16), None);
        // Already aligned: no padding.
        let even = FlatLayout::new("v", [("w".to_string(), vec![4, 8])], 2);
        assert_eq!((even.padded_numel, even.shard_numel()), (32, 16));
    }
}
