//! A spec with a `sweep:` section is many jobs: `run` and `submit`, which start one, and
//! `render` and `prepare`, which make one's script and data, refuse it instead of using the
//! values outside the sweep, and say how to submit its points (`shardrun sweep`) or give the
//! command one point (the sweep turned off); the command they give works.
//! A sweep point's directory, which has no spec of its own, gets the same way out.

mod common;
use common::{shardrun, spec_dir, stderr};

const SWEEP: &str = "name: lr
resources: { tasks_per_node: 2 }
training:
  model: { kind: mlp, input_dim: 4, hidden_dim: 8, output_dim: 4 }
  steps: 2
  total_batch_size: 4
  batch_size_per_device: 2
sweep:
  grid:
    training.optimizer.lr: [1.0e-3, 3.0e-4]
    training.fsdp.wrap: [{kind: module_names, patterns: [layer1]}]
";

/// The words of the suggested command (the last text in backticks), quotes removed.
fn suggested(text: &str) -> Vec<String> {
    let command = text.rsplit('`').nth(1).expect("a command in backticks");
    let mut words = Vec::new();
    let mut quoted = false;
    let mut word = String::new();
    for c in command.chars() {
        match c {
            '\'' => quoted = !quoted,
            ' ' if !quoted => words.push(std::mem::take(&mut word)),
            c => word.push(c),
        }
    }
    words.push(word);
    words
}

#[test]
fn run_and_submit_refuse_a_sweep_and_say_how_to_train_one_point() {
    let dir = spec_dir("sweep.yaml", SWEEP);
    for command in ["run", "submit"] {
        let out = shardrun(dir.path(), &[command, "sweep.yaml"]);
        let text = stderr(&out);
        assert_eq!(out.status.code(), Some(1), "{command} went ahead:\n{text}");
        assert!(
            text.starts_with(&format!(
                "error: sweep.yaml:8:1: field `sweep`: this spec sweeps 2 point(s); `shardrun \
                 {command}` trains one job"
            )) && text.contains("fix: submit the sweep with `shardrun sweep sweep.yaml`"),
            "{text}"
        );
        let words = suggested(&text);
        assert_eq!(
            words,
            [
                "shardrun",
                command,
                "sweep.yaml",
                "--set",
                "sweep=null",
                "--set",
                "training.fsdp.wrap={\"kind\":\"module_names\",\"patterns\":[\"layer1\"]}",
                "--set",
                "training.optimizer.lr=0.001",
                "--set",
                "name=lr-point",
            ]
        );
        assert!(!dir.path().join("runs").exists(), "{command} wrote a run");
        // The suggested values make one job, which plans and renders.
        let mut args: Vec<&str> = words[1..].iter().map(String::as_str).collect();
        args[0] = "plan";
        let out = shardrun(dir.path(), &args);
        assert!(out.status.success(), "{args:?}: {}", stderr(&out));
        let plan = String::from_utf8_lossy(&out.stdout);
        assert!(plan.starts_with("job lr-point\n"), "{plan}");
        assert!(plan.contains("0.001"), "{plan}");
    }
    // `plan` shows the values outside the sweep, and says so.
    let out = shardrun(dir.path(), &["plan", "sweep.yaml"]);
    assert!(out.status.success());
    assert!(
        stderr(&out).starts_with(
            "note: this spec sweeps 2 point(s); this is the plan of the values outside the sweep"
        ),
        "{}",
        stderr(&out)
    );
}

#[test]
fn render_and_prepare_refuse_a_sweep_and_say_how_to_give_them_one_point() {
    let dir = spec_dir("sweep.yaml", SWEEP);
    for (command, does) in [
        ("render", "renders the script of one job"),
        ("prepare", "prepares the data of one job"),
    ] {
        let out = shardrun(dir.path(), &[command, "sweep.yaml"]);
        let text = stderr(&out);
        assert_eq!(out.status.code(), Some(1), "{command} went ahead:\n{text}");
        assert_eq!(String::from_utf8_lossy(&out.stdout), "", "{command}");
        assert!(
            text.starts_with(&format!(
                "error: sweep.yaml:8:1: field `sweep`: this spec sweeps 2 point(s); `shardrun \
                 {command}` {does}, and would "
            )) && text.contains("fix: submit the sweep with `shardrun sweep sweep.yaml`"),
            "{text}"
        );
        // The command it gives does it for the first point.
        let words = suggested(&text);
        assert_eq!(words[..3], ["shardrun", command, "sweep.yaml"], "{text}");
        let args: Vec<&str> = words[1..].iter().map(String::as_str).collect();
        let out = shardrun(dir.path(), &args);
        assert!(out.status.success(), "{args:?}: {}", stderr(&out));
        let stdout = String::from_utf8_lossy(&out.stdout);
        match command {
            "render" => assert!(stdout.contains("#SBATCH --job-name=lr-point\n"), "{stdout}"),
            _ => assert_eq!(stdout, "synthetic data: nothing to prepare\n"),
        }
    }
}

#[test]
fn a_sweep_point_directory_names_its_values() {
    let dir = tempfile::tempdir().unwrap();
    let point = dir.path().join("runs/lr/lr-0123456789abcdef");
    std::fs::create_dir_all(&point).unwrap();
    std::fs::write(
        point.join("manifest.json"),
        r#"{"version": 1, "name": "lr-0123456789abcdef", "state": "FAILED", "config_hash": "",
            "created_at": 0, "updated_at": 0,
            "sweep_params": {"training.optimizer.lr": 0.001}}"#,
    )
    .unwrap();
    let shown = point.display().to_string();
    for command in ["run", "submit"] {
        let out = shardrun(dir.path(), &[command, &shown]);
        assert_eq!(out.status.code(), Some(1));
        assert_eq!(
            stderr(&out),
            format!(
                "error: {shown} is a point of a sweep (training.optimizer.lr=0.001): it has no \
                 spec of its own and runs as a task of its sweep's job array\n  fix: `shardrun \
                 sweep <the sweep's spec>` submits it again if it did not finish (resuming it \
                 from its checkpoint); to train its values as a new job of their own, from step \
                 1: `shardrun {command} <the sweep's spec> --set sweep=null --set \
                 training.optimizer.lr=0.001 --set name=lr-0123456789abcdef`\n"
            )
        );
    }
}
