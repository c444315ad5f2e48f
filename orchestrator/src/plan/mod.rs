//! From a parsed job spec to a fully explicit [`ResolvedJob`]: defaults applied, the batch
//! split checked (`total = per_device × world × accum`, never rounded), Slurm resources and
//! the memory estimate computed. Pure: no I/O, so `plan`, `render`, `submit`, `sweep` and
//! local `run` all see the same numbers.
//!
//! One module per section of the spec, each a function from the spec (and what earlier
//! sections decided) to its part of the resolved job, with errors located in the spec file:
//! [`ranks`], [`batch`], [`model`], [`data`], [`optimizer`], [`fsdp`], [`checkpoint`],
//! [`slurm`], [`memory`]; [`summary`] prints the result for people.

mod batch;
mod checkpoint;
mod data;
mod fsdp;
mod memory;
mod model;
mod optimizer;
mod ranks;
mod slurm;
mod summary;

pub use slurm::parse_slurm_time;

use crate::spec::{JobSpec, LoadedSpec, SpecError};
use serde::{Deserialize, Serialize};
use shardrun_protocol::config::{BatchPlan, DeviceKind, ShardingStrategy};
use shardrun_protocol::TrainConfig;
use std::path::{Path, PathBuf};

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
    /// Tokenized data, under the run root (shared by every run and sweep point there).
    pub const DATA_CACHE_DIR: &str = "data-cache";
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
    #[error(transparent)]
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
}

const GIB: f64 = (1u64 << 30) as f64;

/// The spec being resolved, with the error helper every section uses.
pub(crate) struct Section<'a> {
    loaded: &'a LoadedSpec,
}

impl Section<'_> {
    fn spec(&self) -> &JobSpec {
        &self.loaded.spec
    }

    /// An error about `field` (dotted path), located in the spec file.
    fn err(&self, field: &str, why: impl Into<String>, fix: impl Into<String>) -> PlanError {
        PlanError::from(self.loaded.error_at(field, why, fix))
    }

    /// Workers run in the run directory: a relative path in the spec is relative to the
    /// spec file, made absolute here.
    fn spec_relative(&self, path: &Path) -> PathBuf {
        let base = self.loaded.path.parent().unwrap_or(Path::new("."));
        std::path::absolute(base.join(path)).unwrap_or_else(|_| path.to_path_buf())
    }
}

/// Apply defaults and check everything that parsing alone cannot, section by section.
pub fn resolve(loaded: &LoadedSpec, overrides: &Overrides) -> Result<ResolvedJob, PlanError> {
    let s = Section { loaded };
    let spec = &loaded.spec;
    let t = &spec.training;
    let mut warnings = Vec::new();

    let ranks = ranks::resolve_ranks(&s, overrides)?;
    let grad_accum_steps = batch::batch_split(
        &s,
        t.total_batch_size,
        t.batch_size_per_device,
        ranks.world_size,
    )?;
    let (model, seq_len) = model::resolve_model(&s)?;
    // No model kind has a folder of its own yet to take the tokenizer from.
    let data = data::resolve_data(&s, &model, seq_len, None)?;
    if t.steps == 0 {
        return Err(s.err(
            "training.steps",
            "`steps` is 0",
            "train for at least 1 step",
        ));
    }
    let optimizer = optimizer::resolve_optimizer(&s)?;
    let schedule = optimizer::resolve_schedule(&s)?;
    let fsdp = fsdp::resolve_fsdp(&s, &ranks, &model, &mut warnings)?;
    let checkpoint = checkpoint::resolve_checkpoint(&s)?;
    let slurm = slurm::resolve_slurm(&s, &ranks, overrides)?;
    let preemption = slurm::resolve_preemption(&s, slurm.time_limit_seconds)?;

    let train = TrainConfig {
        name: spec.name.clone(),
        model,
        data,
        steps: t.steps,
        seed: t.seed.unwrap_or(defaults::SEED),
        batch: BatchPlan {
            total_batch_size: t.total_batch_size,
            batch_size_per_device: t.batch_size_per_device,
            world_size: ranks.world_size,
            grad_accum_steps,
        },
        optimizer,
        schedule,
        checkpoint,
        device: ranks.device,
        threads_per_rank: t.threads_per_rank.unwrap_or(ranks.cpus_per_task as usize),
        log_every: t.log_every.unwrap_or(defaults::LOG_EVERY).max(1),
        fsdp,
    };

    let memory = memory::estimate_memory(
        &memory::MemoryInputs {
            num_params: train.model.num_params(),
            strategy: train.fsdp.strategy,
            world_size: ranks.world_size,
            shard_group: train.fsdp.shard_group_size.unwrap_or(ranks.ntasks_per_node),
            device: ranks.device,
            gpu_memory_gb: spec.resources.gpu_memory_gb,
        },
        &mut warnings,
    );
    if let Some(threads) = t
        .threads_per_rank
        .filter(|&n| n as u64 > ranks.cpus_per_task)
    {
        warnings.push(format!(
            "{threads} threads per rank on {} CPUs per task will oversubscribe the cores",
            ranks.cpus_per_task
        ));
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
        world_size: ranks.world_size,
        grad_accum_steps,
        tokens_per_step,
        memory,
        warnings,
    })
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
