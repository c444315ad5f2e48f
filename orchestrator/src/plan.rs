//! From a parsed job spec to a fully explicit [`ResolvedJob`]: defaults applied, the batch
//! split checked (`total = per_device × world × accum`, never rounded), Slurm resources and
//! the memory estimate computed. Pure: no I/O, so `plan`, `render`, `submit`, `sweep` and
//! local `run` all see the same numbers.

use crate::spec::{DataSpec, LoadedSpec, ModelSpec, SpecError};
use serde::{Deserialize, Serialize};
use shardrun_protocol::config::{
    BatchPlan, CheckpointConfig, CheckpointFormat, DType, DataConfig, DeviceKind, FsdpConfig,
    LrDecay, LrSchedule, MixedPrecision, ModelConfig, OptimizerConfig, ShardingStrategy,
    WrapPolicy,
};
use shardrun_protocol::TrainConfig;
use std::fmt::Write as _;
use std::path::PathBuf;

/// Defaults, in one place (docs/job-spec.md repeats them).
pub mod defaults {
    pub const RUN_ROOT: &str = "runs";
    pub const NODES: u64 = 1;
    pub const TASKS_PER_NODE: u64 = 1;
    pub const CPUS_PER_TASK: u64 = 1;
    pub const SEED: u64 = 0;
    pub const LR: f64 = 3e-4;
    pub const BETA1: f64 = 0.9;
    pub const BETA2: f64 = 0.999;
    pub const EPS: f64 = 1e-8;
    pub const WEIGHT_DECAY: f64 = 0.01;
    pub const MIN_LR_RATIO: f64 = 0.1;
    pub const MAX_GATHERS_IN_FLIGHT: usize = 2;
    pub const CHECKPOINT_DIR: &str = "checkpoints";
    pub const CHECKPOINT_KEEP: usize = 2;
    pub const SIGNAL_SECONDS: u64 = 120;
    pub const MAX_REQUEUES: u32 = 3;
    pub const LOG_EVERY: u64 = 1;
}

/// What the caller decides instead of the spec.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Overrides {
    /// Local mode: run this many ranks on one node (CPU ranks or local GPUs) whatever the
    /// spec's `resources` say.
    pub world_size: Option<u64>,
    /// Local mode: force the device kind (e.g. CPU on a machine without GPUs).
    pub device: Option<DeviceKind>,
}

#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    /// A value that parses but cannot run, located in the spec file.
    #[error("{0}")]
    Invalid(#[from] SpecError),
}

/// The Slurm side of a resolved job: exactly the flags the sbatch script will carry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SlurmResources {
    pub nodes: u64,
    /// Ranks per node: one per GPU, or `tasks_per_node` CPU ranks.
    pub ntasks_per_node: u64,
    /// 0 for CPU ranks.
    pub gpus_per_node: u64,
    pub cpus_per_task: u64,
    pub mem: Option<String>,
    pub time: Option<String>,
    pub time_limit_seconds: Option<u64>,
    pub partition: Option<String>,
    pub account: Option<String>,
    pub qos: Option<String>,
    pub reservation: Option<String>,
    pub constraint: Option<String>,
    pub exclusive: bool,
    pub extra_sbatch: Vec<String>,
    pub setup: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PreemptionPlan {
    /// `--signal=B:USR2@<seconds>`.
    pub signal_seconds: u64,
    pub requeue: bool,
    pub max_requeues: u32,
}

/// Model-state memory per rank (fp32 params + grads + AdamW moments, sharded by the
/// strategy); activations and communication buffers come on top.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MemoryEstimate {
    pub num_params: u64,
    pub strategy: ShardingStrategy,
    pub bytes_per_rank: u64,
    /// The same for every strategy, to compare.
    pub per_strategy: Vec<(ShardingStrategy, u64)>,
    pub gpu_memory_bytes: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ResolvedJob {
    pub name: String,
    /// Folder that holds this job's run directory.
    pub run_root: PathBuf,
    /// What every worker runs (`train_config.json`). A relative `checkpoint.dir` is relative
    /// to the run directory; [`crate::rundir::RunDir::create`] makes it absolute.
    pub train: TrainConfig,
    pub slurm: SlurmResources,
    pub preemption: PreemptionPlan,
    pub world_size: u64,
    pub grad_accum_steps: u64,
    pub tokens_per_step: u64,
    pub memory: MemoryEstimate,
    pub warnings: Vec<String>,
    /// The `--set` arguments applied over the spec file, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub overrides: Vec<String>,
}

const GIB: f64 = (1u64 << 30) as f64;

/// Apply defaults and check everything that parsing alone cannot.
pub fn resolve(loaded: &LoadedSpec, overrides: &Overrides) -> Result<ResolvedJob, PlanError> {
    let spec = &loaded.spec;
    let res = &spec.resources;
    let t = &spec.training;
    let mut warnings = Vec::new();
    let err =
        |field: &str, why: String, fix: String| PlanError::from(loaded.error_at(field, why, fix));

    // --- ranks -----------------------------------------------------------------------------
    let gpus_per_node = res.gpus_per_node.unwrap_or(0);
    let mut nodes = res.nodes.unwrap_or(defaults::NODES);
    if nodes == 0 {
        return Err(err(
            "resources.nodes",
            "`nodes` is 0".into(),
            "ask for at least 1 node".into(),
        ));
    }
    let mut ntasks_per_node = if gpus_per_node > 0 {
        if let Some(tasks) = res.tasks_per_node.filter(|&n| n != gpus_per_node) {
            return Err(err(
                "resources.tasks_per_node",
                format!("{tasks} tasks per node with {gpus_per_node} GPUs per node: GPU jobs run one rank per GPU"),
                "remove `tasks_per_node` (it is only for CPU ranks, `gpus_per_node: 0`)".into(),
            ));
        }
        gpus_per_node
    } else {
        res.tasks_per_node.unwrap_or(defaults::TASKS_PER_NODE)
    };
    if ntasks_per_node == 0 {
        return Err(err(
            "resources.tasks_per_node",
            "0 tasks per node".into(),
            "set `tasks_per_node` to the number of CPU ranks per node (at least 1)".into(),
        ));
    }
    let mut device = if gpus_per_node > 0 {
        DeviceKind::Cuda
    } else {
        DeviceKind::Cpu
    };
    if let Some(world) = overrides.world_size {
        if world == 0 {
            return Err(err(
                "resources",
                "world size 0 requested".into(),
                "pass --nproc 1 or more".into(),
            ));
        }
        nodes = 1;
        ntasks_per_node = world;
    }
    if let Some(d) = overrides.device {
        device = d;
    }
    let world_size = nodes * ntasks_per_node;
    let cpus_per_task = res.cpus_per_task.unwrap_or(defaults::CPUS_PER_TASK);
    if cpus_per_task == 0 {
        return Err(err(
            "resources.cpus_per_task",
            "0 CPUs per task".into(),
            "set `cpus_per_task: 1` or more".into(),
        ));
    }

    // --- batch split ----------------------------------------------------------------------
    let grad_accum_steps = batch_split(
        loaded,
        t.total_batch_size,
        t.batch_size_per_device,
        world_size,
    )?;

    // --- model and data -------------------------------------------------------------------
    let (model, seq_len) = resolve_model(loaded)?;
    let data = match &t.data {
        None => DataConfig::Synthetic { seq_len },
        Some(DataSpec::Synthetic { .. }) => DataConfig::Synthetic { seq_len },
        Some(DataSpec::TokenFile { path, .. }) => {
            if let ModelConfig::Transformer { vocab_size, .. } = model {
                if vocab_size > 65536 {
                    return Err(err(
                        "training.model.vocab_size",
                        format!("vocab_size {vocab_size} does not fit the token file's u16 ids"),
                        "use vocab_size ≤ 65536 with `token_file` data".into(),
                    ));
                }
            }
            // Workers run in the run directory: a relative path is relative to the spec file.
            let base = loaded.path.parent().unwrap_or(std::path::Path::new("."));
            let path = std::path::absolute(base.join(path)).unwrap_or_else(|_| path.clone());
            DataConfig::TokenFile { path, seq_len }
        }
    };
    if t.steps == 0 {
        return Err(err(
            "training.steps",
            "`steps` is 0".into(),
            "train for at least 1 step".into(),
        ));
    }

    // --- optimizer and schedule -----------------------------------------------------------
    let o = &t.optimizer;
    let optimizer = OptimizerConfig {
        lr: o.lr.unwrap_or(defaults::LR),
        beta1: o.beta1.unwrap_or(defaults::BETA1),
        beta2: o.beta2.unwrap_or(defaults::BETA2),
        eps: o.eps.unwrap_or(defaults::EPS),
        weight_decay: o.weight_decay.unwrap_or(defaults::WEIGHT_DECAY),
        grad_clip: o.grad_clip,
    };
    if !(optimizer.lr.is_finite() && optimizer.lr > 0.0) {
        return Err(err(
            "training.optimizer.lr",
            format!("lr {} is not a positive number", optimizer.lr),
            "use e.g. `lr: 3.0e-4`".into(),
        ));
    }
    for (field, beta) in [
        ("training.optimizer.beta1", optimizer.beta1),
        ("training.optimizer.beta2", optimizer.beta2),
    ] {
        if !(0.0..1.0).contains(&beta) {
            return Err(err(
                field,
                format!("{beta} is outside [0, 1)"),
                "use a value like 0.9 or 0.999".into(),
            ));
        }
    }
    if optimizer.eps.partial_cmp(&0.0) != Some(std::cmp::Ordering::Greater)
        || optimizer
            .weight_decay
            .partial_cmp(&0.0)
            .is_none_or(|o| o.is_lt())
    {
        return Err(err(
            "training.optimizer",
            "eps must be > 0 and weight_decay ≥ 0".into(),
            "use e.g. `eps: 1.0e-8`, `weight_decay: 0.01`".into(),
        ));
    }
    if let Some(clip) = optimizer
        .grad_clip
        .filter(|c| c.partial_cmp(&0.0) != Some(std::cmp::Ordering::Greater))
    {
        return Err(err(
            "training.optimizer.grad_clip",
            format!("grad_clip {clip} is not positive"),
            "use e.g. `grad_clip: 1.0`, or remove it to disable clipping".into(),
        ));
    }
    let s = &t.schedule;
    let schedule = LrSchedule {
        warmup_steps: s.warmup_steps.unwrap_or(0),
        decay: s.decay.unwrap_or(LrDecay::Cosine),
        min_lr_ratio: s.min_lr_ratio.unwrap_or(defaults::MIN_LR_RATIO),
    };
    if schedule.warmup_steps > t.steps {
        return Err(err(
            "training.schedule.warmup_steps",
            format!(
                "{} warmup steps but only {} steps",
                schedule.warmup_steps, t.steps
            ),
            format!("use at most {} warmup steps", t.steps),
        ));
    }
    if !(0.0..=1.0).contains(&schedule.min_lr_ratio) {
        return Err(err(
            "training.schedule.min_lr_ratio",
            format!("{} is outside [0, 1]", schedule.min_lr_ratio),
            "use e.g. `min_lr_ratio: 0.1`".into(),
        ));
    }

    // --- FSDP -----------------------------------------------------------------------------
    let f = &t.fsdp;
    let strategy = f.strategy.unwrap_or(ShardingStrategy::FullShard);
    let param_dtype = f.mixed_precision.param_dtype.unwrap_or(DType::F32);
    let shard_group_size = match strategy {
        ShardingStrategy::HybridShard => {
            let group = f.shard_group_size.unwrap_or(ntasks_per_node);
            if group == 0 || !world_size.is_multiple_of(group) {
                return Err(err("training.fsdp.shard_group_size", format!("shard groups of {group} ranks do not divide the world size {world_size}"), format!("use a divisor of {world_size}, usually the ranks per node ({ntasks_per_node})")));
            }
            Some(group)
        }
        _ => {
            if f.shard_group_size.is_some() {
                warnings.push(
                    "`training.fsdp.shard_group_size` only applies to HYBRID_SHARD; ignored".into(),
                );
            }
            None
        }
    };
    let max_gathers = f
        .max_gathers_in_flight
        .unwrap_or(defaults::MAX_GATHERS_IN_FLIGHT);
    if max_gathers == 0 {
        return Err(err(
            "training.fsdp.max_gathers_in_flight",
            "0 gathers in flight would never compute".into(),
            "use 1 or more (default 2)".into(),
        ));
    }
    let wrap = f.wrap.clone().unwrap_or(match model {
        ModelConfig::Transformer { .. } => WrapPolicy::Block,
        // The MLP has no blocks: each linear layer is its own unit.
        ModelConfig::Mlp { .. } => WrapPolicy::ModuleNames {
            patterns: vec!["layer1".into(), "layer2".into()],
        },
    });
    let fsdp = FsdpConfig {
        strategy,
        wrap,
        mixed_precision: MixedPrecision {
            param_dtype,
            reduce_dtype: f.mixed_precision.reduce_dtype.unwrap_or(param_dtype),
            buffer_dtype: f.mixed_precision.buffer_dtype.unwrap_or(param_dtype),
        },
        activation_checkpointing: f.activation_checkpointing.unwrap_or(false),
        prefetch: f.prefetch.unwrap_or(true),
        max_gathers_in_flight: max_gathers,
        shard_group_size,
    };

    // --- checkpoints ----------------------------------------------------------------------
    let checkpoint = match &t.checkpoint {
        // Checkpoints "off" means no periodic saves. The ranks still save at the end and on
        // preemption into the run directory, and a re-run or requeue resumes from there:
        // opting out of resuming takes `checkpoint: { resume: false }`.
        None => CheckpointConfig {
            dir: None,
            interval_steps: None,
            interval_minutes: None,
            keep: defaults::CHECKPOINT_KEEP,
            format: CheckpointFormat::Sharded,
            resume: true,
            from: None,
        },
        Some(c) => {
            if c.interval_steps == Some(0) {
                return Err(err(
                    "training.checkpoint.interval_steps",
                    "interval of 0 steps".into(),
                    "use 1 or more, or remove it".into(),
                ));
            }
            if c.interval_minutes
                .is_some_and(|m| m.partial_cmp(&0.0) != Some(std::cmp::Ordering::Greater))
            {
                return Err(err(
                    "training.checkpoint.interval_minutes",
                    "interval must be positive".into(),
                    "use e.g. `interval_minutes: 30`".into(),
                ));
            }
            if c.keep == Some(0) {
                return Err(err(
                    "training.checkpoint.keep",
                    "keeping 0 checkpoints deletes each one as it is written".into(),
                    "keep at least 1".into(),
                ));
            }
            let interval_steps = match (c.interval_steps, c.interval_minutes) {
                // Neither given: one checkpoint at the end.
                (None, None) => Some(t.steps),
                (s, _) => s,
            };
            CheckpointConfig {
                dir: Some(
                    c.dir
                        .clone()
                        .unwrap_or_else(|| PathBuf::from(defaults::CHECKPOINT_DIR)),
                ),
                interval_steps,
                interval_minutes: c.interval_minutes,
                keep: c.keep.unwrap_or(defaults::CHECKPOINT_KEEP),
                format: c.format.unwrap_or(CheckpointFormat::Sharded),
                resume: c.resume.unwrap_or(true),
                from: c.from.clone(),
            }
        }
    };

    // --- Slurm ----------------------------------------------------------------------------
    let time_limit_seconds = match &res.time {
        None => None,
        Some(time) => Some(parse_slurm_time(time).ok_or_else(|| {
            err(
                "resources.time",
                format!("`{time}` is not a Slurm time limit"),
                "write `MM`, `HH:MM:SS` or `D-HH:MM:SS`, e.g. `time: \"02:00:00\"` (quoted)".into(),
            )
        })?),
    };
    if let Some(mem) = &res.mem {
        if !valid_mem(mem) {
            return Err(err(
                "resources.mem",
                format!("`{mem}` is not a Slurm memory size"),
                "write a number with an optional K/M/G/T suffix, e.g. `mem: 16G`".into(),
            ));
        }
    }
    for (i, line) in res.extra_sbatch.iter().enumerate() {
        if !line.starts_with('-') || line.contains('\n') {
            return Err(err(
                "resources.extra_sbatch",
                format!("entry {i} `{line}` is not one sbatch option"),
                "write each option as on the command line, e.g. `--mail-type=END`".into(),
            ));
        }
    }
    if res.setup.iter().any(|l| l.contains('\n')) {
        return Err(err(
            "resources.setup",
            "a setup entry spans several lines".into(),
            "write one shell line per list entry".into(),
        ));
    }
    let p = &spec.preemption;
    let signal_seconds = match (p.signal_seconds, time_limit_seconds) {
        (Some(s), Some(limit)) if s >= limit => {
            return Err(err("preemption.signal_seconds", format!("the warning comes {s} s before a time limit of {limit} s, i.e. before the job starts"), format!("use fewer than {limit} seconds, or a longer `resources.time`")));
        }
        (Some(s), _) => s,
        // Small limits (tests, debug queues) get the warning halfway instead.
        (None, Some(limit)) => defaults::SIGNAL_SECONDS.min(limit / 2),
        (None, None) => defaults::SIGNAL_SECONDS,
    };
    let preemption = PreemptionPlan {
        signal_seconds,
        requeue: p.requeue.unwrap_or(true),
        max_requeues: p.max_requeues.unwrap_or(defaults::MAX_REQUEUES),
    };
    let slurm = SlurmResources {
        nodes,
        ntasks_per_node,
        gpus_per_node: if overrides.world_size.is_some() {
            0
        } else {
            gpus_per_node
        },
        cpus_per_task,
        mem: res.mem.clone(),
        time: res.time.clone(),
        time_limit_seconds,
        partition: res.partition.clone(),
        account: res.account.clone(),
        qos: res.qos.clone(),
        reservation: res.reservation.clone(),
        constraint: res.constraint.clone(),
        exclusive: res.exclusive.unwrap_or(false),
        extra_sbatch: res.extra_sbatch.clone(),
        setup: res.setup.clone(),
    };

    let train = TrainConfig {
        name: spec.name.clone(),
        model,
        data,
        steps: t.steps,
        seed: t.seed.unwrap_or(defaults::SEED),
        batch: BatchPlan {
            total_batch_size: t.total_batch_size,
            batch_size_per_device: t.batch_size_per_device,
            world_size,
            grad_accum_steps,
        },
        optimizer,
        schedule,
        fsdp,
        checkpoint,
        device,
        threads_per_rank: t.threads_per_rank.unwrap_or(cpus_per_task as usize),
        log_every: t.log_every.unwrap_or(defaults::LOG_EVERY).max(1),
    };

    // --- memory ---------------------------------------------------------------------------
    let num_params = train.model.num_params();
    let group = shard_group_size.unwrap_or(ntasks_per_node);
    let per_strategy: Vec<_> = [
        ShardingStrategy::FullShard,
        ShardingStrategy::ShardGradOp,
        ShardingStrategy::HybridShard,
        ShardingStrategy::NoShard,
    ]
    .into_iter()
    .map(|s| {
        (
            s,
            s.model_state_bytes_per_rank(num_params, world_size, group),
        )
    })
    .collect();
    let bytes_per_rank = strategy.model_state_bytes_per_rank(num_params, world_size, group);
    let gpu_memory_bytes = res.gpu_memory_gb.map(|gb| (gb * GIB) as u64);
    if let Some(limit) = gpu_memory_bytes {
        if device == DeviceKind::Cpu {
            warnings.push(
                "`resources.gpu_memory_gb` is set but the job runs CPU ranks; it is ignored".into(),
            );
        } else if bytes_per_rank > limit {
            let fits: Vec<String> = per_strategy
                .iter()
                .filter(|(_, b)| *b <= limit)
                .map(|(s, _)| yaml_name(s))
                .collect();
            warnings.push(format!(
                "model state needs {:.2} GiB per rank with {} but a GPU has {:.2} GiB: the job will run out of memory. {}",
                bytes_per_rank as f64 / GIB,
                yaml_name(&strategy),
                limit as f64 / GIB,
                if fits.is_empty() { "Use more GPUs or a smaller model.".to_string() } else { format!("Strategies that fit: {}.", fits.join(", ")) }
            ));
        }
    }
    if let Some(threads) = t.threads_per_rank.filter(|&n| n as u64 > cpus_per_task) {
        warnings.push(format!("{threads} threads per rank on {cpus_per_task} CPUs per task will oversubscribe the cores"));
    }

    let tokens_per_step = train.tokens_per_step();
    Ok(ResolvedJob {
        name: spec.name.clone(),
        run_root: spec
            .run_root
            .clone()
            .unwrap_or_else(|| PathBuf::from(defaults::RUN_ROOT)),
        train,
        slurm,
        preemption,
        world_size,
        grad_accum_steps,
        tokens_per_step,
        memory: MemoryEstimate {
            num_params,
            strategy,
            bytes_per_rank,
            per_strategy,
            gpu_memory_bytes,
        },
        warnings,
        overrides: loaded.overrides.iter().map(|o| o.arg.clone()).collect(),
    })
}

/// `total / (per_device × world)`, or an error that lists the nearest totals that divide.
fn batch_split(
    loaded: &LoadedSpec,
    total: u64,
    per_device: u64,
    world: u64,
) -> Result<u64, PlanError> {
    if per_device == 0 {
        return Err(loaded
            .error_at(
                "training.batch_size_per_device",
                "`batch_size_per_device` is 0",
                "use at least 1 sample per device",
            )
            .into());
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
        return Err(loaded
            .error_at(
                "training.total_batch_size",
                format!("total batch {total} does not split into per-device batches of {per_device} on {world} ranks ({total} / {unit} is not a whole number of accumulation steps)"),
                fix,
            )
            .into());
    }
    Ok(total / unit)
}

fn resolve_model(loaded: &LoadedSpec) -> Result<(ModelConfig, u64), PlanError> {
    let t = &loaded.spec.training;
    let data_seq = match &t.data {
        Some(DataSpec::Synthetic { seq_len }) | Some(DataSpec::TokenFile { seq_len, .. }) => {
            *seq_len
        }
        None => None,
    };
    match t.model {
        ModelSpec::Mlp {
            input_dim,
            hidden_dim,
            output_dim,
        } => {
            if input_dim == 0 || hidden_dim == 0 || output_dim == 0 {
                return Err(loaded
                    .error_at(
                        "training.model",
                        "a layer dimension is 0",
                        "use positive `input_dim`, `hidden_dim`, `output_dim`",
                    )
                    .into());
            }
            Ok((
                ModelConfig::Mlp {
                    input_dim,
                    hidden_dim,
                    output_dim,
                },
                1,
            ))
        }
        ModelSpec::Transformer {
            vocab_size,
            dim,
            n_layers,
            n_heads,
            max_seq_len,
        } => {
            if vocab_size == 0 || dim == 0 || n_layers == 0 || n_heads == 0 {
                return Err(loaded
                    .error_at(
                        "training.model",
                        "a transformer dimension is 0",
                        "use positive `vocab_size`, `dim`, `n_layers`, `n_heads`",
                    )
                    .into());
            }
            if dim % n_heads != 0 {
                return Err(loaded
                    .error_at(
                        "training.model.n_heads",
                        format!("dim {dim} is not divisible by {n_heads} heads"),
                        format!("use a number of heads that divides {dim}"),
                    )
                    .into());
            }
            let (max_seq_len, seq_len) = match (max_seq_len, data_seq) {
                (Some(m), Some(s)) => (m, s),
                (Some(m), None) => (m, m),
                (None, Some(s)) => (s, s),
                (None, None) => {
                    return Err(loaded
                        .error_at(
                            "training.model.max_seq_len",
                            "the sequence length is not given",
                            "add `max_seq_len: 256` to the model (or `seq_len` to `training.data`)",
                        )
                        .into());
                }
            };
            if seq_len == 0 || seq_len > max_seq_len {
                return Err(loaded.error_at("training.data.seq_len", format!("seq_len {seq_len} is outside 1..={max_seq_len} (the model's max_seq_len)"), format!("use seq_len ≤ {max_seq_len} or raise max_seq_len")).into());
            }
            Ok((
                ModelConfig::Transformer {
                    vocab_size,
                    dim,
                    n_layers,
                    n_heads,
                    max_seq_len,
                },
                seq_len,
            ))
        }
    }
}

/// Slurm time limits: `M`, `M:S`, `H:M:S`, `D-H`, `D-H:M`, `D-H:M:S` → seconds.
pub fn parse_slurm_time(s: &str) -> Option<u64> {
    let num = |x: &str| -> Option<u64> {
        if x.is_empty() || !x.bytes().all(|b| b.is_ascii_digit()) {
            None
        } else {
            x.parse().ok()
        }
    };
    let (days, rest) = match s.split_once('-') {
        Some((d, rest)) => (Some(num(d)?), rest),
        None => (None, s),
    };
    let parts: Vec<u64> = rest.split(':').map(num).collect::<Option<_>>()?;
    let secs = match (days, parts.as_slice()) {
        (None, [m]) => m * 60,
        (None, [m, s]) => m * 60 + s,
        (None, [h, m, s]) => h * 3600 + m * 60 + s,
        (Some(d), [h]) => d * 86400 + h * 3600,
        (Some(d), [h, m]) => d * 86400 + h * 3600 + m * 60,
        (Some(d), [h, m, s]) => d * 86400 + h * 3600 + m * 60 + s,
        _ => return None,
    };
    (secs > 0).then_some(secs)
}

fn valid_mem(mem: &str) -> bool {
    let digits = mem.trim_end_matches(['K', 'M', 'G', 'T', 'k', 'm', 'g', 't']);
    !digits.is_empty()
        && digits.bytes().all(|b| b.is_ascii_digit())
        && mem.len() - digits.len() <= 1
}

impl ResolvedJob {
    /// The plan as people read it (`shardrun plan`, `plan.txt`).
    pub fn summary(&self) -> String {
        let mut out = String::new();
        let s = &self.slurm;
        let t = &self.train;
        let b = &t.batch;
        let _ = writeln!(out, "job {}", self.name);
        let ranks = if s.gpus_per_node > 0 {
            format!("{} GPU(s)", s.gpus_per_node)
        } else {
            format!("{} CPU rank(s)", s.ntasks_per_node)
        };
        let _ = writeln!(
            out,
            "  ranks          {} = {} node(s) × {ranks}, {} CPU(s) per rank, device {}",
            self.world_size,
            s.nodes,
            s.cpus_per_task,
            yaml_name(&t.device)
        );
        let _ = writeln!(
            out,
            "  batch          {} total = {} per device × {} ranks × {} accumulation step(s)",
            b.total_batch_size, b.batch_size_per_device, b.world_size, b.grad_accum_steps
        );
        let _ = writeln!(out, "  tokens/step    {}", self.tokens_per_step);
        let _ = writeln!(
            out,
            "  steps          {} ({} tokens in all)",
            t.steps,
            self.tokens_per_step * t.steps
        );
        let _ = writeln!(
            out,
            "  model          {}: {} parameters",
            yaml_name(&t.model),
            self.memory.num_params
        );
        let _ = writeln!(out, "  fsdp           {}, wrap {}, params {} / reduce {}, activation checkpointing {}, prefetch {}", yaml_name(&t.fsdp.strategy), yaml_name(&t.fsdp.wrap), yaml_name(&t.fsdp.mixed_precision.param_dtype), yaml_name(&t.fsdp.mixed_precision.reduce_dtype), t.fsdp.activation_checkpointing, t.fsdp.prefetch);
        let _ = writeln!(
            out,
            "  optimizer      AdamW lr {} betas ({}, {}) weight decay {}, warmup {} then {} to ×{}",
            t.optimizer.lr,
            t.optimizer.beta1,
            t.optimizer.beta2,
            t.optimizer.weight_decay,
            t.schedule.warmup_steps,
            yaml_name(&t.schedule.decay),
            t.schedule.min_lr_ratio
        );
        let _ = writeln!(out, "  memory/rank    model state (fp32 params + grads + AdamW moments), activations not included:");
        for (strategy, bytes) in &self.memory.per_strategy {
            let mark = if *strategy == self.memory.strategy {
                "  <- chosen"
            } else {
                ""
            };
            let _ = writeln!(
                out,
                "    {:<14} {:>10.3} GiB{mark}",
                yaml_name(strategy),
                *bytes as f64 / GIB
            );
        }
        if let Some(limit) = self.memory.gpu_memory_bytes {
            let _ = writeln!(out, "    GPU memory     {:>10.3} GiB", limit as f64 / GIB);
        }
        let _ = writeln!(
            out,
            "  checkpoints    {}",
            match &t.checkpoint.dir {
                Some(dir) => {
                    let every: Vec<String> = t
                        .checkpoint
                        .interval_steps
                        .map(|s| format!("{s} steps"))
                        .into_iter()
                        .chain(t.checkpoint.interval_minutes.map(|m| format!("{m} min")))
                        .collect();
                    format!(
                        "{}{} every {}, keep {}{}",
                        dir.display(),
                        if dir.is_relative() {
                            " (in the run directory)"
                        } else {
                            ""
                        },
                        every.join(" or "),
                        t.checkpoint.keep,
                        if t.checkpoint.resume {
                            ""
                        } else {
                            "; never resumes (resume: false)"
                        }
                    )
                }
                None if t.checkpoint.resume => {
                    "no periodic saves; the final and preemption checkpoints go to the run \
                     directory, and a re-run or requeue resumes from them"
                        .into()
                }
                None => "off; never resumes (resume: false)".into(),
            }
        );
        let _ = writeln!(out, "  slurm          time {}, partition {}, USR2 {} s before the limit, requeue {} (max {})", s.time.as_deref().unwrap_or("(partition default)"), s.partition.as_deref().unwrap_or("(default)"), self.preemption.signal_seconds, self.preemption.requeue, self.preemption.max_requeues);
        for w in &self.warnings {
            let _ = writeln!(out, "warning: {w}");
        }
        out
    }
}

/// A value as it is written in the spec (`FULL_SHARD`, `{kind: block}`), for messages.
fn yaml_name<T: Serialize>(value: &T) -> String {
    match serde_json::to_value(value) {
        Ok(serde_json::Value::String(s)) => s,
        Ok(other) => other
            .to_string()
            .replace('"', "")
            .replace(':', ": ")
            .replace(',', ", "),
        Err(_) => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::parse;
    use std::path::Path;

    fn job(extra_resources: &str, total: u64, per_device: u64) -> Result<ResolvedJob, PlanError> {
        let yaml = format!(
            "name: t\nresources:\n  tasks_per_node: 2\n{extra_resources}training:\n  model: {{ kind: transformer, vocab_size: 128, dim: 32, n_layers: 2, n_heads: 4, max_seq_len: 16 }}\n  steps: 10\n  total_batch_size: {total}\n  batch_size_per_device: {per_device}\n"
        );
        let loaded = parse(&yaml, Path::new("job.yaml")).expect("parses");
        resolve(&loaded, &Overrides::default())
    }

    #[test]
    fn accumulation_and_tokens() {
        let j = job("", 32, 4).unwrap();
        assert_eq!(
            (j.world_size, j.grad_accum_steps, j.tokens_per_step),
            (2, 4, 32 * 16)
        );
        assert_eq!(j.train.batch.grad_accum_steps, 4);
        assert_eq!(j.train.threads_per_rank, 1);
    }

    #[test]
    fn split_that_does_not_divide_shows_nearest_totals() {
        let PlanError::Invalid(err) = job("", 20, 8).unwrap_err();
        assert_eq!(err.field, "training.total_batch_size");
        assert_eq!(err.line, Some(7));
        assert!(err.fix.contains("nearest 16 or 32"), "{err}");
        assert!(err.fix.contains("[1, 2, 5, 10]"), "{err}");
    }

    #[test]
    fn zero_total_or_per_device_is_an_error() {
        let PlanError::Invalid(err) = job("", 0, 8).unwrap_err();
        assert!(err.fix.contains("nearest 16"), "{err}");
        let PlanError::Invalid(err) = job("", 16, 0).unwrap_err();
        assert_eq!(err.field, "training.batch_size_per_device");
    }

    #[test]
    fn gpu_world_is_nodes_times_gpus_and_local_override_wins() {
        let j = job("  nodes: 2\n  gpus_per_node: 4\n", 64, 2).unwrap_err();
        // tasks_per_node: 2 with 4 GPUs per node is refused: one rank per GPU.
        let PlanError::Invalid(err) = j;
        assert_eq!(err.field, "resources.tasks_per_node");
        let yaml = "name: t\nresources:\n  nodes: 2\n  gpus_per_node: 4\ntraining:\n  model: { kind: mlp, input_dim: 4, hidden_dim: 8, output_dim: 4 }\n  steps: 1\n  total_batch_size: 64\n  batch_size_per_device: 2\n";
        let loaded = parse(yaml, Path::new("job.yaml")).unwrap();
        let j = resolve(&loaded, &Overrides::default()).unwrap();
        assert_eq!(
            (j.world_size, j.grad_accum_steps, j.train.device),
            (8, 4, DeviceKind::Cuda)
        );
        let local = resolve(
            &loaded,
            &Overrides {
                world_size: Some(2),
                device: Some(DeviceKind::Cpu),
            },
        )
        .unwrap();
        assert_eq!(
            (local.world_size, local.grad_accum_steps, local.train.device),
            (2, 16, DeviceKind::Cpu)
        );
    }

    #[test]
    fn warns_when_model_state_does_not_fit_the_gpu() {
        let yaml = "name: t\nresources:\n  gpus_per_node: 2\n  gpu_memory_gb: 0.001\ntraining:\n  model: { kind: mlp, input_dim: 1024, hidden_dim: 1024, output_dim: 1024 }\n  steps: 1\n  total_batch_size: 2\n  batch_size_per_device: 1\n";
        let j = resolve(
            &parse(yaml, Path::new("j.yaml")).unwrap(),
            &Overrides::default(),
        )
        .unwrap();
        assert_eq!(
            j.memory.bytes_per_rank,
            ShardingStrategy::FullShard.model_state_bytes_per_rank(j.memory.num_params, 2, 2)
        );
        assert!(
            j.warnings
                .iter()
                .any(|w| w.contains("will run out of memory")),
            "{:?}",
            j.warnings
        );
        assert!(j.summary().contains("warning: model state needs"));
    }

    #[test]
    fn slurm_time_formats() {
        assert_eq!(parse_slurm_time("30"), Some(1800));
        assert_eq!(parse_slurm_time("01:30"), Some(90));
        assert_eq!(parse_slurm_time("02:00:00"), Some(7200));
        assert_eq!(parse_slurm_time("1-00:00:00"), Some(86400));
        assert_eq!(parse_slurm_time("1-2"), Some(93600));
        assert_eq!(parse_slurm_time("two hours"), None);
        assert_eq!(parse_slurm_time("0"), None);
    }

    #[test]
    fn signal_after_the_time_limit_is_an_error() {
        let yaml = "name: t\nresources:\n  time: \"00:01:00\"\npreemption:\n  signal_seconds: 120\ntraining:\n  model: { kind: mlp, input_dim: 4, hidden_dim: 8, output_dim: 4 }\n  steps: 1\n  total_batch_size: 2\n  batch_size_per_device: 2\n";
        let loaded = parse(yaml, Path::new("j.yaml")).unwrap();
        let PlanError::Invalid(err) = resolve(&loaded, &Overrides::default()).unwrap_err();
        assert_eq!(err.field, "preemption.signal_seconds");
        assert_eq!(err.line, Some(5));
        // Without an explicit value the warning moves to half the limit.
        let loaded = parse(
            &yaml.replace("  signal_seconds: 120\n", "  requeue: false\n"),
            Path::new("j.yaml"),
        )
        .unwrap();
        let j = resolve(&loaded, &Overrides::default()).unwrap();
        assert_eq!(
            (j.preemption.signal_seconds, j.preemption.requeue),
            (30, false)
        );
    }
}
