//! What the commands that take a job spec share: the spec path (a file or a run directory),
//! `--set` overrides, and loading plus resolving in one step.

use crate::resolve::{self, Overrides, ResolvedJob};
use crate::rundir::RunDir;
use crate::spec::{self, overrides, LoadedSpec, Override};
use std::path::{Path, PathBuf};

/// `--set`, shared by `plan`, `render`, `submit` and `run`.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct SetArgs {
    /// Replace a value of the spec: a dotted path as in sweeps and a YAML value
    /// (`--set training.steps=20000`); repeatable, later ones win. Recorded in the run's
    /// job.yaml and resolved.json.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub set: Vec<String>,
}

impl SetArgs {
    pub fn parsed(&self) -> Result<Vec<Override>, crate::spec::SpecError> {
        self.set.iter().map(|arg| overrides::parse(arg)).collect()
    }
}

/// The spec file behind a path that may also be a run directory.
pub fn spec_path(path: &Path) -> PathBuf {
    if path.is_dir() {
        path.join("job.yaml")
    } else {
        path.to_path_buf()
    }
}

/// Load, apply `--set` and resolve in one step; errors already carry file (or flag), line,
/// field and fix. The resolved job records the `--set` arguments.
pub fn load_and_resolve(
    path: &Path,
    overrides: &Overrides,
    set: &SetArgs,
) -> anyhow::Result<(LoadedSpec, ResolvedJob)> {
    let mut loaded = spec::load_with(&spec_path(path), &set.parsed()?)?;
    // A run directory's job.yaml keeps the spec's relative paths: they are relative to the
    // folder of the spec the run was made from.
    if let Some(spec_dir) = RunDir::open(path)
        .ok()
        .filter(|_| path.is_dir())
        .and_then(|run| run.read_manifest().ok()?.spec_dir)
    {
        loaded.base_dir = spec_dir;
    }
    let job = resolve::resolve(&loaded, overrides)?;
    Ok((loaded, job))
}
