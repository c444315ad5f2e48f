//! Loading onto any layout: the elements a rank needs (a range of one of its units' padded
//! flat buffers) are traced parameter by parameter, by name, back to where the checkpoint
//! stored them (a shard of some saved unit, or a tensor of the full files), and read with
//! positioned reads of just those bytes. N ranks → M ranks, another strategy or wrap
//! policy, and sharded ↔ full all go through this one path.

use crate::checkpoint::Checkpoint;
use crate::error::{CheckpointError, Result};
use crate::layout::UnitLayout;
use crate::naming::{optimizer_tensor_name, shard_tensor_name, StateKind, METADATA_FILE};
use shardrun_protocol::config::CheckpointFormat;
use std::ops::Range;

/// One positioned read: `len` elements from `file` at byte `position` into the output at
/// element `dest`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Read {
    file: usize,
    position: u64,
    dest: u64,
    len: u64,
}

impl Checkpoint {
    /// Fill `out` (little-endian f32 bytes) with elements `range` of `kind` of the unit
    /// `target` of the loading layout. Elements no parameter covers (padding, alignment
    /// gaps) become zero.
    pub fn read_unit_range(
        &self,
        kind: StateKind,
        target: &UnitLayout,
        range: Range<u64>,
        out: &mut [u8],
    ) -> Result<()> {
        let len = range.end.saturating_sub(range.start);
        if out.len() as u64 != len * 4 {
            return Err(CheckpointError::InvalidLayout(format!(
                "output of {} bytes for {len} elements of unit {}",
                out.len(),
                target.name
            )));
        }
        out.fill(0);
        for read in self.plan_reads(kind, target, &range)? {
            let dest = (read.dest * 4) as usize..((read.dest + read.len) * 4) as usize;
            self.files()[read.file].read_at(read.position, &mut out[dest])?;
        }
        Ok(())
    }

    /// This rank's shard of `target` (`shard_size` elements, padding zero).
    pub fn read_shard(
        &self,
        kind: StateKind,
        target: &UnitLayout,
        shard_index: u64,
        out: &mut [u8],
    ) -> Result<()> {
        self.read_unit_range(kind, target, target.shard_range(shard_index), out)
    }

    fn plan_reads(
        &self,
        kind: StateKind,
        target: &UnitLayout,
        range: &Range<u64>,
    ) -> Result<Vec<Read>> {
        let mut reads: Vec<Read> = Vec::new();
        for p in &target.params {
            let lo = p.offset.max(range.start);
            let hi = (p.offset + p.numel).min(range.end);
            if lo >= hi {
                continue;
            }
            let (saved_unit, saved) =
                self.saved_param(&p.name)
                    .ok_or_else(|| CheckpointError::LayoutMismatch {
                        path: self.dir().join(METADATA_FILE),
                        what: format!("it has no parameter {}", p.name),
                    })?;
            if saved.shape != p.shape {
                return Err(CheckpointError::LayoutMismatch {
                    path: self.dir().join(METADATA_FILE),
                    what: format!(
                        "{} has shape {:?} in the checkpoint and {:?} in the model",
                        p.name, saved.shape, p.shape
                    ),
                });
            }
            // Elements [a, b) of the parameter land at `dest` in the output.
            let (a, b, dest) = (lo - p.offset, hi - p.offset, lo - range.start);
            match self.metadata().format {
                CheckpointFormat::Sharded => {
                    let shard_size = self.layout().units[*saved_unit].shard_size;
                    let name = shard_tensor_name(*saved_unit, kind);
                    let (mut at, end, mut dest) = (saved.offset + a, saved.offset + b, dest);
                    while at < end {
                        let shard = at / shard_size;
                        let len = end.min((shard + 1) * shard_size) - at;
                        let file = shard as usize;
                        let position =
                            self.files()[file].element_position(&name, at - shard * shard_size)?;
                        push_merged(
                            &mut reads,
                            Read {
                                file,
                                position,
                                dest,
                                len,
                            },
                        );
                        at += len;
                        dest += len;
                    }
                }
                CheckpointFormat::Full => {
                    let (file, name) = match kind {
                        StateKind::Param => (0, p.name.clone()),
                        _ => (1, optimizer_tensor_name(&p.name, kind)),
                    };
                    let position = self.files()[file].element_position(&name, a)?;
                    push_merged(
                        &mut reads,
                        Read {
                            file,
                            position,
                            dest,
                            len: b - a,
                        },
                    );
                }
            }
        }
        Ok(reads)
    }
}

/// Append `read`, extending the previous one when both are contiguous in the file and in
/// the output (neighbouring parameters of the same shard: one large read instead of many).
fn push_merged(reads: &mut Vec<Read>, read: Read) {
    if let Some(last) = reads.last_mut() {
        if last.file == read.file
            && last.position + last.len * 4 == read.position
            && last.dest + last.len == read.dest
        {
            last.len += read.len;
            return;
        }
    }
    reads.push(read);
}
