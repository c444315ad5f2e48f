//! The bridge between the FSDP engine and the checkpoint format (crate
//! `shardrun-checkpoint`): saving at the trainer's step boundaries (interval steps, wall-time
//! minutes, final, preemption) and restoring before training (the newest valid checkpoint of
//! the run, or `checkpoint.from` for fine-tuning).
//!
//! Every rank calls [`Checkpointer::save`] and [`Checkpointer::restore`] at the same point:
//! they run collectives, all on the control communicator (CPU): barriers, per-unit gathers
//! of CPU shards for the full format, a broadcast of which checkpoint to load.

use crate::collectives::Communicator;
use crate::control;
use crate::fsdp::{FlatLayout, FsdpEngine, UnitShardState};
use crate::report::Reporter;
use crate::train::{CheckpointHook, SaveFailure, SaveReason, TrainState, Trainer};
use shardrun_checkpoint::naming::{step_dir_name, COMPLETE_FILE};
use shardrun_checkpoint::{
    clean_stale, commit_observed, find_latest, resolve, write_rank_report, Checkpoint,
    CheckpointError, CommitKind, CommitRequest, CommitStage, DataPosition, FullWriter, Layout,
    LossScaleState, ParamSlot, SaveTarget, SchedulerState, ShardWriter, StateDtypes, StateKind,
    TrainerState, UnitLayout, Verify,
};
use shardrun_models::source::ParamSource;
use shardrun_protocol::config::{CheckpointFormat, TrainConfig};
use shardrun_protocol::messages::LogLevel;
use shardrun_protocol::schedule::Schedule;
use shardrun_protocol::{config_diff, env};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use tch::{Kind, Tensor};

#[derive(Debug, thiserror::Error)]
pub enum CheckpointingError {
    #[error(transparent)]
    Format(#[from] CheckpointError),
    #[error("collective during checkpointing: {0}")]
    Comm(#[from] crate::collectives::CommError),
    #[error(transparent)]
    Fsdp(#[from] crate::fsdp::FsdpError),
    #[error("{0}")]
    Other(String),
    /// Rank 0 could not choose a checkpoint to load: the failure is rank 0's.
    #[error("rank 0 could not choose a checkpoint to load (its log says why)")]
    RootFailed,
    /// The checkpoint was committed, then the ranks' wait for one another after it failed (a
    /// rank died just after its part was written).
    #[error(
        "the checkpoint of step {step} is saved, but a rank left before the ranks' wait after \
         it: {source}"
    )]
    AfterSave {
        step: u64,
        source: crate::collectives::CommError,
    },
}

impl CheckpointingError {
    /// The other rank this error follows from, when a collective of the save names one.
    pub fn peer_at_fault(&self) -> Option<usize> {
        match self {
            CheckpointingError::Comm(e) => e.peer_at_fault(),
            CheckpointingError::AfterSave { source, .. } => source.peer_at_fault(),
            CheckpointingError::Fsdp(e) => e.peer_at_fault(),
            CheckpointingError::RootFailed => Some(0),
            _ => None,
        }
    }
}

/// What a restore loaded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Restored {
    pub dir: PathBuf,
    pub step: u64,
    /// Weights only (`checkpoint.from`, fine-tuning): step, optimizer and schedule start anew.
    pub weights_only: bool,
}

pub struct Checkpointer {
    root: PathBuf,
    format: CheckpointFormat,
    keep: usize,
    interval: Option<Duration>,
    last_save: Instant,
    resume: bool,
    from: Option<PathBuf>,
    config_hash: String,
}

impl Checkpointer {
    /// The run's checkpointer. Under the controller the run directory is always known, so
    /// even with periodic saves off (no `checkpoint.dir`) the final and preemption
    /// checkpoints are written to `<run dir>/checkpoints`, and a re-run or a requeued job
    /// resumes from them unless `checkpoint.resume` is false. `None` when the config names
    /// no folder and no run directory is known (a standalone rank).
    pub fn from_config(config: &TrainConfig) -> Option<Checkpointer> {
        let c = &config.checkpoint;
        let run_dir = std::env::var_os(env::RUN_DIR).map(PathBuf::from);
        let root = c.root(run_dir.as_deref())?;
        Some(Checkpointer {
            root,
            format: c.format,
            keep: c.keep.max(1),
            interval: c
                .interval_minutes
                .filter(|m| m.is_finite() && *m > 0.0)
                .map(|m| Duration::from_secs_f64(m * 60.0)),
            last_save: Instant::now(),
            resume: c.resume,
            from: c.from.clone(),
            config_hash: config.config_hash(),
        })
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Load the newest valid checkpoint of this run (a re-run or requeue continues it); if
    /// there is none, `checkpoint.from` (weights only): [`Checkpointer::agree`], then
    /// [`Checkpointer::load`].
    pub fn restore(
        &mut self,
        trainer: &mut Trainer,
    ) -> Result<Option<Restored>, CheckpointingError> {
        let agreed = self.agree(
            trainer.engine().groups().control.as_ref(),
            trainer.reporter().as_ref(),
        )?;
        self.load(agreed, trainer)
    }

    /// Which checkpoint every rank loads: rank 0 chooses, verifying checksums and cleaning
    /// leftovers of killed saves, and tells the others. Runs before the model is built, so
    /// that a model about to be overwritten is not first read from its own source.
    pub fn agree(
        &self,
        control: &dyn Communicator,
        reporter: &dyn Reporter,
    ) -> Result<Agreed, CheckpointingError> {
        let choice = if control.rank() == 0 {
            self.choose(reporter)
        } else {
            Ok(Choice::Nothing)
        };
        let agreed = broadcast_choice(control, choice.as_ref().ok());
        // Rank 0 reports its own error; the others learn only that there was one.
        let agreed = match (choice, agreed) {
            (Err(e), _) => return Err(e),
            (Ok(_), agreed) => agreed?,
        };
        Ok(Agreed(match agreed {
            Choice::Nothing => None,
            Choice::Resume(step) => Some((self.root.join(step_dir_name(step)), false)),
            Choice::From(step) => {
                let Some(from) = &self.from else {
                    return Err(CheckpointingError::Other(
                        "rank 0 chose checkpoint.from but this rank's config has none".into(),
                    ));
                };
                // `from` is one checkpoint folder, or a folder of them (rank 0 picked the step).
                let dir = if from.join(COMPLETE_FILE).exists() {
                    from.clone()
                } else {
                    from.join(step_dir_name(step))
                };
                Some((dir, true))
            }
        }))
    }

    /// Loads the agreed checkpoint into `trainer`'s shards (and, unless weights only, its
    /// step, optimizer and data position).
    pub fn load(
        &mut self,
        agreed: Agreed,
        trainer: &mut Trainer,
    ) -> Result<Option<Restored>, CheckpointingError> {
        let world = trainer.engine().groups().control.clone();
        let Agreed(Some((dir, weights_only))) = agreed else {
            return Ok(None);
        };
        tracing::debug!(dir = %dir.display(), weights_only, "loading checkpoint");
        let checkpoint = Checkpoint::open(&dir, Verify::Structure)?;
        let target = engine_layout(trainer.engine());
        checkpoint.check_compatible(&target)?;
        let shard = trainer.engine().shard_index() as u64;
        for (u, unit) in target.units.iter().enumerate() {
            let read = |kind| -> Result<Vec<f32>, CheckpointingError> {
                if weights_only && kind != StateKind::Param {
                    return Ok(vec![0.0; unit.shard_size as usize]);
                }
                let mut bytes = vec![0u8; unit.shard_size as usize * 4];
                checkpoint.read_shard(kind, unit, shard, &mut bytes)?;
                Ok(floats(&bytes))
            };
            let state = UnitShardState {
                param: read(StateKind::Param)?,
                exp_avg: read(StateKind::ExpAvg)?,
                exp_avg_sq: read(StateKind::ExpAvgSq)?,
            };
            trainer.engine_mut().import_unit(u, &state)?;
            crate::progress::advance();
        }
        let meta = checkpoint.metadata();
        if !weights_only {
            let t = &meta.trainer;
            trainer
                .restore(&TrainState {
                    step: meta.step,
                    optimizer_steps: t.optimizer_step,
                    loss_scale: t.loss_scale.as_ref().map(|s| s.scale),
                    growth_tracker: t.loss_scale.as_ref().map_or(0, |s| s.growth_tracker),
                    seed: t.seed,
                    micro_batches_done: t.data.micro_batches_done,
                    samples_done: t.data.samples_done,
                    data_fingerprint: t.data.data_fingerprint.clone(),
                    epoch: t.data.epoch,
                    diverged_at: t.diverged_at,
                })
                .map_err(|e| CheckpointingError::Other(e.to_string()))?;
        }
        if world.rank() == 0 {
            let how = if weights_only {
                "weights of"
            } else {
                "resumed from"
            };
            let mut line = format!(
                "{how} checkpoint {} (step {}, saved by {} rank(s) with {})",
                dir.display(),
                meta.step,
                meta.world_size,
                meta.strategy.name()
            );
            if meta.config_hash != self.config_hash {
                match &meta.config {
                    Some(saved) => {
                        let now = serde_json::to_value(&trainer.config).unwrap_or_default();
                        let changed = changed_settings(saved, &now, weights_only);
                        if !changed.is_empty() {
                            line.push_str(&format!(
                                "; settings that differ from the job that saved it: {}",
                                changed.join(", ")
                            ));
                        }
                    }
                    None => line.push_str(
                        "; the job config differs from the one that saved it (the checkpoint \
                         does not record which settings)",
                    ),
                }
            }
            trainer.log(LogLevel::Info, &line);
        }
        self.last_save = Instant::now();
        Ok(Some(Restored {
            dir,
            step: meta.step,
            weights_only,
        }))
    }

    /// Rank 0's pick, logging every checkpoint it passes over.
    fn choose(&self, reporter: &dyn Reporter) -> Result<Choice, CheckpointingError> {
        if self.resume {
            for removed in clean_stale(&self.root)? {
                reporter.log(
                    LogLevel::Warn,
                    &shardrun_checkpoint::naming::removed_line(&removed),
                );
            }
            let found = find_latest(&self.root, Verify::Checksums)?;
            for message in found.fallback_messages() {
                reporter.log(LogLevel::Warn, &message);
            }
            if let Some(checkpoint) = &found.checkpoint {
                for (from, to) in found.set_aside_skipped()? {
                    // What was announced before the ranks started checked the files' sizes
                    // only: this says which steps train again.
                    let again = match shardrun_checkpoint::naming::step_of_dir(&from) {
                        Some(skipped) => {
                            format!("; steps {} to {skipped} train again", checkpoint.step() + 1)
                        }
                        None => String::new(),
                    };
                    reporter.log(
                        LogLevel::Warn,
                        &format!(
                            "set {} aside as {}: it does not load, so the run resumes from the \
                             checkpoint of step {} instead{again}",
                            from.display(),
                            to.file_name().unwrap_or_default().to_string_lossy(),
                            checkpoint.step()
                        ),
                    );
                }
                return Ok(Choice::Resume(checkpoint.step()));
            }
            // Checkpoints that all fail to load are not a run to start over silently: the
            // steps they hold would be trained again, and a copied-back shard repairs one.
            if let Some((newest, why)) = found.skipped.first() {
                return Err(CheckpointingError::Other(format!(
                    "no checkpoint of this run loads ({}; the newest, {}: {why}), and resuming \
                     would start over at step 1; restore a checkpoint's files from a copy and \
                     run it again, or start the run over with --force (which deletes them)",
                    found.skipped_names(),
                    newest.display()
                )));
            }
        }
        if let Some(from) = &self.from {
            let found = resolve(from, Verify::Checksums)?;
            for message in found.fallback_messages() {
                reporter.log(LogLevel::Warn, &message);
            }
            if let Some(checkpoint) = found.checkpoint {
                return Ok(Choice::From(checkpoint.step()));
            }
        }
        Ok(Choice::Nothing)
    }

    fn save_now(
        &mut self,
        trainer: &Trainer,
        reason: SaveReason,
    ) -> Result<Option<String>, CheckpointingError> {
        let started = Instant::now();
        let engine = trainer.engine();
        let groups = engine.groups();
        let (rank, world_size) = (
            groups.control.rank() as u64,
            groups.control.world_size() as u64,
        );
        let state = trainer.train_state();
        let _span =
            tracing::info_span!("checkpoint", step = state.step, reason = ?reason).entered();
        tracing::debug!(root = %self.root.display(), format = ?self.format, "checkpoint save begins");
        let target = SaveTarget::new(&self.root, state.step, world_size);
        if rank == 0 {
            target.prepare()?;
        }
        groups.control.barrier()?;

        let layout = engine_layout(engine);
        let mut files = Vec::new();
        match self.format {
            CheckpointFormat::Sharded => {
                // One replica of each shard is enough; the shard group's first replica writes.
                if groups.replicate.rank() == 0 {
                    let mut writer =
                        ShardWriter::create(&target, &layout, engine.shard_index() as u64)?;
                    for u in 0..layout.units.len() {
                        let s = engine.export_unit(u)?;
                        writer.write_unit(
                            u,
                            &bytes(&s.param),
                            &bytes(&s.exp_avg),
                            &bytes(&s.exp_avg_sq),
                        )?;
                        crate::progress::advance();
                    }
                    files.push(writer.finish()?);
                }
            }
            CheckpointFormat::Full => {
                // Unit by unit: rank 0's shard group gathers one unit at a time; only rank 0
                // writes, so no rank ever holds more than one unit unsharded.
                let mut writer = if rank == 0 {
                    Some(FullWriter::create(&target, &layout)?)
                } else {
                    None
                };
                if groups.replicate.rank() == 0 {
                    for (u, unit) in layout.units.iter().enumerate() {
                        let s = engine.export_unit(u)?;
                        let gather = |values: &[f32]| -> Result<Vec<u8>, CheckpointingError> {
                            if groups.control_shard.world_size() == 1 {
                                return Ok(bytes(values));
                            }
                            let full = Tensor::zeros(
                                [unit.padded_numel as i64],
                                (Kind::Float, tch::Device::Cpu),
                            );
                            groups
                                .control_shard
                                .all_gather(&Tensor::from_slice(values), &full)?
                                .wait()?;
                            Ok(bytes(
                                &Vec::<f32>::try_from(&full)
                                    .map_err(crate::fsdp::FsdpError::from)?,
                            ))
                        };
                        let (param, exp_avg, exp_avg_sq) = (
                            gather(&s.param)?,
                            gather(&s.exp_avg)?,
                            gather(&s.exp_avg_sq)?,
                        );
                        if let Some(writer) = writer.as_mut() {
                            writer.write_unit(u, &param, &exp_avg, &exp_avg_sq)?;
                        }
                        crate::progress::advance();
                    }
                }
                if let Some(writer) = writer {
                    files.extend(writer.finish()?);
                }
            }
        }
        // Training draws no random numbers (data and init are functions of the seed and the
        // sample index), so there is no generator state to keep per rank.
        write_rank_report(&target, rank, Vec::new(), files)?;
        tracing::debug!(
            seconds = started.elapsed().as_secs_f64(),
            "checkpoint: this rank's part is written; waiting for the others"
        );
        groups.control.barrier()?;

        let mut path = None;
        if rank == 0 {
            let request = CommitRequest {
                format: self.format,
                strategy: trainer.config.fsdp.strategy,
                shard_group_size: groups.shard.world_size() as u64,
                dtypes: StateDtypes::fp32_state(trainer.config.fsdp.mixed_precision.param_dtype),
                layout,
                trainer: trainer_state(&trainer.config, &state),
                config_hash: self.config_hash.clone(),
                config: serde_json::to_value(&trainer.config).ok(),
                kind: CommitKind::Checkpoint { keep: self.keep },
            };
            let committed = commit_observed(&target, &request, CommitStage::Prune, &mut |_| {})?;
            let bytes: u64 = committed.metadata.files.iter().map(|f| f.size).sum();
            let seconds = started.elapsed().as_secs_f64();
            trainer.log(
                LogLevel::Info,
                &format!(
                    "{} checkpoint of step {} saved to {} in {seconds:.2} s ({:.0} MB, {:.0} MB/s){}",
                    reason.in_words(),
                    state.step,
                    committed.dir.display(),
                    bytes as f64 / 1e6,
                    bytes as f64 / 1e6 / seconds.max(1e-9),
                    match (
                        committed.pruned.removed.len(),
                        &committed.pruned.kept_from_before_divergence,
                    ) {
                        (0, None) => String::new(),
                        (removed, None) => format!("; removed {removed} older"),
                        (removed, Some(sound)) => format!(
                            "; removed {removed} older, kept {}: the newest from before the run \
                             diverged at step {}",
                            sound.display(),
                            state.diverged_at.unwrap_or_default()
                        ),
                    }
                ),
            );
            for left in &committed.pruned.left {
                trainer.log(
                    LogLevel::Warn,
                    &format!("{left}: it stays (remove it by hand to free its space)"),
                );
            }
            path = Some(committed.dir.display().to_string());
        }
        // Every rank leaves the save once rank 0 has committed it: the next step's time then
        // starts on every rank at once, instead of the others' counting their wait for the
        // commit as training (the job's step time is its slowest rank's).
        groups
            .control
            .barrier()
            .map_err(|source| CheckpointingError::AfterSave {
                step: state.step,
                source,
            })?;
        self.last_save = Instant::now();
        Ok(path)
    }
}

impl CheckpointHook for Checkpointer {
    fn save(
        &mut self,
        trainer: &Trainer,
        reason: SaveReason,
    ) -> Result<Option<String>, SaveFailure> {
        self.save_now(trainer, reason)
            .map_err(|source| SaveFailure {
                root: self.root.clone(),
                source,
            })
    }

    fn time_due(&self) -> Option<bool> {
        self.interval
            .map(|interval| self.last_save.elapsed() >= interval)
    }
}

/// The checkpoint every rank loads (its folder, and whether weights only), if any.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Agreed(Option<(PathBuf, bool)>);

impl Agreed {
    /// Where the model's parameters start before the load: nowhere to read from when a
    /// checkpoint is about to overwrite them all (`None`: the model's own source).
    pub fn param_source(&self) -> Option<ParamSource> {
        self.0
            .as_ref()
            .map(|(dir, _)| ParamSource::Checkpoint { dir: dir.clone() })
    }

    /// The checkpoint folder the ranks agreed to load (the run's own, or
    /// `checkpoint.from`'s), if any.
    pub fn dir(&self) -> Option<&Path> {
        self.0.as_ref().map(|(dir, _)| dir.as_path())
    }
}

/// Rank 0's decision, broadcast to every rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Choice {
    Nothing,
    /// `step-<N>` under the run's checkpoint folder.
    Resume(u64),
    /// Step `N` of `checkpoint.from` (fine-tuning: weights only).
    From(u64),
}

/// Rank 0 tells every rank what to load, over the control communicator: a code and the step
/// (exact in the f64 control values carry). `None` on rank 0 (it failed) reaches the others
/// as code 3.
fn broadcast_choice(
    control: &dyn Communicator,
    choice: Option<&Choice>,
) -> Result<Choice, CheckpointingError> {
    let (code, step) = match choice {
        Some(Choice::Nothing) => (0.0, 0),
        Some(Choice::Resume(step)) => (1.0, *step),
        Some(Choice::From(step)) => (2.0, *step),
        None => (3.0, 0),
    };
    let values = control::broadcast(control, &[code, step as f64], 0)?;
    let step = values[1] as u64;
    match values[0] as u32 {
        0 => Ok(Choice::Nothing),
        1 => Ok(Choice::Resume(step)),
        2 => Ok(Choice::From(step)),
        _ => Err(CheckpointingError::RootFailed),
    }
}

/// The engine's units in the checkpoint crate's terms.
pub fn engine_layout(engine: &FsdpEngine) -> Layout {
    let units = engine.layouts().into_iter().map(unit_layout).collect();
    Layout { units }
}

fn unit_layout(flat: &FlatLayout) -> UnitLayout {
    UnitLayout {
        name: flat.unit.clone(),
        params: flat
            .params
            .iter()
            .map(|p| ParamSlot {
                name: p.name.clone(),
                shape: p.shape.iter().map(|&d| d as u64).collect(),
                offset: p.offset as u64,
                numel: p.numel as u64,
            })
            .collect(),
        numel: flat.numel as u64,
        padded_numel: flat.padded_numel as u64,
        shard_size: flat.shard_numel() as u64,
    }
}

fn trainer_state(config: &TrainConfig, state: &TrainState) -> TrainerState {
    let schedule = Schedule::of(config);
    TrainerState {
        optimizer_step: state.optimizer_steps,
        // The schedule advances with applied updates only, so its position is AdamW's step
        // count; a resume derives it from `optimizer_step` (as older checkpoints allow too).
        scheduler: SchedulerState {
            step: state.optimizer_steps,
            last_lr: schedule.lr(state.optimizer_steps.saturating_sub(1)),
        },
        data: DataPosition {
            samples_done: state.samples_done,
            micro_batches_done: state.micro_batches_done,
            epoch: state.epoch,
            data_fingerprint: state.data_fingerprint.clone(),
        },
        seed: state.seed,
        loss_scale: state.loss_scale.map(|scale| LossScaleState {
            scale,
            growth_tracker: state.growth_tracker,
        }),
        diverged_at: state.diverged_at,
    }
}

fn bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

fn floats(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// Where a run's checkpoints go and where it started from: always another run's when a job
/// starts from its checkpoint (`checkpoint.from`), so not worth a word then.
const ANOTHER_RUNS: &[&str] = &["checkpoint.dir", "checkpoint.from"];

/// The settings of `now` that differ from `saved` (job configs as JSON), other than those a
/// resume may change ([`config_diff::RESUMABLE`]; `shardrun` lists those itself as "changed
/// on resume"), and for a job starting from another run's weights (`from_another_run`), other
/// than [`ANOTHER_RUNS`]: `optimizer.lr 0.0003 → 0.01`.
fn changed_settings(
    saved: &serde_json::Value,
    now: &serde_json::Value,
    from_another_run: bool,
) -> Vec<String> {
    config_diff::differences(saved, now)
        .into_iter()
        .filter(|(path, ..)| !config_diff::under(path, config_diff::RESUMABLE))
        .filter(|(path, ..)| !(from_another_run && config_diff::under(path, ANOTHER_RUNS)))
        .map(|(path, was, is)| {
            format!(
                "{path} {} → {}",
                config_diff::shown(&was),
                config_diff::shown(&is)
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_resume_names_the_settings_it_changed_beyond_those_a_resume_may_change() {
        let saved = serde_json::json!({
            "steps": 30, "log_every": 1, "seed": 0,
            "batch": { "world_size": 2, "grad_accum_steps": 1 },
            "optimizer": { "lr": 0.0003 },
            "checkpoint": { "interval_steps": null, "dir": "checkpoints" },
        });
        let mut now = saved.clone();
        now["steps"] = 140.into();
        now["batch"]["world_size"] = 4.into();
        now["checkpoint"]["interval_steps"] = 20.into();
        assert_eq!(changed_settings(&saved, &now, false), Vec::<String>::new());
        now["optimizer"]["lr"] = 0.01.into();
        now["checkpoint"]["dir"] = "elsewhere".into();
        assert_eq!(
            changed_settings(&saved, &now, false),
            [
                "checkpoint.dir checkpoints → elsewhere",
                "optimizer.lr 0.0003 → 0.01"
            ]
        );
        // A job starting from another run's checkpoint keeps its checkpoints elsewhere.
        now["checkpoint"]["from"] = "other/checkpoints/step-30".into();
        assert_eq!(
            changed_settings(&saved, &now, true),
            ["optimizer.lr 0.0003 → 0.01"]
        );
    }
}
