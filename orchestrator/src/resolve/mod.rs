//! From a parsed job spec to a fully explicit [`ResolvedJob`]: defaults applied, the batch
//! split checked (`total = per_device × world × accum`, never rounded), Slurm resources and
//! the memory estimate computed, so `plan`, `render`, `submit`, `sweep` and local `run` all
//! see the same numbers. What the spec names on disk is looked at, never trained on: a Hugging
//! Face folder's config and weight headers, the data files and tokenizer.
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
pub(crate) mod summary;

pub(crate) use ranks::{all_ranks_words, ranks_words};
pub use slurm::{parse_slurm_time, slurm_duration};

use crate::spec::{JobSpec, LoadedSpec, SpecError};
use serde::{Deserialize, Serialize};
use shardrun_protocol::config::{BatchPlan, DeviceKind, ModelConfig, ShardingStrategy};
use shardrun_protocol::footprint::Footprint;
use shardrun_protocol::TrainConfig;
use std::path::{Path, PathBuf};

/// Tokens one micro-batch may hold on a device (2^32): far past any device's memory, and
/// within what its sizes are counted in.
const MAX_MICRO_BATCH_TOKENS: u64 = 1 << 32;

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

/// The folder run directories go under: the spec's `run_root`, else the default (both
/// relative to the directory `shardrun` is started from, when relative).
pub fn run_root(spec: &JobSpec) -> PathBuf {
    spec.run_root.clone().unwrap_or_else(default_run_root)
}

/// Where run directories go when no spec names a run root: [`defaults::RUN_ROOT`].
pub fn default_run_root() -> PathBuf {
    PathBuf::from(defaults::RUN_ROOT)
}

/// What the caller decides instead of the spec.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Overrides {
    /// Local mode: run this many ranks on one node (CPU ranks or local GPUs) whatever the
    /// spec's `resources` say.
    pub world_size: Option<u64>,
    /// Local mode: force the device kind (e.g. CPU on a machine without GPUs).
    pub device: Option<DeviceKind>,
    /// Plan the job even when its peak memory per rank exceeds the GPU's (`--force`).
    pub force: bool,
    /// The job continues a run already in its run directory (a re-run without `--force`),
    /// whose total batch cannot change: a batch that does not split on the ranks asked for
    /// is answered with the numbers of ranks it splits on.
    pub continues_run: bool,
    /// That run has a checkpoint to resume from, which holds every parameter: a pretrained
    /// folder whose weights no longer open (deleted, moved) is then a warning, not an error.
    pub resumes_from_checkpoint: bool,
    /// `NCCL_*` variables of the shell that submits or runs the job: every rank gets them
    /// unless the spec's `resources.env` or the job's own environment sets them otherwise, so
    /// NCCL settings reach the ranks even where Slurm does not export the submitting
    /// environment.
    pub submitting_env: Vec<(String, String)>,
    /// A sweep point: the dotted paths the sweep gives values, which, like `--set`, are what
    /// an error the spec's other values take part in is blamed on.
    pub swept: Vec<String>,
}

impl Overrides {
    /// No override, and the `NCCL_*` variables of this process's environment.
    pub fn submitting() -> Overrides {
        Overrides {
            submitting_env: nccl_variables(std::env::vars()),
            ..Overrides::default()
        }
    }
}

/// The `NCCL_*` variables among `vars`, sorted by name.
pub fn nccl_variables(vars: impl IntoIterator<Item = (String, String)>) -> Vec<(String, String)> {
    let mut found: Vec<_> = vars
        .into_iter()
        .filter(|(k, _)| k.starts_with("NCCL_"))
        .collect();
    found.sort();
    found
}

#[derive(Debug, thiserror::Error)]
pub enum ResolveError {
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
    /// `--gres=gpu:<type>:<count>`'s type, where the spec names one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_type: Option<String>,
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
    /// Variables every rank gets (the controller sets them for each worker): the spec's
    /// `resources.env` and the submitting shell's `NCCL_*`, sorted by name.
    #[serde(default)]
    pub env: Vec<(String, String)>,
    /// Those of `env` that came from the submitting shell, not the spec: the job's own
    /// environment on the compute node (its set-up lines, modules) overrides them. Absent
    /// from run directories made before it existed, whose `env` is applied as it is.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub from_shell: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PreemptionPlan {
    /// `--signal=B:USR2@<seconds>`.
    pub signal_seconds: u64,
    pub requeue: bool,
    pub max_requeues: u32,
}

/// Peak memory per rank as [`memory`] models it, for the chosen strategy and every other.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MemoryEstimate {
    pub num_params: u64,
    pub strategy: ShardingStrategy,
    pub chosen: StrategyMemory,
    /// Every strategy, to compare.
    pub per_strategy: Vec<StrategyMemory>,
    /// Memory of one GPU (`resources.gpu_memory_gb`) for GPU jobs.
    pub gpu_memory_bytes: Option<u64>,
}

/// One strategy's peak memory per rank and what it is made of at that moment.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StrategyMemory {
    pub strategy: ShardingStrategy,
    pub peak: u64,
    pub at_peak: MemoryParts,
}

/// Bytes per rank at one moment of a step.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoryParts {
    /// fp32 parameter, gradient and AdamW shards (and NO_SHARD's low-precision copy).
    pub state: u64,
    /// Unsharded parameters gathered for compute.
    pub gathered: u64,
    /// Unsharded gradients and reduce-scatters in flight.
    pub gradients: u64,
    /// Activations kept for backward, the running segment's temporaries and the batch.
    pub activations: u64,
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
    /// `--nproc N`: the ranks on this machine that took the place of the spec's resources
    /// (`slurm` then holds one node of N ranks).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nproc: Option<u64>,
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

    /// Whether a `--set` argument gave `field` (or a section holding it).
    fn overridden(&self, field: &str) -> bool {
        self.loaded.overrides.iter().any(|o| o.covers(field))
    }

    /// Whether `field` was given by a `--set` argument or, for a sweep point, by the sweep.
    fn chosen(&self, field: &str, overrides: &Overrides) -> bool {
        self.overridden(field)
            || overrides
                .swept
                .iter()
                .any(|path| crate::spec::overrides::within(field, path))
    }

    /// An error about `field` (dotted path), located in the spec file.
    fn err(&self, field: &str, why: impl Into<String>, fix: impl Into<String>) -> ResolveError {
        ResolveError::from(self.loaded.error_at(field, why, fix))
    }

    /// Workers run in the run directory: a relative path in the spec is relative to the
    /// spec file, made absolute here.
    fn spec_relative(&self, path: &Path) -> PathBuf {
        let joined = self.loaded.base_dir.join(path);
        std::path::absolute(&joined).unwrap_or(joined)
    }
}

/// Apply defaults and check everything that parsing alone cannot, section by section.
pub fn resolve(loaded: &LoadedSpec, overrides: &Overrides) -> Result<ResolvedJob, ResolveError> {
    resolve_with(loaded, overrides, &mut Lookups::default())
}

/// What resolving many jobs (a sweep's points) works out once and reuses: model footprints,
/// and what the data's paths hold on disk.
#[derive(Default)]
pub struct Lookups {
    footprints: Footprints,
    on_disk: data::OnDisk,
}

/// Model footprints already built, kept for resolving many jobs of a few models: describing
/// a model, every parameter by name, is most of a point's planning.
#[derive(Default)]
struct Footprints {
    built: Vec<(ModelConfig, u64, Footprint)>,
}

impl Footprints {
    /// Models kept at once; a sweep over more model shapes describes some again.
    const KEPT: usize = 8;

    fn of(&mut self, model: &ModelConfig, compute_bytes: u64) -> &Footprint {
        let found = self
            .built
            .iter()
            .position(|(m, bytes, _)| *bytes == compute_bytes && m == model);
        let index = match found {
            Some(index) => index,
            None => {
                if self.built.len() == Self::KEPT {
                    self.built.remove(0);
                }
                let footprint = model.footprint(compute_bytes);
                self.built.push((model.clone(), compute_bytes, footprint));
                self.built.len() - 1
            }
        };
        &self.built[index].2
    }
}

/// The spec's paths are taken as written, as no shell reads them: a `~` or `$HOME` would name
/// a folder called `~` or `$HOME` below the current one. Refused, with the path meant.
fn paths_as_written(s: &Section) -> Result<(), ResolveError> {
    let spec = s.spec();
    let t = &spec.training;
    let data = t.data.as_ref();
    let checkpoint = t.checkpoint.as_ref();
    let model_path = match &t.model {
        crate::spec::ModelSpec::Hf { path } => Some(path),
        _ => None,
    };
    let mut paths: Vec<(&str, Option<&PathBuf>)> = vec![
        ("run_root", spec.run_root.as_ref()),
        ("training.model.path", model_path),
        (
            "training.data.chat_template",
            data.and_then(|d| d.chat_template.as_ref()),
        ),
        (
            "training.data.cache_dir",
            data.and_then(|d| d.cache_dir.as_ref()),
        ),
        (
            "training.data.tokenizer.path",
            data.and_then(|d| d.tokenizer.as_ref()?.path.as_ref()),
        ),
        (
            "training.checkpoint.dir",
            checkpoint.and_then(|c| c.dir.as_ref()),
        ),
        (
            "training.checkpoint.from",
            checkpoint.and_then(|c| c.from.as_ref()),
        ),
    ];
    let files = data.and_then(|d| d.files.as_ref());
    paths.extend(
        files
            .into_iter()
            .flatten()
            .map(|f| ("training.data.files", Some(f))),
    );
    let held_out = data.and_then(|d| d.validation.as_ref()?.files.as_ref());
    paths.extend(
        held_out
            .into_iter()
            .flatten()
            .map(|f| ("training.data.validation.files", Some(f))),
    );
    for (field, path) in paths {
        let Some(path) = path else { continue };
        let text = path.to_string_lossy();
        if let Some(meant) = shell_expanded(&text) {
            return Err(s.err(
                field,
                format!("`{text}` would be read as written: nothing expands `~` or `$` variables in a spec"),
                format!("write the path itself: `{meant}`"),
            ));
        }
    }
    Ok(())
}

/// What a shell would make of `path` (`~/x`, `$HOME/x`, `${SCRATCH}/x`), when it would
/// change it.
fn shell_expanded(path: &str) -> Option<String> {
    let home = || std::env::var("HOME").unwrap_or_else(|_| "~".into());
    let mut out = match path.strip_prefix('~') {
        Some(rest) if rest.is_empty() || rest.starts_with('/') => format!("{}{rest}", home()),
        _ => path.to_string(),
    };
    let mut changed = out != path;
    // Left to right, past each value put in (which may hold a `$` of its own).
    let mut from = 0;
    while let Some(at) = out[from..].find('$').map(|i| from + i) {
        let rest = &out[at + 1..];
        let (name, len) = match rest.strip_prefix('{') {
            Some(braced) => {
                let end = braced.find('}')?;
                (&braced[..end], end + 2)
            }
            None => {
                let end = rest
                    .find(|c: char| !(c == '_' || c.is_ascii_alphanumeric()))
                    .unwrap_or(rest.len());
                (&rest[..end], end)
            }
        };
        if name.is_empty() || name.starts_with(|c: char| c.is_ascii_digit()) {
            break;
        }
        let value = std::env::var(name).unwrap_or_else(|_| format!("<{name} is not set>"));
        out = format!("{}{value}{}", &out[..at], &out[at + 1 + len..]);
        from = at + value.len();
        changed = true;
    }
    changed.then_some(out)
}

/// [`resolve`], taking what was worked out already from `lookups` and keeping what is new
/// there.
pub fn resolve_with(
    loaded: &LoadedSpec,
    overrides: &Overrides,
    lookups: &mut Lookups,
) -> Result<ResolvedJob, ResolveError> {
    let s = Section { loaded };
    let spec = &loaded.spec;
    let t = &spec.training;
    let mut warnings = Vec::new();

    paths_as_written(&s)?;
    if let Some(gb) = spec
        .resources
        .gpu_memory_gb
        .filter(|gb| gb.partial_cmp(&0.0) != Some(std::cmp::Ordering::Greater))
    {
        return Err(s.err(
            "resources.gpu_memory_gb",
            format!("`gpu_memory_gb` is {gb}; a GPU's memory is above 0"),
            "write each GPU's whole memory in GiB (80 for an A100 or H100 80GB), or leave it out",
        ));
    }
    let ranks = ranks::resolve_ranks(&s, overrides)?;
    let grad_accum_steps = batch::batch_split(
        &s,
        t.total_batch_size,
        t.batch_size_per_device,
        ranks.world_size,
        overrides,
    )?;
    // A run that resumes its own checkpoint does not read a pretrained folder's weights.
    let resumes = t.checkpoint.as_ref().and_then(|c| c.resume) != Some(false);
    let weights = if overrides.resumes_from_checkpoint && resumes {
        model::Weights::ResumingPastThem
    } else {
        model::Weights::Needed
    };
    let (mut model, seq_len) = model::resolve_model(&s, weights, &mut warnings)?;
    if t.steps == 0 {
        return Err(s.err(
            "training.steps",
            "`steps` is 0",
            "train for at least 1 step",
        ));
    }
    if t.log_every == Some(0) {
        return Err(s.err(
            "training.log_every",
            "`log_every` is 0",
            "log every N ≥ 1 steps, or leave it out to log every step",
        ));
    }
    let optimizer = optimizer::resolve_optimizer(&s)?;
    let schedule = optimizer::resolve_schedule(&s)?;
    let fsdp = fsdp::resolve_fsdp(&s, &ranks, &model, &mut warnings)?;
    let mut checkpoint = checkpoint::resolve_checkpoint(&s)?;
    // An HF folder as `checkpoint.from` is where the model's weights start, not a checkpoint.
    if model::resolve_pretrained_from(
        &s,
        &mut model,
        checkpoint.from.as_deref(),
        seq_len,
        weights,
        &mut warnings,
    )?
    .is_some()
    {
        checkpoint.from = None;
    }
    // Text data takes its tokenizer from the Hugging Face folder the weights come from.
    let data = data::resolve_data(
        &s,
        &model,
        seq_len,
        model.pretrained_folder(),
        &mut lookups.on_disk,
        &mut warnings,
    )?;
    let slurm = slurm::resolve_slurm(&s, &ranks, overrides, &mut warnings)?;
    let preemption = slurm::resolve_preemption(&s, slurm.time_limit_seconds, &mut warnings)?;

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
        log_every: t.log_every.unwrap_or(defaults::LOG_EVERY),
        on_divergence: t.on_divergence.unwrap_or_default(),
        fsdp,
    };

    let footprint = lookups.footprints.of(
        &train.model,
        train.fsdp.mixed_precision.param_dtype.size_bytes(),
    );
    let layout = memory::ModelLayout::new(footprint, &train.fsdp.wrap);
    fsdp::check_wrap_patterns(&s, &layout, &train.fsdp.wrap)?;
    fsdp::warn_about_memory_options(&train.model, &layout, &train.fsdp, &mut warnings);
    let memory = memory::estimate_memory(
        &memory::MemoryInputs {
            footprint,
            layout: &layout,
            fsdp: &train.fsdp,
            world_size: ranks.world_size,
            shard_group: train.fsdp.shard_group_size.unwrap_or(ranks.ntasks_per_node),
            tokens_per_micro_batch: train.tokens_per_micro_batch(),
            loss_chunk_tokens: train.loss_chunk_tokens(),
            grad_accum_steps,
            device: ranks.device,
            gpu_memory_gb: spec.resources.gpu_memory_gb,
            attention_mask_bytes: memory::DocumentAttention::of(&train)
                .map_or(0, memory::DocumentAttention::held_bytes),
        },
        &mut warnings,
    );
    if let Some((why, fix)) = memory.does_not_fit(&train) {
        if !overrides.force {
            return Err(s.err("resources.gpu_memory_gb", why, fix));
        }
        warnings.push(format!("{why}: planned anyway (--force)"));
    }
    warnings.extend(memory.tight_fit());
    if ranks.device == DeviceKind::Cpu {
        // `0` asks for all of the node's memory: nothing to check against.
        let limit = (spec.resources.mem.as_deref())
            .and_then(crate::slurm::parse_memory_size)
            .filter(|&megabytes| megabytes > 0)
            .map(|megabytes| megabytes << 20);
        warnings
            .extend(limit.and_then(|limit| memory.over_host_limit(ranks.ntasks_per_node, limit)));
    }
    if let Some(threads) = t
        .threads_per_rank
        .filter(|&n| n as u64 > ranks.cpus_per_task)
    {
        warnings.push(format!(
            "{threads} threads per rank on {} CPUs per task will oversubscribe the cores",
            ranks.cpus_per_task
        ));
    }

    // The tokens a run trains are counted in u64, and a micro-batch is one tensor.
    let seq_len = train.data.sequence_length(&train.model);
    if t.batch_size_per_device.saturating_mul(seq_len) > MAX_MICRO_BATCH_TOKENS {
        return Err(s.err(
            "training.batch_size_per_device",
            format!(
                "a micro-batch of {} samples × {seq_len} tokens is more than the \
                 {MAX_MICRO_BATCH_TOKENS} tokens one device can hold",
                t.batch_size_per_device
            ),
            "lower `batch_size_per_device`; gradient accumulation makes up the total batch",
        ));
    }
    let tokens_per_step = train.batch.total_batch_size.saturating_mul(seq_len);
    if tokens_per_step.checked_mul(t.steps).is_none() {
        return Err(s.err(
            "training.steps",
            format!(
                "{} steps of {} samples × {seq_len} tokens are more tokens than a run counts \
                 (2^64)",
                t.steps, t.total_batch_size
            ),
            "lower `steps` or `total_batch_size`",
        ));
    }
    Ok(ResolvedJob {
        name: spec.name.clone(),
        run_root: run_root(spec),
        train,
        slurm,
        preemption,
        world_size: ranks.world_size,
        grad_accum_steps,
        tokens_per_step,
        memory,
        warnings,
        overrides: loaded.overrides.iter().map(|o| o.arg.clone()).collect(),
        nproc: overrides.world_size,
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

    fn job(
        extra_resources: &str,
        total: u64,
        per_device: u64,
    ) -> Result<ResolvedJob, ResolveError> {
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
    fn a_time_limit_of_unlimited_is_slurms_and_has_no_notice_of_its_end() {
        for written in ["UNLIMITED", "unlimited", "INFINITE"] {
            let j = job(&format!("  time: {written}\n"), 32, 4).unwrap();
            assert_eq!(j.slurm.time.as_deref(), Some(written));
            assert_eq!(j.slurm.time_limit_seconds, None);
            assert!(
                j.summary().contains(&format!(
                    "time {written}, partition (default), USR2 on preemption (no time limit)"
                )),
                "{}",
                j.summary()
            );
        }
        let refused = job("  time: forever\n", 32, 4).unwrap_err().to_string();
        assert!(refused.contains("or `UNLIMITED`"), "{refused}");
    }

    #[test]
    fn extra_sbatch_options_sbatch_would_refuse_with_the_plans_are_refused() {
        let refused = |extra: &str| {
            job(
                &format!("  mem: 64G\n  extra_sbatch: [\"{extra}\"]\n"),
                32,
                4,
            )
            .err()
            .map(|e| e.to_string())
        };
        let said = refused("--mem-per-gpu=80G").expect("refused");
        assert!(
            said.contains(
                "entry 0 `--mem-per-gpu=80G` asks for memory by --mem-per-gpu, and \
                 `resources.mem: 64G` asks for it by node (--mem)"
            ) && said.contains("keep one: remove `resources.mem`, or this entry"),
            "{said}"
        );
        assert!(refused("--mem-per-cpu 4G").is_some());
        for gpus in ["--gpus-per-task=1", "--ntasks-per-gpu=1"] {
            assert!(
                refused(gpus).is_some_and(|e| e.contains("which shardrun writes itself")),
                "{gpus}"
            );
        }
        // Memory by the GPU, with no memory by the node, is the user's to ask for.
        let by_gpu = "  extra_sbatch: [\"--mem-per-gpu=80G\"]\n";
        assert!(job(by_gpu, 32, 4).is_ok());
        // ... but not by the GPU and by the CPU at once.
        let both =
            "  extra_sbatch: [\"--mem-per-gpu=80G\", \"--mail-type=END\", \"--mem-per-cpu 4G\"]\n";
        let said = job(both, 32, 4).unwrap_err().to_string();
        assert!(
            said.contains(
                "entry 2 `--mem-per-cpu 4G` asks for memory by --mem-per-cpu, and entry 0 \
                 `--mem-per-gpu=80G` by --mem-per-gpu: sbatch refuses a job with both"
            ) && said.contains("keep one of the two entries"),
            "{said}"
        );
        let twice = "  extra_sbatch: [\"--mem-per-gpu=80G\", \"--mem-per-gpu=90G\"]\n";
        assert!(
            job(twice, 32, 4).is_ok(),
            "sbatch takes the last of one option"
        );
        assert_eq!(refused("--mail-type=END"), None);
    }

    #[test]
    fn a_memory_size_written_with_gb_is_read_as_sbatch_reads_it() {
        let j = job("  mem: 200GB\n", 32, 4).unwrap();
        assert_eq!(
            j.slurm.mem.as_deref(),
            Some("200G"),
            "the script has Slurm's form"
        );
        let refused = job("  mem: 200 GiB\n", 32, 4).unwrap_err().to_string();
        assert!(refused.contains("is not a Slurm memory size"), "{refused}");
    }

    #[test]
    fn cpu_ranks_that_need_more_than_resources_mem_are_warned_of() {
        let over = |mem: &str| {
            job(&format!("  mem: \"{mem}\"\n"), 32, 4)
                .unwrap()
                .warnings
                .into_iter()
                .find(|w| w.contains("Slurm's memory limit would kill the job"))
        };
        // Two ranks of about 0.4 GiB each (libtorch) and a tiny model: 700M is too little.
        let said = over("700M").expect("warned");
        assert!(
            said.starts_with("the CPU ranks of a node need about 0.8 GiB (2 × (peak ")
                && said.contains("more than `resources.mem` gives the node (0.7 GiB)")
                && said.contains("raise `resources.mem`"),
            "{said}"
        );
        assert_eq!(over("2G"), None);
        assert_eq!(over("0"), None, "0 asks for all of the node's memory");
        assert_eq!(
            crate::slurm::parse_memory_size("512"),
            Some(512),
            "megabytes by default"
        );
        assert_eq!(crate::slurm::parse_memory_size("1t"), Some(1 << 20));
    }

    #[test]
    fn split_that_does_not_divide_shows_nearest_totals() {
        let ResolveError::Invalid(err) = job("", 20, 8).unwrap_err();
        assert_eq!(err.field, "training.total_batch_size");
        assert_eq!(err.line, Some(7));
        assert!(err.fix.contains("nearest 16 or 32"), "{err}");
        assert!(
            err.fix
                .contains("use a `batch_size_per_device` of 1, 2, 5 or 10"),
            "{err}"
        );
    }

    #[test]
    fn a_bad_eps_or_weight_decay_is_named_at_its_own_key() {
        let refused = |optimizer: &str| {
            let yaml = format!(
                "name: t\ntraining:\n  model: {{ kind: mlp, input_dim: 4, hidden_dim: 8, \
                 output_dim: 4 }}\n  steps: 1\n  total_batch_size: 4\n  \
                 batch_size_per_device: 4\n  optimizer:\n{optimizer}"
            );
            let loaded = parse(&yaml, Path::new("job.yaml")).unwrap();
            let ResolveError::Invalid(e) = resolve(&loaded, &Overrides::default()).unwrap_err();
            (e.field.clone(), e.line, e.why.clone())
        };
        assert_eq!(
            refused("    eps: 1.0e-8\n    weight_decay: -0.5\n"),
            (
                "training.optimizer.weight_decay".into(),
                Some(9),
                "`weight_decay` is -0.5; it must be 0 or more".into()
            )
        );
        assert_eq!(
            refused("    eps: 0\n").0,
            "training.optimizer.eps".to_string()
        );
    }

    #[test]
    fn a_gpu_without_memory_and_a_model_folder_that_is_a_file_are_named() {
        let refused = |resources: &str, model: &str| {
            let yaml = format!(
                "name: t\nresources: {resources}\ntraining:\n  model: {model}\n  steps: 1\n  \
                 total_batch_size: 4\n  batch_size_per_device: 4\n"
            );
            let loaded = parse(&yaml, Path::new("/nowhere/job.yaml")).unwrap();
            let ResolveError::Invalid(e) = resolve(&loaded, &Overrides::default()).unwrap_err();
            (e.field.clone(), e.why.clone())
        };
        let mlp = "{ kind: mlp, input_dim: 4, hidden_dim: 8, output_dim: 4 }";
        assert_eq!(
            refused("{ gpus_per_node: 1, gpu_memory_gb: -1 }", mlp),
            (
                "resources.gpu_memory_gb".into(),
                "`gpu_memory_gb` is -1; a GPU's memory is above 0".into()
            )
        );
        assert_eq!(
            refused("{ gpus_per_node: 1, gpu_type: \"gpu:h100\" }", mlp),
            (
                "resources.gpu_type".into(),
                "`gpu:h100` is not a GPU type as Slurm's GRES names one".into()
            )
        );
        assert_eq!(
            refused("{ gpu_type: h100 }", mlp),
            (
                "resources.gpu_type".into(),
                "a GPU type (`h100`) for a job of CPU ranks".into()
            )
        );
        assert_eq!(
            refused("{}", "{ kind: hf, path: /etc/hostname }"),
            (
                "training.model.path".into(),
                "/etc/hostname is a file, not a model folder".into()
            )
        );
    }

    #[test]
    fn paths_a_shell_would_expand_are_refused_with_the_path_meant() {
        let home = std::env::var("HOME").unwrap();
        assert_eq!(shell_expanded("~/runs"), Some(format!("{home}/runs")));
        assert_eq!(shell_expanded("$HOME/runs"), Some(format!("{home}/runs")));
        assert_eq!(
            shell_expanded("${HOME}/a/${HOME}"),
            Some(format!("{home}/a/{home}"))
        );
        assert_eq!(
            shell_expanded("/x/$SHARDRUN_TEST_NEVER_SET/y"),
            Some("/x/<SHARDRUN_TEST_NEVER_SET is not set>/y".into())
        );
        for as_written in ["runs", "/a/b~c", "~user/x", "/cost/$5", "a$"] {
            assert_eq!(shell_expanded(as_written), None, "{as_written}");
        }
        let yaml = "name: t\nrun_root: ~/runs\ntraining:\n  model: { kind: mlp, input_dim: 4, \
                    hidden_dim: 8, output_dim: 4 }\n  steps: 1\n  total_batch_size: 4\n  \
                    batch_size_per_device: 4\n";
        let loaded = parse(yaml, Path::new("job.yaml")).unwrap();
        let ResolveError::Invalid(e) = resolve(&loaded, &Overrides::default()).unwrap_err();
        assert_eq!((e.field.as_str(), e.line), ("run_root", Some(2)), "{e}");
        assert_eq!(e.fix, format!("write the path itself: `{home}/runs`"));
    }

    #[test]
    fn counts_too_large_to_multiply_are_refused_not_wrapped() {
        let err = |extra: &str, total: u64, per_device: u64| {
            let ResolveError::Invalid(err) = job(extra, total, per_device).unwrap_err();
            err
        };
        // 2 ranks × (2^63 + 4) would wrap to 8, a total that splits.
        let e = err("", 8, (1 << 63) + 4);
        assert_eq!(e.field, "training.batch_size_per_device", "{e}");
        assert_eq!(e.fix, "lower `batch_size_per_device` to at most 4");
        let e = err("  nodes: 4294967296\n", 8, 2);
        assert_eq!(e.field, "resources", "{e}");
        // The largest totals: their nearest split, and the per-device batches that split
        // them up to 2^24 (2^63 - 1 = 7² × 73 × 127 × 337 × 92737 × 649657), found without
        // a search up to 2^32.
        let e = err("", u64::MAX, 2);
        assert!(e.fix.ends_with("nearest 18446744073709551612"), "{e}");
        let e = err("", u64::MAX - 1, 4);
        let listed = e.fix.split_once("batch_size_per_device` of ").unwrap().1;
        let per_device: Vec<u64> = listed
            .split([',', ' '])
            .filter(|n| !n.is_empty() && *n != "or")
            .map(|n| n.parse().unwrap())
            .collect();
        assert_eq!(per_device[..4], [1, 7, 49, 73], "{e}");
        assert!(per_device.iter().all(|&n| n <= 1 << 24), "{e}");
        let e = err("", 1 << 40, 1 << 36);
        assert!(e.why.contains("more than the 4294967296 tokens"), "{e}");
        let yaml = "name: t\ntraining:\n  model: { kind: mlp, input_dim: 4, hidden_dim: 8, \
                    output_dim: 4 }\n  steps: 4611686018427387904\n  total_batch_size: 8\n  \
                    batch_size_per_device: 8\n";
        let loaded = parse(yaml, Path::new("job.yaml")).unwrap();
        let ResolveError::Invalid(e) = resolve(&loaded, &Overrides::default()).unwrap_err();
        assert_eq!(e.field, "training.steps", "{e}");
    }

    #[test]
    fn a_split_broken_by_a_set_per_device_batch_names_that_flag() {
        let yaml = "name: t\nresources: { tasks_per_node: 2 }\ntraining:\n  model: { kind: mlp, \
                    input_dim: 4, hidden_dim: 8, output_dim: 4 }\n  steps: 1\n  \
                    total_batch_size: 8\n  batch_size_per_device: 2\n";
        let set = |args: &[&str]| {
            let sets: Vec<_> = args
                .iter()
                .map(|a| crate::spec::overrides::parse(a).unwrap())
                .collect();
            let loaded =
                crate::spec::overrides::apply(parse(yaml, Path::new("job.yaml")).unwrap(), &sets)
                    .unwrap();
            let ResolveError::Invalid(err) = resolve(&loaded, &Overrides::default()).unwrap_err();
            err
        };
        let err = set(&["training.batch_size_per_device=16"]);
        assert_eq!(err.field, "training.batch_size_per_device", "{err}");
        assert!(
            err.to_string()
                .starts_with("--set training.batch_size_per_device=16: "),
            "{err}"
        );
        // Both set: the total is named, as when neither is.
        let err = set(&[
            "training.total_batch_size=6",
            "training.batch_size_per_device=4",
        ]);
        assert_eq!(err.field, "training.total_batch_size", "{err}");
    }

    #[test]
    fn zero_counts_that_mean_nothing_are_errors_naming_their_field() {
        let spec = |extra: &str| {
            format!(
                "name: t\nresources: {{ tasks_per_node: 2 }}\ntraining:\n  model: {{ kind: mlp, \
                 input_dim: 4, hidden_dim: 8, output_dim: 4 }}\n  steps: 1\n  total_batch_size: 4\n  \
                 batch_size_per_device: 2\n{extra}"
            )
        };
        let err = |yaml: &str| {
            let loaded = parse(yaml, Path::new("job.yaml")).unwrap();
            let ResolveError::Invalid(err) = resolve(&loaded, &Overrides::default()).unwrap_err();
            err
        };
        let e = err(&spec("  log_every: 0\n"));
        assert_eq!(
            (e.field.as_str(), e.line),
            ("training.log_every", Some(8)),
            "{e}"
        );
        assert!(e.fix.contains("leave it out to log every step"), "{e}");
    }

    #[test]
    fn ranks_asked_for_with_nproc_are_named_and_the_ranks_that_split_offered() {
        let yaml = "name: t\nresources: { tasks_per_node: 2 }\ntraining:\n  model: { kind: mlp, \
                    input_dim: 4, hidden_dim: 8, output_dim: 4 }\n  steps: 1\n  \
                    total_batch_size: 8\n  batch_size_per_device: 2\n";
        let loaded = parse(yaml, Path::new("job.yaml")).unwrap();
        let nproc = Overrides {
            world_size: Some(3),
            ..Overrides::default()
        };
        let ResolveError::Invalid(err) = resolve(&loaded, &nproc).unwrap_err();
        assert!(err.why.contains("on 3 ranks (--nproc; "), "{err}");
        assert!(
            err.fix
                .ends_with("; or run it on 1, 2 or 4 ranks (--nproc)"),
            "{err}"
        );
        let ResolveError::Invalid(err) = job("", 20, 8).unwrap_err();
        assert!(err.why.contains("on 2 ranks (`resources`; "), "{err}");
        assert!(!err.fix.contains("--nproc"), "{err}");
    }

    #[test]
    fn zero_total_or_per_device_is_an_error() {
        let ResolveError::Invalid(err) = job("", 0, 8).unwrap_err();
        assert_eq!(err.field, "training.total_batch_size");
        assert!(err.why.starts_with("`total_batch_size` is 0"), "{err}");
        assert!(err.fix.contains("such as 16"), "{err}");
        let ResolveError::Invalid(err) = job("", 16, 0).unwrap_err();
        assert_eq!(err.field, "training.batch_size_per_device");
    }

    #[test]
    fn gpu_world_is_nodes_times_gpus_and_local_override_wins() {
        let j = job("  nodes: 2\n  gpus_per_node: 4\n", 64, 2).unwrap_err();
        // tasks_per_node: 2 with 4 GPUs per node is refused: one rank per GPU.
        let ResolveError::Invalid(err) = j;
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
                ..Overrides::default()
            },
        )
        .unwrap();
        assert_eq!(
            (local.world_size, local.grad_accum_steps, local.train.device),
            (2, 16, DeviceKind::Cpu)
        );
    }

    fn resolve_yaml(yaml: &str, force: bool) -> Result<ResolvedJob, ResolveError> {
        let loaded = parse(yaml, Path::new("j.yaml")).expect("parses");
        resolve(
            &loaded,
            &Overrides {
                force,
                ..Overrides::default()
            },
        )
    }

    #[test]
    fn a_gpu_job_without_cpus_per_task_is_told_it_gets_one_cpu_a_rank() {
        let job = |resources: &str| {
            let yaml = format!(
                "name: t\nresources: {resources}\ntraining:\n  model: {{ kind: mlp, input_dim: 4, hidden_dim: 8, output_dim: 4 }}\n  steps: 1\n  total_batch_size: 2\n  batch_size_per_device: 1\n"
            );
            resolve_yaml(&yaml, false).unwrap().warnings
        };
        let told = |w: &Vec<String>| w.iter().any(|w| w.contains("each GPU rank gets 1 CPU"));
        assert!(told(&job("{ gpus_per_node: 2 }")));
        assert!(!told(&job("{ gpus_per_node: 2, cpus_per_task: 1 }")));
        assert!(!told(&job("{ tasks_per_node: 2 }")));
    }

    #[test]
    fn hybrid_shard_groups_are_whole_nodes_or_parts_of_one() {
        // 3 nodes of 8 GPUs.
        let job = |group: &str| {
            resolve_yaml(
                &format!(
                    "name: t\nresources: {{ nodes: 3, gpus_per_node: 8 }}\ntraining:\n  model: {{ kind: mlp, input_dim: 4, hidden_dim: 8, output_dim: 4 }}\n  steps: 1\n  total_batch_size: 24\n  batch_size_per_device: 1\n  fsdp: {{ strategy: HYBRID_SHARD{group} }}\n"
                ),
                false,
            )
        };
        let warned = |group: &str, text: &str| {
            let job = job(group).unwrap();
            job.warnings.iter().any(|w| w.contains(text))
        };
        assert!(!warned("", "HYBRID_SHARD"), "a node a group by default");
        let summary = job("").unwrap().summary();
        assert!(
            summary.contains(
                "fsdp           HYBRID_SHARD (shard groups of 8 rank(s), 3 replica(s)), wrap"
            ),
            "{summary}"
        );
        assert!(!warned(", shard_group_size: 4", "HYBRID_SHARD"));
        assert!(warned(
            ", shard_group_size: 12",
            "shard groups of 12 ranks are not whole nodes of 8 ranks nor parts of one"
        ));
        assert!(warned(
            ", shard_group_size: 24",
            "one shard group of all 24 ranks has no replicas"
        ));
        let ResolveError::Invalid(err) = job(", shard_group_size: 0").unwrap_err();
        assert_eq!(err.why, "a shard group of 0 ranks holds no shard");
        assert!(warned(
            ", shard_group_size: 1",
            "HYBRID_SHARD with shard groups of 1 rank shards nothing"
        ));
        // One rank a node: the default groups shard nothing, and all ranks in one group is
        // not put right by the ranks of a node.
        let one_a_node = |group: &str| {
            resolve_yaml(
                &format!(
                    "name: t\nresources: {{ nodes: 2, gpus_per_node: 1 }}\ntraining:\n  model: {{ kind: mlp, input_dim: 4, hidden_dim: 8, output_dim: 4 }}\n  steps: 1\n  total_batch_size: 2\n  batch_size_per_device: 1\n  fsdp: {{ strategy: HYBRID_SHARD{group} }}\n"
                ),
                false,
            )
            .unwrap()
            .warnings
        };
        let warnings = one_a_node("");
        assert!(
            warnings.iter().any(|w| w.contains(
                "shards nothing: every rank holds the whole model, as NO_SHARD does, and saves no memory (a group is the ranks of a node, here 1); use FULL_SHARD"
            )),
            "{warnings:?}"
        );
        let warnings = one_a_node(", shard_group_size: 2");
        assert!(
            warnings
                .iter()
                .any(|w| w.ends_with("it trains as FULL_SHARD does (say FULL_SHARD)")),
            "{warnings:?}"
        );
    }

    /// A small Llama from scratch on this machine's `/etc/hostname`, bytes as tokens.
    fn small_llama(model: &str, rest: &str) -> String {
        format!(
            "name: t\ntraining:\n  model: {{ kind: llama, vocab_size: 300, dim: 32, n_layers: 2, n_heads: 2, ffn_dim: 64{model} }}\n  data: {{ kind: text, files: [/etc/hostname], tokenizer: {{ kind: bytes }}, seq_len: 16 }}\n  steps: 1\n  total_batch_size: 1\n  batch_size_per_device: 1\n{rest}"
        )
    }

    #[test]
    fn a_byte_tokenizer_past_the_models_vocabulary_is_refused_before_any_data_is_read() {
        let fits = resolve_yaml(&small_llama("", ""), false).expect("257 ids in 300");
        assert!(fits.warnings.is_empty(), "{:?}", fits.warnings);
        let small = small_llama("", "").replace("vocab_size: 300", "vocab_size: 256");
        let ResolveError::Invalid(err) = resolve_yaml(&small, false).unwrap_err();
        assert_eq!(err.field, "training.data.tokenizer");
        assert_eq!(err.line, Some(4));
        assert!(err.why.contains("run to 256"), "{err}");
        assert_eq!(err.fix, "raise the model's `vocab_size` (at least 257)");
    }

    #[test]
    fn a_context_shorter_than_the_sequences_is_warned_about() {
        let job = resolve_yaml(&small_llama(", max_position_embeddings: 8", ""), false).unwrap();
        assert!(
            job.warnings.iter().any(|w| w.starts_with(
                "`training.model.max_position_embeddings` is 8, shorter than the 16 tokens"
            )),
            "{:?}",
            job.warnings
        );
    }

    #[test]
    fn a_wrap_pattern_that_matches_no_module_is_refused_with_the_one_meant() {
        let wrap = |patterns: &str| {
            small_llama(
                "",
                &format!(
                    "  fsdp:\n    wrap:\n      kind: module_names\n      patterns: {patterns}\n"
                ),
            )
        };
        resolve_yaml(&wrap("[model.layers.*.mlp]"), false).expect("matches the MLPs");
        let ResolveError::Invalid(err) =
            resolve_yaml(&wrap("[model.layers.*.mlp, layers.*.self_attn]"), false).unwrap_err();
        assert_eq!(err.field, "training.fsdp.wrap.patterns[1]");
        assert_eq!(err.line, Some(11));
        assert_eq!(
            err.why,
            "`layers.*.self_attn` matches no module of the model"
        );
        assert_eq!(err.fix, "did you mean `model.layers.*.self_attn`?");
        // A typo, with or without the prefix.
        for typo in ["model.layer.*", "layer.*.mlp", "model.layers.*.self_atn"] {
            let ResolveError::Invalid(err) =
                resolve_yaml(&wrap(&format!("[{typo}]")), false).unwrap_err();
            let meant = match typo {
                "model.layer.*" => "model.layers.*",
                "layer.*.mlp" => "model.layers.*.mlp",
                _ => "model.layers.*.self_attn",
            };
            assert_eq!(err.fix, format!("did you mean `{meant}`?"), "{typo}");
        }
        let ResolveError::Invalid(err) = resolve_yaml(&wrap("[attention]"), false).unwrap_err();
        assert!(
            err.fix
                .contains("the model's modules include `model`, `model.embed_tokens`"),
            "{err}"
        );
    }

    #[test]
    fn a_job_that_does_not_fit_the_gpu_is_refused_unless_forced() {
        let yaml = "name: t\nresources:\n  gpus_per_node: 2\n  gpu_memory_gb: 1.5\ntraining:\n  model: { kind: mlp, input_dim: 4096, hidden_dim: 8192, output_dim: 4096 }\n  steps: 1\n  total_batch_size: 2\n  batch_size_per_device: 1\n";
        let ResolveError::Invalid(err) = resolve_yaml(yaml, false).unwrap_err();
        assert_eq!(err.field, "resources.gpu_memory_gb");
        assert_eq!(err.line, Some(4));
        assert!(
            err.why.contains("with FULL_SHARD") && err.why.contains("exceeds the 0.5 GiB"),
            "{err}"
        );
        assert!(err.fix.contains("--force"), "{err}");
        // One sample a rank already, and samples that are not sequences: neither a smaller
        // batch nor a shorter seq_len is offered.
        assert!(
            !err.fix.contains("batch_size_per_device") && !err.fix.contains("seq_len"),
            "{err}"
        );
        let forced = resolve_yaml(yaml, true).expect("--force plans it");
        assert_eq!(forced.memory.fits(), Some(false));
        assert!(
            forced.warnings.iter().any(|w| w.contains("planned anyway")),
            "{:?}",
            forced.warnings
        );
        assert!(forced.summary().contains("warning: peak memory per rank"));
        // Twice the GPU memory and it fits.
        let roomy = resolve_yaml(&yaml.replace("1.5", "3"), false).expect("fits");
        assert_eq!(roomy.memory.fits(), Some(true));
        assert!(!roomy.warnings.iter().any(|w| w.contains("fragmentation")));
        // Just enough: it fits, with a warning that the allocator needs more than the peak.
        let peak = forced.memory.chosen.peak as f64;
        let tight_gb = (peak / 0.95 + (1u64 << 30) as f64) / GIB;
        let tight = resolve_yaml(&yaml.replace("1.5", &format!("{tight_gb}")), false)
            .expect("fits, tightly");
        assert_eq!(tight.memory.fits(), Some(true));
        assert!(
            tight
                .warnings
                .iter()
                .any(|w| w.contains("is 95% of the") && w.contains("expandable_segments")),
            "{:?}",
            tight.warnings
        );
        // Without the GPU's memory, the plan says the fit is not checked.
        let unknown = resolve_yaml(&yaml.replace("  gpu_memory_gb: 1.5\n", ""), false).unwrap();
        assert!(
            unknown.summary().contains(
                "GPU memory     not given (`resources.gpu_memory_gb`): the fit is not checked"
            ),
            "{}",
            unknown.summary()
        );
        // A GPU memory no larger than what CUDA and NCCL take is a misread unit.
        let ResolveError::Invalid(err) =
            resolve_yaml(&yaml.replace("1.5", "1"), false).unwrap_err();
        assert!(err.why.contains("has nothing left for the job"), "{err}");
        assert!(err.fix.contains("whole memory in GiB"), "{err}");
    }

    /// A 65-billion-parameter transformer (LLaMA-65B's sizes: dim 8192, 80 layers, 64 heads,
    /// vocab 32000, sequences of 2048) on 2 nodes of 8 80-GiB GPUs, bf16 compute.
    fn llm_65b(strategy: &str, checkpointing: bool) -> String {
        format!("name: big\nresources:\n  nodes: 2\n  gpus_per_node: 8\n  gpu_memory_gb: 80\ntraining:\n  model: {{ kind: transformer, vocab_size: 32000, dim: 8192, n_layers: 80, n_heads: 64, max_seq_len: 2048 }}\n  steps: 1\n  total_batch_size: 16\n  batch_size_per_device: 1\n  fsdp:\n    strategy: {strategy}\n    mixed_precision: {{ param_dtype: bf16, reduce_dtype: f32 }}\n    activation_checkpointing: {checkpointing}\n")
    }

    #[test]
    fn shard_grad_op_keeps_the_whole_model_gathered_and_does_not_fit_65b_on_16_gpus() {
        let full = resolve_yaml(&llm_65b("FULL_SHARD", true), false).expect("FULL_SHARD fits");
        let n = full.memory.num_params;
        assert!((64_000_000_000..66_000_000_000).contains(&n), "{n}");
        let by = |s: ShardingStrategy| {
            full.memory
                .per_strategy
                .iter()
                .find(|m| m.strategy == s)
                .cloned()
                .unwrap()
        };
        let (fsdp, zero2) = (
            by(ShardingStrategy::FullShard),
            by(ShardingStrategy::ShardGradOp),
        );
        // Both hold the same sharded state; SHARD_GRAD_OP also every parameter in bf16.
        assert_eq!(fsdp.at_peak.state, zero2.at_peak.state);
        // 16 bytes per parameter over 16 ranks, plus each unit's padding.
        assert!(
            (n..n + 100 * 16 * 16).contains(&fsdp.at_peak.state),
            "{fsdp:?}"
        );
        assert!(zero2.at_peak.gathered > 19 * n / 10, "{zero2:?}");
        assert!(fsdp.at_peak.gathered < n / 16, "{fsdp:?}");
        assert!(
            fsdp.peak < 79 << 30 && zero2.peak > 130 << 30,
            "{fsdp:?} {zero2:?}"
        );
        let ResolveError::Invalid(err) =
            resolve_yaml(&llm_65b("SHARD_GRAD_OP", true), false).unwrap_err();
        assert!(err.why.contains("with SHARD_GRAD_OP"), "{err}");
        assert!(err.fix.contains("use FULL_SHARD"), "{err}");
        // Without activation checkpointing 80 blocks keep their activations: FULL_SHARD no
        // longer fits either.
        let plain = resolve_yaml(&llm_65b("FULL_SHARD", false), true).unwrap();
        assert!(
            plain.memory.chosen.at_peak.activations > 10 * fsdp.at_peak.activations,
            "{:?} vs {fsdp:?}",
            plain.memory.chosen
        );
        assert_eq!(plain.memory.fits(), Some(false));
    }

    /// A Llama whose output layer outweighs the rest (Llama 3's vocabulary, dim 64): the peak
    /// is the loss, in the last segment's forward, which holds one chunk's logits and makes
    /// the output weight's gradient (the unit's flat buffer in the reduce dtype, a chunk's
    /// share in the parameter dtype); that segment's backward makes none.
    #[test]
    fn the_output_layers_gradient_is_counted_where_the_loss_makes_it() {
        let yaml = "name: t\nresources:\n  tasks_per_node: 2\ntraining:\n  model: { kind: llama, vocab_size: 128256, dim: 64, n_layers: 1, n_heads: 4, n_kv_heads: 2, ffn_dim: 172 }\n  data: { kind: synthetic, seq_len: 2048 }\n  steps: 1\n  total_batch_size: 2\n  batch_size_per_device: 1\n  fsdp:\n    mixed_precision: { param_dtype: bf16, reduce_dtype: f32 }\n";
        let job = resolve_yaml(yaml, false).expect("resolves");
        let head = 128_256 * 64u64;
        // The head's unit: the final norm's weight and the output layer's, over 2 ranks.
        let unit = (64 + head).div_ceil(2) * 2;
        let at_peak = &job.memory.chosen.at_peak;
        assert_eq!(at_peak.gradients, unit * 4 + head * 2, "{at_peak:?}");
        let chunk = shardrun_models::loss::chunk_tokens(None, 128_256).min(2048);
        assert!(
            at_peak.activations > chunk * 128_256 * (4 + 2),
            "one chunk's fp32 logits and their bf16 gradient: {at_peak:?}"
        );
    }

    #[test]
    fn stopping_on_divergence_is_asked_for_and_said_by_the_plan_and_the_default_hash_is_kept() {
        let yaml = |extra: &str| {
            format!(
                "name: t\ntraining:\n  model: {{ kind: mlp, input_dim: 4, hidden_dim: 8, output_dim: 4 }}\n  steps: 1\n  total_batch_size: 2\n  batch_size_per_device: 1\n{extra}"
            )
        };
        let stops = resolve_yaml(&yaml("  on_divergence: stop\n"), false).unwrap();
        assert_eq!(
            stops.train.on_divergence,
            shardrun_protocol::config::OnDivergence::Stop
        );
        assert!(
            stops.summary().contains(
                "steps          1 (2 samples in all); stops at the first whose loss or gradients are not finite\n"
            ),
            "{}",
            stops.summary()
        );
        let goes_on = resolve_yaml(&yaml(""), false).unwrap();
        let written = resolve_yaml(&yaml("  on_divergence: continue\n"), false).unwrap();
        assert_eq!(goes_on.train, written.train);
        assert!(goes_on
            .summary()
            .contains("steps          1 (2 samples in all)\n"));
        assert!(
            goes_on.summary().contains("  samples/step   2\n"),
            "{}",
            goes_on.summary()
        );
        // The default is not written: configs of runs from before the key hash as they did.
        let json = serde_json::to_value(&goes_on.train).unwrap();
        assert!(json.get("on_divergence").is_none(), "{json}");
        assert_ne!(goes_on.train.config_hash(), stops.train.config_hash());
    }

    #[test]
    fn fp16_reduction_without_fp16_parameters_is_warned_about_and_the_schedule_is_told() {
        let job = |extra: &str| {
            format!("name: t\nresources:\n  tasks_per_node: 2\ntraining:\n  model: {{ kind: transformer, vocab_size: 128, dim: 32, n_layers: 2, n_heads: 4, max_seq_len: 16 }}\n  steps: 10\n  total_batch_size: 2\n  batch_size_per_device: 1\n{extra}")
        };
        let unscaled = |j: &ResolvedJob| j.warnings.iter().any(|w| w.contains("no loss scaling"));
        for (params, fix) in [
            ("bf16", "reduce in bf16 or f32"),
            ("f32", "leave `reduce_dtype` out"),
        ] {
            let j = resolve_yaml(
                &job(&format!("  fsdp: {{ mixed_precision: {{ param_dtype: {params}, reduce_dtype: f16 }} }}\n")),
                false,
            )
            .unwrap();
            assert!(
                unscaled(&j) && j.warnings.iter().any(|w| w.contains(fix)),
                "{params}: {:?}",
                j.warnings
            );
        }
        let j = resolve_yaml(
            &job("  fsdp: { mixed_precision: { param_dtype: f16 } }\n"),
            false,
        )
        .unwrap();
        assert!(!unscaled(&j), "{:?}", j.warnings);

        // A constant LR has no floor to decay to.
        let constant = resolve_yaml(&job("  schedule: { decay: constant }\n"), false).unwrap();
        assert!(
            constant.summary().contains(", warmup 0 then constant\n"),
            "{}",
            constant.summary()
        );
        let cosine = resolve_yaml(
            &job("  schedule: { decay: cosine, min_lr_ratio: 0.1 }\n"),
            false,
        )
        .unwrap();
        assert!(
            cosine.summary().contains(" then cosine to ×0.1\n"),
            "{}",
            cosine.summary()
        );
        // Clipping is said whether on or off (the Trainer clips unasked), and eps too.
        assert!(
            constant.summary().contains(" eps 1e-8 ")
                && constant
                    .summary()
                    .contains(", no gradient clipping, warmup 0"),
            "{}",
            constant.summary()
        );
        let clipped = resolve_yaml(&job("  optimizer: { grad_clip: 1.0 }\n"), false).unwrap();
        assert!(
            clipped
                .summary()
                .contains(", gradients clipped to norm 1, warmup"),
            "{}",
            clipped.summary()
        );
    }

    #[test]
    fn wrapping_finer_than_a_block_and_checkpointing_without_blocks_warn() {
        let transformer = |wrap: &str| {
            format!("name: t\nresources:\n  tasks_per_node: 2\ntraining:\n  model: {{ kind: transformer, vocab_size: 128, dim: 32, n_layers: 2, n_heads: 4, max_seq_len: 16 }}\n  steps: 1\n  total_batch_size: 2\n  batch_size_per_device: 1\n  fsdp: {{ wrap: {wrap} }}\n")
        };
        let finer = |j: &ResolvedJob| j.warnings.iter().any(|w| w.contains("save no memory"));
        let j = resolve_yaml(
            &transformer("{ kind: module_names, patterns: [\"layers.*.attention\"] }"),
            false,
        )
        .unwrap();
        assert!(finer(&j), "{:?}", j.warnings);
        assert!(
            j.warnings
                .iter()
                .any(|w| w.contains("(layers.0: layers.0, layers.0.attention)")),
            "{:?}",
            j.warnings
        );
        let j = resolve_yaml(
            &transformer("{ kind: size_based, min_params: 1000 }"),
            false,
        )
        .unwrap();
        assert!(finer(&j), "{:?}", j.warnings);
        for quiet in [
            "{ kind: block }",
            "{ kind: module_names, patterns: [\"layers.*\"] }",
            "{ kind: size_based, min_params: 100000 }",
        ] {
            let j = resolve_yaml(&transformer(quiet), false).unwrap();
            assert!(!finer(&j), "{quiet}: {:?}", j.warnings);
        }
        let mlp = "name: t\ntraining:\n  model: { kind: mlp, input_dim: 4, hidden_dim: 8, output_dim: 4 }\n  steps: 1\n  total_batch_size: 2\n  batch_size_per_device: 2\n  fsdp: { activation_checkpointing: true }\n";
        let j = resolve_yaml(mlp, false).unwrap();
        assert!(
            j.warnings
                .iter()
                .any(|w| w.contains("the mlp model has none: it changes nothing")),
            "{:?}",
            j.warnings
        );
        let j = resolve_yaml(&mlp.replace("true", "false"), false).unwrap();
        assert!(j.warnings.is_empty(), "{:?}", j.warnings);
    }

    #[test]
    fn signal_after_the_time_limit_is_an_error() {
        let yaml = "name: t\nresources:\n  time: \"00:01:00\"\npreemption:\n  signal_seconds: 120\ntraining:\n  model: { kind: mlp, input_dim: 4, hidden_dim: 8, output_dim: 4 }\n  steps: 1\n  total_batch_size: 2\n  batch_size_per_device: 2\n";
        let loaded = parse(yaml, Path::new("j.yaml")).unwrap();
        let ResolveError::Invalid(err) = resolve(&loaded, &Overrides::default()).unwrap_err();
        assert_eq!(err.field, "preemption.signal_seconds");
        assert_eq!(err.line, Some(5));
        for (secs, why) in [("0", "no time to save"), ("70000", "largest warning time")] {
            let loaded = parse(
                &yaml
                    .replace("\"00:01:00\"", "\"02:00:00\"")
                    .replace("120", secs),
                Path::new("j.yaml"),
            )
            .unwrap();
            let ResolveError::Invalid(err) = resolve(&loaded, &Overrides::default()).unwrap_err();
            assert_eq!(err.field, "preemption.signal_seconds");
            assert!(err.why.contains(why), "{}", err.why);
        }
        // A notice that leaves less than the minute by which Slurm may send it early is
        // warned of.
        let loaded = parse(
            &yaml.replace("  signal_seconds: 120\n", "  signal_seconds: 20\n"),
            Path::new("j.yaml"),
        )
        .unwrap();
        let j = resolve(&loaded, &Overrides::default()).unwrap();
        assert!(
            j.warnings.iter().any(|w| w.starts_with(
                "the time-limit notice comes 20 s before a limit of 60 s, 40 s in, and Slurm may send it up to 60 s early"
            )),
            "{:?}",
            j.warnings
        );
        let loaded = parse(
            &yaml
                .replace("\"00:01:00\"", "\"00:02:00\"")
                .replace("  signal_seconds: 120\n", "  signal_seconds: 60\n"),
            Path::new("j.yaml"),
        )
        .unwrap();
        let j = resolve(&loaded, &Overrides::default()).unwrap();
        assert!(j.warnings.is_empty(), "{:?}", j.warnings);
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
        // ... where a limit under 2 minutes may still have it as the job starts.
        assert!(
            j.warnings.iter().any(|w| w.starts_with(
                "the time-limit notice comes 30 s before a limit of 60 s, 30 s in, and Slurm \
                 may send it up to 60 s early"
            ) && w.ends_with(
                "give it more `resources.time` (the notice comes halfway \
                 through a limit under 4 minutes)"
            )),
            "{:?}",
            j.warnings
        );
        let loaded = parse(
            &yaml
                .replace("\"00:01:00\"", "\"00:02:00\"")
                .replace("  signal_seconds: 120\n", ""),
            Path::new("j.yaml"),
        )
        .unwrap();
        let j = resolve(&loaded, &Overrides::default()).unwrap();
        assert_eq!(j.preemption.signal_seconds, 60);
        assert!(j.warnings.is_empty(), "{:?}", j.warnings);
    }

    #[test]
    fn every_rank_gets_the_spec_env_and_the_submitting_nccl_variables() {
        let yaml = "name: t\nresources:\n  tasks_per_node: 2\n  env: { NCCL_DEBUG: WARN, OMP_PROC_BIND: close }\ntraining:\n  model: { kind: mlp, input_dim: 4, hidden_dim: 8, output_dim: 4 }\n  steps: 1\n  total_batch_size: 4\n  batch_size_per_device: 2\n";
        let loaded = parse(yaml, Path::new("job.yaml")).expect("parses");
        let submitting = nccl_variables([
            ("NCCL_DEBUG".to_string(), "INFO".to_string()),
            ("NCCL_SOCKET_IFNAME".to_string(), "ib0".to_string()),
            ("HOME".to_string(), "/home/me".to_string()),
        ]);
        let job = resolve(
            &loaded,
            &Overrides {
                submitting_env: submitting,
                ..Overrides::default()
            },
        )
        .unwrap();
        let pair = |k: &str, v: &str| (k.to_string(), v.to_string());
        assert_eq!(
            job.slurm.env,
            vec![
                pair("NCCL_DEBUG", "WARN"),
                pair("NCCL_SOCKET_IFNAME", "ib0"),
                pair("OMP_PROC_BIND", "close"),
            ]
        );
        // The shell's NCCL_DEBUG is the spec's to set.
        assert_eq!(job.slurm.from_shell, ["NCCL_SOCKET_IFNAME"]);
        let bad = yaml.replace("OMP_PROC_BIND", "2BAD");
        let err = resolve(
            &parse(&bad, Path::new("job.yaml")).unwrap(),
            &Overrides::default(),
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("resources.env") && err.contains("2BAD"),
            "{err}"
        );
    }
}
