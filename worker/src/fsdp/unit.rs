//! One FSDP unit at run time: its fp32 shard, gradient shard and AdamW state (all
//! persistent, 1/N of the unit each), and the gathered buffer whose views are the parameters
//! forward and backward read. The gathered buffer holds memory only while the unit computes.

use super::flat::FlatLayout;
use super::FsdpError;
use crate::collectives::{Communicator, ReduceOp, Work};
use crate::model::{ParamKind, ParamSpec};
use crate::optim::AdamWState;
use crate::shim;
use shardrun_models::source::ParamSource;
use tch::{Device, Kind, Tensor};

enum Gather {
    /// Only the shard is resident (the gathered buffer has no memory or is stale).
    Sharded,
    /// All-gather issued; `input` must outlive the collective.
    InFlight { work: Work, _input: Tensor },
    /// Parameters readable.
    Gathered,
}

/// A reduce-scatter issued for this unit's gradients, to be folded into the gradient shard.
pub struct PendingReduce {
    work: Work,
    /// The unsharded gradients; must outlive the collective.
    input: Tensor,
    output: Tensor,
}

impl PendingReduce {
    /// Bytes held until it completes: the unsharded input and the shard-sized output.
    pub fn bytes(&self) -> u64 {
        tensor_bytes(&self.input) + tensor_bytes(&self.output)
    }
}

fn tensor_bytes(t: &Tensor) -> u64 {
    (t.numel() * t.kind().elt_size_in_bytes()) as u64
}

pub struct FlatUnit {
    pub layout: FlatLayout,
    /// Kind of each parameter of the layout (weight decay groups).
    pub kinds: Vec<ParamKind>,
    /// This rank's part of the flat fp32 parameters, `layout.shard_numel()` elements.
    pub shard: Tensor,
    /// This rank's part of the reduced fp32 gradients (accumulated over micro-steps).
    pub grad: Tensor,
    pub adam: AdamWState,
    /// The whole flat buffer in `param_kind`; parameters are views of it.
    gathered: Tensor,
    /// Leaf tensors (requires grad) viewing `gathered`, in layout order.
    pub params: Vec<Tensor>,
    /// Unsharded gradients not reduced yet (one micro-step, or several under no_sync).
    unreduced: Option<Tensor>,
    /// Which parameters' ranges of `unreduced` hold a gradient (the rest is uninitialised).
    written: Vec<bool>,
    /// World-size-1 shard groups in fp32 compute straight on the shard: nothing to gather.
    aliases_shard: bool,
    state: Gather,
    reduce_kind: Kind,
}

impl FlatUnit {
    /// Builds the unit holding shard `shard_index` of `layout`, taking from `source` only
    /// the element ranges of the parameters that overlap that shard.
    pub fn new(
        layout: FlatLayout,
        specs: &[&ParamSpec],
        shard_index: i64,
        source: &ParamSource,
        device: Device,
        param_kind: Kind,
        reduce_kind: Kind,
    ) -> Result<FlatUnit, FsdpError> {
        let shard = Tensor::empty([layout.shard_numel()], (Kind::Float, device));
        fill_shard(&shard, &layout, specs, shard_index, source)?;
        let aliases_shard = layout.shard_count == 1 && param_kind == Kind::Float;
        let gathered = if aliases_shard {
            shard.shallow_clone()
        } else {
            Tensor::empty([layout.padded_numel], (param_kind, device))
        };
        let params = layout
            .params
            .iter()
            .map(|p| {
                // An empty leaf re-pointed at its range: allocating the parameter's own
                // (unsharded) size here would put a whole tensor in memory for nothing.
                let mut leaf = Tensor::empty([0], (param_kind, device));
                leaf.set_data(
                    &gathered
                        .narrow(0, p.offset, p.numel)
                        .view(p.shape.as_slice()),
                );
                leaf.set_requires_grad(true)
            })
            .collect();
        if !aliases_shard {
            shim::release_storage(&gathered)?;
        }
        let state = if aliases_shard {
            Gather::Gathered
        } else {
            Gather::Sharded
        };
        let written = vec![false; layout.params.len()];
        Ok(FlatUnit {
            kinds: specs.iter().map(|s| s.kind).collect(),
            // Allocated by `allocate_state` once every unit's shard is loaded: loading then
            // holds the shards alone.
            grad: Tensor::zeros([0], (Kind::Float, device)),
            adam: AdamWState::zeros_like(&Tensor::zeros([0], (Kind::Float, device))),
            layout,
            shard,
            gathered,
            params,
            unreduced: None,
            written,
            aliases_shard,
            state,
            reduce_kind,
        })
    }

    /// Allocates the gradient shard and the AdamW state (zeros), shaped like the shard.
    pub fn allocate_state(&mut self) {
        self.grad = self.shard.zeros_like();
        self.adam = AdamWState::zeros_like(&self.shard);
    }

    pub fn is_sharded(&self) -> bool {
        matches!(self.state, Gather::Sharded)
    }

    pub fn is_in_flight(&self) -> bool {
        matches!(self.state, Gather::InFlight { .. })
    }

    /// Starts gathering the parameters (no-op unless sharded).
    pub fn begin_gather(&mut self, comm: &dyn Communicator) -> Result<(), FsdpError> {
        if !self.is_sharded() {
            return Ok(());
        }
        let kind = self.gathered.kind();
        let nbytes = self.layout.padded_numel as usize * kind.elt_size_in_bytes();
        if shim::storage_nbytes(&self.gathered) == 0 {
            shim::allocate_storage(&self.gathered, nbytes)?;
        }
        let input = if kind == Kind::Float {
            self.shard.shallow_clone()
        } else {
            self.shard.to_kind(kind)
        };
        if self.layout.shard_count == 1 {
            tch::no_grad(|| self.gathered.copy_(&input));
            self.state = Gather::Gathered;
        } else {
            let work = comm.all_gather(&input, &self.gathered)?;
            self.state = Gather::InFlight {
                work,
                _input: input,
            };
        }
        Ok(())
    }

    /// Waits for the all-gather, if one is in flight.
    pub fn finish_gather(&mut self) -> Result<(), FsdpError> {
        match std::mem::replace(&mut self.state, Gather::Sharded) {
            // Gathered only once the wait succeeds: a failed one leaves a partial buffer.
            Gather::InFlight { work, .. } => {
                work.wait()?;
                self.state = Gather::Gathered;
            }
            other => self.state = other,
        }
        Ok(())
    }

    /// Frees the gathered parameters. Autograd may still hold views of them: they get memory
    /// again (re-gathered) before backward reads them.
    pub fn release(&mut self) -> Result<(), FsdpError> {
        if self.aliases_shard {
            return Ok(());
        }
        // The work's kept tensors do not protect this memory: releasing swaps the storage's
        // pointer out from under every tensor sharing it, so the gather must be over.
        self.finish_gather()?;
        shim::release_storage(&self.gathered)?;
        self.state = Gather::Sharded;
        Ok(())
    }

    /// Before the shard changes (optimizer step, restore): the gathered copy, if still
    /// resident, will no longer match it. A gather still in flight is waited for first: it
    /// reads the shard, and its work keeps the memory it writes from being freed under it.
    pub fn mark_stale(&mut self) -> Result<(), FsdpError> {
        self.finish_gather()?;
        if !self.aliases_shard {
            self.state = Gather::Sharded;
        }
        Ok(())
    }

    /// Adds one parameter's unsharded gradient (any float dtype) to the unreduced buffer:
    /// the first gradient of a parameter is copied in, later ones added, so the buffer is
    /// never zero-filled as a whole.
    pub fn accumulate_grad(&mut self, param: usize, grad: &Tensor) {
        let p = &self.layout.params[param];
        let (padded, kind, device) = (
            self.layout.padded_numel,
            self.reduce_kind,
            self.shard.device(),
        );
        let flat = self
            .unreduced
            .get_or_insert_with(|| Tensor::empty([padded], (kind, device)));
        let mut range = flat.narrow(0, p.offset, p.numel);
        let grad = grad.reshape([-1]);
        if self.written[param] {
            let _ = range.g_add_(&grad);
        } else {
            range.copy_(&grad);
            self.written[param] = true;
        }
    }

    /// The unreduced gradients with unwritten ranges and the padding zeroed.
    fn take_unreduced(&mut self) -> Option<Tensor> {
        let flat = self.unreduced.take()?;
        for (p, written) in self.layout.params.iter().zip(self.written.iter_mut()) {
            if !std::mem::take(written) {
                let _ = flat.narrow(0, p.offset, p.numel).zero_();
            }
        }
        let pad = self.layout.padded_numel - self.layout.numel;
        if pad > 0 {
            let _ = flat.narrow(0, self.layout.numel, pad).zero_();
        }
        Some(flat)
    }

    /// Reduce-scatters (mean over the shard group) the unreduced gradients towards the
    /// gradient shard; with a shard group of one it folds them in directly.
    pub fn reduce_grad(
        &mut self,
        comm: &dyn Communicator,
    ) -> Result<Option<PendingReduce>, FsdpError> {
        let Some(unreduced) = self.take_unreduced() else {
            return Ok(None);
        };
        if self.layout.shard_count == 1 {
            let _ = self.grad.g_add_(&unreduced);
            return Ok(None);
        }
        let output = Tensor::empty(
            [self.layout.shard_numel()],
            (self.reduce_kind, self.shard.device()),
        );
        let work = comm.reduce_scatter(&unreduced, &output, ReduceOp::Avg)?;
        Ok(Some(PendingReduce {
            work,
            input: unreduced,
            output,
        }))
    }

    pub fn finish_reduce(&mut self, pending: PendingReduce) -> Result<(), FsdpError> {
        pending.work.wait()?;
        let _ = self.grad.g_add_(&pending.output);
        Ok(())
    }

    /// Bytes of gathered parameters this unit holds now (0 when released or when it
    /// computes on its shard directly).
    pub fn gathered_bytes(&self) -> u64 {
        if self.aliases_shard {
            0
        } else {
            shim::storage_nbytes(&self.gathered) as u64
        }
    }

    /// Bytes of unsharded gradients waiting for their reduce-scatter.
    pub fn unsharded_grad_bytes(&self) -> u64 {
        self.unreduced.as_ref().map_or(0, tensor_bytes)
    }

    /// Bytes this unit keeps resident between steps: shard, gradient shard, AdamW state and
    /// whatever gathered memory is still held.
    pub fn resident_bytes(&self) -> u64 {
        tensor_bytes(&self.shard)
            + tensor_bytes(&self.grad)
            + self.adam.bytes()
            + self.gathered_bytes()
    }

    pub fn zero_grad(&mut self) {
        let _ = self.grad.zero_();
    }
}

/// Writes shard `shard_index` of `layout` into `shard` (fp32): each overlapping parameter
/// range straight from `source` (on the CPU into the shard's own memory, so loading holds the
/// shard and nothing of the model besides), and zeros in the padding after the last one.
fn fill_shard(
    shard: &Tensor,
    layout: &FlatLayout,
    specs: &[&ParamSpec],
    shard_index: i64,
    source: &ParamSource,
) -> Result<(), FsdpError> {
    let (start, end) = layout.shard_range(shard_index);
    let mut staging = Vec::new();
    for (p, spec) in layout.params.iter().zip(specs) {
        let Some((in_param, in_shard, len)) = FlatLayout::overlap(p, start, end) else {
            continue;
        };
        let range = in_param as u64..(in_param + len) as u64;
        let mut dst = shard.narrow(0, in_shard, len);
        if dst.device() == Device::Cpu {
            // SAFETY: `dst` is a contiguous fp32 CPU view of `len` elements of `shard`,
            // which outlives this borrow; nothing else reads or writes it meanwhile.
            let values =
                unsafe { std::slice::from_raw_parts_mut(dst.data_ptr() as *mut f32, len as usize) };
            source.fill(spec, range, values)?;
        } else {
            staging.resize(len as usize, 0.0f32);
            source.fill(spec, range, &mut staging)?;
            tch::no_grad(|| dst.copy_(&Tensor::from_slice(&staging)));
        }
    }
    // Parameters lie back to back from 0 to `numel`; only the tail is padding.
    let filled = (layout.numel - start).clamp(0, end - start);
    if filled < end - start {
        let _ = shard.narrow(0, filled, end - start - filled).zero_();
    }
    Ok(())
}
