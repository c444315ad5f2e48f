//! `shardrun run job.yaml [--nproc N] [--run-dir DIR] [--set key=value]`: the whole job on
//! this machine, with N CPU ranks or one rank per local GPU, no Slurm needed. Run again on
//! the same run directory, it continues the run (see [`crate::rerun`]).

use crate::commands::controller::supervise;
use crate::commands::spec_args::{self, OneJob, SetArgs};
use crate::job_controller::options::ControllerArgs;
use crate::job_controller::LaunchMode;
use crate::rerun::{self, RunStart};
use crate::resolve::{self, Overrides};
use crate::rundir::{NewRun, RunDir, StartLock};
use crate::spec::{overrides, JobSpec, LoadedSpec};
use shardrun_protocol::config::DeviceKind;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Job spec (YAML), or a run directory (its `job.yaml` is used, and it is the run
    /// directory).
    pub spec: PathBuf,
    /// Number of ranks (default: the spec's world size).
    #[arg(long)]
    pub nproc: Option<u64>,
    /// Where to write the run (default: the spec's run root / name).
    #[arg(long)]
    pub run_dir: Option<PathBuf>,
    /// Train on this device kind whatever the spec says.
    #[arg(long, value_enum)]
    pub device: Option<DeviceArg>,
    /// Delete the run directory's run (checkpoints, logs, metrics) and start over at step 1,
    /// and run even when the job's peak memory per rank exceeds the GPU's. Without it, a run
    /// directory holding an interrupted run resumes it.
    #[arg(long)]
    pub force: bool,
    /// No progress bar, one summary line per step instead (automatic when not a terminal).
    #[arg(long)]
    pub no_progress: bool,
    #[command(flatten)]
    pub set: SetArgs,
    #[command(flatten)]
    pub controller: ControllerArgs,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum DeviceArg {
    Cpu,
    Cuda,
}

pub fn execute(args: Args) -> anyhow::Result<()> {
    if args.nproc == Some(0) {
        anyhow::bail!("--nproc 0 would start no rank\n  fix: pass --nproc 1 or more");
    }
    let mut path = PathBuf::new();
    let (loaded, job) = spec_args::load_one_job(&args.spec, &args.set, OneJob::Run, |loaded| {
        path = match &args.run_dir {
            Some(dir) => dir.clone(),
            None => run_path(&args.spec, &loaded.spec)?,
        };
        Ok(Overrides {
            world_size: args.nproc,
            device: args.device.map(|d| match d {
                DeviceArg::Cpu => DeviceKind::Cpu,
                DeviceArg::Cuda => DeviceKind::Cuda,
            }),
            force: args.force,
            continues_run: continues_run(&path, args.force),
            resumes_from_checkpoint: resumes_from_checkpoint(&path, args.force),
            ..Overrides::submitting()
        })
    })?;
    // One GPU per rank, checked before anything is created.
    let gpus = match job.train.device {
        DeviceKind::Cuda => {
            let asked = asked_for_cuda(args.device, &loaded);
            Some(crate::gpus::for_local_run(job.world_size, &asked).map_err(anyhow::Error::msg)?)
        }
        DeviceKind::Cpu => None,
    };
    let job_yaml = overrides::recorded_yaml(&loaded);
    let spec_dir = std::path::absolute(&loaded.base_dir)?;
    // An existing run directory is this command's alone until its controller holds it.
    let starting = StartLock::of_existing(&path)?;
    let prepared = rerun::prepare(
        &path,
        NewRun {
            resolved: &job,
            job_yaml: &job_yaml,
            sbatch: None,
            sweep_params: &BTreeMap::new(),
            force: args.force,
            spec_dir: Some(&spec_dir),
            data_here: true,
        },
    )?;
    let Some(run) = announce(prepared) else {
        return Ok(());
    };
    for warning in &job.warnings {
        errln!("warning: {warning}");
    }
    if let Some(warning) =
        allocation_left_idle(crate::commands::controller::allocation_node_count())
    {
        errln!("warning: {warning}");
    }
    let opts = args.controller.options(
        &run,
        LaunchMode::Local {
            gpus,
            forced: args.force,
        },
        !args.no_progress,
    )?;
    supervise(&run, opts, starting)?;
    outln!("run directory: {}", run.path().display());
    outln!(
        "  plot: shardrun plot {}",
        crate::output::pasteable(run.path())
    );
    Ok(())
}

/// Inside an allocation of several nodes (`salloc --nodes 2`), `run` still starts every
/// rank on this one: the others stay idle, which is said. `nodes`: the allocation's.
fn allocation_left_idle(nodes: Option<u64>) -> Option<String> {
    let nodes = nodes.filter(|&n| n > 1)?;
    Some(format!(
        "this Slurm allocation has {nodes} nodes, and `shardrun run` starts every rank on this \
         one ({}): the other {} stay idle; to train across the nodes, submit the spec as a \
         batch job (`shardrun submit`), whose controller starts the ranks with srun",
        shardrun_protocol::host::hostname(),
        nodes - 1
    ))
}

/// What asked for CUDA, as a refusal names it: `--device cuda`, or the spec's
/// `gpus_per_node`, where it was set (the `--set` that set it last, or the file).
fn asked_for_cuda(device: Option<DeviceArg>, loaded: &LoadedSpec) -> String {
    const FIELD: &str = "resources.gpus_per_node";
    match (device, loaded.spec.resources.gpus_per_node) {
        (None, Some(gpus)) => match loaded.overrides.iter().rev().find(|o| o.covers(FIELD)) {
            Some(set) => set.flag(),
            None => format!("`{FIELD}: {gpus}` in {}", loaded.path.display()),
        },
        _ => "--device cuda".to_string(),
    }
}

/// The run directory of a spec: the spec's own folder when given a run directory, else
/// `<run_root>/<name>`.
pub fn run_path(spec_path: &Path, spec: &JobSpec) -> anyhow::Result<PathBuf> {
    if spec_path.is_dir() && RunDir::open(spec_path).is_ok() {
        return Ok(std::path::absolute(spec_path)?);
    }
    Ok(RunDir::planned_path(&resolve::run_root(spec), &spec.name)?)
}

/// Whether the job continues a run already at `path` (without `--force`, which starts over).
pub fn continues_run(path: &Path, force: bool) -> bool {
    !force && RunDir::open(path).is_ok()
}

/// Whether the job resumes the run at `path` from one of the run's checkpoints (without
/// `--force`, and unless the run was set not to resume).
pub fn resumes_from_checkpoint(path: &Path, force: bool) -> bool {
    if force {
        return false;
    }
    let Ok(run) = RunDir::open(path) else {
        return false;
    };
    run.read_train_config()
        .ok()
        .filter(|recorded| recorded.checkpoint.resume)
        .and_then(|recorded| rerun::newest_checkpoint(&run, &recorded))
        .is_some()
}

/// Says first what a re-run does (resume, start over, nothing); the run to start, if any.
pub fn announce(prepared: RunStart) -> Option<RunDir> {
    match prepared {
        RunStart::New(run) => Some(run),
        RunStart::Replaced { run, deleted } => {
            outln!("--force: deleted {deleted}; starting over at step 1");
            Some(run)
        }
        RunStart::Redone(redone) => {
            outln!("{}", redone.message());
            Some(redone.run)
        }
        RunStart::Resume(resume) => {
            let mut lines = vec![resume.headline()];
            lines.extend(resume.detail_lines());
            for line in &lines {
                outln!("{line}");
            }
            // Said where the run's log is read too (`tail -f`, a Slurm job's output, which
            // this command on a login node does not reach).
            if let Err(e) = resume.run.note_in_train_log(&lines) {
                errln!(
                    "warning: cannot write {}: {e}",
                    resume.run.train_log().display()
                );
            }
            Some(resume.run)
        }
        RunStart::Finished(finished) => {
            outln!("{}", finished.message());
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_in_an_allocation_of_several_nodes_says_the_others_stay_idle() {
        let warning = allocation_left_idle(Some(3)).expect("a warning");
        assert!(
            warning.starts_with("this Slurm allocation has 3 nodes")
                && warning.contains("the other 2 stay idle")
                && warning.contains("`shardrun submit`"),
            "{warning}"
        );
        assert_eq!(allocation_left_idle(Some(1)), None);
        assert_eq!(allocation_left_idle(None), None);
    }
    use crate::spec::parse;

    fn demo(run_root: Option<&Path>) -> crate::spec::LoadedSpec {
        let yaml = include_str!("../../../examples/demo.yaml");
        let mut loaded = parse(yaml, Path::new("demo.yaml")).unwrap();
        loaded.spec.run_root = run_root.map(Path::to_path_buf);
        loaded
    }

    #[test]
    fn a_spec_runs_in_the_directory_its_resolved_job_plans() {
        let cwd = std::env::current_dir().unwrap();
        let elsewhere = tempfile::tempdir().unwrap();
        for (run_root, expected) in [
            (None, cwd.join("runs/demo")),
            (Some(Path::new("sub/runs")), cwd.join("sub/runs/demo")),
            (Some(elsewhere.path()), elsewhere.path().join("demo")),
        ] {
            let loaded = demo(run_root);
            let job = crate::resolve::resolve(&loaded, &Overrides::default()).unwrap();
            let planned = RunDir::planned_path(&job.run_root, &job.name).unwrap();
            assert_eq!(planned, expected);
            assert_eq!(
                run_path(Path::new("demo.yaml"), &loaded.spec).unwrap(),
                planned
            );
        }
    }

    #[test]
    fn cuda_is_asked_for_by_the_flag_the_spec_file_or_the_set_that_set_gpus() {
        let gpus = |yaml: &str, sets: &[&str]| {
            let loaded = parse(yaml, Path::new("job.yaml")).unwrap();
            let sets: Vec<_> = sets.iter().map(|s| overrides::parse(s).unwrap()).collect();
            overrides::apply(loaded, &sets).unwrap()
        };
        let cpu = include_str!("../../../examples/demo.yaml");
        let in_file = cpu.replace("gpus_per_node: 0 ", "gpus_per_node: 2 ");
        assert_ne!(in_file, cpu, "the demo sets `gpus_per_node: 0`");
        assert_eq!(
            asked_for_cuda(None, &gpus(&in_file, &[])),
            "`resources.gpus_per_node: 2` in job.yaml"
        );
        assert_eq!(
            asked_for_cuda(None, &gpus(cpu, &["resources.gpus_per_node=4"])),
            "--set resources.gpus_per_node=4"
        );
        assert_eq!(
            asked_for_cuda(Some(DeviceArg::Cuda), &gpus(&in_file, &[])),
            "--device cuda"
        );
    }

    #[test]
    fn a_run_directory_given_as_the_spec_is_the_run_directory() {
        let tmp = tempfile::tempdir().unwrap();
        let loaded = demo(Some(&tmp.path().join("root")));
        let dir = tmp.path().join("moved");
        std::fs::create_dir(&dir).unwrap();
        std::fs::write(dir.join("manifest.json"), "{}").unwrap();
        assert_eq!(run_path(&dir, &loaded.spec).unwrap(), dir);
        assert_eq!(
            run_path(&dir.join("job.yaml"), &loaded.spec).unwrap(),
            tmp.path().join("root/demo"),
            "a spec file names its run directory by its run root and name"
        );
    }
}
