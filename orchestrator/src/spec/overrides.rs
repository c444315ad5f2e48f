//! `--set dotted.key=value` on the command line: a value of the spec replaced without editing
//! the file. Paths are the sweep's (`training.optimizer.lr`), values are YAML (`20000`,
//! `3.0e-4`, `true`, `bf16`, `{kind: block}`). Each override is checked as the file would
//! be, and its errors name the flag instead of a line of the file.

use super::{JobSpec, LoadedSpec, SpecError, SpecErrorKind};
use serde_norway::Value;

/// One `--set path=value`.
#[derive(Debug, Clone, PartialEq)]
pub struct Override {
    /// Dotted path of a spec key.
    pub path: String,
    pub value: Value,
    /// The argument as given (`training.steps=20000`), for messages.
    pub arg: String,
}

impl Override {
    /// `--set training.steps=20000`, as errors name it.
    pub fn flag(&self) -> String {
        format!("--set {}", self.arg)
    }

    /// Whether an error about `field` is about this override's value: the same key, a key
    /// or list entry (`files[0]`) inside the value it set, or the section it set a key of.
    pub fn covers(&self, field: &str) -> bool {
        within(field, &self.path) || (!field.is_empty() && within(&self.path, field))
    }
}

/// Whether the dotted `field` is `path` or inside it (`training.optimizer.betas` and
/// `training.data.files[0]` in `training.optimizer`, `training.data.files`).
pub fn within(field: &str, path: &str) -> bool {
    field
        .strip_prefix(path)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with(['.', '[']))
}

/// Parses `path=value` (the value is YAML; an empty value is YAML's null).
pub fn parse(arg: &str) -> Result<Override, SpecError> {
    let flag_error = |why: String, fix: &str| {
        SpecError::from_flag(
            &format!("--set {arg}"),
            String::new(),
            SpecErrorKind::Invalid,
            why,
            fix.to_string(),
        )
    };
    let Some((path, text)) = arg.split_once('=') else {
        return Err(flag_error(
            "not of the form `dotted.key=value`".into(),
            "write e.g. `--set training.steps=20000` or `--set training.optimizer.lr=3.0e-4`",
        ));
    };
    let path = path.trim();
    if path.is_empty() || path.split('.').any(|part| part.trim().is_empty()) {
        return Err(flag_error(
            format!("`{path}` is not a dotted path like `training.optimizer.lr`"),
            "name a key of the spec by its sections, as sweeps do (docs/job-spec.md)",
        ));
    }
    let value: Value = serde_norway::from_str(text).map_err(|e| {
        flag_error(
            format!("the value `{text}` is not valid YAML: {e}"),
            "quote strings that contain YAML syntax, e.g. `--set 'resources.time=\"02:00:00\"'`",
        )
    })?;
    Ok(Override {
        path: path.to_string(),
        value,
        arg: arg.to_string(),
    })
}

/// The spec with every override applied in order (a later one wins). Each is checked on its
/// own against the schema, so a typo or a value of the wrong type is reported against its
/// flag, with the same explanation and fix a file would get.
pub fn apply(mut loaded: LoadedSpec, overrides: &[Override]) -> Result<LoadedSpec, SpecError> {
    for o in overrides {
        let mut doc = serde_norway::to_value(&loaded.spec).map_err(|e| {
            SpecError::from_flag(
                &o.flag(),
                o.path.clone(),
                SpecErrorKind::Invalid,
                format!("cannot apply it: {e}"),
                String::new(),
            )
        })?;
        set_path(&mut doc, &o.path, o.value.clone()).map_err(|why| {
            SpecError::from_flag(
                &o.flag(),
                o.path.clone(),
                SpecErrorKind::Invalid,
                why,
                "set a key inside it instead, e.g. `training.optimizer.lr`".into(),
            )
        })?;
        // Read back as a file is, so the error explains the field the same way.
        let text = serde_norway::to_string(&doc).unwrap_or_default();
        let spec: JobSpec = super::read::read(&text).map_err(|e| {
            if let Some(error) = written_key_made_unknown(&loaded, o, &e) {
                return error;
            }
            // The flag names whole paths.
            let fix = e.unknown.and_then(|u| u.did_you_mean()).unwrap_or(e.fix);
            SpecError::from_flag(&o.flag(), e.field, e.kind, e.why, fix)
        })?;
        loaded.spec = spec;
        loaded.overrides.push(o.clone());
    }
    if !overrides.is_empty() {
        super::validate_name(&loaded)?;
    }
    Ok(loaded)
}

/// A key the file wrote that the flag's value leaves with no place (`--set
/// training.model.kind=llama` under a `model:` with `path:`): the error is the file's key,
/// pointed at there, and says which flag made it unknown.
fn written_key_made_unknown(
    loaded: &LoadedSpec,
    o: &Override,
    e: &super::read::ReadError,
) -> Option<SpecError> {
    let key = e.unknown.as_ref()?.path.as_str();
    // A key inside the flag's own value is the flag's error.
    if o.covers(key) {
        return None;
    }
    // Written in the file itself, not by an earlier flag.
    let at = super::yaml::locate_written_key(&loaded.source, key)?;
    Some(SpecError::in_file(
        &loaded.path,
        &loaded.source,
        Some(at),
        e.field.clone(),
        e.kind,
        format!("{} once `{}` applies", e.why, o.flag()),
        format!("remove it from the file, or leave out the flag; {}", e.fix),
    ))
}

/// Sets `a.b.c` in a YAML document, creating the sections left to their defaults.
pub fn set_path(doc: &mut Value, path: &str, value: Value) -> Result<(), String> {
    if path.split('.').any(|p| p.is_empty()) {
        return Err(format!(
            "`{path}` is not a dotted path like `training.optimizer.lr`"
        ));
    }
    // The grid's keys are dotted paths themselves: `sweep.grid.training.seed` sets the
    // grid's `training.seed`.
    let parts: Vec<&str> = match path.strip_prefix("sweep.grid.") {
        Some(swept) => vec!["sweep", "grid", swept],
        None => path.split('.').collect(),
    };
    let mut cur = doc;
    for (i, part) in parts.iter().enumerate() {
        if cur.is_null() {
            *cur = Value::Mapping(Default::default());
        }
        let Value::Mapping(map) = cur else {
            return Err(format!(
                "`{}` is a value, not a section",
                parts[..i].join(".")
            ));
        };
        let key = Value::String((*part).to_string());
        if i + 1 == parts.len() {
            map.insert(key, value);
            return Ok(());
        }
        cur = map.entry(key).or_insert(Value::Null);
    }
    Ok(())
}

/// What `job.yaml` of a run records: the spec text as written when nothing was overridden,
/// else the spec with the overrides applied, under a comment naming them.
pub fn recorded_yaml(loaded: &LoadedSpec) -> String {
    if loaded.overrides.is_empty() {
        return loaded.source.clone();
    }
    let flags: Vec<String> = loaded.overrides.iter().map(Override::flag).collect();
    let body = serde_norway::to_string(&loaded.spec).unwrap_or_default();
    format!(
        "# {} with {} (written out again: its comments are not kept)\n{body}",
        loaded.path.display(),
        flags.join(" ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resolve::{resolve, Overrides};
    use crate::spec::parse as parse_spec;
    use std::path::Path;

    const DEMO: &str = include_str!("../../../examples/demo.yaml");

    fn with(args: &[&str]) -> Result<LoadedSpec, SpecError> {
        let loaded = parse_spec(DEMO, Path::new("demo.yaml")).unwrap();
        let overrides: Vec<Override> = args.iter().map(|a| parse(a)).collect::<Result<_, _>>()?;
        apply(loaded, &overrides)
    }

    #[test]
    fn a_grid_key_is_one_dotted_path() {
        let loaded = with(&["sweep.grid.training.seed=[5, 6]"]).unwrap();
        let grid = loaded.spec.sweep.unwrap().grid;
        assert_eq!(grid.keys().collect::<Vec<_>>(), ["training.seed"]);
        assert_eq!(grid["training.seed"].len(), 2);
    }

    #[test]
    fn values_are_yaml_typed_and_later_flags_win() {
        let loaded = with(&[
            "training.steps=20000",
            "training.optimizer.lr=3.0e-4",
            "training.fsdp.activation_checkpointing=true",
            "training.fsdp.wrap={kind: size_based, min_params: 1000}",
            "training.seed=1",
            "training.seed=2",
            "resources.time=\"01:00:00\"",
        ])
        .unwrap();
        let t = &loaded.spec.training;
        assert_eq!(t.steps, 20000);
        assert_eq!(t.optimizer.lr, Some(3.0e-4));
        assert_eq!(t.fsdp.activation_checkpointing, Some(true));
        assert_eq!(t.seed, Some(2));
        assert_eq!(loaded.spec.resources.time.as_deref(), Some("01:00:00"));
        assert_eq!(
            t.fsdp.wrap,
            Some(shardrun_protocol::config::WrapPolicy::SizeBased { min_params: 1000 })
        );
        // Sections the file left out are created.
        let loaded = with(&["preemption.max_requeues=7"]).unwrap();
        assert_eq!(loaded.spec.preemption.max_requeues, Some(7));
    }

    #[test]
    fn a_section_set_to_null_takes_its_defaults() {
        // PyTorch's `mixed_precision=None`: an earlier bf16 gives way to the f32 default.
        let bf16 = "training.fsdp.mixed_precision={param_dtype: bf16}";
        let before = with(&[bf16]).unwrap().spec.training.fsdp.mixed_precision;
        assert_ne!(before, Default::default());
        for null in ["null", "~", ""] {
            let loaded = with(&[bf16, &format!("training.fsdp.mixed_precision={null}")]).unwrap();
            assert_eq!(
                loaded.spec.training.fsdp.mixed_precision,
                Default::default(),
                "{null:?}"
            );
        }
        // In the file too, and for a list: as if the key were not written.
        let loaded = parse_spec(
            &DEMO.replace(
                "  schedule:\n    warmup_steps: 20\n    decay: cosine\n    min_lr_ratio: 0.1\n",
                "  schedule: ~\n",
            ),
            Path::new("demo.yaml"),
        )
        .unwrap();
        assert_eq!(loaded.spec.training.schedule, Default::default());
        let loaded = with(&["resources.extra_sbatch=null"]).unwrap();
        assert!(loaded.spec.resources.extra_sbatch.is_empty());
        // A quoted "null" is a string, and no section.
        let err = with(&["training.fsdp.mixed_precision=\"null\""]).unwrap_err();
        assert!(err.why.contains("expected a mapping"), "{err}");
    }

    #[test]
    fn errors_name_the_flag_with_the_files_explanation() {
        let err = with(&["training.stepz=5"]).unwrap_err();
        assert_eq!(err.kind, SpecErrorKind::UnknownField);
        assert_eq!(err.fix, "did you mean `training.steps`?");
        assert!(
            err.to_string().starts_with(
                "--set training.stepz=5: field `training`: unknown key `training.stepz`"
            ),
            "{err}"
        );
        let err = with(&["training.steps=many"]).unwrap_err();
        assert_eq!(err.field, "training.steps");
        assert_eq!(err.fix, "write a whole number (0 or more) here");
        assert_eq!(err.line, None);
        assert!(
            err.to_string().starts_with("--set training.steps=many: "),
            "{err}"
        );
        let err = with(&["training.fsdp.strategy=FULL_SHAD"]).unwrap_err();
        assert_eq!(err.fix, "did you mean `FULL_SHARD`?");
        let err = with(&["training.learning_rate=0.1"]).unwrap_err();
        assert_eq!(
            err.fix,
            "did you mean `training.optimizer.lr`? (the name here of the Hugging Face Trainer's \
             `learning_rate`)"
        );
        let err = with(&["training.steps"]).unwrap_err();
        assert!(err.to_string().contains("dotted.key=value"), "{err}");
        let err = with(&["training.steps.max=3"]).unwrap_err();
        assert!(err.why.contains("is a value, not a section"), "{err}");
    }

    #[test]
    fn a_key_of_the_file_the_flag_leaves_unknown_is_pointed_at_in_the_file() {
        // The file's transformer keys have no place in an MLP.
        let err = with(&["training.model.kind=mlp"]).unwrap_err();
        assert_eq!(err.kind, SpecErrorKind::UnknownField);
        let line = err.line.expect("located in the file");
        let written = DEMO.lines().nth(line as usize - 1).unwrap();
        let text = err.to_string();
        assert!(text.starts_with("demo.yaml:"), "{text}");
        assert!(
            text.contains("once `--set training.model.kind=mlp` applies"),
            "{text}"
        );
        let key = err
            .why
            .split('`')
            .nth(1)
            .unwrap()
            .rsplit('.')
            .next()
            .unwrap();
        assert!(
            written.trim_start().starts_with(&format!("{key}:")),
            "{written} holds {key}: {text}"
        );
        assert!(err.fix.starts_with("remove it from the file"), "{text}");
        // A key an earlier flag wrote is that flag's, not the file's.
        let err = with(&[
            "training.model={kind: mlp, input_dim: 4, hidden_dim: 8, output_dim: 4}",
            "training.model.kind=transformer",
        ])
        .unwrap_err();
        assert!(
            err.to_string()
                .starts_with("--set training.model.kind=transformer: "),
            "{err}"
        );
    }

    #[test]
    fn errors_found_by_the_plan_point_at_the_flag() {
        let loaded = with(&["training.total_batch_size=20"]).unwrap();
        let err = resolve(&loaded, &Overrides::default()).unwrap_err();
        let text = err.to_string();
        assert!(
            text.starts_with(
                "--set training.total_batch_size=20: field `training.total_batch_size`: total batch 20"
            ),
            "{text}"
        );
        let loaded = with(&["training.schedule.min_lr_ratio=2"]).unwrap();
        let text = resolve(&loaded, &Overrides::default())
            .unwrap_err()
            .to_string();
        assert!(
            text.starts_with("--set training.schedule.min_lr_ratio=2: "),
            "{text}"
        );
        // A field the flag did not touch is still located in the file.
        let loaded = with(&["training.steps=10"]).unwrap();
        let text = resolve(&loaded, &Overrides::default())
            .unwrap_err()
            .to_string();
        assert!(
            text.starts_with("demo.yaml:"),
            "20 warmup steps in the file, 10 steps from the flag: {text}"
        );
    }

    #[test]
    fn the_recorded_yaml_reads_back_to_the_same_spec() {
        let loaded = with(&["training.steps=400", "resources.time=\"00:30:00\""]).unwrap();
        let text = recorded_yaml(&loaded);
        assert!(
            text.starts_with(
                "# demo.yaml with --set training.steps=400 --set resources.time=\"00:30:00\""
            ),
            "{text}"
        );
        let again = parse_spec(&text, Path::new("job.yaml")).unwrap();
        assert_eq!(again.spec, loaded.spec);
        let plain = with(&[]).unwrap();
        assert_eq!(
            recorded_yaml(&plain),
            DEMO,
            "without --set, the text as written"
        );
    }
}
