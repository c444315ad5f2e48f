//! What differs between the job a run directory started with and the job a re-run asks for,
//! field by field, named as the spec names them, and which differences a resumed run can
//! take: those that change where, how fast or for how long it trains, not what it computes.

use crate::resolve::ResolvedJob;
use serde_json::Value;
use shardrun_protocol::config::ModelConfig;
use shardrun_protocol::config_diff::{differences, shown, under, RESUMABLE};
use std::fmt;

/// One field that differs.
#[derive(Debug, Clone, PartialEq)]
pub struct FieldChange {
    /// As the spec names it (`training.optimizer.lr`, `resources.nodes`, `world size`).
    pub field: String,
    pub was: Value,
    pub now: Value,
    /// Applied on resume (else the re-run is refused).
    pub safe: bool,
    /// What made the change when the spec did not (`--nproc 4`).
    pub by: Option<String>,
}

impl fmt::Display for FieldChange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: {} → {}",
            self.field,
            shown(&self.was),
            shown(&self.now)
        )?;
        match &self.by {
            Some(by) => write!(f, " ({by})"),
            None => Ok(()),
        }
    }
}

/// Resolved fields that follow from others, or name the run rather than describe it.
const IGNORED: &[&str] = &[
    "name",
    // The training config's copy of `name`.
    "train.name",
    "nproc",
    "run_root",
    "world_size",
    "grad_accum_steps",
    "tokens_per_step",
    "memory",
    "warnings",
    "overrides",
    "slurm.time_limit_seconds",
    // Where `slurm.env`'s values came from; the values themselves are compared.
    "slurm.from_shell",
];

/// Resolved sections a resumed run may take besides the training config's resumable
/// fields ([`RESUMABLE`]): where and when it is scheduled.
const SAFE_SECTIONS: &[&str] = &["slurm", "preemption"];

fn safe(path: &str) -> bool {
    path.strip_prefix("train.")
        .is_some_and(|field| under(field, RESUMABLE))
        || under(path, SAFE_SECTIONS)
}

/// In words, for the refusal's hint.
pub const SAFE_IN_WORDS: &str = "training.steps, the world size, the device kind, resources \
    and preemption, training.batch_size_per_device, the checkpoint interval, keep, format and resume, \
    log_every, on_divergence, threads_per_rank, FSDP's strategy, wrap, shard_group_size, prefetch, \
    max_gathers_in_flight, activation_checkpointing and loss_chunk_tokens, and \
    validation's every_steps and max_batches";

/// Resolved fields `--nproc` sets (one node of N ranks, in place of the spec's resources):
/// when it ran either job they follow the world size, which is named with the flag.
const SET_BY_NPROC: &[&str] = &["slurm.nodes", "slurm.ntasks_per_node"];

/// Every field that differs between `was` and `now`, in the spec's order of sections.
pub fn between(was: &ResolvedJob, now: &ResolvedJob) -> Vec<FieldChange> {
    let total_batch = now.train.batch.total_batch_size;
    let total_stays = was.train.batch.total_batch_size == total_batch;
    let nproc = match (was.nproc, now.nproc) {
        (_, Some(n)) => Some(format!("--nproc {n}")),
        (Some(n), None) => Some(format!("was --nproc {n}")),
        (None, None) => None,
    };
    // A model read from a Hugging Face folder has the architecture the folder's config.json
    // gives: a change there is the file's, not the spec's.
    let folder_config = match (&was.train.model, &now.train.model) {
        (ModelConfig::Llama(a), ModelConfig::Llama(b)) if a.pretrained == b.pretrained => {
            b.pretrained.as_ref().map(|dir| {
                format!(
                    "changed in {}",
                    dir.join(shardrun_models::hf::CONFIG_FILE).display()
                )
            })
        }
        _ => None,
    };
    let mut changes: Vec<FieldChange> = differences(
        &serde_json::to_value(was).unwrap_or_default(),
        &serde_json::to_value(now).unwrap_or_default(),
    )
    .into_iter()
    .filter(|(path, ..)| !under(path, IGNORED))
    .filter(|(path, ..)| nproc.is_none() || !SET_BY_NPROC.contains(&path.as_str()))
    .map(|(path, was, now)| FieldChange {
        field: spec_name(&path),
        safe: safe(&path),
        by: nproc
            .clone()
            .filter(|_| path == "train.batch.world_size")
            .or_else(|| default_changed(&path, &was, &now))
            .or_else(|| {
                folder_config
                    .clone()
                    .filter(|_| path.starts_with("train.model.architecture."))
            })
            .or_else(|| {
                // It follows from the world size and micro-batch, never from the spec (or
                // from a new total batch, named on its own line).
                (path == "train.batch.grad_accum_steps" && total_stays)
                    .then(|| format!("the total batch stays {total_batch}"))
            }),
        was,
        now,
    })
    .collect();
    // Accumulation follows the world size, micro-batch and total batch: named after them.
    if let Some(at) = changes
        .iter()
        .position(|c| c.field == "gradient accumulation")
    {
        let accumulation = changes.remove(at);
        let causes = [
            "world size",
            "training.batch_size_per_device",
            "training.total_batch_size",
        ];
        let after = changes
            .iter()
            .rposition(|c| causes.contains(&c.field.as_str()))
            .map_or(at, |i| i + 1);
        changes.insert(after.min(changes.len()), accumulation);
    }
    changes
}

/// What to say of a change that a new default makes to a spec that does not set the value:
/// runs started before `document_mask` defaulted to true with `packing: whole_documents`.
fn default_changed(path: &str, was: &Value, now: &Value) -> Option<String> {
    (path == "train.data.document_mask" && *was == Value::Bool(false) && *now == Value::Bool(true))
        .then(|| {
            "if the spec does not set it: with `packing: whole_documents` it now defaults to \
         true; `document_mask: false` keeps what the run trained with"
                .to_string()
        })
}

/// A resolved path as the spec spells it.
fn spec_name(path: &str) -> String {
    let renamed = [
        ("train.batch.world_size", "world size"),
        ("train.batch.grad_accum_steps", "gradient accumulation"),
        ("train.batch.total_batch_size", "training.total_batch_size"),
        (
            "train.batch.batch_size_per_device",
            "training.batch_size_per_device",
        ),
        ("train.device", "device"),
        ("slurm.ntasks_per_node", "resources.tasks_per_node"),
    ];
    if let Some((_, name)) = renamed.iter().find(|(from, _)| *from == path) {
        return name.to_string();
    }
    // The data's source is one resolved section; the spec writes its keys in `data`.
    if let Some(source) = path.strip_prefix("train.data.source.") {
        let key = match source {
            "text.field" => "field",
            "text.prompt" => "prompt_field",
            "text.completion" => "completion_field",
            "text.format" => "field, prompt_field",
            "split.by" => "split",
            "split.separator" => "separator",
            other => other.split(['.', '[']).next().unwrap_or(other),
        };
        return format!("training.data.{key}");
    }
    for (from, to) in [("train.", "training."), ("slurm.", "resources.")] {
        if let Some(rest) = path.strip_prefix(from) {
            return format!("{to}{rest}");
        }
    }
    path.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resolve::{resolve, Overrides};

    #[test]
    fn a_document_mask_turned_on_by_its_new_default_says_how_to_keep_it_off() {
        let on = |was: bool, now: bool| {
            default_changed(
                "train.data.document_mask",
                &Value::Bool(was),
                &Value::Bool(now),
            )
        };
        assert!(on(false, true).is_some_and(|s| s.contains("`document_mask: false`")));
        assert_eq!(on(true, false), None);
        assert_eq!(
            default_changed("train.seed", &Value::Bool(false), &Value::Bool(true)),
            None
        );
    }
    use crate::spec::{overrides, parse};
    use std::path::Path;

    fn job(sets: &[&str], nproc: Option<u64>) -> ResolvedJob {
        let loaded = parse(
            include_str!("../../../examples/demo.yaml"),
            Path::new("demo.yaml"),
        )
        .unwrap();
        let sets: Vec<_> = sets.iter().map(|s| overrides::parse(s).unwrap()).collect();
        let loaded = overrides::apply(loaded, &sets).unwrap();
        resolve(
            &loaded,
            &Overrides {
                world_size: nproc,
                ..Overrides::default()
            },
        )
        .unwrap()
    }

    #[test]
    fn fields_of_the_data_source_are_named_as_the_spec_writes_them() {
        for (resolved, spec) in [
            ("train.data.source.text.field", "training.data.field"),
            (
                "train.data.source.text.prompt",
                "training.data.prompt_field",
            ),
            (
                "train.data.source.split.separator",
                "training.data.separator",
            ),
            ("train.data.source.files[1]", "training.data.files"),
            (
                "train.data.source.messages_field",
                "training.data.messages_field",
            ),
        ] {
            assert_eq!(spec_name(resolved), spec, "{resolved}");
        }
    }

    /// Both jobs of a Llama read from the folder `models/llama`, whose config.json gave
    /// `now` another RMSNorm epsilon.
    #[test]
    fn an_edited_config_json_of_the_model_folder_is_named_as_where_the_change_is() {
        let llama = |pretrained: &str, norm_eps: f64| {
            let mut j = job(
                &["training.model={kind: llama, vocab_size: 1024, dim: 64, n_layers: 2, n_heads: 4, ffn_dim: 128}"],
                None,
            );
            let ModelConfig::Llama(m) = &mut j.train.model else {
                panic!("a Llama")
            };
            m.pretrained = Some(pretrained.into());
            m.architecture.norm_eps = norm_eps;
            j
        };
        let changes = between(&llama("models/llama", 1e-5), &llama("models/llama", 1e-3));
        assert_eq!(changes.len(), 1, "{changes:?}");
        assert_eq!(
            changes[0].to_string(),
            "training.model.architecture.norm_eps: 0.00001 → 0.001 (changed in \
             models/llama/config.json)"
        );
        // Another folder is a change of the spec's.
        let changes = between(&llama("models/llama", 1e-5), &llama("models/other", 1e-3));
        assert!(changes.iter().all(|c| c.by.is_none()), "{changes:?}");
    }

    #[test]
    fn the_same_job_has_no_changes() {
        assert_eq!(between(&job(&[], None), &job(&[], None)), vec![]);
        // Nor one run under another name (a copied run directory): names are not settings.
        assert_eq!(
            between(&job(&["name=a"], None), &job(&["name=b"], None)),
            vec![]
        );
    }

    #[test]
    fn longer_training_another_world_and_strategy_are_safe_and_named_as_in_the_spec() {
        let changes = between(
            &job(&[], None),
            &job(
                &[
                    "training.steps=400",
                    "training.log_every=10",
                    "resources.time=\"01:00:00\"",
                    "training.fsdp.strategy=SHARD_GRAD_OP",
                ],
                Some(1),
            ),
        );
        let named: Vec<String> = changes.iter().map(|c| c.to_string()).collect();
        assert_eq!(
            named,
            vec![
                "resources.time: 00:10:00 → 01:00:00",
                "world size: 2 → 1 (--nproc 1)",
                "gradient accumulation: 1 → 2 (the total batch stays 16)",
                "training.fsdp.strategy: FULL_SHARD → SHARD_GRAD_OP",
                "training.log_every: 1 → 10",
                "training.steps: 200 → 400",
            ]
        );
        assert!(changes.iter().all(|c| c.safe), "{changes:?}");
    }

    #[test]
    fn the_ranks_of_nproc_are_named_by_the_flag_not_as_resources() {
        let named = |was: &ResolvedJob, now: &ResolvedJob| -> Vec<String> {
            between(was, now).iter().map(|c| c.to_string()).collect()
        };
        // Batches of 4 per device, so the demo's 16 split on 4 ranks too.
        let job = |sets: &[&str], nproc| {
            let mut sets = sets.to_vec();
            sets.push("training.batch_size_per_device=4");
            job(&sets, nproc)
        };
        // The spec's 2 ranks on one node, then --nproc: its ranks per node are the flag's.
        assert_eq!(
            named(&job(&[], None), &job(&[], Some(4))),
            [
                "world size: 2 → 4 (--nproc 4)",
                "gradient accumulation: 2 → 1 (the total batch stays 16)"
            ]
        );
        assert_eq!(named(&job(&[], None), &job(&[], Some(2))), [""; 0]);
        assert_eq!(
            named(&job(&[], Some(4)), &job(&[], None)),
            [
                "world size: 4 → 2 (was --nproc 4)",
                "gradient accumulation: 1 → 2 (the total batch stays 16)"
            ]
        );
        // Two nodes of 2 in the spec, 4 ranks here: the same world size, nothing to say.
        assert_eq!(
            named(
                &job(&["resources.nodes=2"], None),
                &job(&["resources.nodes=2"], Some(4))
            ),
            [""; 0]
        );
        // Without --nproc, resources the spec changes are named as the spec names them.
        assert_eq!(
            named(&job(&[], None), &job(&["resources.tasks_per_node=4"], None)),
            [
                "resources.tasks_per_node: 2 → 4",
                "world size: 2 → 4",
                "gradient accumulation: 2 → 1 (the total batch stays 16)"
            ]
        );
    }

    #[test]
    fn what_the_model_computes_is_not_safe() {
        let changes = between(
            &job(&[], None),
            &job(
                &[
                    "training.optimizer.lr=0.002",
                    "training.model.dim=128",
                    "training.total_batch_size=32",
                    "training.fsdp.mixed_precision.param_dtype=bf16",
                ],
                None,
            ),
        );
        let unsafe_fields: Vec<&str> = changes
            .iter()
            .filter(|c| !c.safe)
            .map(|c| c.field.as_str())
            .collect();
        // A new total batch changes the accumulation too: not said to stay.
        assert!(
            changes
                .iter()
                .any(|c| c.to_string() == "gradient accumulation: 1 → 2"),
            "{changes:?}"
        );
        assert_eq!(
            unsafe_fields,
            vec![
                "training.total_batch_size",
                "training.fsdp.mixed_precision.param_dtype",
                "training.fsdp.mixed_precision.reduce_dtype",
                "training.model.dim",
                "training.optimizer.lr"
            ]
        );
    }
}
