//! Peak memory per rank, per strategy: what the worker's FSDP engine allocates, step by step,
//! from the model's footprint (parameters, segments, activation bytes per token) and the
//! job's batch, dtypes and FSDP options.
//!
//! * **state at rest**: fp32 parameter shard, gradient shard and AdamW's two moments
//!   (16 bytes per parameter, divided over the shard group), plus NO_SHARD's persistent
//!   low-precision copy of the parameters;
//! * **gathered parameters** (in the parameter dtype): FULL_SHARD and HYBRID_SHARD hold the
//!   running segment's units and the ones prefetched for the next visits, at most
//!   `max_gathers_in_flight` units; SHARD_GRAD_OP keeps every unit gathered from its forward
//!   to its backward, so the whole model at the turn from forward to backward;
//! * **gradient buffers**: the running segment's parameter gradients (parameter dtype) and
//!   its units' flat unsharded gradients (reduce dtype), one reduce-scatter in flight (input
//!   and output), and under SHARD_GRAD_OP with accumulation the whole model's unsharded
//!   gradients kept between micro-steps (no_sync); a language model's output layer has its
//!   gradient made in the last segment's forward, with the loss (its unit's flat buffer and
//!   a chunk's gradient of the weight), not in that segment's backward;
//! * **activations**: each segment's saved tensors and output over the rank's tokens per
//!   micro-step (with activation checkpointing a block keeps only its output and recomputes
//!   the rest in its backward), plus the running segment's temporaries (the loss's: one
//!   chunk's logits and their gradient, in the last segment's forward), plus the dense
//!   (seq × seq) mask of packed documents where they attend through one
//!   ([`DocumentAttention`]).
//!
//! The peak is the largest sum over the visits of one step (each segment's forward, each
//! segment's backward, then the replicas' all-reduce and the optimizer). Not modelled: the
//! CUDA context and NCCL's buffers, allocator caching and fragmentation, libtorch's own
//! workspaces (the plan keeps [`GPU_RESERVED_BYTES`] of a GPU for them).

use super::{yaml_name, MemoryEstimate, MemoryParts, StrategyMemory, GIB};
use shardrun_protocol::config::{
    DType, DataConfig, DeviceKind, FsdpConfig, ModelConfig, ShardingStrategy, TrainConfig,
    WrapPolicy,
};
use shardrun_protocol::footprint::Footprint;
use shardrun_protocol::units::{plan_units, segment_units, SegmentSpec, UnitPlan};

/// What a GPU loses before the job allocates anything: the CUDA context and NCCL's buffers.
pub const GPU_RESERVED_BYTES: u64 = 1 << 30;

/// A CPU rank's resident memory before its model: libtorch, its threads and the worker
/// (about 350 MiB measured), which the plan's peak leaves out.
pub const CPU_RANK_RUNTIME_BYTES: u64 = 400 << 20;

/// The share of a GPU's usable memory past which a plan that fits is said to be tight:
/// PyTorch's caching allocator reserves more than the peak it allocates (fragmentation,
/// commonly 5-10% more), which the plan does not model.
const TIGHT_FIT: f64 = 0.9;

/// What the plan knows when it estimates memory.
pub struct MemoryInputs<'a> {
    pub footprint: &'a Footprint,
    /// The footprint's units under the job's wrap policy.
    pub layout: &'a ModelLayout,
    pub fsdp: &'a FsdpConfig,
    pub world_size: u64,
    /// Ranks per shard group (HYBRID_SHARD), else ranks per node.
    pub shard_group: u64,
    /// Tokens (samples, for models without sequences) one rank processes per micro-step.
    pub tokens_per_micro_batch: u64,
    /// Tokens of a language model's loss computed at once ([`TrainConfig::loss_chunk_tokens`]).
    pub loss_chunk_tokens: Option<u64>,
    pub grad_accum_steps: u64,
    pub device: DeviceKind,
    pub gpu_memory_gb: Option<f64>,
    /// The dense mask of packed documents a rank holds through each micro-step (0 where
    /// there is none).
    pub attention_mask_bytes: u64,
}

/// How the tokens of packed documents keep to their own document (`document_mask`), as the
/// worker chooses: flash attention's variable-length kernel, from the documents' bounds,
/// where it can run (CUDA, bf16 or fp16 parameters, heads of at most 256 in multiples of 8,
/// and a GPU of compute capability 8.0 or more, which the plan cannot know); else a dense
/// (batch, 1, seq, seq) mask in the parameter dtype (rows padded to
/// [`shardrun_models::llama::MASK_ROW_ALIGNMENT`]), one per micro-batch, that every layer
/// reads and keeps for its backward and that goes with its micro-batch. Making it briefly
/// takes a boolean (batch, seq, seq) more, left out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DocumentAttention {
    Dense {
        mask_bytes: u64,
    },
    /// `mask_bytes`: the dense mask a GPU older than compute capability 8.0 needs instead.
    FlashVarlen {
        mask_bytes: u64,
    },
}

impl DocumentAttention {
    /// `None` where the batch's tokens attend causally across the whole sequence.
    pub fn of(train: &TrainConfig) -> Option<DocumentAttention> {
        let (DataConfig::Dataset(data), ModelConfig::Llama(model)) = (&train.data, &train.model)
        else {
            return None;
        };
        if !data.document_mask {
            return None;
        }
        let dtype = train.fsdp.mixed_precision.param_dtype;
        let mask_bytes = shardrun_models::llama::dense_mask_values(
            train.batch.batch_size_per_device,
            data.seq_len,
        ) * dtype.size_bytes();
        let flash = shardrun_models::llama::flash_varlen_takes(
            train.device == DeviceKind::Cuda,
            dtype != DType::F32,
            model.architecture.head_dim,
        );
        Some(if flash {
            DocumentAttention::FlashVarlen { mask_bytes }
        } else {
            DocumentAttention::Dense { mask_bytes }
        })
    }

    /// What a rank holds for it through a micro-step, as the plan counts it.
    pub fn held_bytes(self) -> u64 {
        match self {
            DocumentAttention::Dense { mask_bytes } => mask_bytes,
            DocumentAttention::FlashVarlen { .. } => 0,
        }
    }
}

pub fn estimate_memory(m: &MemoryInputs, warnings: &mut Vec<String>) -> MemoryEstimate {
    let layout = m.layout;
    let per_strategy: Vec<StrategyMemory> = [
        ShardingStrategy::FullShard,
        ShardingStrategy::ShardGradOp,
        ShardingStrategy::HybridShard,
        ShardingStrategy::NoShard,
    ]
    .into_iter()
    .map(|s| strategy_memory(s, m, layout))
    .collect();
    let chosen = per_strategy
        .iter()
        .find(|s| s.strategy == m.fsdp.strategy)
        .cloned()
        .unwrap_or_else(|| strategy_memory(m.fsdp.strategy, m, layout));
    let gpu_memory_bytes = m.gpu_memory_gb.map(|gb| (gb * GIB) as u64);
    if gpu_memory_bytes.is_some() && m.device == DeviceKind::Cpu {
        warnings.push(
            "`resources.gpu_memory_gb` is set but the job runs CPU ranks; it is ignored".into(),
        );
    }
    MemoryEstimate {
        num_params: m.footprint.num_params(),
        strategy: m.fsdp.strategy,
        chosen,
        per_strategy,
        gpu_memory_bytes: gpu_memory_bytes.filter(|_| m.device == DeviceKind::Cuda),
    }
}

impl MemoryEstimate {
    /// GPU memory the job may use: the GPU's, less what CUDA and NCCL take.
    pub fn usable_gpu_bytes(&self) -> Option<u64> {
        self.gpu_memory_bytes
            .map(|b| b.saturating_sub(GPU_RESERVED_BYTES))
    }

    /// Whether the chosen strategy's peak fits the GPU (`None`: no GPU memory given).
    pub fn fits(&self) -> Option<bool> {
        self.usable_gpu_bytes()
            .map(|usable| self.chosen.peak <= usable)
    }

    /// A warning when the chosen strategy's peak fits the GPU with less than a tenth of it
    /// to spare ([`TIGHT_FIT`]).
    pub fn tight_fit(&self) -> Option<String> {
        let usable = self.usable_gpu_bytes()?;
        let share = self.chosen.peak as f64 / usable.max(1) as f64;
        (self.chosen.peak <= usable && share > TIGHT_FIT).then(|| {
            format!(
                "peak memory per rank {:.1} GiB is {:.0}% of the {:.1} GiB a GPU has for the \
                 job: PyTorch's caching allocator commonly reserves 5-10% more than it \
                 allocates (fragmentation), which may run it out of memory; leave room (see \
                 the plan's other strategies, activation checkpointing, a smaller \
                 batch_size_per_device) or set `PYTORCH_CUDA_ALLOC_CONF: \
                 expandable_segments:True` in `resources.env`",
                gib(self.chosen.peak),
                share * 100.0,
                gib(usable)
            )
        })
    }

    /// A warning when CPU ranks need more host memory on a node than `resources.mem` (bytes)
    /// lets them have: Slurm's memory limit kills the job when they pass it.
    pub fn over_host_limit(&self, ranks_per_node: u64, limit: u64) -> Option<String> {
        let per_rank = self.chosen.peak + CPU_RANK_RUNTIME_BYTES;
        let needed = per_rank.saturating_mul(ranks_per_node);
        (needed > limit).then(|| {
            format!(
                "the CPU ranks of a node need about {:.1} GiB ({ranks_per_node} × (peak {:.2} \
                 GiB + about {:.1} GiB for libtorch)), more than `resources.mem` gives the node \
                 ({:.1} GiB): Slurm's memory limit would kill the job (OUT_OF_MEMORY); raise \
                 `resources.mem` or plan less memory per rank",
                gib(needed),
                gib(self.chosen.peak),
                gib(CPU_RANK_RUNTIME_BYTES),
                gib(limit)
            )
        })
    }

    /// Why the job cannot run and what would fit, when the peak exceeds the GPU; the ways
    /// to save memory named are those the job does not take already and that would help:
    /// more GPUs only shrink the sharded state, a smaller batch is one of more than one.
    pub fn does_not_fit(&self, train: &TrainConfig) -> Option<(String, String)> {
        let fsdp = &train.fsdp;
        let usable = self.usable_gpu_bytes()?;
        if self.chosen.peak <= usable {
            return None;
        }
        if usable == 0 {
            return Some((
                format!(
                    "a GPU of {:.1} GiB has nothing left for the job once CUDA and NCCL have their \
                     {:.1} GiB",
                    gib(self.gpu_memory_bytes.unwrap_or(0)),
                    gib(GPU_RESERVED_BYTES)
                ),
                "`resources.gpu_memory_gb` is each GPU's whole memory in GiB (80 for an \
                 A100 or H100 80GB); leave it out if the partition's GPUs are not known, or \
                 pass --force to run it anyway"
                    .to_string(),
            ));
        }
        let fits: Vec<String> = self
            .per_strategy
            .iter()
            .filter(|s| s.peak <= usable)
            .map(|s| format!("{} ({:.1} GiB)", yaml_name(&s.strategy), gib(s.peak)))
            .collect();
        let why = format!(
            "peak memory per rank {:.1} GiB with {} (state {:.1} + gathered parameters {:.1} + gradient buffers {:.1} + activations {:.1} GiB at the peak) exceeds the {:.1} GiB a GPU has for the job ({:.1} GiB less {:.1} GiB for CUDA and NCCL)",
            gib(self.chosen.peak),
            yaml_name(&self.strategy),
            gib(self.chosen.at_peak.state),
            gib(self.chosen.at_peak.gathered),
            gib(self.chosen.at_peak.gradients),
            gib(self.chosen.at_peak.activations),
            gib(usable),
            gib(self.gpu_memory_bytes.unwrap_or(0)),
            gib(GPU_RESERVED_BYTES),
        );
        let mut savings = Vec::new();
        let unsharded = self.chosen.peak - self.chosen.at_peak.state;
        if unsharded < usable {
            savings.push("more GPUs");
        }
        // Fewer tokens a micro-step only help where activations are a part of the peak that
        // counts; checkpointing recomputes blocks, which the MLP has none of.
        let activations = self.chosen.at_peak.activations * 10 >= self.chosen.peak;
        let blocks = !matches!(train.model, ModelConfig::Mlp { .. });
        if !fsdp.activation_checkpointing && blocks && activations {
            savings.push("activation checkpointing");
        }
        if train.batch.batch_size_per_device > 1 && activations {
            savings.push("a smaller batch_size_per_device");
        }
        if train.data.sequence_length(&train.model) > 1 && activations {
            savings.push("a shorter seq_len");
        }
        if fsdp.mixed_precision.param_dtype == DType::F32 {
            savings.push("bf16 parameters");
        }
        let savings = match savings.split_last() {
            Some((last, [])) => last.to_string(),
            Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
            None => String::new(),
        };
        let fix = match (fits.is_empty(), savings.is_empty()) {
            (true, true) => "use GPUs with more memory".to_string(),
            (true, false) => format!("use {savings}"),
            (false, true) => format!("use {}", fits.join(" or ")),
            (false, false) => format!("use {}, or {savings}", fits.join(" or ")),
        };
        Some((why, format!("{fix}; or pass --force to run it anyway")))
    }
}

fn gib(bytes: u64) -> f64 {
    bytes as f64 / GIB
}

impl MemoryParts {
    fn total(&self) -> u64 {
        self.state + self.gathered + self.gradients + self.activations
    }
}

/// The model's units and what each segment reads under the job's wrap policy, the same
/// under every strategy: planned once per job, for the memory plan and for the warnings
/// about wrapping.
pub struct ModelLayout {
    /// `(name, elements)` of every parameter, in model order.
    pub sizes: Vec<(String, u64)>,
    pub segments: Vec<SegmentSpec>,
    pub units: Vec<UnitPlan>,
    /// Elements of each unit, unpadded.
    unit_numel: Vec<u64>,
    /// The units each segment reads, in segment order.
    reads: Vec<Vec<usize>>,
    /// Elements of the parameters each segment reads (what autograd's gradients hold).
    segment_numel: Vec<u64>,
    /// The output layer's weight ([`Footprint::output_weight`]): its unit and elements.
    output: Option<(usize, u64)>,
}

impl ModelLayout {
    pub fn new(f: &Footprint, wrap: &WrapPolicy) -> ModelLayout {
        let sizes = f.param_sizes();
        let segments = f.segment_specs();
        let units = plan_units(&sizes, &segments, wrap);
        let numel_of: std::collections::HashMap<&str, u64> =
            sizes.iter().map(|(n, e)| (n.as_str(), *e)).collect();
        let output = f.output_weight.as_ref().and_then(|name| {
            let index = sizes.iter().position(|(n, _)| n == name)?;
            let unit = units.iter().position(|u| u.params.contains(&index))?;
            Some((unit, sizes[index].1))
        });
        ModelLayout {
            output,
            unit_numel: units
                .iter()
                .map(|u| u.params.iter().map(|&i| sizes[i].1).sum())
                .collect(),
            reads: segment_units(&sizes, &segments, &units),
            segment_numel: segments
                .iter()
                .map(|s| {
                    s.params
                        .iter()
                        .filter_map(|n| numel_of.get(n.as_str()))
                        .sum()
                })
                .collect(),
            sizes,
            segments,
            units,
        }
    }
}

fn strategy_memory(
    strategy: ShardingStrategy,
    m: &MemoryInputs,
    layout: &ModelLayout,
) -> StrategyMemory {
    let f = m.footprint;
    let fsdp = m.fsdp;
    let shards = match strategy {
        ShardingStrategy::FullShard | ShardingStrategy::ShardGradOp => m.world_size,
        ShardingStrategy::HybridShard => m.shard_group,
        ShardingStrategy::NoShard => 1,
    }
    .max(1);
    let replicas = m.world_size / shards;
    let param_bytes = fsdp.mixed_precision.param_dtype.size_bytes();
    let reduce_bytes = fsdp.mixed_precision.reduce_dtype.size_bytes();
    // A shard group of one in fp32 computes on its shard: nothing is gathered.
    let aliases = shards == 1 && param_bytes == 4;

    // Each unit's elements, padded to a multiple of the shard count.
    let padded: Vec<u64> = layout
        .unit_numel
        .iter()
        .map(|n| n.div_ceil(shards) * shards)
        .collect();
    let reads = &layout.reads;
    let k = reads.len();
    let all: u64 = padded.iter().sum();

    let state = all / shards * 16
        + if strategy == ShardingStrategy::NoShard && !aliases {
            all * param_bytes // the low-precision copy NO_SHARD never frees
        } else {
            0
        };
    let unit_bytes = |set: &[usize], per_element: u64| -> u64 {
        set.iter().map(|&u| padded[u] * per_element).sum()
    };

    // Visit v < k is segment v's forward; visit v >= k is segment 2k-1-v's backward.
    let segment_of = |v: usize| if v < k { v } else { 2 * k - 1 - v };
    let gathered_at = |v: usize| -> u64 {
        if aliases || strategy == ShardingStrategy::NoShard {
            return 0; // NO_SHARD's copy is counted in the state
        }
        let s = segment_of(v);
        let mut alive: Vec<usize> = match strategy {
            // Every unit of the segments up to this one stays gathered until its backward.
            ShardingStrategy::ShardGradOp => {
                let mut set: Vec<usize> = reads[..=s].iter().flatten().copied().collect();
                set.sort_unstable();
                set.dedup();
                set
            }
            _ => reads[s].clone(),
        };
        if fsdp.prefetch {
            let limit = fsdp.max_gathers_in_flight.max(1);
            let mut in_window = reads[s].len();
            'ahead: for next in v + 1..(v + 1 + limit).min(2 * k) {
                for &u in &reads[segment_of(next)] {
                    if in_window >= limit {
                        break 'ahead;
                    }
                    if !alive.contains(&u) {
                        alive.push(u);
                        in_window += 1;
                    }
                }
            }
        }
        unit_bytes(&alive, param_bytes)
    };
    // Unsharded gradients SHARD_GRAD_OP keeps between micro-steps under no_sync.
    let no_sync =
        if strategy == ShardingStrategy::ShardGradOp && m.grad_accum_steps > 1 && shards > 1 {
            all * reduce_bytes
        } else {
            0
        };
    let in_flight = |u: usize| -> u64 {
        if shards == 1 {
            0 // folded into the gradient shard at once
        } else {
            padded[u] * reduce_bytes + padded[u] / shards * reduce_bytes
        }
    };

    let tokens = m.tokens_per_micro_batch;
    // A language model's loss holds its logits for one chunk of tokens at a time.
    let loss_chunk = m.loss_chunk_tokens.unwrap_or(tokens);
    // The last segment's forward runs the output layer's backward too, chunk by chunk: a
    // chunk's weight gradient (parameter dtype) goes into the unit's flat gradients there,
    // and that segment's backward has none to make.
    let output_of = |s: usize| layout.output.filter(|_| s + 1 == k);
    let checkpointed = |s: usize| fsdp.activation_checkpointing && f.segments[s].spec.is_block;
    let kept = |s: usize| {
        let seg = &f.segments[s];
        if checkpointed(s) {
            seg.output
        } else {
            seg.saved + seg.output
        }
    };
    // Bytes per token of every segment before `s` keeps for its backward.
    let before = |s: usize| -> u64 { (0..s).map(kept).sum::<u64>() };
    let running = |s: usize| {
        let seg = &f.segments[s];
        seg.saved + seg.output + seg.transient
    };

    let mut peak = MemoryParts::default();
    let mut consider = |parts: MemoryParts| {
        if parts.total() > peak.total() {
            peak = parts;
        }
    };
    for v in 0..2 * k {
        let s = segment_of(v);
        let loss_chunks = if v < k {
            loss_chunk * f.segments[s].chunked
        } else {
            0
        };
        let activations =
            tokens * (f.batch + before(s) + running(s)) + loss_chunks + m.attention_mask_bytes;
        let gradients = if v < k {
            match output_of(s) {
                Some((unit, numel)) => {
                    no_sync.max(padded[unit] * reduce_bytes) + numel * param_bytes
                }
                None => no_sync,
            }
        } else {
            // The segment's parameter gradients from autograd and its units' flat buffers,
            // while the previous visit's last reduce-scatter is in flight.
            let autograd =
                (layout.segment_numel[s] - output_of(s).map_or(0, |(_, n)| n)) * param_bytes;
            let previous = if s + 1 < k {
                reads[s + 1]
                    .iter()
                    .map(|&u| in_flight(u))
                    .max()
                    .unwrap_or(0)
            } else {
                0
            };
            no_sync.max(unit_bytes(&reads[s], reduce_bytes)) + autograd + previous
        };
        consider(MemoryParts {
            state,
            gathered: gathered_at(v),
            gradients,
            activations,
        });
    }
    // After backward: the replicas' all-reduce copies gradients to the reduce dtype when it
    // differs; AdamW holds two temporaries the size of a unit's shard (the denominator and
    // the scaled first moment).
    let replica_copies = if replicas > 1 && reduce_bytes != 4 {
        all / shards * reduce_bytes
    } else {
        0
    };
    let largest_shard = padded.iter().map(|p| p / shards).max().unwrap_or(0);
    consider(MemoryParts {
        state,
        gradients: replica_copies.max(2 * largest_shard * 4),
        ..MemoryParts::default()
    });

    StrategyMemory {
        strategy,
        peak: peak.total(),
        at_peak: peak,
    }
}
