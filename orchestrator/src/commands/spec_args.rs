//! What the commands that take a job spec share: the spec path (a file or a run directory),
//! `--set` overrides, and loading plus resolving in one step (for the commands that take one
//! job, with a sweep refused).

use crate::resolve::{self, Overrides, ResolvedJob};
use crate::rundir::RunDir;
use crate::sbatch;
use crate::spec::{self, overrides, LoadedSpec, Override, SpecError};
use crate::sweeps;
use std::path::{Path, PathBuf};

/// `--set`, shared by `plan`, `prepare`, `render`, `submit`, `run` and `sweep`.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct SetArgs {
    /// Replace a value of the spec: a dotted path as in sweeps and a YAML value
    /// (`--set training.steps=20000`); repeatable, later ones win. `submit` and `run` record
    /// them in the run's job.yaml and resolved.json, `sweep` in each point's resolved.json.
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
    let loaded = load(path, set, "plan")?;
    let job = resolve::resolve(&loaded, overrides)?;
    Ok((loaded, job))
}

/// `run`, `submit`, `render` and `prepare`: the spec behind `path` with `--set` applied,
/// refused when it sweeps ([`refuse_sweep`]), and resolved with the overrides `decide` picks
/// from it (`run` and `submit` look at the run directory it names first).
pub fn load_one_job(
    path: &Path,
    set: &SetArgs,
    command: OneJob,
    decide: impl FnOnce(&LoadedSpec) -> anyhow::Result<Overrides>,
) -> anyhow::Result<(LoadedSpec, ResolvedJob)> {
    let loaded = load(path, set, command.name())?;
    refuse_sweep(&loaded, command, path)?;
    let overrides = decide(&loaded)?;
    let job = resolve::resolve(&loaded, &overrides)?;
    Ok((loaded, job))
}

/// The spec behind `path` with `--set` applied. A sweep point's directory has no spec of
/// its own: refused, saying how its values train as a job of their own.
fn load(path: &Path, set: &SetArgs, command: &str) -> anyhow::Result<LoadedSpec> {
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
                 again if it did not finish (resuming it from its checkpoint); to train its \
                 values as a new job of their own, from step 1: `{}`",
                path.display(),
                label.join(" "),
                sweeps::one_point_command(command, "<the sweep's spec>", &m.name, &m.sweep_params)
            );
        }
    }
    if path.is_dir() && !spec_path(path).exists() && manifest.is_none() {
        anyhow::bail!(not_a_spec_folder(path, command));
    }
    let mut loaded = spec::load_with(&spec_path(path), &set.parsed()?)?;
    // A run directory's job.yaml keeps the spec's relative paths: they are relative to the
    // folder of the spec the run was made from.
    if let Some(spec_dir) = manifest.and_then(|m| m.spec_dir) {
        loaded.base_dir = spec_dir;
    }
    // The data cache's default follows the run root, which is relative to the folder
    // `shardrun` runs in: a run directory continued from another folder keeps the cache it
    // was made with, rather than look changed.
    if let (Some(run), Some(data)) = (&run, loaded.spec.training.data.as_mut()) {
        if data.cache_dir.is_none() {
            if let Ok(resolved) = run.read_resolved() {
                if let shardrun_protocol::config::DataConfig::Dataset(d) = &resolved.train.data {
                    data.cache_dir = Some(d.cache_dir.clone());
                }
            }
        }
    }
    Ok(loaded)
}

/// A folder that is neither a spec's run directory nor holds a `job.yaml`: what the command
/// takes instead, and the spec lines for a model folder or data folder given in its place.
pub fn not_a_spec_folder(path: &Path, command: &str) -> String {
    // Spec paths are relative to the spec file, wherever it is: the folder as it is.
    let absolute = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    let in_yaml = serde_norway::to_string(&absolute.to_string_lossy())
        .map(|text| text.trim_end().to_string())
        .unwrap_or_else(|_| absolute.display().to_string());
    let instead = if path.join(shardrun_models::hf::CONFIG_FILE).is_file() {
        format!(
            " It looks like a Hugging Face model folder: a spec trains it with\n    \
             training:\n      model: {{kind: hf, path: {in_yaml}}}\n  \
             (examples/llama-finetune.yaml is a whole one)"
        )
    } else if path.join("tokenizer.json").is_file() {
        format!(
            " It looks like a tokenizer folder: a spec names it as \
             `training.data.tokenizer: {{path: {in_yaml}}}` (docs/job-spec.md, `data`)"
        )
    } else {
        String::new()
    };
    let takes = if command == "sweep" {
        "takes a sweep's spec (a YAML file with a `sweep:` section)"
    } else {
        "takes a job spec (a YAML file) or a run directory"
    };
    format!(
        "{} is a folder without a job.yaml, and not a run directory: `shardrun {command}` \
         {takes}.{instead}\n  \
         fix: `shardrun {command} <your spec>.yaml`; `shardrun plan examples/demo.yaml` shows a \
         working spec",
        path.display()
    )
}

/// The commands that take a spec as one job, and what they do with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OneJob {
    Run,
    Submit,
    Render,
    Prepare,
}

impl OneJob {
    fn name(self) -> &'static str {
        match self {
            OneJob::Run => "run",
            OneJob::Submit => "submit",
            OneJob::Render => "render",
            OneJob::Prepare => "prepare",
        }
    }

    /// What the command does with one job, and what it would do with a sweep's spec.
    fn with_a_sweep(self) -> &'static str {
        match self {
            OneJob::Run | OneJob::Submit => {
                "trains one job, and would train the values outside the sweep only"
            }
            OneJob::Render => {
                "renders the script of one job, and would render the one of the values outside \
                 the sweep only"
            }
            OneJob::Prepare => {
                "prepares the data of one job, and would prepare the data of the values outside \
                 the sweep only"
            }
        }
    }

    /// What the one-point command line is for.
    fn one_point(self) -> &'static str {
        match self {
            OneJob::Run => "to train one point on this machine",
            OneJob::Submit => "to submit one point as a job of its own",
            OneJob::Render => "to see the script of one point as a job of its own",
            OneJob::Prepare => {
                "to prepare a point's data ahead (points with the same data and tokenizer share \
                 it)"
            }
        }
    }
}

/// `run`, `submit`, `render` and `prepare` take one job: a spec with a sweep is refused (they
/// would use the values outside the sweep and silently drop the rest), saying how to submit
/// the sweep and how to give the command one point.
fn refuse_sweep(loaded: &LoadedSpec, command: OneJob, path: &Path) -> Result<(), SpecError> {
    let Some(sweep) = &loaded.spec.sweep else {
        return Ok(());
    };
    let spec = sbatch::shell_quote(&path.display().to_string());
    Err(loaded.error_at(
        "sweep",
        format!(
            "this spec sweeps {} point(s); `shardrun {}` {}",
            sweeps::written_points(sweep),
            command.name(),
            command.with_a_sweep()
        ),
        format!(
            "submit the sweep with `shardrun sweep {spec}` (every point, as Slurm job arrays; \
             `--dry-run` lists them); {}, turn the sweep off and give the point's values, \
             e.g. the first point: `{}`",
            command.one_point(),
            sweeps::one_point_command(
                command.name(),
                &spec,
                &format!("{}-point", loaded.spec.name),
                &sweeps::first_point(sweep)
            )
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    const ONE_JOB: &str = "name: one
resources: { tasks_per_node: 2 }
training:
  model: { kind: mlp, input_dim: 4, hidden_dim: 8, output_dim: 4 }
  steps: 2
  total_batch_size: 4
  batch_size_per_device: 1
";

    #[test]
    fn one_job_is_loaded_refused_when_it_sweeps_and_resolved_with_the_overrides_decided() {
        let dir = tempfile::tempdir().unwrap();
        let spec = dir.path().join("job.yaml");
        std::fs::write(&spec, ONE_JOB).unwrap();
        let set = SetArgs {
            set: vec!["training.steps=3".into()],
        };
        let (loaded, job) = load_one_job(&spec, &set, OneJob::Run, |loaded| {
            assert_eq!(
                loaded.spec.training.steps, 3,
                "--set applies before deciding"
            );
            Ok(Overrides {
                world_size: Some(4),
                ..Overrides::default()
            })
        })
        .unwrap();
        assert_eq!(loaded.spec.name, "one");
        assert_eq!((job.world_size, job.train.steps), (4, 3));

        let sweep = format!("{ONE_JOB}sweep:\n  grid:\n    training.steps: [1, 2]\n");
        std::fs::write(&spec, sweep).unwrap();
        for command in [OneJob::Run, OneJob::Submit, OneJob::Render, OneJob::Prepare] {
            let err = load_one_job(&spec, &SetArgs::default(), command, |_| {
                panic!("{command:?} decided overrides for a sweep")
            })
            .unwrap_err()
            .to_string();
            assert!(
                err.contains(&format!("`shardrun {}`", command.name())),
                "{err}"
            );
        }
    }
}
