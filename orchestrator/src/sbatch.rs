//! The sbatch script, rendered from `templates/sbatch.sh` with askama. A pure function of
//! the resolved job and where things live, so golden-file tests pin the exact output.

use crate::resolve::{PreemptionPlan, ResolvedJob, SlurmResources};
use askama::Template;
use std::path::{Path, PathBuf};

/// What one script runs: a single run directory, or one of many by array task id.
#[derive(Debug, Clone, PartialEq)]
pub enum ScriptTarget {
    Single {
        run_dir: PathBuf,
    },
    Array {
        /// One run directory per line; task N runs line N+1.
        points_file: PathBuf,
        /// Where Slurm writes the tasks' `%x-%A_%a.out` files.
        log_dir: PathBuf,
        tasks: usize,
        throttle: Option<u32>,
    },
}

#[derive(Debug, thiserror::Error)]
pub enum RenderError {
    #[error("path {0} contains a control character, a backslash, or both kinds of quotes, which #SBATCH lines cannot carry\n  fix: use a run_root without them")]
    UnsafePath(PathBuf),
    #[error("an array needs at least one task")]
    EmptyArray,
    #[error("rendering templates/sbatch.sh failed: {0}")]
    Template(#[from] askama::Error),
}

/// The start of the line each attempt of a job writes first to its error file (`shardrun:
/// start of job 41 on node7, attempt 2`). A requeued job appends to the same file: what
/// came after the last such line is the last attempt's.
pub const ATTEMPT_START: &str = "shardrun: start of job ";

#[derive(Template)]
#[template(path = "sbatch.sh", escape = "none")]
struct SbatchTemplate<'a> {
    version: &'a str,
    attempt_start: &'a str,
    name: &'a str,
    s: &'a SlurmResources,
    preemption: &'a PreemptionPlan,
    array: Option<String>,
    output: String,
    error: String,
    /// Shell-quoted.
    points_file: Option<String>,
    run_dir: String,
    shardrun: String,
    /// The `srun` arguments the controller starts the ranks with, for people reading the
    /// script.
    ranks_srun: String,
}

/// Render the batch script. `shardrun_exe` is the absolute path of the binary the job runs
/// as its controller (normally the one doing the rendering).
pub fn render_sbatch(
    job: &ResolvedJob,
    target: &ScriptTarget,
    shardrun_exe: &Path,
) -> Result<String, RenderError> {
    let (array, output, error, points_file, run_dir) = match target {
        ScriptTarget::Single { run_dir } => (
            None,
            sbatch_file_pattern(run_dir, "%x-%j.out")?,
            sbatch_file_pattern(run_dir, "%x-%j.err")?,
            None,
            shell_quote(&run_dir.to_string_lossy()),
        ),
        ScriptTarget::Array {
            points_file,
            log_dir,
            tasks,
            throttle,
        } => {
            if *tasks == 0 {
                return Err(RenderError::EmptyArray);
            }
            let range = match throttle {
                Some(t) => format!("0-{}%{t}", tasks - 1),
                None => format!("0-{}", tasks - 1),
            };
            let points = shell_quote(&points_file.to_string_lossy());
            (
                Some(range),
                sbatch_file_pattern(log_dir, "%x-%A_%a.out")?,
                sbatch_file_pattern(log_dir, "%x-%A_%a.err")?,
                Some(points),
                String::new(),
            )
        }
    };
    let template = SbatchTemplate {
        version: env!("CARGO_PKG_VERSION"),
        attempt_start: ATTEMPT_START,
        name: &job.name,
        s: &job.slurm,
        preemption: &job.preemption,
        array,
        output,
        error,
        points_file,
        run_dir,
        shardrun: shell_quote(&shardrun_exe.to_string_lossy()),
        ranks_srun: crate::job_controller::launcher::srun_args(
            job.world_size,
            job.slurm.nodes,
            job.slurm.gpus_per_node,
        )
        .join(" "),
    };
    let mut script = template.render()?;
    if !script.ends_with('\n') {
        script.push('\n');
    }
    Ok(script)
}

/// `<dir>/<pattern>` as one word of an #SBATCH line. sbatch splits those lines itself: single
/// or double quotes group a word as in a shell, an unquoted `#` starts a comment, and Slurm
/// reads `%` in file names as a pattern (`%%` is a literal `%`). Plain paths stay unquoted.
fn sbatch_file_pattern(dir: &Path, pattern: &str) -> Result<String, RenderError> {
    let text = dir.to_string_lossy();
    if text.chars().any(|c| c.is_control() || c == '\\')
        || (text.contains('"') && text.contains('\''))
    {
        return Err(RenderError::UnsafePath(dir.to_path_buf()));
    }
    let word = format!("{}/{pattern}", text.replace('%', "%%"));
    Ok(
        if word
            .chars()
            .any(|c| c.is_whitespace() || "'\"#".contains(c))
        {
            let quote = if word.contains('"') { '\'' } else { '"' };
            format!("{quote}{word}{quote}")
        } else {
            word
        },
    )
}

/// Quote for POSIX sh: plain words stay as they are, anything else is single-quoted.
pub fn shell_quote(text: &str) -> String {
    let plain = !text.is_empty()
        && text
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "/._-+=:,@".contains(c));
    if plain {
        text.to_string()
    } else {
        format!("'{}'", text.replace('\'', r"'\''"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resolve::{resolve, Overrides};
    use crate::spec::parse;

    const EXE: &str = "/opt/shardrun/bin/shardrun";

    fn resolved(text: &str) -> ResolvedJob {
        resolve(
            &parse(text, Path::new("job.yaml")).unwrap(),
            &Overrides::default(),
        )
        .unwrap()
    }

    #[test]
    fn demo_script() {
        let job = resolved(include_str!("../../examples/demo.yaml"));
        let script = render_sbatch(
            &job,
            &ScriptTarget::Single {
                run_dir: "/home/me/runs/demo".into(),
            },
            Path::new(EXE),
        )
        .unwrap();
        insta::assert_snapshot!(script);
    }

    #[test]
    fn a_job_that_does_not_requeue_is_never_requeued_by_its_controller() {
        let spec = include_str!("../../examples/demo.yaml").to_string()
            + "preemption: { requeue: false }\n";
        let job = resolved(&spec);
        let target = ScriptTarget::Single {
            run_dir: "/home/me/runs/demo".into(),
        };
        let script = render_sbatch(&job, &target, Path::new(EXE)).unwrap();
        assert!(script.contains("\n#SBATCH --no-requeue\n"), "{script}");
        assert!(
            script.contains("\nexport SHARDRUN_MAX_REQUEUES=0\n"),
            "{script}"
        );
        assert!(!script.contains("\n#SBATCH --requeue\n"), "{script}");
    }

    #[test]
    fn gpu_cluster_script_carries_every_flag() {
        // The example's data files, where planning looks for them.
        let data = tempfile::tempdir().unwrap();
        for file in ["train.bin", "val.bin"] {
            std::fs::write(data.path().join(file), [0u8; 2]).unwrap();
        }
        // With a set-up line, as a site's may need.
        let spec = include_str!("../../examples/gpu-cluster.yaml")
            .replace("/scratch/data/", &format!("{}/", data.path().display()))
            .replace("  env:", "  setup: [source /etc/profile]\n  env:");
        let job = resolved(&spec);
        let script = render_sbatch(
            &job,
            &ScriptTarget::Single {
                run_dir: "/scratch/my-user/runs/llm-1b".into(),
            },
            Path::new(EXE),
        )
        .unwrap();
        for flag in [
            "--nodes=2",
            "--ntasks-per-node=4",
            "--gres=gpu:4",
            "--cpus-per-task=8",
            "--mem=200G",
            "--time=1-00:00:00",
            "--partition=gpu",
            "--account=my-project",
            "--qos=normal",
            "--constraint=[a100|h100]",
            "--exclusive",
            "--signal=B:USR2@300",
            "--requeue",
            "--mail-type=END,FAIL",
            "%x-%j.out",
            "%x-%j.err",
        ] {
            assert!(
                script.contains(&format!("#SBATCH {flag}")) || script.contains(flag),
                "missing {flag}"
            );
        }
        insta::assert_snapshot!(script);
    }

    #[test]
    fn a_gpu_type_is_asked_with_the_gpus() {
        let spec = include_str!("../../examples/mlp.yaml").replace(
            "  tasks_per_node: 2\n",
            "  gpus_per_node: 2\n  gpu_type: h100\n",
        );
        let target = ScriptTarget::Single {
            run_dir: "/home/me/runs/mlp".into(),
        };
        let script = render_sbatch(&resolved(&spec), &target, Path::new(EXE)).unwrap();
        assert!(script.contains("\n#SBATCH --gres=gpu:h100:2\n"), "{script}");
        assert_eq!(script.matches("#SBATCH --gres").count(), 1, "{script}");
        // The step asks for the job's GPUs, whatever their type.
        assert!(script.contains("#   srun --ntasks=2 "), "{script}");
        assert!(
            script.contains(" --gres=gpu:2 shardrun-worker\n"),
            "{script}"
        );
    }

    #[test]
    fn array_script() {
        let job = resolved(include_str!("../../examples/sweep.yaml"));
        let target = ScriptTarget::Array {
            points_file: "/home/me/runs/mlp-sweep/arrays/points-1.txt".into(),
            log_dir: "/home/me/runs/mlp-sweep/slurm".into(),
            tasks: 12,
            throttle: Some(4),
        };
        let script = render_sbatch(&job, &target, Path::new(EXE)).unwrap();
        assert!(script.contains("#SBATCH --array=0-11%4"));
        assert!(script.contains("%x-%A_%a.out"));
        insta::assert_snapshot!(script);
    }

    #[test]
    fn paths_sbatch_cannot_carry_are_refused() {
        let job = resolved(include_str!("../../examples/mlp.yaml"));
        for dir in [
            "/home/me/it's a \"run\"/x",
            "/home/me/a\\b/x",
            "/home/me/a\nb/x",
        ] {
            let err = render_sbatch(
                &job,
                &ScriptTarget::Single {
                    run_dir: dir.into(),
                },
                Path::new(EXE),
            )
            .unwrap_err();
            assert!(matches!(err, RenderError::UnsafePath(_)), "{dir:?}: {err}");
        }
    }

    #[test]
    fn paths_with_spaces_quotes_and_percent_are_quoted_for_sbatch_and_the_shell() {
        let job = resolved(include_str!("../../examples/sweep.yaml"));
        let target = ScriptTarget::Array {
            points_file: "/home/me/it's a 100% #1 root/grid/arrays/1-1-1.points".into(),
            log_dir: "/home/me/it's a 100% #1 root/grid/slurm".into(),
            tasks: 3,
            throttle: None,
        };
        let script = render_sbatch(&job, &target, Path::new(EXE)).unwrap();
        // sbatch groups a double-quoted word and reads `%%` as a literal `%`.
        assert!(
            script.contains(
                "#SBATCH --output=\"/home/me/it's a 100%% #1 root/grid/slurm/%x-%A_%a.out\"\n"
            ),
            "{script}"
        );
        // The shell reads the points file through a single-quoted word.
        assert!(
            script.contains(r#"p" '/home/me/it'\''s a 100% #1 root/grid/arrays/1-1-1.points')"#),
            "{script}"
        );
        let single = render_sbatch(
            &job,
            &ScriptTarget::Single {
                run_dir: "/runs/a \"quoted\" run".into(),
            },
            Path::new(EXE),
        )
        .unwrap();
        assert!(
            single.contains("#SBATCH --error='/runs/a \"quoted\" run/%x-%j.err'\n"),
            "{single}"
        );
        assert!(
            single.contains("export SHARDRUN_RUN_DIR='/runs/a \"quoted\" run'\n"),
            "{single}"
        );
    }

    #[test]
    fn shell_quoting() {
        assert_eq!(shell_quote("/a/b-c_d.e"), "/a/b-c_d.e");
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
        assert_eq!(shell_quote(""), "''");
    }
}
