//! Where every parameter lives: FSDP units, each a flat fp32 buffer holding its parameters at
//! fixed offsets, padded to a multiple of the shard group size and cut into equal shards.
//!
//! The layout is recorded in every checkpoint; loading maps parameters *by name*, so a
//! checkpoint reshards onto any other layout (world size, strategy, wrap policy, alignment)
//! as long as the names and shapes agree.

use crate::error::{CheckpointError, Result};
use serde::{Deserialize, Serialize};
use std::collections::HashSet;
use std::ops::Range;

/// One parameter inside a unit's flat buffer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ParamSlot {
    /// PyTorch module path, e.g. `layers.0.attention.wq.weight`.
    pub name: String,
    pub shape: Vec<u64>,
    /// First element in the unit's (unpadded) flat buffer.
    pub offset: u64,
    pub numel: u64,
}

impl ParamSlot {
    pub fn range(&self) -> Range<u64> {
        self.offset..self.offset + self.numel
    }
}

/// One FSDP unit: the flat buffer that is gathered and sharded as a whole.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UnitLayout {
    /// Name of the unit (a module path such as `layers.3`, or a segment such as `head`), for
    /// messages.
    pub name: String,
    pub params: Vec<ParamSlot>,
    /// Elements of the flat buffer before padding (including any alignment gaps).
    pub numel: u64,
    /// `shard_size × shard count`, ≥ `numel`; the tail is zero padding.
    pub padded_numel: u64,
    /// Elements per shard.
    pub shard_size: u64,
}

impl UnitLayout {
    /// Parameters packed back to back in the given order (no alignment gaps), padded so that
    /// `shard_count` equal shards cover the buffer.
    pub fn packed(
        name: impl Into<String>,
        params: impl IntoIterator<Item = (String, Vec<u64>)>,
        shard_count: u64,
    ) -> Result<UnitLayout> {
        let mut offset = 0;
        let params: Vec<ParamSlot> = params
            .into_iter()
            .map(|(name, shape)| {
                let numel = shape.iter().product();
                let slot = ParamSlot {
                    name,
                    shape,
                    offset,
                    numel,
                };
                offset += numel;
                slot
            })
            .collect();
        UnitLayout::with_offsets(name, params, offset, shard_count)
    }

    /// Parameters at offsets chosen by the engine (which may align them); `numel` is the
    /// unpadded buffer length.
    pub fn with_offsets(
        name: impl Into<String>,
        params: Vec<ParamSlot>,
        numel: u64,
        shard_count: u64,
    ) -> Result<UnitLayout> {
        if shard_count == 0 {
            return Err(CheckpointError::InvalidLayout("shard count is 0".into()));
        }
        let shard_size = numel.div_ceil(shard_count).max(1);
        let unit = UnitLayout {
            name: name.into(),
            params,
            numel,
            padded_numel: shard_size * shard_count,
            shard_size,
        };
        unit.validate()?;
        Ok(unit)
    }

    pub fn shard_count(&self) -> u64 {
        self.padded_numel / self.shard_size.max(1)
    }

    /// Elements of the padded flat buffer that shard `index` holds.
    pub fn shard_range(&self, index: u64) -> Range<u64> {
        let start = index * self.shard_size;
        start..start + self.shard_size
    }

    pub fn validate(&self) -> Result<()> {
        let fail = |what: String| {
            Err(CheckpointError::InvalidLayout(format!(
                "unit {}: {what}",
                self.name
            )))
        };
        if self.shard_size == 0 || !self.padded_numel.is_multiple_of(self.shard_size) {
            return fail(format!(
                "padded size {} is not a multiple of the shard size {}",
                self.padded_numel, self.shard_size
            ));
        }
        if self.padded_numel < self.numel {
            return fail(format!(
                "padded size {} < size {}",
                self.padded_numel, self.numel
            ));
        }
        let mut ranges: Vec<(Range<u64>, &str)> = Vec::with_capacity(self.params.len());
        for p in &self.params {
            let product: Option<u64> = p.shape.iter().try_fold(1u64, |a, &d| a.checked_mul(d));
            if product != Some(p.numel) {
                return fail(format!(
                    "{} has shape {:?} but numel {}",
                    p.name, p.shape, p.numel
                ));
            }
            if p.offset
                .checked_add(p.numel)
                .is_none_or(|end| end > self.numel)
            {
                return fail(format!(
                    "{} ends past the unit's {} elements",
                    p.name, self.numel
                ));
            }
            ranges.push((p.range(), &p.name));
        }
        ranges.sort_by_key(|(r, _)| r.start);
        for pair in ranges.windows(2) {
            if pair[0].0.end > pair[1].0.start {
                return fail(format!("{} overlaps {}", pair[0].1, pair[1].1));
            }
        }
        Ok(())
    }
}

/// Every unit of the model, in execution order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Layout {
    pub units: Vec<UnitLayout>,
}

impl Layout {
    pub fn new(units: Vec<UnitLayout>) -> Result<Layout> {
        let layout = Layout { units };
        layout.validate()?;
        Ok(layout)
    }

    /// All units have the same number of shards (the shard group size).
    pub fn shard_count(&self) -> u64 {
        self.units.first().map_or(1, UnitLayout::shard_count)
    }

    pub fn validate(&self) -> Result<()> {
        let mut names = HashSet::new();
        let shards = self.shard_count();
        for unit in &self.units {
            unit.validate()?;
            if unit.shard_count() != shards {
                return Err(CheckpointError::InvalidLayout(format!(
                    "unit {} has {} shards, unit {} has {shards}",
                    unit.name,
                    unit.shard_count(),
                    self.units[0].name
                )));
            }
            for p in &unit.params {
                if !names.insert(p.name.as_str()) {
                    return Err(CheckpointError::InvalidLayout(format!(
                        "parameter {} appears twice",
                        p.name
                    )));
                }
            }
        }
        Ok(())
    }

    /// Parameters of the whole model in layout order.
    pub fn params(&self) -> impl Iterator<Item = (usize, &ParamSlot)> {
        self.units
            .iter()
            .enumerate()
            .flat_map(|(u, unit)| unit.params.iter().map(move |p| (u, p)))
    }

    pub fn num_params(&self) -> u64 {
        self.params().map(|(_, p)| p.numel).sum()
    }
}
