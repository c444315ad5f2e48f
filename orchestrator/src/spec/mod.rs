//! The YAML job spec: what a person writes. Parsed with `deny_unknown_fields` so a typo is an
//! error, never a silently ignored key; optional fields stay `None` here and get their
//! defaults in [`crate::plan`], so the resolved config is explicit about every value.
//!
//! The full schema with every default is documented in `docs/job-spec.md`.

mod error;
mod locate;
mod schema;

pub use error::did_you_mean;
pub use error::{SpecError, SpecErrorKind};
pub use locate::locate_path;
pub use schema::*;

use std::path::{Path, PathBuf};

/// A parsed job spec together with where it came from (for error locations).
#[derive(Debug, Clone)]
pub struct LoadedSpec {
    pub spec: JobSpec,
    /// File the spec was read from (`<string>` for specs parsed from memory).
    pub path: PathBuf,
    /// The YAML text, kept to point errors found after parsing at their line.
    pub source: String,
}

impl LoadedSpec {
    /// An error about `field` (dotted path) found after parsing, located in the source.
    pub fn error_at(
        &self,
        field: &str,
        why: impl Into<String>,
        fix: impl Into<String>,
    ) -> SpecError {
        let location = locate_path(&self.source, field);
        SpecError {
            file: self.path.clone(),
            line: location.map(|l| l.0),
            column: location.map(|l| l.1),
            field: field.to_string(),
            kind: SpecErrorKind::Invalid,
            why: why.into(),
            fix: fix.into(),
        }
    }
}

/// Read and parse a job spec file.
pub fn load(path: &Path) -> Result<LoadedSpec, SpecError> {
    let source = std::fs::read_to_string(path).map_err(|e| SpecError {
        file: path.to_path_buf(),
        line: None,
        column: None,
        field: String::new(),
        kind: SpecErrorKind::Io,
        why: format!("cannot read the file: {e}"),
        fix: "check the path; `shardrun plan examples/demo.yaml` shows a working spec".into(),
    })?;
    parse(&source, path)
}

/// Parse a job spec from YAML text; `path` is only used in error messages.
pub fn parse(source: &str, path: &Path) -> Result<LoadedSpec, SpecError> {
    let spec: JobSpec =
        serde_norway::from_str(source).map_err(|e| SpecError::from_yaml(&e, path, source))?;
    let loaded = LoadedSpec {
        spec,
        path: path.to_path_buf(),
        source: source.to_string(),
    };
    validate_name(&loaded)?;
    Ok(loaded)
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
