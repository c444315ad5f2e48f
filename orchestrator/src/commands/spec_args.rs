//! What the commands that take a job spec share: the spec path (a file or a run directory),
//! `--set` overrides, and loading plus resolving in one step.

use crate::resolve::{self, Overrides, ResolvedJob};
use crate::rundir::RunDir;
use crate::sbatch;
use crate::spec::{self, overrides, LoadedSpec, Override, SpecError};
use crate::sweeps;
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
    let loaded = load(path, set)?;
    let job = resolve::resolve(&loaded, overrides)?;
    Ok((loaded, job))
}

/// The spec behind `path` with `--set` applied. A sweep point's directory has no spec of
/// its own: refused, saying how its values train as a job of their own.
pub fn load(path: &Path, set: &SetArgs) -> anyhow::Result<LoadedSpec> {
    let run = RunDir::open(path).ok().filter(|_| path.is_dir());
    let manifest = run.as_ref().and_then(|run| run.read_manifest().ok());
    if let Some(m) = manifest.as_ref().filter(|m| !m.sweep_params.is_empty()) {
        if !spec_path(path).exists() {
            let label: Vec<String> = m
                .sweep_params
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect();
            anyhow::bail!(
                "{} is a point of a sweep ({}): it has no spec of its own and runs as a task of \
                 its sweep's job array\n  fix: `shardrun sweep <the sweep's spec>` submits it \
                 again if it failed; to train its values as a job of their own: `{}`",
                path.display(),
                label.join(" "),
                sweeps::one_point_command("run", "<the sweep's spec>", &m.name, &m.sweep_params)
            );
        }
    }
    let mut loaded = spec::load_with(&spec_path(path), &set.parsed()?)?;
    // A run directory's job.yaml keeps the spec's relative paths: they are relative to the
    // folder of the spec the run was made from.
    if let Some(spec_dir) = manifest.and_then(|m| m.spec_dir) {
        loaded.base_dir = spec_dir;
    }
    Ok(loaded)
}

/// `run` and `submit` train one job: a spec with a sweep is refused (it would train the
/// values outside the sweep and silently drop the rest), saying how to train its points.
pub fn refuse_sweep(loaded: &LoadedSpec, command: &str, path: &Path) -> Result<(), SpecError> {
    let Some(sweep) = &loaded.spec.sweep else {
        return Ok(());
    };
    let alone = match command {
        "run" => "to train one point on this machine",
        _ => "to submit one point as a job of its own",
    };
    let spec = sbatch::shell_quote(&path.display().to_string());
    Err(loaded.error_at(
        "sweep",
        format!(
            "this spec sweeps {} points; `shardrun {command}` trains one job, and would train \
             the values outside the sweep only",
            sweeps::written_points(sweep)
        ),
        format!(
            "submit the sweep with `shardrun sweep {spec}` (every point, as Slurm job arrays; \
             `--dry-run` lists them); {alone}, turn the sweep off and give the point's values, \
             e.g. the first point: `{}`",
            sweeps::one_point_command(
                command,
                &spec,
                &format!("{}-point", loaded.spec.name),
                &sweeps::first_point(sweep)
            )
        ),
    ))
}
