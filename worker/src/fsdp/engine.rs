//! The FSDP engine: one micro-step of forward and backward, segment by segment.
//!
//! Each segment's forward runs on a detached input that requires grad (a graph cut), so its
//! backward can run on its own with the upstream gradient (`shim::grad`). That is what lets a
//! unit be gathered just before its segment runs, freed right after, gathered again just
//! before its backward, and reduce-scattered as soon as its segment's backward is done.
//!
//! Visits: forward visits segments `0..k`, backward visits `k..2k` (segment `2k-1-v`).
//!
//! Memory stays bounded by a few units, whatever the model's size:
//! * gathered parameters: a unit is gathered for the visits that read it and freed after
//!   the last of a run of consecutive visits reading it (FULL_SHARD, HYBRID_SHARD; the other
//!   strategies keep it from forward to its backward); at most `max_gathers_in_flight` units,
//!   the running segment's included, are gathered at once;
//! * unsharded gradients: a unit's flat gradient exists from its segment's backward until its
//!   reduce-scatter completes, and at most [`REDUCE_SCATTERS_IN_FLIGHT`] reduce-scatters are
//!   left running while the next segment's backward computes (PyTorch FSDP2 waits for the
//!   previous reduce-scatter likewise). A unit read by two segments (a tied embedding and
//!   output head) is reduce-scattered after each, the results added into its gradient shard.
//!   Under no_sync (SHARD_GRAD_OP and NO_SHARD before the last micro-step) gradients are kept
//!   unsharded across micro-steps instead: that is what no_sync trades memory for.
//!
//! Nothing here reads a device value on the host: the loss comes back as a device scalar and
//! the gradient norm as another, for the training loop to read once per step
//! ([`crate::host`]). Collective calls run inside an [`EngineScope`], the only place the data
//! communicator accepts them.

use super::flat::FlatLayout;
use super::groups::ProcessGroups;
use super::unit::{FlatUnit, PendingReduce};
use super::wrap::plan_units;
use super::FsdpError;
use crate::collectives::{EngineScope, ReduceOp};
use crate::data::Batch;
use crate::host;
use crate::model::{loss, Model, Params, SegmentSpec};
use crate::optim::{adamw_step_fused, decay_weights, decayed_ranges};
use crate::shim;
use shardrun_models::source::ParamSource;
use shardrun_protocol::config::{OptimizerConfig, ShardingStrategy, WrapPolicy};
use std::collections::{HashMap, HashSet, VecDeque};
use tch::{Device, Kind, Tensor};

#[derive(Debug, Clone)]
pub struct EngineOptions {
    pub strategy: ShardingStrategy,
    /// dtype of gathered parameters and of compute.
    pub param_kind: Kind,
    /// dtype gradients are reduced in.
    pub reduce_kind: Kind,
    pub activation_checkpointing: bool,
    pub prefetch: bool,
    /// At most this many units gathered at once: the running segment's and those gathered
    /// ahead of it (prefetched). The running segment's units are always gathered.
    pub max_gathers_in_flight: usize,
    /// Tokens of a language model's loss computed at once (`None`: the default for its
    /// vocabulary, `shardrun_models::loss::chunk_tokens`).
    pub loss_chunk_tokens: Option<u64>,
    pub device: Device,
}

/// One unit's optimizer-relevant shard, as plain fp32 values (checkpoint export/import).
#[derive(Debug, Clone, PartialEq)]
pub struct UnitShardState {
    pub param: Vec<f32>,
    pub exp_avg: Vec<f32>,
    pub exp_avg_sq: Vec<f32>,
}

/// Reduce-scatters left running while the next segment's backward computes; issuing another
/// first waits for the oldest, so its unsharded gradient buffer is freed.
pub const REDUCE_SCATTERS_IN_FLIGHT: usize = 1;

/// Peaks of the memory the engine allocates beyond the persistent shards, since the last
/// [`FsdpEngine::reset_memory_stats`]: what a test or a benchmark checks stays bounded.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MemoryStats {
    /// Bytes of gathered (unsharded) parameters alive at once.
    pub gathered_bytes: u64,
    /// Units holding gathered parameters (or an all-gather into them) at once.
    pub gathered_units: usize,
    /// Bytes of unsharded gradients alive at once: flat buffers not reduce-scattered yet,
    /// reduce-scatters in flight (input and output).
    pub unsharded_grad_bytes: u64,
}

/// What forward keeps of a segment for its backward.
enum Saved {
    /// The segment's graph: its (detached, requires-grad) input and its output.
    Graph {
        input: Option<Tensor>,
        output: Tensor,
    },
    /// Activation checkpointing: only the input; backward recomputes the forward.
    Checkpoint { input: Tensor },
}

pub struct FsdpEngine {
    model: Box<dyn Model>,
    segments: Vec<SegmentSpec>,
    /// Units each segment reads.
    segment_units: Vec<Vec<usize>>,
    /// (unit, index in unit) of each parameter a segment reads.
    segment_params: Vec<Vec<(usize, usize)>>,
    /// (unit, index in unit) of the output layer's weight, whose gradient the chunked loss
    /// hands over ([`shardrun_models::ModelDescription::output_weight`]).
    output_weight: Option<(usize, usize)>,
    units: Vec<FlatUnit>,
    /// Every parameter by name: the leaf tensors viewing the gathered buffers.
    param_map: HashMap<String, Tensor>,
    /// Per segment, the names of the parameters it declares (the only ones it may read).
    segment_names: Vec<HashSet<String>>,
    /// Per unit: its last backward visit.
    last_backward: Vec<usize>,
    groups: ProcessGroups,
    options: EngineOptions,
    memory: MemoryStats,
    /// Reduce-scatters issued and not waited for yet, oldest first.
    reducing: VecDeque<(usize, PendingReduce)>,
    /// AdamW steps taken (bias correction counts from these).
    pub optimizer_steps: u64,
    /// How filling this rank's shards went.
    pub loading: LoadingStats,
    /// Inside [`FsdpEngine::forward_only`]: no backward visits follow, so none is prefetched.
    forward_only: bool,
}

/// Time and memory of filling the shards from their source, before the gradient shards and
/// AdamW state are allocated.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LoadingStats {
    pub seconds: f64,
    /// Resident memory before the first shard was allocated.
    pub rss_before_bytes: u64,
    /// Peak resident memory (`VmHWM`) once every shard was filled.
    pub peak_rss_bytes: u64,
    /// Elements of this rank's shards.
    pub shard_elements: u64,
}

impl FsdpEngine {
    /// Splits `model` into units and fills this rank's shards from `source` (never the whole
    /// model).
    pub fn new(
        model: Box<dyn Model>,
        policy: &WrapPolicy,
        source: &ParamSource,
        groups: ProcessGroups,
        options: EngineOptions,
    ) -> Result<FsdpEngine, FsdpError> {
        let specs = model.params();
        let segments = model.segments();
        let started = std::time::Instant::now();
        let rss_before_bytes = crate::metrics::rss_bytes();
        let shard_count = groups.shard.world_size() as i64;
        let shard_index = groups.shard.rank() as i64;
        let mut units = Vec::new();
        let mut location: HashMap<String, (usize, usize)> = HashMap::new();
        for plan in plan_units(&specs, &segments, policy) {
            let members: Vec<_> = plan.params.iter().map(|&i| &specs[i]).collect();
            for (j, spec) in members.iter().enumerate() {
                location.insert(spec.name.clone(), (units.len(), j));
            }
            let layout = FlatLayout::new(
                &plan.name,
                members.iter().map(|s| (s.name.clone(), s.shape.clone())),
                shard_count,
            );
            units.push(FlatUnit::new(
                layout,
                &members,
                shard_index,
                source,
                options.device,
                options.param_kind,
                options.reduce_kind,
            )?);
        }
        let loading = LoadingStats {
            seconds: started.elapsed().as_secs_f64(),
            rss_before_bytes,
            peak_rss_bytes: crate::metrics::peak_rss_bytes(),
            shard_elements: units.iter().map(|u| u.layout.shard_numel() as u64).sum(),
        };
        for u in &mut units {
            u.allocate_state();
        }
        let mut segment_params = Vec::new();
        let mut segment_units: Vec<Vec<usize>> = Vec::new();
        for segment in &segments {
            let params = segment
                .params
                .iter()
                .map(|name| {
                    location.get(name).copied().ok_or_else(|| {
                        FsdpError::Invalid(format!(
                            "segment {} reads unknown parameter {name}",
                            segment.name
                        ))
                    })
                })
                .collect::<Result<Vec<_>, _>>()?;
            let mut used: Vec<usize> = params.iter().map(|&(u, _)| u).collect();
            used.sort_unstable();
            used.dedup();
            segment_units.push(used);
            segment_params.push(params);
        }
        let output_weight = match &model.description().output_weight {
            Some(name) => Some(location.get(name).copied().ok_or_else(|| {
                FsdpError::Invalid(format!(
                    "the output layer's weight {name} is not a parameter"
                ))
            })?),
            None => None,
        };
        let k = segments.len();
        let mut last_backward = vec![usize::MAX; units.len()];
        for (s, used) in segment_units.iter().enumerate() {
            for &u in used {
                // The lowest segment using a unit is the last one backward visits.
                if last_backward[u] == usize::MAX {
                    last_backward[u] = 2 * k - 1 - s;
                }
            }
        }
        let param_map = units
            .iter()
            .flat_map(|u| {
                u.layout
                    .params
                    .iter()
                    .zip(&u.params)
                    .map(|(p, t)| (p.name.clone(), t.shallow_clone()))
            })
            .collect();
        let segment_names = segments
            .iter()
            .map(|segment| segment.params.iter().cloned().collect())
            .collect();
        Ok(FsdpEngine {
            model,
            segments,
            segment_units,
            segment_params,
            output_weight,
            units,
            param_map,
            segment_names,
            last_backward,
            groups,
            options,
            memory: MemoryStats::default(),
            reducing: VecDeque::new(),
            optimizer_steps: 0,
            loading,
            forward_only: false,
        })
    }

    fn segment_of_visit(&self, visit: usize) -> usize {
        let k = self.segments.len();
        if visit < k {
            visit
        } else {
            2 * k - 1 - visit
        }
    }

    fn reshards_after_forward(&self) -> bool {
        matches!(
            self.options.strategy,
            ShardingStrategy::FullShard | ShardingStrategy::HybridShard
        )
    }

    /// Whether visit `visit + 1` (if any) reads unit `u`.
    fn next_visit_reads(&self, visit: usize, u: usize) -> bool {
        visit + 1 < 2 * self.segments.len()
            && self.segment_units[self.segment_of_visit(visit + 1)].contains(&u)
    }

    /// Gathers what `visit` reads and, with prefetch, starts gathering the next visits'
    /// units while fewer than `max_gathers_in_flight` units are gathered or gathering (the
    /// ones `visit` reads count).
    fn prepare(&mut self, visit: usize) -> Result<(), FsdpError> {
        let shard = self.groups.shard.clone();
        let needed = self.segment_units[self.segment_of_visit(visit)].clone();
        for &u in &needed {
            self.units[u].begin_gather(shard.as_ref())?;
        }
        if self.options.prefetch {
            let limit = self.options.max_gathers_in_flight.max(1);
            // Units gathering ahead stay in flight until the visit that reads them waits.
            let mut alive = needed.len()
                + (0..self.units.len())
                    .filter(|u| !needed.contains(u) && self.units[*u].is_in_flight())
                    .count();
            let last_visit = if self.forward_only {
                self.segments.len()
            } else {
                2 * self.segments.len()
            };
            'ahead: for next in visit + 1..(visit + 1 + limit).min(last_visit) {
                for u in self.segment_units[self.segment_of_visit(next)].clone() {
                    if alive >= limit {
                        break 'ahead;
                    }
                    if self.units[u].is_sharded() {
                        self.units[u].begin_gather(shard.as_ref())?;
                        alive += 1;
                    }
                }
            }
        }
        self.note_memory();
        for &u in &needed {
            self.units[u].finish_gather()?;
        }
        Ok(())
    }

    /// FULL_SHARD/HYBRID_SHARD free what this forward visit read unless the next visit
    /// reads it too (the head, around the loss): a tied embedding is freed after the
    /// embeddings and gathered again for the head.
    fn after_forward(&mut self, visit: usize) -> Result<(), FsdpError> {
        if !self.reshards_after_forward() {
            return Ok(());
        }
        for u in self.segment_units[visit].clone() {
            if !self.next_visit_reads(visit, u) {
                self.units[u].release()?;
            }
        }
        Ok(())
    }

    /// After a backward visit: frees the gathered units it read (unless the next visit
    /// reads them; SHARD_GRAD_OP keeps a unit until its last backward visit) and issues
    /// their gradients' reduce-scatter, waiting for older ones beyond
    /// [`REDUCE_SCATTERS_IN_FLIGHT`].
    fn after_backward(&mut self, visit: usize, sync: bool) -> Result<(), FsdpError> {
        let strategy = self.options.strategy;
        // FULL_SHARD/HYBRID_SHARD reduce every micro-step so unsharded gradients never
        // outlive a unit's backward; the others skip communication until the last one
        // (FSDP's no_sync), keeping unsharded gradients instead.
        let reduce_now = sync
            || matches!(
                strategy,
                ShardingStrategy::FullShard | ShardingStrategy::HybridShard
            );
        let shard = self.groups.shard.clone();
        for u in self.segment_units[self.segment_of_visit(visit)].clone() {
            if self.next_visit_reads(visit, u) {
                continue;
            }
            let done_with_params = self.reshards_after_forward() || self.last_backward[u] == visit;
            if strategy != ShardingStrategy::NoShard && done_with_params {
                self.units[u].release()?;
            }
            if (reduce_now || self.units[u].layout.shard_count == 1)
                && self.units[u].unsharded_grad_bytes() > 0
            {
                while self.reducing.len() >= REDUCE_SCATTERS_IN_FLIGHT {
                    self.finish_oldest_reduce()?;
                }
                if let Some(p) = self.units[u].reduce_grad(shard.as_ref())? {
                    self.reducing.push_back((u, p));
                    self.note_memory();
                }
            }
        }
        Ok(())
    }

    /// Waits for the oldest reduce-scatter in flight and folds it into its gradient shard.
    fn finish_oldest_reduce(&mut self) -> Result<(), FsdpError> {
        if let Some((u, p)) = self.reducing.pop_front() {
            self.units[u].finish_reduce(p)?;
        }
        Ok(())
    }

    /// Records the current gathered and unsharded-gradient memory into the peaks.
    fn note_memory(&mut self) {
        let mut now = MemoryStats::default();
        for u in &self.units {
            let gathered = u.gathered_bytes();
            if gathered > 0 {
                now.gathered_bytes += gathered;
                now.gathered_units += 1;
            }
            now.unsharded_grad_bytes += u.unsharded_grad_bytes();
        }
        now.unsharded_grad_bytes += self.reducing.iter().map(|(_, p)| p.bytes()).sum::<u64>();
        let peak = &mut self.memory;
        peak.gathered_bytes = peak.gathered_bytes.max(now.gathered_bytes);
        peak.gathered_units = peak.gathered_units.max(now.gathered_units);
        peak.unsharded_grad_bytes = peak.unsharded_grad_bytes.max(now.unsharded_grad_bytes);
    }

    /// Peaks since the last [`FsdpEngine::reset_memory_stats`] (or the engine's creation).
    pub fn memory_stats(&self) -> MemoryStats {
        self.memory
    }

    pub fn reset_memory_stats(&mut self) {
        self.memory = MemoryStats::default();
    }

    /// Forward and backward of one micro-batch; gradients of `loss · loss_factor` are added to
    /// the gradient shards. `sync`: the last micro-step of an optimizer step (gradients are
    /// fully reduced, across replicas too). Returns the (unscaled) local loss, an f64 scalar
    /// on the device (not read: see [`crate::host`]).
    pub fn forward_backward(
        &mut self,
        batch: &Batch,
        loss_factor: f64,
        sync: bool,
    ) -> Result<Tensor, FsdpError> {
        let _engine = EngineScope::enter();
        let k = self.segments.len();
        let mut x = batch.inputs_as(self.options.param_kind);
        let mut saved = Vec::with_capacity(k);
        let mut loss = None;
        let mut head_upstream = None;
        for s in 0..k {
            self.prepare(s)?;
            let p = Params::of_segment(&self.param_map, &self.segment_names[s]);
            if self.options.activation_checkpointing && self.segments[s].is_block {
                let y = tch::no_grad(|| self.model.forward_segment(s, &p, &x, batch));
                saved.push(Saved::Checkpoint {
                    input: std::mem::replace(&mut x, y),
                });
            } else {
                let input = (s > 0).then(|| x.detach().set_requires_grad(true));
                let input_or_batch = input.as_ref().unwrap_or(&x);
                let head = (s + 1 == k)
                    .then(|| self.model.output_layer(&p, input_or_batch))
                    .flatten();
                if let Some(head) = head {
                    // The loss and the output layer's backward, a chunk of tokens at a
                    // time; backward continues from the output layer's input.
                    let weight = self.output_weight.ok_or_else(|| {
                        FsdpError::Invalid(
                            "the model has an output layer but names no output weight".into(),
                        )
                    })?;
                    let chunk = self.loss_chunk(head.weight);
                    let units = &mut self.units;
                    let (mean, grad_hidden) = loss::chunked_loss_and_grads(
                        &head.hidden.detach(),
                        head.weight,
                        &batch.targets,
                        chunk,
                        loss_factor,
                        &mut |grad| units[weight.0].accumulate_grad(weight.1, grad),
                    );
                    loss = Some(mean.to_kind(Kind::Double));
                    head_upstream = Some(grad_hidden);
                    saved.push(Saved::Graph {
                        input,
                        output: head.hidden,
                    });
                } else {
                    let y = self.model.forward_segment(s, &p, input_or_batch, batch);
                    x = y.detach();
                    let output = if s + 1 == k {
                        loss = Some(x.to_kind(Kind::Double));
                        y * loss_factor
                    } else {
                        y
                    };
                    saved.push(Saved::Graph { input, output });
                }
            }
            self.after_forward(s)?;
        }

        // The last segment's backward starts from its output layer's input where the loss
        // was computed in chunks, else from the loss itself.
        let mut upstream: Option<Tensor> = head_upstream;
        for s in (0..k).rev() {
            let visit = 2 * k - 1 - s;
            self.prepare(visit)?;
            if s + 1 < k && upstream.is_none() {
                return Err(FsdpError::Invalid(format!(
                    "segment {} got no gradient from the segment after it",
                    self.segments[s].name
                )));
            }
            let (input, output) = match saved.pop() {
                Some(Saved::Graph { input, output }) => (input, output),
                Some(Saved::Checkpoint { input: x }) => {
                    let input = (s > 0).then(|| x.detach().set_requires_grad(true));
                    let p = Params::of_segment(&self.param_map, &self.segment_names[s]);
                    let y = self
                        .model
                        .forward_segment(s, &p, input.as_ref().unwrap_or(&x), batch);
                    (input, y)
                }
                None => {
                    return Err(FsdpError::Invalid(
                        "backward ran past the saved segments".into(),
                    ))
                }
            };
            let grads = {
                let mut wrt: Vec<&Tensor> = input.iter().collect();
                wrt.extend(
                    self.segment_params[s]
                        .iter()
                        .map(|&(u, i)| &self.units[u].params[i]),
                );
                shim::grad(&output, upstream.as_ref(), &wrt)?
            };
            drop(output);
            let mut grads = grads.into_iter();
            if input.is_some() {
                upstream = grads.next().flatten();
            }
            for (&(u, i), grad) in self.segment_params[s].iter().zip(grads) {
                if let Some(grad) = grad {
                    self.units[u].accumulate_grad(i, &grad);
                }
            }
            self.note_memory();
            self.after_backward(visit, sync)?;
        }
        while !self.reducing.is_empty() {
            self.finish_oldest_reduce()?;
        }
        if sync {
            self.sync_replicas()?;
        }
        loss.ok_or_else(|| {
            FsdpError::Invalid(
                "the model's last segment gave no loss (activation checkpointing of the loss \
                 segment?)"
                    .into(),
            )
        })
    }

    /// The loss of `batch` without gradients (evaluation). Units are gathered segment by
    /// segment as in training and none stays gathered afterwards; gradients, optimizer state
    /// and the shards are untouched.
    /// The loss is an f64 scalar on the device (not read: see [`crate::host`]).
    pub fn forward_only(&mut self, batch: &Batch) -> Result<Tensor, FsdpError> {
        let _engine = EngineScope::enter();
        self.forward_only = true;
        let loss = self.forward_segments_without_grad(batch);
        self.forward_only = false;
        for unit in &mut self.units {
            if !unit.is_sharded() {
                unit.release()?;
            }
        }
        loss
    }

    fn forward_segments_without_grad(&mut self, batch: &Batch) -> Result<Tensor, FsdpError> {
        let mut x = batch.inputs_as(self.options.param_kind);
        let k = self.segments.len();
        for s in 0..k {
            self.prepare(s)?;
            let p = Params::of_segment(&self.param_map, &self.segment_names[s]);
            x = tch::no_grad(|| {
                let head = (s + 1 == k)
                    .then(|| self.model.output_layer(&p, &x))
                    .flatten();
                match head {
                    Some(head) => loss::chunked_loss(
                        &head.hidden,
                        head.weight,
                        &batch.targets,
                        self.loss_chunk(head.weight),
                    ),
                    None => self.model.forward_segment(s, &p, &x, batch),
                }
            });
            self.after_forward(s)?;
        }
        Ok(x.to_kind(Kind::Double))
    }

    /// Tokens of the loss computed at once, for an output layer of `weight`.
    fn loss_chunk(&self, weight: &Tensor) -> i64 {
        let vocab = weight.size()[0] as u64;
        shardrun_models::loss::chunk_tokens(self.options.loss_chunk_tokens, vocab) as i64
    }

    /// Averages the gradient shards over the replicate group (NO_SHARD, HYBRID_SHARD), on
    /// the wire in `reduce_kind` like the shard group's reduce-scatter.
    fn sync_replicas(&mut self) -> Result<(), FsdpError> {
        if self.groups.replicate.world_size() == 1 {
            return Ok(());
        }
        let reduce_kind = self.options.reduce_kind;
        let mut works = Vec::with_capacity(self.units.len());
        for u in &self.units {
            let wire = if reduce_kind == u.grad.kind() {
                u.grad.shallow_clone()
            } else {
                u.grad.to_kind(reduce_kind)
            };
            works.push((
                self.groups.replicate.all_reduce(&wire, ReduceOp::Avg)?,
                wire,
            ));
        }
        for (u, (work, wire)) in self.units.iter_mut().zip(works) {
            work.wait()?;
            if wire.kind() != u.grad.kind() {
                tch::no_grad(|| u.grad.copy_(&wire));
            }
        }
        Ok(())
    }

    /// Squared L2 norm of this rank's gradient shards, an f64 scalar on the device: each
    /// shard's f32 norm (as `clip_grad_norm_` takes them; a squared copy of the shard, or an
    /// f64 one, would be transient memory several times the largest shard), squared and
    /// summed in f64. Not finite when some gradient element is not, so it is the fp16
    /// overflow check too (or when a shard's norm passes f32's range, ~1.8e19, which is no
    /// step to take either). The global norm is the sum over one replica of each shard (the
    /// training loop adds them on the control plane).
    pub fn local_grad_norm_sq(&self) -> Tensor {
        let device = self.options.device;
        self.units
            .iter()
            .fold(Tensor::zeros([], (Kind::Double, device)), |acc, u| {
                acc + u.grad.norm().to_kind(Kind::Double).square()
            })
    }

    pub fn scale_grads(&mut self, factor: f64) {
        for u in &mut self.units {
            let _ = u.grad.g_mul_scalar_(factor);
        }
    }

    pub fn zero_grads(&mut self) {
        for u in &mut self.units {
            u.zero_grad();
        }
    }

    /// AdamW on every shard (one fused call for all units); gathered copies are stale after.
    pub fn optimizer_step(&mut self, config: &OptimizerConfig, lr: f64) -> Result<(), FsdpError> {
        for u in &mut self.units {
            u.mark_stale()?;
        }
        self.optimizer_steps += 1;
        let step = self.optimizer_steps;
        // Decoupled decay first, only on the decayed parameters' ranges (the no-decay group
        // at weight_decay 0), then one fused Adam update without decay.
        let shard_index = self.shard_index() as i64;
        for u in &self.units {
            let decayed = decayed_ranges(&u.layout, &u.kinds, shard_index, config);
            decay_weights(config, lr, &u.shard, &decayed);
        }
        let adam = OptimizerConfig {
            weight_decay: 0.0,
            ..config.clone()
        };
        let tensors: Vec<_> = self
            .units
            .iter()
            .map(|u| (&u.shard, &u.grad, &u.adam))
            .collect();
        adamw_step_fused(&adam, lr, step, &tensors)?;
        Ok(())
    }

    /// Bytes of parameters, gradients and optimizer state resident on this rank.
    pub fn model_state_bytes(&self) -> u64 {
        self.units.iter().map(FlatUnit::resident_bytes).sum()
    }

    pub fn groups(&self) -> &ProcessGroups {
        &self.groups
    }

    /// Each unit's layout: parameter names, shapes, offsets, padding, shard count.
    pub fn layouts(&self) -> Vec<&FlatLayout> {
        self.units.iter().map(|u| &u.layout).collect()
    }

    /// Which shard of every unit this rank holds.
    pub fn shard_index(&self) -> usize {
        self.groups.shard.rank()
    }

    /// This rank's fp32 parameter and AdamW shards of unit `unit`.
    pub fn export_unit(&self, unit: usize) -> Result<UnitShardState, FsdpError> {
        let u = self
            .units
            .get(unit)
            .ok_or_else(|| FsdpError::Invalid(format!("no unit {unit}")))?;
        let values = host::f32_values;
        Ok(UnitShardState {
            param: values(&u.shard)?,
            exp_avg: values(&u.adam.exp_avg)?,
            exp_avg_sq: values(&u.adam.exp_avg_sq)?,
        })
    }

    /// Loads this rank's shards of unit `unit` (lengths must match the layout's shard size).
    pub fn import_unit(&mut self, unit: usize, state: &UnitShardState) -> Result<(), FsdpError> {
        let u = self
            .units
            .get_mut(unit)
            .ok_or_else(|| FsdpError::Invalid(format!("no unit {unit}")))?;
        let n = u.layout.shard_numel() as usize;
        for (what, values) in [
            ("param", &state.param),
            ("exp_avg", &state.exp_avg),
            ("exp_avg_sq", &state.exp_avg_sq),
        ] {
            if values.len() != n {
                return Err(FsdpError::Invalid(format!(
                    "unit {}: {what} shard has {} values, the layout needs {n}",
                    u.layout.unit,
                    values.len()
                )));
            }
        }
        u.mark_stale()?;
        let device = u.shard.device();
        tch::no_grad(|| {
            u.shard
                .copy_(&Tensor::from_slice(&state.param).to_device(device));
            u.adam
                .exp_avg
                .copy_(&Tensor::from_slice(&state.exp_avg).to_device(device));
            u.adam
                .exp_avg_sq
                .copy_(&Tensor::from_slice(&state.exp_avg_sq).to_device(device));
        });
        Ok(())
    }

    /// Every parameter, unsharded, in fp32 on the CPU (all ranks of the shard group must call).
    pub fn full_parameters(&self) -> Result<Vec<(String, Tensor)>, FsdpError> {
        self.unsharded(|u| &u.shard)
    }

    /// Every parameter's accumulated gradient, unsharded, in fp32 on the CPU (all ranks of
    /// the shard group must call).
    pub fn full_gradients(&self) -> Result<Vec<(String, Tensor)>, FsdpError> {
        self.unsharded(|u| &u.grad)
    }

    /// Gathers one fp32 shard tensor of every unit and cuts it into parameters.
    fn unsharded(
        &self,
        shard_of: impl Fn(&FlatUnit) -> &Tensor,
    ) -> Result<Vec<(String, Tensor)>, FsdpError> {
        let _engine = EngineScope::enter();
        let mut out = Vec::new();
        for u in &self.units {
            let shard = shard_of(u);
            let full = Tensor::empty([u.layout.padded_numel], (Kind::Float, shard.device()));
            if u.layout.shard_count == 1 {
                tch::no_grad(|| full.narrow(0, 0, u.layout.padded_numel).copy_(shard));
            } else {
                self.groups.shard.all_gather(shard, &full)?.wait()?;
            }
            let full = host::to_cpu(&full)?;
            for p in &u.layout.params {
                let value = full.narrow(0, p.offset, p.numel).view(p.shape.as_slice());
                out.push((p.name.clone(), value));
            }
        }
        Ok(out)
    }
}
