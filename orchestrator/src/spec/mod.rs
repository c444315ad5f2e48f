//! The YAML job spec: what a person writes. Parsed with `deny_unknown_fields` so a typo is an
//! error, never a silently ignored key; optional fields stay `None` here and get their
//! defaults in [`crate::resolve`], so the resolved config is explicit about every value.
//!
//! The text is read into a tree that keeps where every key and value was written (`yaml`)
//! and deserialized from it (`de`, `read`), so every error, including those the plan finds
//! later, points at a line and column of the file.
//!
//! The full schema with every default is documented in `docs/job-spec.md`.

mod de;
mod error;
pub mod overrides;
pub(crate) mod read;
mod schema;
mod yaml;

pub use error::did_you_mean;
pub use error::{Excerpt, SpecError, SpecErrorKind};
pub use overrides::Override;
pub use schema::*;
pub use yaml::{locate_path, Location};

use std::path::{Path, PathBuf};

/// A parsed job spec together with where it came from (for error locations).
#[derive(Debug, Clone)]
pub struct LoadedSpec {
    pub spec: JobSpec,
    /// File the spec was read from (`<string>` for specs parsed from memory).
    pub path: PathBuf,
    /// What relative paths in the spec are relative to: the spec file's folder; for the
    /// `job.yaml` of a run directory, the folder of the spec the run was made from.
    pub base_dir: PathBuf,
    /// The YAML text, kept to point errors found after parsing at their line.
    pub source: String,
    /// `--set` values applied on top of the file, in order; errors about them name the flag.
    pub overrides: Vec<Override>,
}

impl LoadedSpec {
    /// An error about `field` (dotted path) found after parsing, located in the source.
    pub fn error_at(
        &self,
        field: &str,
        why: impl Into<String>,
        fix: impl Into<String>,
    ) -> SpecError {
        if let Some(o) = self.overrides.iter().rev().find(|o| o.covers(field)) {
            return SpecError::from_flag(
                &o.flag(),
                field.to_string(),
                SpecErrorKind::Invalid,
                why.into(),
                fix.into(),
            );
        }
        SpecError::in_file(
            &self.path,
            &self.source,
            locate_path(&self.source, field),
            field.to_string(),
            SpecErrorKind::Invalid,
            why.into(),
            fix.into(),
        )
    }
}

/// Read and parse a job spec file, then apply `--set` overrides.
pub fn load_with(path: &Path, overrides: &[Override]) -> Result<LoadedSpec, SpecError> {
    overrides::apply(load(path)?, overrides)
}

/// Read and parse a job spec file.
pub fn load(path: &Path) -> Result<LoadedSpec, SpecError> {
    let bytes = std::fs::read(path).map_err(|e| SpecError {
        file: path.into(),
        line: None,
        column: None,
        excerpt: None,
        field: String::new(),
        kind: SpecErrorKind::Io,
        why: format!("cannot read the file: {e}"),
        fix: "check the path; `shardrun plan examples/demo.yaml` shows a working spec".into(),
    })?;
    let source = String::from_utf8(bytes).map_err(|e| not_utf8(path, e))?;
    parse(&source, path)
}

/// A spec is UTF-8 text: where the first byte that is not is (often a file saved as Latin-1).
fn not_utf8(path: &Path, error: std::string::FromUtf8Error) -> SpecError {
    let valid = error.utf8_error().valid_up_to();
    let bytes = error.as_bytes();
    let before = String::from_utf8_lossy(&bytes[..valid]);
    let line = before.matches('\n').count() as u32 + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) as u32 + 1;
    SpecError::in_file(
        path,
        &String::from_utf8_lossy(bytes),
        Some(yaml::Location {
            line,
            column,
            width: 1,
        }),
        String::new(),
        SpecErrorKind::Syntax,
        format!(
            "the spec is not UTF-8 text: byte 0x{:02x} here is not a character in UTF-8",
            bytes[valid]
        ),
        "save the file as UTF-8 (e.g. `iconv -f latin1 -t utf-8`), or write the character \
         as an escape in a double-quoted string (`\\u00e9`)"
            .into(),
    )
}

/// Parse a job spec from YAML text; `path` is only used in error messages.
pub fn parse(source: &str, path: &Path) -> Result<LoadedSpec, SpecError> {
    if is_blank(source) {
        return Err(SpecError::in_file(
            path,
            source,
            None,
            String::new(),
            SpecErrorKind::MissingField,
            "the spec is empty (nothing but blank lines and comments)".into(),
            "a job spec needs at least `name:` and `training:` (model, steps, total_batch_size, \
             batch_size_per_device); start from examples/demo.yaml, docs/job-spec.md lists every key"
                .into(),
        ));
    }
    let spec: JobSpec = read::read(source).map_err(|e| SpecError::from_read(e, path, source))?;
    let loaded = LoadedSpec {
        spec,
        path: path.to_path_buf(),
        base_dir: match path.parent() {
            Some(dir) if !dir.as_os_str().is_empty() => dir.to_path_buf(),
            _ => PathBuf::from("."),
        },
        source: source.to_string(),
        overrides: Vec::new(),
    };
    validate_name(&loaded)?;
    Ok(loaded)
}

/// Nothing but blank lines, comments and document markers: an empty document.
fn is_blank(source: &str) -> bool {
    source.lines().all(|line| {
        let line = line.trim();
        line.is_empty() || line.starts_with('#') || line == "---" || line == "..."
    })
}

/// Job names become file names, `#SBATCH --job-name` and log prefixes: keep them plain.
fn validate_name(loaded: &LoadedSpec) -> Result<(), SpecError> {
    let name = &loaded.spec.name;
    let ok = !name.is_empty()
        && name.len() <= 100
        && !name.starts_with(['.', '-'])
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if ok {
        Ok(())
    } else {
        Err(loaded.error_at(
            "name",
            format!("`{name}` is not a valid job name (it becomes a directory name and the Slurm job name)"),
            "use letters, digits, `-`, `_` and `.` only, not starting with `.` or `-`, at most 100 characters",
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_str(yaml: &str) -> Result<LoadedSpec, SpecError> {
        parse(yaml, Path::new("job.yaml"))
    }

    const MINIMAL: &str = "name: t\ntraining:\n  model: { kind: mlp, input_dim: 4, hidden_dim: 8, output_dim: 4 }\n  steps: 2\n  total_batch_size: 4\n  batch_size_per_device: 2\n";

    #[test]
    fn every_example_parses_and_resolves() {
        for (file, text) in [
            ("demo.yaml", include_str!("../../../examples/demo.yaml")),
            ("mlp.yaml", include_str!("../../../examples/mlp.yaml")),
            ("sweep.yaml", include_str!("../../../examples/sweep.yaml")),
        ] {
            let loaded = parse(text, Path::new(file)).unwrap_or_else(|e| panic!("{file}: {e}"));
            crate::resolve::resolve(&loaded, &crate::resolve::Overrides::default())
                .unwrap_or_else(|e| panic!("{file}: {e}"));
        }
        // These name data files or a Hugging Face folder, looked at when planned (the worker
        // tests plan the local one on a folder made by transformers); here they must parse.
        for (file, text) in [
            (
                "gpu-cluster.yaml",
                include_str!("../../../examples/gpu-cluster.yaml"),
            ),
            (
                "llama-local.yaml",
                include_str!("../../../examples/llama-local.yaml"),
            ),
            (
                "llama-finetune.yaml",
                include_str!("../../../examples/llama-finetune.yaml"),
            ),
        ] {
            parse(text, Path::new(file)).unwrap_or_else(|e| panic!("{file}: {e}"));
        }
    }

    #[test]
    fn unknown_key_gets_did_you_mean_with_location() {
        let yaml = MINIMAL.replace("  steps: 2\n", "  steps: 2\n  optimizer:\n    lrr: 0.1\n");
        let err = parse_str(&yaml).unwrap_err();
        assert_eq!(err.kind, SpecErrorKind::UnknownField);
        assert_eq!(err.field, "training.optimizer");
        assert_eq!((err.line, err.column), (Some(6), Some(5)));
        assert!(err.why.contains("training.optimizer.lrr"), "{err}");
        assert_eq!(err.fix, "did you mean `lr`?");
        let text = err.to_string();
        assert!(
            text.starts_with("job.yaml:6:5: field `training.optimizer`"),
            "{text}"
        );
    }

    #[test]
    fn an_empty_spec_says_it_is_empty_and_what_a_spec_needs() {
        for empty in ["", "\n\n", "# a job, one day\n", "---\n# nothing yet\n"] {
            let err = parse_str(empty).unwrap_err();
            assert_eq!(err.kind, SpecErrorKind::MissingField, "{empty:?}");
            assert!(err.why.starts_with("the spec is empty"), "{err}");
            assert!(err.fix.contains("`name:` and `training:`"), "{err}");
        }
        // A spec with content but no name still names the missing key.
        let err = parse_str(&MINIMAL.replace("name: t\n", "")).unwrap_err();
        assert!(err.why.contains("`name` is missing"), "{err}");
    }

    #[test]
    fn unknown_top_level_key() {
        let err = parse_str(&format!("{MINIMAL}resource:\n  nodes: 2\n")).unwrap_err();
        assert_eq!(err.kind, SpecErrorKind::UnknownField);
        assert_eq!(err.line, Some(7));
        assert_eq!(err.fix, "did you mean `resources`?");
    }

    #[test]
    fn unknown_enum_value_suggests_the_closest() {
        let yaml = MINIMAL.replace(
            "  steps: 2\n",
            "  steps: 2\n  fsdp:\n    strategy: FULL_SHAD\n",
        );
        let err = parse_str(&yaml).unwrap_err();
        assert_eq!(err.kind, SpecErrorKind::WrongValue);
        assert_eq!(err.field, "training.fsdp.strategy");
        assert_eq!(err.line, Some(6));
        assert_eq!(err.fix, "did you mean `FULL_SHARD`?");
    }

    #[test]
    fn a_pytorch_dtype_name_is_answered_with_the_name_here() {
        for (theirs, ours) in [("bfloat16", "bf16"), ("float16", "f16"), ("float32", "f32")] {
            let yaml = MINIMAL.replace(
                "  steps: 2\n",
                &format!("  steps: 2\n  fsdp:\n    mixed_precision: {{ param_dtype: {theirs} }}\n"),
            );
            let err = parse_str(&yaml).unwrap_err();
            assert_eq!(err.field, "training.fsdp.mixed_precision.param_dtype");
            assert_eq!(
                err.fix,
                format!("did you mean `{ours}`? (the name here of PyTorch's `{theirs}`)")
            );
        }
    }

    #[test]
    fn a_hugging_face_trainer_argument_is_answered_with_where_it_is_here() {
        for (written, field, fix) in [
            (
                "  steps: 2\n  learning_rate: 0.1\n",
                "training",
                "did you mean `training.optimizer.lr`? (the name here of the Hugging Face \
                 Trainer's `learning_rate`)",
            ),
            (
                "  steps: 2\n  optimizer: { learning_rate: 0.1 }\n",
                "training.optimizer",
                "did you mean `training.optimizer.lr`? (the name here of the Hugging Face \
                 Trainer's `learning_rate`)",
            ),
            (
                "  steps: 2\n  gradient_accumulation_steps: 4\n",
                "training",
                "did you mean `training.total_batch_size`? (the name here of the Hugging Face \
                 Trainer's `gradient_accumulation_steps`: here the accumulation is worked out \
                 from the samples per optimizer step over all ranks)",
            ),
            (
                "  steps: 2\n  bf16: true\n",
                "training",
                "did you mean `training.fsdp.mixed_precision`? (the name here of the Hugging \
                 Face Trainer's `bf16`: `mixed_precision: { param_dtype: bf16, reduce_dtype: \
                 f32 }`)",
            ),
            (
                "  steps: 2\n  max_length: 512\n",
                "training",
                "did you mean `training.data.seq_len`? (the name here of TRL's `max_length`)",
            ),
            // A key of this spec in another section.
            (
                "  steps: 2\n  lr: 0.1\n",
                "training",
                "did you mean `training.optimizer.lr`?",
            ),
        ] {
            let err = parse_str(&MINIMAL.replace("  steps: 2\n", written)).unwrap_err();
            assert_eq!(err.kind, SpecErrorKind::UnknownField);
            assert_eq!(err.field, field);
            assert_eq!(err.fix, fix);
        }
        // Where the spec has the key under the same name, it is suggested as any other.
        let err =
            parse_str(&MINIMAL.replace("  steps: 2\n", "  steps: 2\n  optimizer: { lrr: 0.1 }\n"))
                .unwrap_err();
        assert_eq!(err.fix, "did you mean `lr`?");
        // submitit's names, in `resources`.
        let err = parse_str(&MINIMAL.replace(
            "training:\n",
            "resources: { slurm_additional_parameters: [--mail-type=END] }\ntraining:\n",
        ))
        .unwrap_err();
        assert_eq!(
            err.fix,
            "did you mean `resources.extra_sbatch`? (the name here of submitit's \
             `slurm_additional_parameters`: sbatch options as on the command line, e.g. \
             `[--mail-type=END]`)"
        );
    }

    #[test]
    fn a_value_of_the_wrong_type_is_answered_with_how_it_is_written() {
        let fix = |yaml: &str| parse_str(yaml).unwrap_err().fix;
        assert_eq!(
            fix(&MINIMAL.replace(
                "  steps: 2\n",
                "  steps: 2\n  fsdp: { mixed_precision: bf16 }\n"
            )),
            "write a mapping of keys (`key: value` lines) here, e.g. `mixed_precision: { \
             param_dtype: bf16, reduce_dtype: f32 }`"
        );
        // The example is itself a valid spec.
        let example = MINIMAL.replace(
            "  steps: 2\n",
            "  steps: 2\n  fsdp: { mixed_precision: { param_dtype: bf16, reduce_dtype: f32 } }\n",
        );
        assert!(parse_str(&example).is_ok());
        // An unquoted `[a100|h100]` is a list to YAML.
        let constraint = format!("{MINIMAL}resources: {{ constraint: [a100|h100] }}\n");
        assert_eq!(
            fix(&constraint),
            "write one value here; YAML reads an unquoted `[a100|h100]` as a list: to give it \
             as text, quote it: `\"[a100|h100]\"`"
        );
        let partitions = format!("{MINIMAL}resources: {{ partition: [gpu, debug] }}\n");
        assert!(
            fix(&partitions).contains("`\"[gpu, debug]\"`"),
            "{}",
            fix(&partitions)
        );
        // A block list has no brackets to quote.
        let block = format!("{MINIMAL}resources:\n  partition:\n    - gpu\n    - debug\n");
        assert_eq!(fix(&block), "write one value here, not a list");
        let quoted = format!("{MINIMAL}resources: {{ constraint: \"[a100|h100]\" }}\n");
        assert!(parse_str(&quoted).is_ok());
        // Every example, written at its place, is read.
        for (field, examples) in read::SECTION_EXAMPLES {
            for example in examples.split("` or `") {
                let parents: Vec<&str> = field.split('.').collect();
                let (top, inner) = parents[..parents.len() - 1].split_first().unzip();
                let mut yaml = example.to_string();
                for parent in inner.unwrap_or_default().iter().rev() {
                    // A data section names its kind.
                    let kind = if *parent == "data" {
                        "kind: text, "
                    } else {
                        ""
                    };
                    yaml = format!("{parent}: {{ {kind}{yaml} }}");
                }
                let spec = match top {
                    Some(&"training") => {
                        MINIMAL.replace("  steps: 2\n", &format!("  steps: 2\n  {yaml}\n"))
                    }
                    Some(top) => format!("{MINIMAL}{top}: {{ {yaml} }}\n"),
                    None => format!("{MINIMAL}{yaml}\n"),
                };
                if let Err(e) = parse_str(&spec) {
                    panic!("{field}: {example}: {e}\n{spec}");
                }
            }
        }
    }

    #[test]
    fn data_files_are_a_list_or_one_path_written_alone() {
        let with = |files: &str| {
            let data = format!(
                "  steps: 2\n  data: {{ kind: text, files: {files}, validation: {{ files: {files} }} }}\n"
            );
            parse_str(&MINIMAL.replace("  steps: 2\n", &data))
        };
        for written in ["train.txt", "[train.txt]", "\"train.txt\""] {
            let data = with(written).unwrap().spec.training.data.unwrap();
            let one = Some(vec![PathBuf::from("train.txt")]);
            assert_eq!(data.files, one, "{written}");
            assert_eq!(data.validation.unwrap().files, one, "{written}");
        }
        let number = with("2024").unwrap().spec.training.data.unwrap();
        assert_eq!(number.files, Some(vec![PathBuf::from("2024")]));
        let two = with("[a.txt, b/*.txt]")
            .unwrap()
            .spec
            .training
            .data
            .unwrap();
        assert_eq!(two.files.unwrap().len(), 2);
        let err = with("{ path: a.txt }").unwrap_err();
        assert_eq!(err.field, "training.data.files");
        assert!(
            err.why.contains("a list of paths or glob patterns, or one"),
            "{err}"
        );
    }

    #[test]
    fn a_transformers_config_name_is_answered_with_the_name_here() {
        let yaml = MINIMAL.replace(
            "{ kind: mlp, input_dim: 4, hidden_dim: 8, output_dim: 4 }",
            "{ kind: llama, vocab_size: 8, hidden_size: 32 }",
        );
        let err = parse_str(&yaml).unwrap_err();
        assert_eq!(err.kind, SpecErrorKind::UnknownField);
        assert_eq!(err.field, "training.model");
        assert_eq!(
            err.fix,
            "did you mean `dim`? (the name here of transformers' `hidden_size`)"
        );
    }

    #[test]
    fn wrong_type_names_field_and_expected_type() {
        let err = parse_str(&MINIMAL.replace("steps: 2", "steps: many")).unwrap_err();
        assert_eq!(err.kind, SpecErrorKind::WrongValue);
        assert_eq!(err.field, "training.steps");
        assert_eq!(err.line, Some(4));
        assert_eq!(err.fix, "write a whole number (0 or more) here");
        let err = parse_str(&MINIMAL.replace("steps: 2", "steps: -3")).unwrap_err();
        assert_eq!(
            err.why,
            "invalid value: integer `-3`, expected a whole number (0 or more)"
        );
        // u64's largest is a whole number, though YAML reads it as a float.
        let loaded = parse_str(&MINIMAL.replace("steps: 2", "steps: 18446744073709551615"));
        assert_eq!(loaded.unwrap().spec.training.steps, u64::MAX);
    }

    #[test]
    fn a_value_in_the_wrong_case_is_suggested_as_written() {
        let err = parse_str(&format!("{MINIMAL}  fsdp: {{ strategy: full_shard }}\n")).unwrap_err();
        assert_eq!(err.fix, "did you mean `FULL_SHARD`?");
    }

    #[test]
    fn sections_of_the_wrong_shape_are_named_in_the_specs_words() {
        let err = parse_str(&MINIMAL.replace(
            "model: { kind: mlp, input_dim: 4, hidden_dim: 8, output_dim: 4 }",
            "model: mlp",
        ))
        .unwrap_err();
        assert_eq!(err.field, "training.model");
        assert_eq!(
            err.fix,
            "write a mapping that names its `kind` (`{kind: llama, ...}`; kinds: transformer, \
             mlp, llama, hf) here"
        );
        // A spec that is a word, or a list, rather than a mapping of keys.
        for text in ["hello\n", "- a\n", "- name: u10\n"] {
            let err = parse_str(text).unwrap_err();
            assert!(
                err.why
                    .ends_with("expected a mapping of keys (`key: value` lines)"),
                "{text}: {err}"
            );
            assert_eq!(
                (err.field.as_str(), at(&err)),
                ("", (Some(1), Some(1))),
                "{err}"
            );
        }
    }

    #[test]
    fn an_alias_of_no_anchor_and_a_spec_not_in_utf8_are_shown_where_they_are() {
        let err = parse_str(&MINIMAL.replace("steps: 2", "steps: *undefined")).unwrap_err();
        assert_eq!(
            err.why,
            "not valid YAML: the alias `*undefined` names no anchor above it"
        );
        assert_eq!(at(&err), (Some(4), Some(10)), "{err}");
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("job.yaml");
        let mut bytes = MINIMAL.replace("name: t", "name: \"caf").into_bytes();
        let at_byte = bytes.iter().position(|&b| b == b'\n').unwrap();
        bytes.splice(at_byte..at_byte, [0xe9, b'"']);
        std::fs::write(&path, bytes).unwrap();
        let err = load(&path).unwrap_err();
        assert_eq!((err.line, err.column), (Some(1), Some(11)), "{err}");
        assert!(
            err.why.starts_with("the spec is not UTF-8 text: byte 0xe9"),
            "{err}"
        );
    }

    #[test]
    fn missing_field_says_what_to_add() {
        let err = parse_str(&MINIMAL.replace("  steps: 2\n", "")).unwrap_err();
        assert_eq!(err.kind, SpecErrorKind::MissingField);
        assert!(err.why.contains("training.steps"), "{err}");
        assert!(err.fix.starts_with("add `steps:`"), "{err}");
    }

    #[test]
    fn malformed_yaml_has_line_and_column() {
        let err = parse_str("name: t\n  bad: indent\n").unwrap_err();
        assert_eq!(err.kind, SpecErrorKind::Syntax);
        assert_eq!((err.line, err.column), (Some(2), Some(6)), "{err}");
    }

    /// (line, column) of an error.
    fn at(err: &SpecError) -> (Option<u32>, Option<u32>) {
        (err.line, err.column)
    }

    #[test]
    fn flow_maps_are_located_key_by_key() {
        // An unknown key, found while reading.
        let yaml = MINIMAL.replace(
            "  steps: 2\n",
            "  steps: 2\n  fsdp: {strategy: FULL_SHARD, bogus: 1}\n",
        );
        let err = parse_str(&yaml).unwrap_err();
        assert_eq!(err.kind, SpecErrorKind::UnknownField);
        assert_eq!(err.field, "training.fsdp");
        assert_eq!(at(&err), (Some(5), Some(32)), "{err}");
        assert!(
            err.fix.starts_with("use one of `strategy`, `wrap`"),
            "{err}"
        );
        // Also in a section whose `kind` decides its keys (serde reads it in two passes).
        let yaml = MINIMAL.replace("output_dim: 4 }", "output_dim: 4, bogus: 1 }");
        let err = parse_str(&yaml).unwrap_err();
        assert_eq!(err.field, "training.model");
        assert_eq!(at(&err), (Some(3), Some(67)), "{err}");
        // There serde does not say which value has the wrong type: the value written once in
        // the section is meant; one written twice leaves the section marked.
        let err = parse_str(&MINIMAL.replace("input_dim: 4", "input_dim: many")).unwrap_err();
        assert_eq!(err.field, "training.model.input_dim");
        assert_eq!(at(&err), (Some(3), Some(34)), "{err}");
        let twice = MINIMAL.replace("input_dim: 4", "input_dim: many, bogus: many");
        let err = parse_str(&twice).unwrap_err();
        assert_eq!(err.field, "training.model");
        assert_eq!(at(&err), (Some(3), Some(10)), "{err}");
        // A field found wrong after reading.
        let loaded = parse_str(MINIMAL).unwrap();
        let err = loaded.error_at("training.model.hidden_dim", "why", "fix");
        assert_eq!(at(&err), (Some(3), Some(37)), "{err}");
        assert_eq!(err.excerpt.as_ref().map(|e| e.width), Some(10));
        // A key the flow map leaves out (a default) points at the map's own key.
        let err = loaded.error_at("training.model.max_seq_len", "why", "fix");
        assert_eq!(at(&err), (Some(3), Some(3)), "{err}");
    }

    #[test]
    fn a_hash_inside_quotes_is_part_of_the_value() {
        let yaml = format!("{MINIMAL}resources: {{partition: \"gpu #2\", time: \"1:00 #x\"}}\n");
        let loaded = parse_str(&yaml).unwrap();
        assert_eq!(loaded.spec.resources.partition.as_deref(), Some("gpu #2"));
        let err = loaded.error_at("resources.time", "why", "fix");
        assert_eq!(at(&err), (Some(7), Some(34)), "{err}");
        let yaml = format!(
            "name: \"x #1\" # a comment\n{}resources:\n  partition: \"gpu #2\" # a comment\n  time: \"1:00 #x\"\n",
            MINIMAL.replace("name: t\n", "")
        );
        let err = parse_str(&yaml).unwrap_err();
        assert_eq!((err.field.as_str(), at(&err)), ("name", (Some(1), Some(1))));
        let loaded = parse_str(&yaml.replace("x #1", "x1")).unwrap();
        let err = loaded.error_at("resources.time", "why", "fix");
        assert_eq!(at(&err), (Some(9), Some(3)), "{err}");
    }

    #[test]
    fn aliases_are_read_and_their_errors_point_at_the_alias() {
        let yaml = MINIMAL.replace("  steps: 2\n", "  steps: &n 2\n  log_every: *n\n");
        let loaded = parse_str(&yaml).unwrap();
        assert_eq!(loaded.spec.training.log_every, Some(2));
        let yaml = MINIMAL
            .replace("name: t\n", "name: &n t\n")
            .replace("  steps: 2\n", "  steps: *n\n");
        let err = parse_str(&yaml).unwrap_err();
        assert_eq!(err.field, "training.steps");
        assert_eq!(at(&err), (Some(4), Some(10)), "{err}");
        assert_eq!(
            err.why,
            "invalid type: string \"t\", expected a whole number (0 or more)"
        );
    }

    /// What serde calls a unit value or a float is said as the spec was written: a key with
    /// nothing after it, a whole number too large; a required key written in the wrong
    /// section is pointed at.
    #[test]
    fn values_and_misplaced_keys_are_said_as_written() {
        let err = parse_str(&MINIMAL.replace("  steps: 2\n", "  steps:\n")).unwrap_err();
        assert_eq!(
            err.why,
            "invalid type: no value (nothing, or null, after the key), expected a whole number \
             (0 or more)"
        );
        let err =
            parse_str(&MINIMAL.replace("steps: 2", "steps: 99999999999999999999")).unwrap_err();
        assert_eq!(
            err.why,
            "invalid type: a whole number larger than 18446744073709551615, expected a whole \
             number (0 or more)"
        );
        // Written as a float, a number that fits is said as serde says it.
        let err = parse_str(&MINIMAL.replace("steps: 2", "steps: 1e19")).unwrap_err();
        assert!(err.why.starts_with("invalid type: floating point"), "{err}");
        let err = parse_str(&(MINIMAL.replace("  steps: 2\n", "") + "steps: 7\n")).unwrap_err();
        assert_eq!(err.why, "required key `training.steps` is missing");
        assert_eq!(
            err.fix,
            "`steps` is written at the top level (line 6): move it under `training:`, indented"
        );
        // The top level's keys, as serde knows them, are the ones a misplaced key is told
        // from.
        let err = parse_str(&(MINIMAL.to_string() + "zzzz: 1\n")).unwrap_err();
        let listed: Vec<String> = schema::TOP_LEVEL_KEYS
            .iter()
            .map(|k| format!("`{k}`"))
            .collect();
        assert_eq!(err.fix, format!("use one of {}", listed.join(", ")));
        // A key of the same name in another section is that section's own.
        let yaml = MINIMAL.replace("  steps: 2\n", "") + "resources:\n  env: { steps: \"5\" }\n";
        let err = parse_str(&yaml).unwrap_err();
        assert!(err.fix.starts_with("add `steps:` here"), "{err}");
    }

    #[test]
    fn merge_keys_are_refused_where_written() {
        let yaml = MINIMAL.replace(
            "  steps: 2\n",
            "  steps: 2\n  optimizer: &o {lr: 0.1}\n  schedule:\n    <<: *o\n",
        );
        let err = parse_str(&yaml).unwrap_err();
        assert_eq!(err.kind, SpecErrorKind::Syntax);
        assert_eq!(at(&err), (Some(7), Some(5)), "{err}");
        assert!(err.why.contains("merge keys (`<<`)"), "{err}");
    }

    #[test]
    fn a_second_document_is_refused_at_its_line() {
        let err = parse_str(&format!("{MINIMAL}---\nname: u\n")).unwrap_err();
        assert_eq!(err.kind, SpecErrorKind::Syntax);
        assert_eq!(at(&err), (Some(7), Some(1)), "{err}");
        assert!(err.why.contains("a job spec is one document"), "{err}");
        let err = parse_str(&format!("{MINIMAL}...\n---\n")).unwrap_err();
        assert_eq!(at(&err), (Some(8), Some(1)), "{err}");
        // An opening `---` and a closing `...` frame the one document.
        assert!(parse_str(&format!("---\n{MINIMAL}...\n")).is_ok());
    }

    #[test]
    fn values_keep_the_text_they_were_written_with() {
        let yaml = format!("{MINIMAL}resources:\n  partition: 0x10\n  time: 1:00:00\n  mem: ~\n  env: {{A: 1.0e-3, B: yes}}\n");
        let r = parse_str(&yaml).unwrap().spec.resources;
        assert_eq!(r.partition.as_deref(), Some("0x10"));
        assert_eq!(r.time.as_deref(), Some("1:00:00"));
        assert_eq!(r.mem, None);
        assert_eq!(r.env["A"], "1.0e-3");
        assert_eq!(r.env["B"], "yes");
    }

    #[test]
    fn bad_names_are_refused() {
        for name in ["", "a b", "../x", "-x", "x/y"] {
            let yaml = MINIMAL.replace("name: t", &format!("name: {name:?}"));
            let err = parse_str(&yaml).unwrap_err();
            assert_eq!(err.field, "name", "{name}: {err}");
            assert_eq!(err.line, Some(1));
        }
    }

    #[test]
    fn unreadable_file_is_an_error_not_a_panic() {
        let err = load(Path::new("/nonexistent/job.yaml")).unwrap_err();
        assert_eq!(err.kind, SpecErrorKind::Io);
    }
}
