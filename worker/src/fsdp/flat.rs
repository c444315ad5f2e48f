//! The flat-parameter layout of one unit: its parameters laid end to end in one buffer,
//! padded so the buffer splits evenly into one shard per rank of the shard group.

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
    /// `numel` rounded up to a multiple of `shard_count` (the padding is zeros, never read).
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
        let padded_numel = (offset + shard_count - 1) / shard_count * shard_count;
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
    fn pads_to_a_multiple_of_the_shard_count() {
        let layout = FlatLayout::new(
            "u",
            [("a".to_string(), vec![2, 3]), ("b".to_string(), vec![5])],
            3,
        );
        assert_eq!(
            (layout.numel, layout.padded_numel, layout.shard_numel()),
            (11, 12, 4)
        );
        assert_eq!(layout.shard_range(2), (8, 12));
        let b = &layout.params[1];
        assert_eq!(b.offset, 6);
        assert_eq!(FlatLayout::overlap(b, 4, 8), Some((0, 2, 2)));
        assert_eq!(FlatLayout::overlap(b, 8, 12), Some((2, 0, 3)));
        assert_eq!(FlatLayout::overlap(&layout.params[0], 8, 12), None);
    }
}
